//! A real `mailroom serve` process (the release binary beside this one),
//! as `crates/mailroom-cli/tests/support` starts it: its own config file,
//! `--listen 127.0.0.1:0`, JSON logs on stderr read for the bound address.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The `mailroom` binary: beside this executable (`target/release`), or
/// `MAILROOM_BIN`.
pub fn mailroom_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("MAILROOM_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    let bin = exe.with_file_name("mailroom");
    if !bin.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p mailroom-cli) or set MAILROOM_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// One running `mailroom serve`. Killed on drop.
pub struct Serve {
    child: tokio::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// WARN and ERROR log lines (the first thousand), with when they arrived.
    pub problems: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Serve {
    /// Starts `mailroom --config <config> serve` on the store at `store_url`
    /// and waits (up to 30 s) for the line naming the bound address.
    pub async fn start(config: &Path, store_url: &str) -> anyhow::Result<Self> {
        let mut child = Command::new(mailroom_bin()?)
            .arg("--config")
            .arg(config)
            .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
            .current_dir(config.parent().context("config dir")?)
            .env_remove("MAILROOM_CONFIG")
            .env_remove("MAILROOM_LISTEN")
            .env("MAILROOM_STORE_URL", store_url)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("spawning mailroom serve")?;
        let mut lines = BufReader::new(child.stderr.take().context("stderr")?).lines();
        let listen = tokio::time::timeout(Duration::from_secs(30), async {
            let mut said = Vec::new();
            while let Some(line) = lines.next_line().await? {
                let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                if let Some(l) = v.get("listen").and_then(|l| l.as_str()) {
                    return Ok(l.to_owned());
                }
                said.push(line);
            }
            bail!("mailroom exited before listening: {}", said.join(" | "))
        })
        .await
        .context("mailroom did not listen within 30 s")??;
        let problems: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let sink = problems.clone();
        // Keep draining stderr so the child never blocks on a full pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("\"WARN\"") || line.contains("\"ERROR\"") {
                    let mut p = sink.lock().unwrap_or_else(|e| e.into_inner());
                    if p.len() < 1000 {
                        p.push((Instant::now(), line));
                    }
                }
            }
        });
        Ok(Self {
            child,
            base: format!("http://{listen}"),
            problems,
        })
    }

    /// The distinct WARN/ERROR messages logged so far, most frequent first.
    pub fn problem_summary(&self) -> Vec<String> {
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        for (_, line) in self
            .problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
            let msg = v.pointer("/fields/message").or_else(|| v.get("message"));
            let error = v.pointer("/fields/error").or_else(|| v.get("error"));
            let key = format!(
                "{} {}",
                msg.and_then(|m| m.as_str()).unwrap_or(line),
                error.and_then(|e| e.as_str()).unwrap_or("")
            );
            *counts.entry(key.chars().take(160).collect()).or_default() += 1;
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        v.into_iter().map(|(m, n)| format!("{n}x {m}")).collect()
    }

    /// When the first WARN/ERROR line containing `text` arrived.
    pub fn first_problem(&self, text: &str) -> Option<Instant> {
        let p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        p.iter().find(|(_, l)| l.contains(text)).map(|(t, _)| *t)
    }

    /// The process id (while it runs).
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("mailroom already exited")
    }

    /// `kill -9`, then reap.
    pub async fn kill9(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends SIGTERM and returns at once.
    pub fn signal_term(&self) -> anyhow::Result<()> {
        let pid = self.child.id().context("already exited")?;
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if !sent.success() {
            bail!("kill -TERM {pid} failed");
        }
        Ok(())
    }

    /// Waits up to `limit` for the exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .with_context(|| format!("mailroom did not exit within {limit:?}"))?
            .context("waiting for mailroom")
    }
}

/// Writes `mailroom.toml` into `dir`.
pub fn write_config(dir: &Path, text: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join("mailroom.toml");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
