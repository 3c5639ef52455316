//! The attacks, one file each, and what they share: a fresh store, a
//! config directory, the recorder and the recording handler endpoint.

mod cluster;
mod diskfull;
mod hostile;
mod kill9;
mod lease;
mod panic;
mod pgfreeze;
mod pgrestart;
mod poison;
mod rabbitmq;
mod sigterm;
mod storm;

use super::check::{self, Expect, Verdict};
use super::child::{Serve, write_config};
use super::load::{Load, Running};
use super::record::{Record, Recorder};
use super::{Report, store};
use crate::backend::{Backend, Fresh};
use futures::future::BoxFuture;
use mailroom_testkit::harness::Receiver;
use std::path::PathBuf;
use std::time::Duration;

/// One scenario of the matrix.
pub struct Scenario {
    pub name: &'static str,
    /// Whether it runs on this store.
    pub applies: fn(&Backend) -> bool,
    /// Runs it (`quick` for CI) and returns its row.
    pub run: fn(bool, Backend) -> BoxFuture<'static, anyhow::Result<Report>>,
}

fn any_store(_: &Backend) -> bool {
    true
}

/// The matrix, in the order it runs.
pub const ALL: &[Scenario] = &[
    Scenario {
        name: "kill9",
        applies: any_store,
        run: |quick, b| Box::pin(kill9::run(quick, b)),
    },
    Scenario {
        name: "cluster",
        applies: cluster::applies,
        run: |quick, b| Box::pin(cluster::run(quick, b)),
    },
    Scenario {
        name: "pgrestart",
        applies: pgrestart::applies,
        run: |quick, b| Box::pin(pgrestart::run(quick, b)),
    },
    Scenario {
        name: "pghold",
        applies: pgfreeze::applies,
        run: |quick, b| Box::pin(pgfreeze::run_hold(quick, b)),
    },
    Scenario {
        name: "pgdrop",
        applies: pgfreeze::applies,
        run: |quick, b| Box::pin(pgfreeze::run_drop(quick, b)),
    },
    Scenario {
        name: "diskfull",
        applies: diskfull::applies,
        run: |quick, b| Box::pin(diskfull::run(quick, b)),
    },
    Scenario {
        name: "rabbitmq",
        applies: any_store,
        run: |quick, b| Box::pin(rabbitmq::run(quick, b)),
    },
    Scenario {
        name: "amqpfreeze",
        applies: rabbitmq::freeze_applies,
        run: |quick, b| Box::pin(rabbitmq::run_freeze(quick, b)),
    },
    Scenario {
        name: "dlq",
        applies: any_store,
        run: |quick, b| Box::pin(rabbitmq::dlq::run(quick, b)),
    },
    Scenario {
        name: "lease",
        applies: any_store,
        run: |quick, b| Box::pin(lease::run(quick, b)),
    },
    Scenario {
        name: "poison",
        applies: any_store,
        run: |quick, b| Box::pin(poison::run(quick, b)),
    },
    Scenario {
        name: "panic",
        applies: any_store,
        run: |quick, b| Box::pin(panic::run(quick, b)),
    },
    Scenario {
        name: "storm",
        applies: any_store,
        run: |quick, b| Box::pin(storm::run(quick, b)),
    },
    Scenario {
        name: "hostile",
        applies: hostile::applies,
        run: |quick, b| Box::pin(hostile::run(quick, b)),
    },
    Scenario {
        name: "sigterm",
        applies: any_store,
        run: |quick, b| Box::pin(sigterm::run(quick, b)),
    },
];

/// A scenario's world: a fresh store, a directory for the config, the
/// recorder and the handler endpoint.
pub struct World {
    pub fresh: Fresh,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub rec: Recorder,
}

impl World {
    /// `config(receiver_url)` is the `mailroom.toml` text.
    pub async fn new(
        backend: &Backend,
        handler_delay: Duration,
        config: impl Fn(&str) -> String,
    ) -> anyhow::Result<Self> {
        let fresh = backend.fresh().await?;
        let dir = tempfile::tempdir()?;
        let rec = Recorder::new();
        let receiver = Receiver::start(rec.clone(), handler_delay).await?;
        let config = write_config(dir.path(), &config(&receiver.url))?;
        Ok(Self {
            fresh,
            dir,
            config,
            rec,
        })
    }

    pub async fn serve(&self) -> anyhow::Result<Serve> {
        super::child::serve(&self.config, &self.fresh.url).await
    }

    /// `kill -9` of `serve`, recorded as a disruption from just before the
    /// signal until the process is reaped: until then it may still call
    /// handlers whose success it will never commit. Returns when it began.
    pub async fn kill9(&self, serve: &mut Serve) -> Duration {
        let from = self.rec.now();
        serve.kill9();
        self.rec.disrupted_between(from, self.rec.now());
        from
    }

    /// Reads the store and checks the record against it.
    pub async fn check(&self, expect: &Expect) -> anyhow::Result<(Record, Verdict)> {
        let rows = store::rows(&self.fresh.url).await?;
        let record = self.rec.snapshot();
        let verdict = check::check(&record, &rows, expect);
        Ok((record, verdict))
    }

    /// Drops the PostgreSQL database (the SQLite file goes with the tempdir).
    pub async fn cleanup(self) -> anyhow::Result<()> {
        self.fresh.cleanup().await
    }
}

/// The lease of [`two_topics`]' topics, in seconds.
pub const LEASE_SECS: u64 = 6;

