//! Group commit for inserts.
//!
//! Callers send their [`NewEvent`] through a bounded queue (full →
//! [`StoreError::Overloaded`] at once, so intake sheds load). One task
//! takes the first waiting insert, drains up to `max_batch − 1` more without
//! waiting, and writes them all with one multi-row
//! `INSERT ... SELECT FROM UNNEST(...) ON CONFLICT (source, dedup_key) DO
//! NOTHING RETURNING id` in one transaction: one commit — one WAL flush
//! with `synchronous_commit = on` — for the whole group. Only after the
//! commit is every caller answered (SPEC §2.1); if it fails, each gets
//! [`StoreError::Unavailable`].
//!
//! Duplicates: rows that did not come back from `RETURNING` were already
//! stored (by an earlier transaction, or by an earlier row of this very
//! batch: rows are inserted in queue order, so of two inserts of one key in
//! one batch the first wins and the second is its duplicate). Their stored
//! ids are read in the same transaction. `ON CONFLICT` waits for a
//! concurrent transaction inserting the same key to end, so the stored row
//! is committed and visible to that next statement.

use crate::sql::{db, parse_id};
use mailroom_core::{Inserted, NewEvent, Result, StoreError};
use sqlx::PgPool;
use std::collections::{BTreeSet, HashMap};
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
    pub(crate) fn start(pool: PgPool, group: usize, capacity: usize) -> Self {
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

/// After the database proved unreachable, inserts fail at once for this long
/// instead of each waiting out the pool's acquire timeout in turn (senders get
/// a prompt 503 and retry); then the next group probes it again.
const FAIL_FAST: std::time::Duration = std::time::Duration::from_secs(1);

async fn run(pool: PgPool, mut rx: mpsc::Receiver<Job>, group: usize, commits: Arc<AtomicU64>) {
    let mut batch: Vec<Job> = Vec::with_capacity(group);
    let mut down_since: Option<std::time::Instant> = None;
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < group {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
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
                for job in batch.drain(..) {
                    let result = insert_batch(&pool, &[&job.event]).await;
                    if result.is_ok() {
                        commits.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = job
                        .reply
                        .send(result.and_then(|mut a| a.pop().ok_or_else(stopped)));
                }
            }
            Err(e) => {
                // Usually nothing was committed; if the connection broke
                // during COMMIT it may have been, which dedup makes harmless
                // when the sender retries.
                tracing::warn!(error = %e, jobs = batch.len(), "insert group failed");
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(clone_error(&e)));
                }
                if matches!(e, StoreError::Unavailable(_)) {
                    down_since = Some(std::time::Instant::now());
                    // Whatever queued up meanwhile would fail the same way.
                    while let Ok(job) = rx.try_recv() {
                        let _ = job.reply.send(Err(clone_error(&e)));
                    }
                }
            }
        }
    }
    tracing::debug!("postgres insert task stopped: every handle was dropped");
}

fn clone_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Invalid(s) => StoreError::Invalid(s.clone()),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// Rows in queue order (`ord`), so the first of two same-key inserts wins.
const INSERT: &str = "
    INSERT INTO mailroom.events (id, source, topic, dedup_key, key, type, status, attempts,
        max_attempts, next_attempt_at, received_at, correlation_id, causation_id,
        content_type, payload)
    SELECT t.id::uuid, t.source, t.topic, t.dedup_key, t.key, t.type, 'pending', 0,
        t.max_attempts, now(), now(), t.correlation_id, t.causation_id, t.content_type, t.payload
    FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::text[], $9::text[], $10::bytea[], $11::int8[])
         WITH ORDINALITY AS t(id, source, topic, dedup_key, key, type, correlation_id,
                              causation_id, content_type, payload, max_attempts, ord)
    ORDER BY t.ord
    ON CONFLICT (source, dedup_key) DO NOTHING
    RETURNING id::text, topic";

