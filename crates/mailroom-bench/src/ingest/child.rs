//! The child mailroom processes (`__serve`) that the HTTP load is sent to.

use super::Settings;
use anyhow::{Context, bail};
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// One child `__serve` process.
pub(super) struct Child {
    child: tokio::process::Child,
    pub(super) pid: String,
    pub(super) addr: SocketAddr,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

pub(super) async fn spawn_child(
    s: &Settings,
    group_commit: bool,
    url: &str,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("__serve")
        .args(["--store", url])
        .args(["--listen", "127.0.0.1:0"])
        .args([
            "--group-commit",
            if group_commit { "true" } else { "false" },
        ]);
    if s.no_metrics {
        cmd.arg("--no-metrics");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the mailroom child process")?;
    let pid = child.id().context("child pid")?.to_string();
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .context("the child did not start listening within 60 s")??
        .context("the child exited before listening")?;
    let addr: SocketAddr = first
        .strip_prefix("LISTENING ")
        .with_context(|| format!("unexpected child output {first:?}"))?
        .parse()?;
    Ok(Child {
        child,
        pid,
        addr,
        lines,
    })
}

impl Child {
    /// Stops mailroom gracefully (closes its stdin) and returns its commit count.
    pub(super) async fn stop(mut self) -> anyhow::Result<u64> {
        drop(self.child.stdin.take());
        let mut commits = 0;
        while let Some(line) = self.lines.next_line().await? {
            if let Some(n) = line.strip_prefix("COMMITS ") {
                commits = n.trim().parse()?;
            }
        }
        let status = self.child.wait().await?;
        if !status.success() {
            bail!("the mailroom child exited with {status}");
        }
        Ok(commits)
    }
}
