//! [`PrivateRabbit`]: a RabbitMQ node that one test owns outright, so it may
//! stop and start it without disturbing the shared node of
//! `./scripts/test.sh` that other tests use.
//!
//! It drives `scripts/rabbit-node.sh` (the same functions as the test
//! services, `scripts/lib/services.sh`): a node on free loopback ports with
//! its own epmd and its state in a directory of its own, run as the
//! `rabbitmq` user when we are root. A start takes a few seconds.
//!
//! The methods block (they wait for the node): from async code call them
//! through `tokio::task::spawn_blocking`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A RabbitMQ node of its own, stopped and deleted on drop.
#[derive(Debug)]
pub struct PrivateRabbit {
    dir: PathBuf,
    url: String,
}

/// `scripts/rabbit-node.sh` of this repository.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/rabbit-node.sh")
}

/// Runs `rabbit-node.sh <verb> <dir>` and returns its stdout.
fn node(verb: &str, dir: &Path) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(script())
        .arg(verb)
        .arg(dir)
        // The node must not inherit the harness's pipes (it would wait for
        // them): the script sends the node's output to files in `dir`.
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", script().display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "rabbit-node.sh {verb} {}: {}\n{}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

impl PrivateRabbit {
    /// Starts a new node; its URL is `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    ///
    /// # Panics
    /// If rabbitmq-server is missing or the node does not start (the
    /// message carries the script's log).
    pub fn start() -> Self {
        // The `rabbitmq` user must be able to reach the directory: not
        // $TMPDIR (which may be under /root) when we are root.
        let base = if crate::private_pg::is_root() {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "mailroom-private-rabbit-{}",
            uuid::Uuid::now_v7().simple()
        ));
        let url = match node("start", &dir) {
            Ok(url) => url,
            Err(e) => {
                let _ = node("down", &dir);
                panic!("private RabbitMQ did not start: {e}");
            }
        };
        Self { dir, url }
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`; the same after a restart.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stops the node cleanly (SIGTERM: clients get `connection.close`,
    /// durable queues and persistent messages are kept) and waits until it
    /// is gone.
    ///
    /// # Panics
    /// If the script fails.
    pub fn stop(&self) {
        node("stop", &self.dir).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts the stopped node again, on the same port with the same data,
    /// and waits until it answers the AMQP handshake.
    ///
    /// # Panics
    /// If it does not start.
    pub fn start_again(&self) {
        let url = node("start", &self.dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(url, self.url, "the node came back on another port");
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        // Best effort: the node may already be stopped.
        let _ = node("down", &self.dir);
    }
}