/// Inserts `events` in one transaction; answers in the same order.
async fn insert_batch(pool: &PgPool, events: &[&NewEvent]) -> Result<Vec<Inserted>> {
    const CTX: &str = "inserting events";
    for e in events {
        check_text(e)?;
    }
    let text = |f: fn(&NewEvent) -> Option<&str>| -> Vec<Option<String>> {
        events.iter().map(|e| f(e).map(str::to_owned)).collect()
    };
    let ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    let rows: Vec<(String, String)> = sqlx::query_as(INSERT)
        .bind(&ids)
        .bind(text(|e| Some(&e.source)))
        .bind(text(|e| Some(&e.topic)))
        .bind(text(|e| Some(&e.dedup_key)))
        .bind(text(|e| e.key.as_deref()))
        .bind(text(|e| e.event_type.as_deref()))
        .bind(text(|e| e.correlation_id.as_deref()))
        .bind(text(|e| e.causation_id.as_deref()))
        .bind(text(|e| e.content_type.as_deref()))
        .bind(
            events
                .iter()
                .map(|e| e.payload.to_vec())
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| i64::from(e.max_attempts))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db(CTX))?;
    let mut fresh = BTreeSet::new();
    let mut topics = BTreeSet::new();
    for (id, topic) in rows {
        fresh.insert(id);
        topics.insert(topic);
    }
    // Stored ids of the duplicates, by (source, dedup key).
    let dup_keys: Vec<&NewEvent> = events
        .iter()
        .zip(&ids)
        .filter(|(_, id)| !fresh.contains(*id))
        .map(|(e, _)| *e)
        .collect();
    let mut stored: HashMap<(String, String), String> = HashMap::new();
    if !dup_keys.is_empty() {
        let found: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT e.source, e.dedup_key, e.id::text FROM mailroom.events e
             JOIN UNNEST($1::text[], $2::text[]) AS k(source, dedup_key)
               ON e.source = k.source AND e.dedup_key = k.dedup_key",
        )
        .bind(
            dup_keys
                .iter()
                .map(|e| e.source.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            dup_keys
                .iter()
                .map(|e| e.dedup_key.clone())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db(CTX))?;
        stored.extend(found.into_iter().map(|(s, d, id)| ((s, d), id)));
    }
    if !topics.is_empty() {
        // Delivered at commit, to every instance listening (SPEC §11).
        sqlx::query("SELECT pg_notify($1, t) FROM UNNEST($2::text[]) AS t")
            .bind(crate::NOTIFY_CHANNEL)
            .bind(topics.into_iter().collect::<Vec<_>>())
            .execute(&mut *tx)
            .await
            .map_err(db(CTX))?;
    }
    let mut answers = Vec::with_capacity(events.len());
    for (e, id) in events.iter().zip(&ids) {
        if fresh.contains(id) {
            answers.push(Inserted {
                id: e.id,
                duplicate: false,
            });
            continue;
        }
        let Some(stored_id) = stored.get(&(e.source.clone(), e.dedup_key.clone())) else {
            // Deleted by retention between the two statements: let the caller retry.
            return Err(StoreError::Unavailable(format!(
                "postgres: the stored event for dedup key {:?} vanished during the insert",
                e.dedup_key
            )));
        };
        answers.push(Inserted {
            id: parse_id(stored_id)?,
            duplicate: true,
        });
    }
    tx.commit().await.map_err(db(CTX))?;
    Ok(answers)
}

/// PostgreSQL `text` cannot hold NUL; refuse such input before it can fail a
/// whole group.
fn check_text(e: &NewEvent) -> Result<()> {
    let fields = [
        ("source", Some(e.source.as_str())),
        ("topic", Some(e.topic.as_str())),
        ("dedup key", Some(e.dedup_key.as_str())),
        ("key", e.key.as_deref()),
        ("type", e.event_type.as_deref()),
        ("correlation id", e.correlation_id.as_deref()),
        ("causation id", e.causation_id.as_deref()),
        ("content type", e.content_type.as_deref()),
    ];
    for (name, value) in fields {
        if value.is_some_and(|v| v.contains('\0')) {
            return Err(StoreError::Invalid(format!(
                "the event's {name} contains a NUL character"
            )));
        }
    }
    Ok(())
}
