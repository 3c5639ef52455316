//! Group commit for inserts.
//!
//! Callers send their [`NewEvent`] through a bounded queue (full →
//! [`StoreError::Overloaded`] at once, so intake sheds load). One task
//! takes the first waiting insert, drains up to `max_batch − 1` more without
//! waiting, and writes them all with one multi-row
//! `INSERT ... SELECT FROM UNNEST(...) ON CONFLICT (source, dedup_key) DO
//! NOTHING RETURNING id` in one transaction: one commit — one WAL flush
//! with `synchronous_commit = on` — for the whole group. Only after the
//! commit is every caller answered (nothing is acknowledged before it is
//! durable); if it fails, each gets
//! [`StoreError::Unavailable`]. The statement, and how it tells duplicates
//! apart, is [`sql::insert_batch`](crate::sql::insert_batch).

use crate::db::Db;
use crate::sql;
use crate::timeouts::{DATA_LIMIT, bounded};
use mailroom_core::{Inserted, NewEvent, Result, StoreError};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::{mpsc, oneshot};

struct Job {
    event: NewEvent,
    reply: oneshot::Sender<Result<Inserted>>,
}

/// Handle to the insert task. The task ends when every handle is dropped
/// (after finishing the queued inserts).
pub(crate) struct Writer {
    queue: mpsc::Sender<Job>,
    commits: Arc<AtomicU64>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("commits", &self.commits())
            .finish_non_exhaustive()
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("postgres insert task has stopped".into())
}

impl Writer {
    /// Starts the task. `group` is the most inserts per transaction (1
    /// without group commit).
    pub(crate) fn start(pool: Db, group: usize, capacity: usize) -> Self {
        let (queue, rx) = mpsc::channel(capacity);
        let commits = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(pool, rx, group.max(1), Arc::clone(&commits)));
        Self { queue, commits }
    }

    /// Insert transactions committed so far.
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Queues `event` and waits for its committed answer.
    pub(crate) async fn insert(&self, event: NewEvent) -> Result<Inserted> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .try_send(Job { event, reply })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => StoreError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => stopped(),
            })?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Waits for the next job, then takes the ones already queued behind it, up
/// to `group` in all, into `batch`: what one transaction will carry.
/// `false` once every sender is gone and the queue is drained.
pub(crate) async fn next_group<T>(
    rx: &mut mpsc::Receiver<T>,
    batch: &mut Vec<T>,
    group: usize,
) -> bool {
    let Some(first) = rx.recv().await else {
        return false;
    };
    batch.push(first);
    take_queued(rx, batch, group);
    true
}

/// Moves what is queued in `rx` into `batch`, up to `group` in all.
pub(crate) fn take_queued<T>(rx: &mut mpsc::Receiver<T>, batch: &mut Vec<T>, group: usize) {
    while batch.len() < group {
        match rx.try_recv() {
            Ok(job) => batch.push(job),
            Err(_) => break,
        }
    }
}

/// After the database proved unreachable, inserts fail at once for this long
/// instead of each waiting out the pool's acquire timeout in turn (senders get
/// a prompt 503 and retry); then the next group probes it again.
const FAIL_FAST: std::time::Duration = std::time::Duration::from_secs(1);

/// One group's transaction, within [`DATA_LIMIT`]. Past it the outcome is
/// unknown (the commit may have reached the server): the callers are told
/// the store is unavailable, so their events are not acknowledged, and
/// their senders' retries are deduplicated against whatever did commit.
async fn insert_batch(pool: &Db, events: &[&NewEvent]) -> Result<Vec<Inserted>> {
    bounded(
        DATA_LIMIT,
        "committing inserts",
        sql::insert_batch(pool, events),
    )
    .await
}

async fn run(pool: Db, mut rx: mpsc::Receiver<Job>, group: usize, commits: Arc<AtomicU64>) {
    let mut batch: Vec<Job> = Vec::with_capacity(group);
    let mut down_since: Option<std::time::Instant> = None;
    while next_group(&mut rx, &mut batch, group).await {
        if down_since.is_some_and(|t| t.elapsed() < FAIL_FAST) {
            for job in batch.drain(..) {
                let _ = job.reply.send(Err(StoreError::Unavailable(
                    "the database is unreachable; retrying it within a second".into(),
                )));
            }
            continue;
        }
        let events: Vec<&NewEvent> = batch.iter().map(|j| &j.event).collect();
        match insert_batch(&pool, &events).await {
            Ok(answers) => {
                down_since = None;
                commits.fetch_add(1, Ordering::Relaxed);
                for (job, answer) in batch.drain(..).zip(answers) {
                    // The caller may have gone away; nothing to do then.
                    let _ = job.reply.send(Ok(answer));
                }
            }
            Err(StoreError::Invalid(why)) if batch.len() > 1 => {
                // One bad event must not fail its neighbours: write them one by one.
                tracing::debug!(error = %why, jobs = batch.len(), "insert group refused; retrying one by one");
                insert_one_by_one(&pool, &mut batch, &commits).await;
            }
            Err(e) => {
                if fail_group(&mut batch, &mut rx, &e) {
                    down_since = Some(std::time::Instant::now());
                }
            }
        }
    }
    tracing::debug!("postgres insert task stopped: every handle was dropped");
}

/// Inserts each job of a refused group in its own transaction.
async fn insert_one_by_one(pool: &Db, batch: &mut Vec<Job>, commits: &AtomicU64) {
    for job in batch.drain(..) {
        let result = insert_batch(pool, &[&job.event]).await;
        if result.is_ok() {
            commits.fetch_add(1, Ordering::Relaxed);
        }
        let _ = job
            .reply
            .send(result.and_then(|mut a| a.pop().ok_or_else(stopped)));
    }
}

/// Answers every job of a failed group with `e`. When the database is
/// unreachable, whatever queued up meanwhile would fail the same way and
/// is answered too; returns whether that was the case.
fn fail_group(batch: &mut Vec<Job>, rx: &mut mpsc::Receiver<Job>, e: &StoreError) -> bool {
    // Usually nothing was committed; if the connection broke during COMMIT
    // it may have been, which dedup makes harmless when the sender retries.
    tracing::warn!(error = %e, jobs = batch.len(), "insert group failed");
    for job in batch.drain(..) {
        let _ = job.reply.send(Err(clone_error(e)));
    }
    let unreachable = matches!(e, StoreError::Unavailable(_));
    if unreachable {
        while let Ok(job) = rx.try_recv() {
            let _ = job.reply.send(Err(clone_error(e)));
        }
    }
    unreachable
}

fn clone_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Invalid(s) => StoreError::Invalid(s.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}
