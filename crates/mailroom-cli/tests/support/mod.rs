//! Shared by the multi-process tests (`cluster.rs`, `pg_outage.rs`): a real
//! `mailroom serve` child process, and an HTTP receiver that records every
//! delivery the handler makes.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One `mailroom serve` process. Killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Serve {
    child: Child,
    /// `http://127.0.0.1:<port>` (`https://` with `[tls]`).
    pub base: String,
    /// WARN and ERROR log lines (from the start on), for the report and
    /// for diagnosis.
    pub problems: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    /// Starts `mailroom serve --config <config> --listen 127.0.0.1:0
    /// --log-format json` with `MAILROOM_STORE_URL=store_url`, and waits
    /// for the start-up log line that names the bound address.
    pub fn start(config: &Path, store_url: &str) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailroom"));
        cmd.arg("--config")
            .arg(config)
            .current_dir(config.parent().expect("config dir"));
        Self::spawn(cmd, store_url)
    }

    /// The quick start: `mailroom serve` with no config file, run in `dir`
    /// (which must hold no `mailroom.toml`), otherwise as [`Serve::start`].
    pub fn start_quick(dir: &Path, store_url: &str) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mailroom"));
        cmd.current_dir(dir);
        Self::spawn(cmd, store_url)
    }

    fn spawn(mut cmd: Command, store_url: &str) -> Self {
        let mut child = cmd
            .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
            .env_remove("MAILROOM_CONFIG")
            .env_remove("MAILROOM_LISTEN")
            .env("MAILROOM_STORE_URL", store_url)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mailroom serve");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        let problems: Arc<Mutex<Vec<String>>> = Arc::default();
        loop {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mailroom did not start in time");
            }
            let Some(Ok(line)) = lines.next() else {
                let status = child.wait();
                panic!("mailroom exited before listening: {status:?}");
            };
            if line.contains("\"WARN\"") || line.contains("\"ERROR\"") {
                problems.lock().expect("lock").push(line.clone());
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if let Some(listen) = v.get("listen").and_then(|l| l.as_str()) {
                let base = v
                    .get("url")
                    .and_then(|u| u.as_str())
                    .map_or_else(|| format!("http://{listen}"), str::to_owned);
                let sink = problems.clone();
                // Keep draining stderr so the child never blocks on a full pipe.
                std::thread::spawn(move || {
                    for line in lines.map_while(Result::ok) {
                        if line.contains("\"WARN\"") || line.contains("\"ERROR\"") {
                            let mut p = sink.lock().expect("lock");
                            if p.len() < 10_000 {
                                p.push(line);
                            }
                        }
                    }
                });
                return Self {
                    child,
                    base,
                    problems,
                };
            }
        }
    }

    /// Still running (not exited, not killed)?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGTERM and returns at once (the graceful stop goes on).
    pub fn signal_term(&self) {
        self.signal("TERM");
    }

    /// Sends the signal `name` (`HUP`, `TERM`...) and returns at once.
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), pid.as_str()])
            .status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -{name} {pid}");
    }

    /// SIGTERM (graceful shutdown), then waits up to 30 s for the exit;
    /// whether it exited with success.
    pub fn terminate(&mut self) -> bool {
        self.signal_term();
        self.wait_exit()
    }

    /// Waits up to 30 s for the exit (after a signal); whether it exited
    /// with success.
    pub fn wait_exit(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                _ => panic!(
                    "mailroom did not stop within 30 s of SIGTERM; its warnings: {:?}",
                    self.problem_summary()
                ),
            }
        }
    }

    /// `kill -9`, then reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// WARN/ERROR messages, counted by their `message` field.
    pub fn problem_summary(&self) -> Vec<(String, usize)> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for line in self.problems.lock().expect("lock").iter() {
            let msg = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| {
                    let level = v.get("level")?.as_str()?.to_owned();
                    let msg = v.get("message")?.as_str()?.to_owned();
                    Some(format!("{level} {msg}"))
                })
                .unwrap_or_else(|| line.chars().take(200).collect());
            *counts.entry(msg).or_default() += 1;
        }
        let mut v: Vec<_> = counts.into_iter().collect();
        v.sort_by_key(|b| std::cmp::Reverse(b.1));
        v
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs `mailroom --config <config> <args...>` to completion (at most
/// `limit`), with `MAILROOM_STORE_URL=store_url`; (success, stdout, stderr).
pub fn run_mailroom(
    config: &Path,
    store_url: &str,
    args: &[&str],
    limit: Duration,
) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .arg("--config")
        .arg(config)
        .args(args)
        .current_dir(config.parent().expect("config dir"))
        .env_remove("MAILROOM_CONFIG")
        .env_remove("MAILROOM_LISTEN")
        .env("MAILROOM_STORE_URL", store_url)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mailroom");
    // Read both pipes while waiting, so a chatty child never blocks on one.
    let read_all = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read_all(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mailroom {args:?} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        stdout.join().expect("stdout reader"),
        stderr.join().expect("stderr reader"),
    )
}

