//! A real `mailroom` process: `mailroom serve` on `--listen 127.0.0.1:0`
//! with JSON logs on stderr, read for the bound address and kept (its WARN
//! and ERROR lines); and the one-shot verbs run to completion.

use super::HarnessError;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long `mailroom serve` may take to listen.
const START_LIMIT: Duration = Duration::from_secs(30);
/// How long a stop after SIGTERM may take in [`Serve::terminate`].
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// WARN/ERROR lines kept per process.
const KEPT_PROBLEMS: usize = 10_000;
/// How often an exit is polled.
const POLL: Duration = Duration::from_millis(20);

/// One running `mailroom serve`. Killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Serve {
    child: Child,
    /// `http://127.0.0.1:<port>` (the start-up line's `url`: `https://`
    /// with `[tls]`).
    pub base: String,
    /// WARN and ERROR log lines from the start on, with when they arrived.
    problems: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Serve {
    /// Starts `<bin> --config <config> serve` with
    /// `MAILROOM_STORE_URL=store_url`, in the config's directory, and waits
    /// (up to 30 s) for the start-up line naming the bound address.
    pub fn start(bin: &Path, config: &Path, store_url: &str) -> Result<Self, HarnessError> {
        let dir = config
            .parent()
            .ok_or_else(|| HarnessError::Config(config.to_owned()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--config").arg(config).current_dir(dir);
        Self::spawn(cmd, store_url)
    }

    /// The quick start: `<bin> serve` with no config file, run in `dir`
    /// (which must hold no `mailroom.toml`), otherwise as [`Serve::start`].
    pub fn start_quick(bin: &Path, dir: &Path, store_url: &str) -> Result<Self, HarnessError> {
        let mut cmd = Command::new(bin);
        cmd.current_dir(dir);
        Self::spawn(cmd, store_url)
    }

    /// [`Serve::start`] off the async runtime's threads (the wait for the
    /// start-up line blocks).
    pub async fn spawn_async(
        bin: &Path,
        config: &Path,
        store_url: &str,
    ) -> Result<Self, HarnessError> {
        let (bin, config, url) = (bin.to_owned(), config.to_owned(), store_url.to_owned());
        tokio::task::spawn_blocking(move || Self::start(&bin, &config, &url))
            .await
            .map_err(|e| HarnessError::Start(format!("start-up task failed: {e}")))?
    }

    fn spawn(mut cmd: Command, store_url: &str) -> Result<Self, HarnessError> {
        let mut child = cmd
            .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
            .env_remove("MAILROOM_CONFIG")
            .env_remove("MAILROOM_LISTEN")
            .env("MAILROOM_STORE_URL", store_url)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(HarnessError::Spawn)?;
        let Some(stderr) = child.stderr.take() else {
            kill(&mut child);
            return Err(HarnessError::Start("no stderr pipe".into()));
        };
        let problems: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel::<Result<String, String>>();
        let sink = problems.clone();
        // Reads every line for the life of the process, so that it never
        // blocks on a full pipe; the first line naming the address is sent
        // back, as is the end of the output before it.
        std::thread::spawn(move || {
            let mut said = Vec::new();
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("\"WARN\"") || line.contains("\"ERROR\"") {
                    let mut p = sink.lock().unwrap_or_else(|e| e.into_inner());
                    if p.len() < KEPT_PROBLEMS {
                        p.push((Instant::now(), line.clone()));
                    }
                }
                if let Some(sender) = &tx {
                    if let Some(base) = listening(&line) {
                        let _ = sender.send(Ok(base));
                        tx = None;
                    } else if said.len() < 20 {
                        said.push(line);
                    }
                }
            }
            if let Some(sender) = tx {
                let _ = sender.send(Err(said.join(" | ")));
            }
        });
        match rx.recv_timeout(START_LIMIT) {
            Ok(Ok(base)) => Ok(Self {
                child,
                base,
                problems,
            }),
            Ok(Err(said)) => {
                let status = child.wait().map_err(HarnessError::Wait)?;
                Err(HarnessError::Start(format!(
                    "exited ({status}) before listening: {said}"
                )))
            }
            Err(_) => {
                kill(&mut child);
                Err(HarnessError::Start(format!(
                    "did not listen within {START_LIMIT:?}"
                )))
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running (not exited, not killed)?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends the signal `name` (`HUP`, `TERM`...) and returns at once.
    pub fn signal(&self, name: &str) -> Result<(), HarnessError> {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), pid.as_str()])
            .status()
            .map_err(HarnessError::Spawn)?;
        if sent.success() {
            Ok(())
        } else {
            Err(HarnessError::Signal(format!("kill -{name} {pid}: {sent}")))
        }
    }

    /// Sends SIGTERM and returns at once (the graceful stop goes on).
    pub fn signal_term(&self) -> Result<(), HarnessError> {
        self.signal("TERM")
    }

    /// SIGTERM (graceful shutdown), then waits up to 30 s for the exit;
    /// whether it exited with success.
    pub fn terminate(&mut self) -> Result<bool, HarnessError> {
        self.signal_term()?;
        Ok(self.wait_exit(STOP_LIMIT)?.success())
    }

    /// Waits up to `limit` for the exit (after a signal), blocking.
    pub fn wait_exit(&mut self, limit: Duration) -> Result<ExitStatus, HarnessError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().map_err(HarnessError::Wait)? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(self.late(limit));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits up to `limit` for the exit (after a signal), on the async
    /// runtime.
    pub async fn exit_within(&mut self, limit: Duration) -> Result<ExitStatus, HarnessError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().map_err(HarnessError::Wait)? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(self.late(limit));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    fn late(&self, limit: Duration) -> HarnessError {
        HarnessError::Stop(format!(
            "mailroom did not exit within {limit:?}; its warnings: {:?}",
            self.problem_summary()
        ))
    }

    /// `kill -9`, then reap.
    pub fn kill9(&mut self) {
        kill(&mut self.child);
    }

    /// The WARN and ERROR log lines so far (JSON, one per line).
    pub fn problems(&self) -> Vec<String> {
        let p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().map(|(_, l)| l.clone()).collect()
    }

    /// When the first WARN/ERROR line containing `text` arrived.
    pub fn first_problem(&self, text: &str) -> Option<Instant> {
        let p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().find(|(_, l)| l.contains(text)).map(|(t, _)| *t)
    }

    /// The distinct WARN/ERROR messages logged so far, most frequent first
    /// (`"3x WARN <message> <error>"`).
    pub fn problem_summary(&self) -> Vec<String> {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for line in self.problems() {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            let text = |key: &str| {
                v.pointer(&format!("/fields/{key}"))
                    .or_else(|| v.get(key))
                    .and_then(|m| m.as_str())
                    .map(str::to_owned)
            };
            let key = match text("message") {
                Some(msg) => format!(
                    "{} {msg} {}",
                    text("level").unwrap_or_default(),
                    text("error").unwrap_or_default()
                ),
                None => line,
            };
            *counts.entry(key.chars().take(200).collect()).or_default() += 1;
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        v.into_iter().map(|(m, n)| format!("{n}x {m}")).collect()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The base URL a start-up log line names, if it is that line.
fn listening(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let listen = v.get("listen")?.as_str()?;
    Some(
        v.get("url")
            .and_then(|u| u.as_str())
            .map_or_else(|| format!("http://{listen}"), str::to_owned),
    )
}

/// What a one-shot `mailroom` command did.
#[derive(Debug, Clone)]
pub struct Ran {
    /// Exited with success.
    pub success: bool,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

/// Runs `<bin> --config <config> <args...>` to completion (at most
/// `limit`, then it is killed and this fails), with
/// `MAILROOM_STORE_URL=store_url`, in the config's directory.
pub fn run(
    bin: &Path,
    config: &Path,
    store_url: &str,
    args: &[&str],
    limit: Duration,
) -> Result<Ran, HarnessError> {
    let dir = config
        .parent()
        .ok_or_else(|| HarnessError::Config(config.to_owned()))?;
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(args)
        .current_dir(dir)
        .env_remove("MAILROOM_CONFIG")
        .env_remove("MAILROOM_LISTEN")
        .env("MAILROOM_STORE_URL", store_url)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(HarnessError::Spawn)?;
    // Read both pipes while waiting, so a chatty child never blocks on one.
    let read_all = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let stdout = read_all(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let stderr = read_all(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(HarnessError::Wait)? {
            break status;
        }
        if Instant::now() > deadline {
            kill(&mut child);
            return Err(HarnessError::Stop(format!(
                "mailroom {args:?} did not exit within {limit:?}"
            )));
        }
        std::thread::sleep(POLL);
    };
    Ok(Ran {
        success: status.success(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Writes `mailroom.toml` into `dir` and returns its path.
pub fn write_config(dir: &Path, text: &str) -> Result<PathBuf, HarnessError> {
    let path = dir.join("mailroom.toml");
    std::fs::write(&path, text).map_err(|e| HarnessError::Write(path.clone(), e))?;
    Ok(path)
}