/// Two sources over HTTP handlers: `seq` into a sequential topic keyed by
/// `/k`, `single` into a single topic; fast retries, short leases. The
/// lease outlasts the 2 s timeout by 4 s (it was 1 s) so that completions
/// delayed on a loaded machine (load 18 on 2 cores, a storm of 512
/// deliveries in flight) do not let it expire: a rerun then is the
/// documented at-least-once path (`seq_expect` counts it in `reruns`),
/// not the attack under test.
pub fn two_topics(receiver: &str) -> String {
    format!(
        r#"
[[source]]
name = "seq"
topic = "seq"
id = {{ json = "/id" }}

[[source]]
name = "single"
topic = "single"
id = {{ json = "/id" }}

[[topic]]
name = "seq"
mode = "sequential"
key = "/k"
concurrency = 16
timeout = "2s"
lease = "{LEASE_SECS}s"
retry = {{ max_attempts = 50, base = "100ms", max_delay = "1s" }}
handler = {{ http = {{ url = "{receiver}" }} }}

[[topic]]
name = "single"
concurrency = 16
timeout = "2s"
lease = "{LEASE_SECS}s"
retry = {{ max_attempts = 50, base = "100ms", max_delay = "1s" }}
handler = {{ http = {{ url = "{receiver}" }} }}
"#
    )
}

/// The loads of `two_topics`: 8 senders over 4 keys each into `seq`, 8
/// into `single`, unbounded, without pause.
pub fn two_loads() -> [Load; 2] {
    let seq = Load {
        source: "seq",
        clients: 8,
        keys_per_client: 4,
        per_client: None,
        poison: None,
        pad: 200,
        pause: Duration::ZERO,
    };
    let single = Load {
        source: "single",
        clients: 8,
        keys_per_client: 1,
        ..seq.clone()
    };
    [seq, single]
}

/// Stops the loads, waits (up to 60 s) until no event is open, and notes
/// the drain in `notes`; a failure when it does not drain.
pub async fn stop_and_drain(
    loads: Vec<Running>,
    url: &str,
    notes: &mut Vec<String>,
) -> anyhow::Result<Option<String>> {
    for l in loads {
        l.stop().await;
    }
    let drained = store::settle(url, store::all_final, Duration::from_secs(60)).await?;
    Ok(match drained {
        Some(d) => {
            notes.push(format!("drained in {:.1}s after the load", d.as_secs_f64()));
            None
        }
        None => Some("events still pending/running 60 s after the load".into()),
    })
}

/// A spawned task aborted when dropped, so that a scenario dropped at its
/// deadline leaves nothing running, and joined within a time limit.
pub struct Task<T>(tokio::task::JoinHandle<T>);

impl<T: Send + 'static> Task<T> {
    pub fn spawn(f: impl Future<Output = T> + Send + 'static) -> Self {
        Self(tokio::spawn(f))
    }

    /// Its result, or an error naming `what` when it runs past `limit`
    /// (then it is aborted).
    pub async fn join(mut self, limit: Duration, what: &str) -> anyhow::Result<T> {
        match tokio::time::timeout(limit, &mut self.0).await {
            Ok(r) => Ok(r?),
            Err(_) => anyhow::bail!("{what} did not end within {} s", limit.as_secs()),
        }
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits for every task of `set`, or fails naming `what` after `limit`
/// (the rest are aborted with the set).
pub async fn join_all<T: 'static>(
    mut set: tokio::task::JoinSet<T>,
    limit: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let all = async { while set.join_next().await.is_some() {} };
    tokio::time::timeout(limit, all)
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not end within {} s", limit.as_secs()))
}

/// The sequential topics of `two_topics`.
pub fn seq_expect() -> Expect {
    Expect {
        sequential: ["seq".to_string()].into(),
        lease: Some(Duration::from_secs(LEASE_SECS)),
        ..Expect::default()
    }
}

/// The longest wait, over `faults`, from a fault to the next ack after it.
pub fn recovery(record: &Record, faults: &[Duration]) -> Option<Duration> {
    faults
        .iter()
        .filter_map(|f| {
            let next = record.acks.iter().map(|a| a.at).filter(|at| at > f).min()?;
            Some(next - *f)
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::{Task, join_all};
    use std::sync::Arc;
    use std::time::Duration;

    /// A task that never ends, holding `held` until it is dropped.
    async fn forever(held: Arc<()>) {
        let _held = held;
        std::future::pending::<()>().await;
    }

    /// Lets the runtime drop what an abort released.
    async fn settle(held: &Arc<()>) -> usize {
        for _ in 0..100 {
            if Arc::strong_count(held) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Arc::strong_count(held)
    }

    #[tokio::test]
    async fn a_task_past_its_limit_is_an_error_and_is_aborted() {
        let held = Arc::new(());
        let task = Task::spawn(forever(held.clone()));
        let e = task
            .join(Duration::from_millis(50), "the publisher")
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "the publisher did not end within 0 s");
        assert_eq!(settle(&held).await, 1, "the task still runs");
    }

    #[tokio::test]
    async fn a_dropped_task_is_aborted_and_a_finished_one_joins() {
        let held = Arc::new(());
        drop(Task::spawn(forever(held.clone())));
        assert_eq!(settle(&held).await, 1, "the task still runs");
        let done = Task::spawn(async { 7 });
        assert_eq!(done.join(Duration::from_secs(5), "x").await.unwrap(), 7);
    }

    #[tokio::test]
    async fn join_all_fails_on_a_task_that_never_ends() {
        let held = Arc::new(());
        let mut set = tokio::task::JoinSet::new();
        set.spawn(async {});
        set.spawn(forever(held.clone()));
        let e = join_all(set, Duration::from_millis(50), "the storm's deliveries")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("did not end within"), "{e}");
        assert_eq!(settle(&held).await, 1, "the task still runs");
    }
}
