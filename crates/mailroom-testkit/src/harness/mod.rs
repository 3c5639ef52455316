//! The process-test harness: what every test of a real `mailroom` process
//! and the fault matrix share.
//!
//! - [`Serve`]: `mailroom serve` as a child process (its port read from the
//!   start-up log line, SIGTERM or `kill -9`, its WARN/ERROR lines), and
//!   [`run`] for the one-shot verbs; [`write_config`] writes its file;
//! - [`Receiver`]: the handler endpoint, recording every call in a
//!   [`Recorder`] and answering as the payload's `"fail"` asks;
//! - [`record`]: acknowledgements and handler calls on one clock;
//! - [`check`]: the checker, which counts lost, duplicate and out-of-order
//!   processing in a record against the store's rows ([`store`] reads them);
//! - [`eventually`]: a condition polled until it holds.

pub mod check;
mod receiver;
pub mod record;
mod serve;
pub mod store;

pub use receiver::Receiver;
pub use record::{Ack, Call, Outcome, Record, Recorder};
pub use serve::{Ran, Serve, run, write_config};

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Why the harness could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The process could not be spawned (or `kill` run).
    #[error("spawning: {0}")]
    Spawn(#[source] std::io::Error),
    /// Waiting for the process failed.
    #[error("waiting for mailroom: {0}")]
    Wait(#[source] std::io::Error),
    /// `mailroom serve` did not come up.
    #[error("mailroom serve did not start: {0}")]
    Start(String),
    /// The process did not stop in time.
    #[error("{0}")]
    Stop(String),
    /// A signal could not be sent.
    #[error("{0}")]
    Signal(String),
    /// A config path without a directory.
    #[error("{0}: not a file in a directory")]
    Config(PathBuf),
    /// The store could not be read.
    #[error("{0}")]
    Store(String),
    /// A file could not be written.
    #[error("writing {0}: {1}")]
    Write(PathBuf, #[source] std::io::Error),
}

/// What an [`eventually`] probe answers: `true` (or `Some(value)`) once
/// the condition holds.
pub trait Settled {
    /// What [`eventually`] returns: `()` for a `bool`, the value of an `Option`.
    type Value;
    /// `Some` once the condition holds.
    fn settled(self) -> Option<Self::Value>;
}

impl Settled for bool {
    type Value = ();
    fn settled(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Settled for Option<T> {
    type Value = T;
    fn settled(self) -> Option<T> {
        self
    }
}

/// Polls `check` every 50 ms until it holds (returns `true`, or `Some`,
/// whose value it returns); panics naming `what` when `limit` passes first.
pub async fn eventually<F, Fut>(
    limit: Duration,
    what: &str,
    mut check: F,
) -> <Fut::Output as Settled>::Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future,
    Fut::Output: Settled,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await.settled() {
            return value;
        }
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every row of `mailroom.events` is `done`, polling every
/// 100 ms; panics with `what` after `limit`. Returns how long it took.
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A cheap pseudo-random number below `n` (test jitter, not cryptography).
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
