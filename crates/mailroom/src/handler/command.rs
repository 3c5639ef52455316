//! The `command` handler: runs a program per attempt with the
//! payload on stdin and the envelope in `MAILROOM_*` environment variables.
//! Exit 0 is success, 65 (`EX_DATAERR`) a permanent failure, anything else a
//! retry; the tail of stderr becomes the error text.
//!
//! The program does not inherit mailroom's environment, which holds its
//! secrets (`MAILROOM_API_TOKEN`, passwords given through `${VAR}`): it gets
//! [`BASE_ENV`] (and every `LC_*`) where mailroom has them, the variables
//! its topic lists (`command = { argv = [...], env = ["NAME"] }`), and its
//! own `MAILROOM_*` envelope, which wins over both.

use super::{BatchOutcome, Handler, tail};
use mailroom_core::{Event, Outcome};
use std::ffi::OsString;
use std::process::Stdio;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Exit code meaning "never retry" (sysexits.h `EX_DATAERR`).
pub const PERMANENT_EXIT: i32 = 65;
/// How much of stderr is kept as error text.
const STDERR_TAIL: usize = 2048;

/// The variables of mailroom's environment a program always gets when they
/// are set, besides every `LC_*`: what finds programs (`PATH`), their files
/// (`HOME`, `TMPDIR`) and formats text and times (`LANG`, `TZ`). None of
/// them is where a secret is kept.
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TMPDIR"];

/// Runs a program per attempt: payload on stdin, envelope in `MAILROOM_*`
/// variables; exit 0 is done, 65 a permanent failure, anything else a
/// retry.
#[derive(Debug, Clone)]
pub struct CommandHandler {
    argv: Vec<String>,
    /// What the program gets from mailroom's environment, read once when
    /// the handler is built.
    inherited: Vec<(OsString, OsString)>,
}

impl CommandHandler {
    /// `argv[0]` is the program; it must not be empty. The program gets
    /// [`BASE_ENV`] and `LC_*` from this process's environment, nothing else
    /// of it unless [`pass_env`](Self::pass_env) names it.
    pub fn new(argv: Vec<String>) -> Result<Self, String> {
        if argv.first().is_none_or(String::is_empty) {
            return Err(
                "command: give the program and its arguments, e.g. [\"./handle.sh\"]".into(),
            );
        }
        Ok(Self {
            argv,
            inherited: inherited(&[], std::env::vars_os()),
        })
    }

    /// Also passes these variables of this process's environment, where
    /// set (`command = { ..., env = ["NAME"] }`). Each name is a shell
    /// variable name (`[A-Za-z_][A-Za-z0-9_]*`).
    pub fn pass_env(mut self, names: &[String]) -> Result<Self, String> {
        if let Some(bad) = names.iter().find(|n| !is_env_name(n)) {
            return Err(format!(
                "env: {bad:?} is not a variable name (letters, digits and _, not starting with a digit)"
            ));
        }
        self.inherited = inherited(names, std::env::vars_os());
        Ok(self)
    }
}

/// Whether `name` is a portable environment variable name (POSIX.1-2017
/// §8.1: letters, digits and `_`, not starting with a digit).
pub fn is_env_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| !c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The variables of `vars` a program gets: [`BASE_ENV`], `LC_*` and `names`.
fn inherited(
    names: &[String],
    vars: impl Iterator<Item = (OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    vars.filter(|(name, _)| {
        name.to_str().is_some_and(|n| {
            BASE_ENV.contains(&n) || n.starts_with("LC_") || names.iter().any(|w| w == n)
        })
    })
    .collect()
}

impl CommandHandler {
    /// Runs the program once with `stdin` and `env`; judges its exit.
    async fn run(&self, stdin_bytes: bytes::Bytes, env: Vec<(&'static str, String)>) -> Outcome {
        let mut cmd = tokio::process::Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // The attempt's timeout drops this future; the child must die with it.
            .kill_on_drop(true)
            // Nothing of mailroom's environment but what the program is given.
            .env_clear()
            .envs(self.inherited.iter().map(|(k, v)| (k, v)))
            .envs(env);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return Outcome::retry(format!("cannot start {:?}: {e}", self.argv[0])),
        };
        let mut stdin = child.stdin.take();
        let mut stderr = child.stderr.take();
        let write = async move {
            if let Some(mut s) = stdin.take() {
                // A program that exits without reading stdin is not a failure.
                let _ = s.write_all(&stdin_bytes).await;
            }
        };
        let read = async move {
            let mut buf = Vec::new();
            if let Some(s) = stderr.as_mut() {
                let mut chunk = [0u8; 4096];
                while let Ok(n) = s.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.len() > 4 * STDERR_TAIL {
                        buf.drain(..buf.len() - STDERR_TAIL);
                    }
                }
            }
            buf
        };
        let ((), err, status) = tokio::join!(write, read, child.wait());
        let stderr = tail(&String::from_utf8_lossy(&err), STDERR_TAIL);
        match status {
            Err(e) => Outcome::retry(format!("waiting for {:?} failed: {e}", self.argv[0])),
            Ok(s) if s.success() => Outcome::Success,
            Ok(s) => {
                let what = match s.code() {
                    Some(code) => format!("exit code {code}"),
                    None => "killed by a signal".to_string(),
                };
                let error = if stderr.is_empty() {
                    what
                } else {
                    format!("{what}: {stderr}")
                };
                if s.code() == Some(PERMANENT_EXIT) {
                    Outcome::Permanent { error }
                } else {
                    Outcome::retry(error)
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl Handler for CommandHandler {
    async fn handle(&self, event: &Event) -> Outcome {
        let mut env = vec![
            ("MAILROOM_EVENT_ID", event.id.to_string()),
            ("MAILROOM_TOPIC", event.topic.clone()),
            ("MAILROOM_SOURCE", event.source.clone()),
            ("MAILROOM_DEDUP_KEY", event.dedup_key.clone()),
            ("MAILROOM_ATTEMPT", event.attempts.to_string()),
            ("MAILROOM_RECEIVED_AT", event.received_at.to_string()),
        ];
        for (name, value) in [
            ("MAILROOM_KEY", &event.key),
            ("MAILROOM_TYPE", &event.event_type),
            ("MAILROOM_CORRELATION_ID", &event.correlation_id),
            ("MAILROOM_CAUSATION_ID", &event.causation_id),
            ("MAILROOM_CONTENT_TYPE", &event.content_type),
        ] {
            if let Some(v) = value {
                env.push((name, v.clone()));
            }
        }
        // W3C Trace Context's name for it outside HTTP headers.
        if let Some(t) = super::outgoing_traceparent(event) {
            env.push(("TRACEPARENT", t));
        }
        self.run(event.payload.clone().unwrap_or_default(), env)
            .await
    }

    /// Batch topics: a JSON array of event objects on stdin; the exit code
    /// applies to the whole batch.
    async fn handle_batch(&self, events: &[Event]) -> BatchOutcome {
        let array: Vec<_> = events
            .iter()
            .map(crate::answer::EventObject::summary)
            .collect();
        let env = vec![
            (
                "MAILROOM_TOPIC",
                events.first().map(|e| e.topic.clone()).unwrap_or_default(),
            ),
            ("MAILROOM_BATCH_SIZE", events.len().to_string()),
        ];
        BatchOutcome::All(
            self.run(serde_json::to_vec(&array).unwrap_or_default().into(), env)
                .await,
        )
    }
}
