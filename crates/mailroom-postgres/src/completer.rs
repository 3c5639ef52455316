//! Group commit for completions, the other hot write of the data path.
//!
//! Same shape as the insert `writer`: a bounded queue (full →
//! [`StoreError::Overloaded`]), one task that drains what is waiting and
//! records it all with one statement — a fenced `UPDATE ... FROM
//! UNNEST(...)` plus the history rows — in one transaction and one commit,
//! then answers each caller. A completion whose token is not current
//! changes nothing and gets [`StoreError::StaleToken`] (or `NotFound`),
//! exactly as if it had run alone; of two completions with the same token in
//! one group, one wins and the other is stale.

use crate::sql::{completion_parts, db, parse_id};
use mailroom_core::{Completion, EventId, FencingToken, Result, StoreError};
use sqlx::PgPool;
use std::collections::HashSet;
use tokio::sync::{mpsc, oneshot};

struct Job {
    id: EventId,
    token: FencingToken,
    completion: Completion,
    reply: oneshot::Sender<Result<()>>,
}

/// Handle to the completion task; it ends when every handle is dropped.
#[derive(Debug)]
pub(crate) struct Completer {
    queue: mpsc::Sender<Job>,
}

fn stopped() -> StoreError {
    StoreError::Unavailable("postgres completion task has stopped".into())
}

impl Completer {
    /// Starts the task; `group` is the most completions per transaction.
    pub(crate) fn start(pool: PgPool, group: usize, capacity: usize) -> Self {
        let (queue, rx) = mpsc::channel(capacity);
        tokio::spawn(run(pool, rx, group.max(1)));
        Self { queue }
    }

    /// Queues a completion and waits for its committed answer.
    pub(crate) async fn complete(
        &self,
        id: EventId,
        token: FencingToken,
        completion: Completion,
    ) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .try_send(Job {
                id,
                token,
                completion,
                reply,
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => StoreError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => stopped(),
            })?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(pool: PgPool, mut rx: mpsc::Receiver<Job>, group: usize) {
    let mut batch: Vec<Job> = Vec::with_capacity(group);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < group {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        match complete_batch(&pool, &batch).await {
            Ok(answers) => {
                for (job, answer) in batch.drain(..).zip(answers) {
                    // The caller may have gone away; nothing to do then.
                    let _ = job.reply.send(answer);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, jobs = batch.len(), "completion group failed; nothing in it was committed");
                let why = e.to_string();
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(StoreError::Unavailable(why.clone())));
                }
            }
        }
    }
}

/// Input rows in queue order; `ord` tells which ones ended.
pub(crate) const COMPLETE_MANY: &str = "
    WITH input AS (
        SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::int8[], $5::text[], $6::text[])
            WITH ORDINALITY AS t(id, token, status, delay_us, error, outcome, ord)
    ), ended AS (
        UPDATE mailroom.events e
        SET status = i.status,
            next_attempt_at = now() + i.delay_us * interval '1 microsecond',
            lease_until = NULL,
            last_error = COALESCE(i.error, e.last_error)
        FROM input i
        WHERE e.id = i.id::uuid AND e.status = 'running' AND e.attempts = i.token
        RETURNING e.seq, e.started_at, e.worker, i.ord, i.token, i.outcome, i.error
    ), recorded AS (
        INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
        SELECT seq, token, COALESCE(started_at, now()), now(), outcome, error, worker FROM ended
        ON CONFLICT DO NOTHING
    )
    SELECT ord FROM ended";

/// Records `jobs` in one transaction; one answer per job, in order.
async fn complete_batch(pool: &PgPool, jobs: &[Job]) -> Result<Vec<Result<()>>> {
    const CTX: &str = "completing attempts";
    let mut ids = Vec::with_capacity(jobs.len());
    let mut tokens = Vec::with_capacity(jobs.len());
    let mut statuses = Vec::with_capacity(jobs.len());
    let mut delays = Vec::with_capacity(jobs.len());
    let mut errors = Vec::with_capacity(jobs.len());
    let mut outcomes = Vec::with_capacity(jobs.len());
    for job in jobs {
        let (status, delay, error, outcome) = completion_parts(&job.completion);
        ids.push(job.id.to_string());
        tokens.push(i64::from(job.token.0));
        statuses.push(status.as_str());
        delays.push(delay);
        // PostgreSQL text cannot hold NUL; keep the rest of the error text.
        errors.push(error.map(|e| e.replace('\0', "\u{FFFD}")));
        outcomes.push(outcome);
    }
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    let ended: Vec<i64> = sqlx::query_scalar(COMPLETE_MANY)
        .bind(&ids)
        .bind(&tokens)
        .bind(&statuses)
        .bind(&delays)
        .bind(&errors)
        .bind(&outcomes)
        .fetch_all(&mut *tx)
        .await
        .map_err(db(CTX))?;
    let ended: HashSet<usize> = ended
        .into_iter()
        .filter_map(|ord| usize::try_from(ord).ok())
        .collect();
    // For the rest: stale if the event exists, else not found.
    let mut existing = HashSet::new();
    if ended.len() < jobs.len() {
        let missing: Vec<&str> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| !ended.contains(&(i + 1)))
            .map(|(_, id)| id.as_str())
            .collect();
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT id::text FROM mailroom.events WHERE id = ANY($1::text[]::uuid[])",
        )
        .bind(&missing)
        .fetch_all(&mut *tx)
        .await
        .map_err(db(CTX))?;
        for id in found {
            existing.insert(parse_id(&id)?);
        }
    }
    tx.commit().await.map_err(db(CTX))?;
    Ok(jobs
        .iter()
        .enumerate()
        .map(|(i, job)| {
            if ended.contains(&(i + 1)) {
                Ok(())
            } else if existing.contains(&job.id) {
                Err(StoreError::StaleToken)
            } else {
                Err(StoreError::NotFound)
            }
        })
        .collect())
}