/// Writes `mailroom.toml` into `dir` and returns its path. A configuration
/// the loader accepts must also validate against the file's JSON Schema
/// (`mailroom config schema`), so every test's configuration checks it.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    schema_accepts_what_loads(text);
    let path = dir.join("mailroom.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Panics when the loader accepts `text` (every `${VAR}` set) and the
/// schema refuses it. Files the loader refuses (the error-path tests) are
/// left to the loader's own messages.
fn schema_accepts_what_loads(text: &str) {
    let any = |_: &str| Some("x".to_owned());
    if mailroom_config::Config::from_toml("mailroom.toml", text, &any).is_err() {
        return;
    }
    let schema = mailroom_config::schema::schema();
    let validator = jsonschema::draft202012::new(&schema).expect("the schema compiles");
    let table: toml::Table = toml::from_str(text).expect("TOML the loader read");
    let instance = serde_json::to_value(table).expect("JSON");
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "the configuration schema refuses a file the loader accepts: {errors:#?}\n{text}"
    );
}

/// One delivery as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// `webhook-id`: the event id.
    pub event_id: String,
    /// `mailroom-dedup-key`.
    pub dedup_key: String,
    /// `mailroom-key`.
    pub key: String,
    /// The payload's `/n` (per-key counter), if any.
    pub n: Option<u64>,
    /// Since the receiver started.
    pub start: Duration,
    /// When the answer was produced, or when the request was dropped
    /// (the sending instance was killed and the connection closed).
    pub end: Duration,
    /// The handler answered (200); false when it was cut short.
    pub completed: bool,
}

/// An HTTP endpoint on 127.0.0.1:0 that answers every POST 200 after a
/// short sleep (0–`max_sleep_us` µs, so overlaps would show) and records it.
#[derive(Debug, Clone)]
pub struct Receiver {
    /// `http://127.0.0.1:<port>/deliver`.
    pub url: String,
    log: Arc<Mutex<Vec<Delivery>>>,
}

struct Recording {
    log: Arc<Mutex<Vec<Delivery>>>,
    epoch: Instant,
    d: Option<Delivery>,
}

impl Drop for Recording {
    fn drop(&mut self) {
        if let Some(mut d) = self.d.take() {
            d.end = self.epoch.elapsed();
            self.log.lock().expect("lock").push(d);
        }
    }
}

impl Receiver {
    /// Binds and serves in the background (for the life of the runtime).
    pub async fn start(max_sleep_us: u64) -> Self {
        let log: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let epoch = Instant::now();
        let state = (log.clone(), epoch);
        let app = axum::Router::new().route(
            "/deliver",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (log, epoch) = state.clone();
                    async move {
                        let h = |name: &str| {
                            headers
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned()
                        };
                        let n = serde_json::from_slice::<serde_json::Value>(&body)
                            .ok()
                            .and_then(|v| v.get("n").and_then(serde_json::Value::as_u64));
                        let mut rec = Recording {
                            log,
                            epoch,
                            d: Some(Delivery {
                                event_id: h("webhook-id"),
                                dedup_key: h("mailroom-dedup-key"),
                                key: h("mailroom-key"),
                                n,
                                start: epoch.elapsed(),
                                end: Duration::ZERO,
                                completed: false,
                            }),
                        };
                        if max_sleep_us > 0 {
                            let us = rand_below(max_sleep_us + 1);
                            tokio::time::sleep(Duration::from_micros(us)).await;
                        }
                        // Completed: recorded now, before the answer leaves.
                        if let Some(d) = rec.d.as_mut() {
                            d.completed = true;
                        }
                        drop(rec);
                        "ok"
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind receiver");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("receiver");
        });
        Self {
            url: format!("http://{addr}/deliver"),
            log,
        }
    }

    /// Everything recorded so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.log.lock().expect("lock").clone()
    }
}

/// A cheap pseudo-random number below `n` (test jitter, not cryptography).
/// Waits until every row of `mailroom.events` is `done`, polling every
/// 200 ms; fails with `what` after `limit`. Returns how long it took.
pub async fn wait_all_done(pool: &sqlx::PgPool, limit: Duration, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        let open: i64 =
            sqlx::query_scalar("SELECT count(*) FROM mailroom.events WHERE status <> 'done'")
                .fetch_one(pool)
                .await
                .expect("count");
        if open == 0 {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{open} events {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn rand_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish() % n.max(1)
}
