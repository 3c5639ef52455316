//! Completions: the fenced writes of a worker's attempt, recording its end
//! (one, or a group in one statement) and extending its lease.

use super::{db, micros, ts};
use crate::db::Db;
use jiff::Timestamp;
use mailroom_core::{Completion, EventId, FencingToken, Result, Status, StoreError};
use std::collections::HashSet;
use std::time::Duration;

/// `StaleToken` if the event exists, else `NotFound`.
async fn stale_or_missing(pool: &Db, id: EventId) -> StoreError {
    let found = sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM mailroom.events WHERE id = $1::text::uuid)",
    )
    .bind(id.to_string())
    .fetch_one(pool)
    .await;
    match found {
        Ok(true) => StoreError::StaleToken,
        Ok(false) => StoreError::NotFound,
        Err(e) => db("checking a fencing token")(e),
    }
}

/// What a completion writes: status, retry delay (µs), error, history outcome.
fn completion_parts(c: &Completion) -> (Status, Option<i64>, Option<&str>, &'static str) {
    match c {
        Completion::Done => (Status::Done, None, None, "done"),
        Completion::Retry { delay, error } => (
            Status::Pending,
            Some(micros(*delay)),
            Some(error.as_str()),
            "retry",
        ),
        Completion::Dead { error } => (Status::Dead, None, Some(error.as_str()), "dead"),
    }
}

/// Records the end of one attempt, if `token` is still current: a group
/// of one ([`complete_many`]).
pub(crate) async fn complete(
    pool: &Db,
    id: EventId,
    token: FencingToken,
    completion: &Completion,
) -> Result<()> {
    complete_many(pool, &[(id, token, completion)])
        .await?
        .pop()
        .unwrap_or(Err(StoreError::NotFound))
}

/// Pushes a running event's lease to now + `lease`, if `token` is current.
pub(crate) async fn extend(
    pool: &Db,
    id: EventId,
    token: FencingToken,
    lease: Duration,
) -> Result<Timestamp> {
    let until: Option<i64> = sqlx::query_scalar(concat!(
        "UPDATE mailroom.events SET lease_until = now() + $1 * interval '1 microsecond'
         WHERE id = $2::text::uuid AND status = 'running' AND attempts = $3
         RETURNING ",
        us!("lease_until")
    ))
    .bind(micros(lease))
    .bind(id.to_string())
    .bind(i64::from(token.0))
    .fetch_optional(pool)
    .await
    .map_err(db("extending a lease"))?;
    match until {
        Some(until) => ts(until),
        None => Err(stale_or_missing(pool, id).await),
    }
}

/// Input rows in queue order; `ord` tells which ones ended. Per attempt:
/// the fenced update of the event (HOT: no index mentions a column it
/// changes), its queue row deleted (done, or dead without a key) or sent
/// back (a retry, due at its new time; a dead keyed event stays as the
/// `dead` row that blocks its key), and its history row.
///
/// The events are found by id (`events_id_key`) and their queue rows by
/// `seq` (`queue_pkey`): neither walks finished events.
///
/// The history row is a plain insert: `(event_seq, attempt)` is new by
/// construction, since an attempt number is handed out once (each claim
/// adds one) and its end is recorded once, here or by lease rescue, each
/// fenced on the event still running that attempt (the SQLite store
/// relies on the same). `ON CONFLICT DO NOTHING`, which this had, made
/// every history row a speculative insertion: 12 % of the statement's
/// database CPU.
pub(super) const COMPLETE_MANY: &str = "
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
        RETURNING e.seq, e.key, e.status, e.next_attempt_at, e.started_at, e.worker,
                  i.ord, i.token, i.outcome, i.error
    ), requeued AS (
        UPDATE mailroom.queue q
        SET state = x.status, run_at = COALESCE(x.next_attempt_at, q.run_at)
        FROM ended x
        WHERE q.seq = x.seq AND (x.status = 'pending' OR (x.status = 'dead' AND x.key IS NOT NULL))
    ), dequeued AS (
        DELETE FROM mailroom.queue q USING ended x
        WHERE q.seq = x.seq AND (x.status = 'done' OR (x.status = 'dead' AND x.key IS NULL))
    ), recorded AS (
        INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
        SELECT seq, token, COALESCE(started_at, now()), now(), outcome, error, worker FROM ended
    )
    SELECT ord FROM ended";

/// Records the ends of several attempts in one statement (its own
/// transaction: one round trip), each exactly as [`complete`] would; one
/// answer per item, in order. An item that did not end is told apart
/// (stale token or unknown event) after the commit: events are never
/// deleted while their attempts can still end, and if retention removed
/// one meanwhile, `NotFound` is what it is by then.
pub(crate) async fn complete_many(
    pool: &Db,
    items: &[(EventId, FencingToken, &Completion)],
) -> Result<Vec<Result<()>>> {
    const CTX: &str = "completing attempts";
    let mut ids = Vec::with_capacity(items.len());
    let mut tokens = Vec::with_capacity(items.len());
    let mut statuses = Vec::with_capacity(items.len());
    let mut delays = Vec::with_capacity(items.len());
    let mut errors = Vec::with_capacity(items.len());
    let mut outcomes = Vec::with_capacity(items.len());
    for (id, token, completion) in items {
        let (status, delay, error, outcome) = completion_parts(completion);
        ids.push(id.to_string());
        tokens.push(i64::from(token.0));
        statuses.push(status.as_str());
        delays.push(delay);
        // PostgreSQL text cannot hold NUL; keep the rest of the error text.
        errors.push(error.map(|e| e.replace('\0', "\u{FFFD}")));
        outcomes.push(outcome);
    }
    let ended: Vec<i64> = sqlx::query_scalar(COMPLETE_MANY)
        .bind(&ids)
        .bind(&tokens)
        .bind(&statuses)
        .bind(&delays)
        .bind(&errors)
        .bind(&outcomes)
        .fetch_all(pool)
        .await
        .map_err(db(CTX))?;
    let ended: HashSet<usize> = ended
        .into_iter()
        .filter_map(|ord| usize::try_from(ord).ok())
        .collect();
    // For the rest: stale if the event exists, else not found.
    let missing: Vec<&str> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| !ended.contains(&(i + 1)))
        .map(|(_, id)| id.as_str())
        .collect();
    let existing = existing_ids(pool, &missing).await?;
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, (id, _, _))| {
            if ended.contains(&(i + 1)) {
                Ok(())
            } else if existing.contains(id) {
                Err(StoreError::StaleToken)
            } else {
                Err(StoreError::NotFound)
            }
        })
        .collect())
}

/// Which of `ids` name stored events.
async fn existing_ids(pool: &Db, ids: &[&str]) -> Result<HashSet<EventId>> {
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    let found: Vec<String> = sqlx::query_scalar(
        "SELECT id::text FROM mailroom.events WHERE id = ANY($1::text[]::uuid[])",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .map_err(db("completing attempts"))?;
    found.iter().map(|id| EventId::parse_stored(id)).collect()
}
