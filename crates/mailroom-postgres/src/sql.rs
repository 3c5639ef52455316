//! The SQL of every store operation, as plain async functions of a pool.
//!
//! Times cross the wire as `bigint` microseconds since the Unix epoch (the
//! resolution of `timestamptz`), so no date-time crate is needed between
//! PostgreSQL and [`jiff`]. Every instant that matters is computed by
//! PostgreSQL (`now()`: the transaction's start; `clock_timestamp()` for
//! [`Store::now`](mailroom_core::Store::now)); Rust only passes durations.

use bytes::Bytes;
use jiff::Timestamp;
use mailroom_core::{
    Attempt, AttemptWindow, ClaimRequest, Claimed, Completion, Event, EventId, FencingToken,
    KeyCursor, ListFilter, OnDead, Page, PurgeReport, Result, Retention, Status, StoreError,
    TopicStats,
};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use std::collections::BTreeMap;
use std::time::Duration;

/// Default and largest page of a listing.
const DEFAULT_LIMIT: u32 = 100;
const MAX_LIMIT: u32 = 1000;
/// Rows one purge statement touches, so retention never holds many row locks.
const PURGE_CHUNK: i64 = 2000;
/// Longest duration passed to SQL (200 years): keeps `now() + d` inside
/// both `timestamptz` and [`Timestamp`], and exact as a `float8` of microseconds.
const MAX_DURATION_US: i64 = 200 * 366 * 86_400 * 1_000_000;
/// Advisory-lock class (first half of the two-key form) of the per-key claim
/// locks, so they never meet the migration lock or an application's locks.
pub(crate) const KEY_LOCK_CLASS: i32 = 0x6d72_6b79; // "mrky"

/// `timestamptz` expression → `bigint` microseconds since the epoch (exact).
macro_rules! us {
    ($col:literal) => {
        concat!("(extract(epoch FROM ", $col, ") * 1000000)::int8")
    };
}

/// The columns [`event_from_row`] decodes, in order, for events aliased `e`.
macro_rules! event_cols {
    () => {
        concat!(
            "e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type, e.status, ",
            "e.attempts, e.max_attempts, ",
            us!("e.next_attempt_at"),
            ", ",
            us!("e.received_at"),
            ", e.correlation_id, e.causation_id, e.content_type, e.payload, e.last_error, ",
            us!("e.lease_until")
        )
    };
}

/// Maps a database error to a [`StoreError`], saying what was being done.
/// Data exceptions (SQLSTATE class 22: bad text encoding, out-of-range
/// values) are the caller's input; everything else means the database could
/// not do its part, and intake must answer 503 / nack.
pub(crate) fn db(context: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| match &e {
        sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("22")) => {
            StoreError::Invalid(format!("postgres: {context}: {e}"))
        }
        _ => StoreError::Unavailable(format!("postgres: {context}: {e}")),
    }
}

/// A duration as SQL microseconds, capped at [`MAX_DURATION_US`].
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros())
        .unwrap_or(i64::MAX)
        .min(MAX_DURATION_US)
}

pub(crate) fn ts(us: i64) -> Result<Timestamp> {
    Timestamp::from_microsecond(us)
        .map_err(|e| StoreError::Corrupt(format!("timestamp {us} out of range: {e}")))
}

fn opt_ts(us: Option<i64>) -> Result<Option<Timestamp>> {
    us.map(ts).transpose()
}

fn col<'r, T>(row: &'r PgRow, i: usize) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

fn count(row: &PgRow, i: usize) -> Result<u32> {
    let n: i64 = col(row, i)?;
    u32::try_from(n).map_err(|_| StoreError::Corrupt(format!("count {n} out of range")))
}

pub(crate) fn parse_id(text: &str) -> Result<EventId> {
    text.parse()
        .map_err(|e| StoreError::Corrupt(format!("event id {text:?}: {e}")))
}

/// Decodes a row selected with `event_cols!()`; returns its `seq` too.
fn event_from_row(row: &PgRow) -> Result<(i64, Event)> {
    let id: String = col(row, 1)?;
    let status: String = col(row, 7)?;
    let event = Event {
        id: parse_id(&id)?,
        source: col(row, 2)?,
        topic: col(row, 3)?,
        dedup_key: col(row, 4)?,
        key: col(row, 5)?,
        event_type: col(row, 6)?,
        status: status.parse().map_err(StoreError::Corrupt)?,
        attempts: count(row, 8)?,
        max_attempts: count(row, 9)?,
        next_attempt_at: opt_ts(col(row, 10)?)?,
        received_at: ts(col(row, 11)?)?,
        correlation_id: col(row, 12)?,
        causation_id: col(row, 13)?,
        content_type: col(row, 14)?,
        payload: col::<Option<Vec<u8>>>(row, 15)?.map(Bytes::from),
        last_error: col(row, 16)?,
        lease_until: opt_ts(col(row, 17)?)?,
        history: Vec::new(),
    };
    Ok((col(row, 0)?, event))
}

fn events_from_rows(rows: &[PgRow]) -> Result<Vec<(i64, Event)>> {
    rows.iter().map(event_from_row).collect()
}

pub(crate) async fn now(pool: &PgPool) -> Result<Timestamp> {
    let us: i64 = sqlx::query_scalar(concat!("SELECT ", us!("clock_timestamp()")))
        .fetch_one(pool)
        .await
        .map_err(db("reading the database clock"))?;
    ts(us)
}

async fn history(pool: &PgPool, seq: i64) -> Result<Vec<Attempt>> {
    const CTX: &str = "reading attempt history";
    let rows = sqlx::query(concat!(
        "SELECT attempt, ",
        us!("started_at"),
        ", ",
        us!("finished_at"),
        ", outcome, error, worker
         FROM mailroom.attempts WHERE event_seq = $1 ORDER BY attempt"
    ))
    .bind(seq)
    .fetch_all(pool)
    .await
    .map_err(db(CTX))?;
    rows.iter()
        .map(|row| {
            let outcome: String = col(row, 3)?;
            Ok(Attempt {
                attempt: count(row, 0)?,
                started_at: ts(col(row, 1)?)?,
                finished_at: opt_ts(col(row, 2)?)?,
                outcome: outcome.parse().map_err(StoreError::Corrupt)?,
                error: col(row, 4)?,
                worker: col(row, 5)?,
            })
        })
        .collect()
}

async fn event_by_id(pool: &PgPool, id: EventId) -> Result<Option<(i64, Event)>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        event_cols!(),
        " FROM mailroom.events e WHERE e.id = $1::text::uuid"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await
    .map_err(db("reading an event"))?;
    row.as_ref().map(event_from_row).transpose()
}

/// One event with its history.
pub(crate) async fn get(pool: &PgPool, id: EventId) -> Result<Option<Event>> {
    match event_by_id(pool, id).await? {
        None => Ok(None),
        Some((seq, mut event)) => {
            event.history = history(pool, seq).await?;
            Ok(Some(event))
        }
    }
}

/// The head rule of sequential topics, for a candidate event `e`: no earlier
/// open event of its key blocks it, and no event of its key is running.
/// Both subqueries are served by the `events_open_keys` partial index.
macro_rules! head_of_key {
    ($blocking:literal) => {
        concat!(
            "(e.key IS NULL OR (
                NOT EXISTS (SELECT 1 FROM mailroom.events p
                    WHERE p.topic = e.topic AND p.key = e.key
                      AND p.status IN ('pending', 'running', 'dead') AND p.seq < e.seq ",
            $blocking,
            ")
                AND NOT EXISTS (SELECT 1 FROM mailroom.events r
                    WHERE r.topic = e.topic AND r.key = e.key AND r.status = 'running')))"
        )
    };
}
// With OnDead::Skip a dead event does not hold its key back.
macro_rules! head_block {
    () => {
        head_of_key!("")
    };
}
macro_rules! head_skip {
    () => {
        head_of_key!("AND p.status <> 'dead'")
    };
}

/// Moves the events whose `seq` the selection yields to `running`.
/// `$1` lease (µs), `$2` worker; the selection's own parameters follow.
///
/// `= ANY(ARRAY(selection))`, not `IN (selection)`: the selection runs once
/// and the rows are then fetched through the primary key. With `IN`, a
/// generic plan (a prepared statement's after five runs), which guesses
/// that `LIMIT $n` keeps a tenth of the pending rows, hash-joined the
/// selection against a sequential scan of the whole table on every claim.
macro_rules! claim_update {
    ($selection:expr) => {
        concat!(
            "UPDATE mailroom.events e
             SET status = 'running', attempts = e.attempts + 1,
                 lease_until = now() + $1 * interval '1 microsecond',
                 started_at = now(), worker = $2, next_attempt_at = NULL
             WHERE e.seq = ANY(ARRAY(",
            $selection,
            ")) RETURNING ",
            event_cols!()
        )
    };
}

/// Independent events: one statement. `FOR UPDATE SKIP LOCKED` makes
/// concurrent claimers (any number of instances) pass over each other's
/// rows instead of waiting or taking the same event.
///
/// Why the topic is spelled `= ANY(ARRAY[$3])` and the rows ordered by
/// `(topic, seq)`: with `topic = $3 ... ORDER BY seq`, the primary key too
/// yields pending rows in `seq` order, and whenever the statistics say most
/// rows are pending (the last ANALYZE ran during a backlog) the planner
/// walks the primary key from the start, filtering, so every claim steps
/// over all the finished rows of the table (51 ms per claim with 50,000
/// finished rows, against 2 ms), exactly while a backlog drains. An
/// equality with a constant would make `topic` redundant in the ORDER BY;
/// `= ANY` keeps it, so only `events_claim (topic, seq)` can produce the
/// order without sorting every pending row, whatever the statistics say
/// (migration 5 dropped the one other index in that order).
/// Sequential claims (`claim_candidates!`) do the same.
///
/// `$5` is where the walk starts (`seq >= $5`): `0` for the whole topic, or
/// a floor past the rows earlier claims already took (see `floor.rs`).
const CLAIM_ANY: &str = claim_update!(
    "SELECT c.seq FROM mailroom.events c
     WHERE c.topic = ANY(ARRAY[$3::text]) AND c.seq >= $5
       AND c.status = 'pending' AND c.next_attempt_at <= now()
     ORDER BY c.topic, c.seq LIMIT $4 FOR UPDATE SKIP LOCKED"
);

/// Sequential topics, step 1: the candidate heads (on this statement's
/// snapshot), each of whose key we then try to lock. `$1` topic, `$2` max,
/// `$3` lock class, `$4` window.
///
/// The walk goes over the topic's pending events in arrival order, testing
/// the head rule on each, and ends when it has `$2` heads or, at the
/// latest, at the `$4`-th pending event (`bound`): with a few keys and
/// deep backlogs almost every pending event waits behind its key's head,
/// and an unbounded walk would test them all on every claim. Returns
/// whether the bound cut the walk short (more pending events lie past it:
/// [`HEADS_BY_KEY`] then looks for the heads of the keys the walk did not
/// reach) and the `seq` of keyless candidates and of candidates whose key
/// lock we now hold.
macro_rules! claim_candidates {
    ($head:expr) => {
        concat!(
            "WITH bound AS MATERIALIZED (
                 SELECT b.seq FROM mailroom.events b
                 WHERE b.topic = ANY(ARRAY[$1::text]) AND b.status = 'pending'
                 ORDER BY b.topic, b.seq OFFSET $4 - 1 LIMIT 1
             ), candidates AS MATERIALIZED (
                 SELECT e.seq, e.key FROM mailroom.events e
                 WHERE e.topic = ANY(ARRAY[$1::text]) AND e.status = 'pending'
                   AND e.next_attempt_at <= now()
                   AND e.seq <= COALESCE((SELECT seq FROM bound), 9223372036854775807) AND ",
            $head,
            " ORDER BY e.topic, e.seq LIMIT $2 FOR UPDATE OF e SKIP LOCKED)
             SELECT EXISTS (SELECT 1 FROM bound),
                    ARRAY(SELECT c.seq FROM candidates c
                          WHERE c.key IS NULL
                             OR pg_try_advisory_xact_lock($3, hashtext($1 || chr(31) || c.key))
                          ORDER BY c.seq)"
        )
    };
}

/// The keys of a sequential topic that have open events, in key order, one
/// index probe each (a "skip scan" of `events_open_keys`), and each key's
/// head: its first open event (pending, running or dead; `$dead` drops dead
/// ones for `OnDead::Skip`), kept if it is pending and nothing of its key
/// runs. Columns `seq`, `key`, `next_attempt_at`. `$1` topic; `$keys` the
/// most keys visited, so a topic with very many keys costs a bounded walk
/// (keys past it are reached once earlier ones have no open events).
///
/// Spelled so that only `events_open_keys (topic, key, seq)` yields the
/// orders asked for, whatever the statistics say (see [`CLAIM_ANY`] for
/// `= ANY`). The key of a head is matched as the range `>= key AND <= key`:
/// an equality would make `key` redundant in the ORDER BY, and with many
/// rows per key the planner then found a key's first open event by
/// walking the primary key from the table's start, over every finished
/// event.
macro_rules! heads_by_key {
    ($dead:literal, $keys:literal) => {
        concat!(
            "WITH RECURSIVE keys (key, n) AS (
                 (SELECT k.key, 1 FROM mailroom.events k
                  WHERE k.topic = ANY(ARRAY[$1::text]) AND k.key IS NOT NULL
                    AND k.status IN ('pending', 'running', 'dead')
                  ORDER BY k.topic, k.key LIMIT 1)
                 UNION ALL
                 SELECT next.key, keys.n + 1
                 FROM keys CROSS JOIN LATERAL (
                     SELECT k.key FROM mailroom.events k
                     WHERE k.topic = ANY(ARRAY[$1::text]) AND k.key > keys.key
                       AND k.key IS NOT NULL AND k.status IN ('pending', 'running', 'dead')
                     ORDER BY k.topic, k.key LIMIT 1) next
                 WHERE keys.n < ",
            $keys,
            "
             ), heads AS (
                 SELECT h.seq, h.key, h.next_attempt_at
                 FROM keys CROSS JOIN LATERAL (
                     SELECT f.seq, f.key, f.status, f.next_attempt_at FROM mailroom.events f
                     WHERE f.topic = ANY(ARRAY[$1::text])
                       AND f.key >= keys.key AND f.key <= keys.key
                       AND f.status IN ('pending', 'running', 'dead') ",
            $dead,
            "
                     ORDER BY f.topic, f.key, f.seq LIMIT 1) h
                 WHERE h.status = 'pending'
                   AND NOT EXISTS (SELECT 1 FROM mailroom.events r
                       WHERE r.topic = $1 AND r.key = keys.key AND r.status = 'running')
             )"
        )
    };
}

/// Sequential topics, step 1 past the walk's bound: the heads of keys
/// ([`heads_by_key!`]) that are due, minus the `seq`s the walk already
/// took (`$3`), locked as the walk's are. `$1` topic, `$2` max, `$4` lock
/// class.
macro_rules! claim_heads_by_key {
    ($dead:literal) => {
        concat!(
            heads_by_key!($dead, "10000"),
            ", candidates AS MATERIALIZED (
                 SELECT e.seq, e.key FROM mailroom.events e
                 WHERE e.seq = ANY(ARRAY(SELECT seq FROM heads WHERE next_attempt_at <= now()))
                   AND NOT (e.seq = ANY($3)) AND e.status = 'pending'
                 ORDER BY e.seq LIMIT $2 FOR UPDATE OF e SKIP LOCKED)
             SELECT c.seq FROM candidates c
             WHERE pg_try_advisory_xact_lock($4, hashtext($1 || chr(31) || c.key))
             ORDER BY c.seq"
        )
    };
}
const HEADS_BY_KEY: &str = claim_heads_by_key!("");
const HEADS_BY_KEY_SKIP_DEAD: &str = claim_heads_by_key!("AND f.status <> 'dead'");

/// Sequential topics, step 1 past the walk's bound: due keyless events
/// (independent; only the outbox can store them in a sequential topic),
/// minus the `seq`s already taken (`$3`). `$1` topic, `$2` max. It walks
/// every pending event of the topic, so a claim runs it at most once per
/// [`RESCAN`](crate::floor::RESCAN) while the topic's heads are sparse:
/// without it, a keyless event behind a blocked key's deep backlog would
/// never come within the walk's bound.
const KEYLESS: &str = "
    SELECT e.seq FROM mailroom.events e
    WHERE e.topic = ANY(ARRAY[$1::text]) AND e.status = 'pending'
      AND e.next_attempt_at <= now() AND e.key IS NULL AND NOT (e.seq = ANY($3))
    ORDER BY e.topic, e.seq LIMIT $2 FOR UPDATE OF e SKIP LOCKED";

/// Pending events a sequential claim's walk tests at most (its bound).
pub(crate) const SEQUENTIAL_WINDOW: i64 = 1024;
/// The bound right after a walk that it cut short: the topic's heads are
/// sparse among its pending events (few keys, deep backlogs), so most of
/// them come from [`HEADS_BY_KEY`] and a long walk would mostly test
/// events waiting behind their key's head.
pub(crate) const SPARSE_WINDOW: i64 = 64;

/// Sequential topics, step 2: re-check the head rule on a snapshot taken
/// after the key locks were granted, and claim. `$3` = candidate seqs.
///
/// The candidates' rows are pending and stay so: step 1 locked them (`FOR
/// UPDATE`) in this transaction, and `now()` is the transaction's start in
/// both statements. So the rows are found by `seq` alone, through the
/// primary key. Repeating `topic`, `status` and `next_attempt_at` here let
/// the planner, with no statistics yet (a new table under its first
/// backlog), read them through `events_claim` instead, filtering every
/// pending row of the topic: 38 ms per claim with 70,000 pending.
macro_rules! claim_locked {
    ($head:expr) => {
        claim_update!(concat!(
            "SELECT e.seq FROM mailroom.events e WHERE e.seq = ANY($3) AND ",
            $head,
            " FOR UPDATE OF e SKIP LOCKED"
        ))
    };
}

/// Claims independent events (no `per_key`), walking the topic's pending
/// events from `seq >= from`. Returns each claimed event with its `seq`,
/// oldest first.
pub(crate) async fn claim_from(
    pool: &PgPool,
    req: &ClaimRequest,
    from: i64,
) -> Result<Vec<(i64, Claimed)>> {
    let rows = sqlx::query(CLAIM_ANY)
        .bind(micros(req.lease))
        .bind(&req.worker)
        .bind(&req.topic)
        .bind(i64::from(req.max))
        .bind(from)
        .fetch_all(pool)
        .await
        .map_err(db("claiming events"))?;
    claimed_from_rows(&rows)
}

/// Claims heads of keys, for sequential topics. The head rule ("no earlier
/// open event of the key, none running") reads *other* rows, which row
/// locks alone cannot protect: two transactions could each see "nothing of
/// key K is running" on their own snapshots and claim two different events
/// of K (e.g. a replayed earlier event and the next one). So a claim of a
/// keyed event is made under a transaction-scoped advisory lock on (topic,
/// key):
///
/// 1. pick the candidate heads and `pg_try_advisory_xact_lock` each key; a
///    key another claim holds is skipped (not waited for). One statement
///    walks the pending events in arrival order, up to a bound; when the
///    bound cut it short of `max` heads, a second one finds the heads of
///    the other keys, one key at a time (`HEADS_BY_KEY`);
/// 2. in a *second* statement — whose READ COMMITTED snapshot is taken after
///    the locks were granted, so it sees every claim of those keys that
///    committed before (a transaction's effects are visible before its locks
///    are released) — re-check the head rule and claim.
///
/// Only claims make events `running`, and every claim of key K holds K's
/// lock until it commits, so two running events of one key can never
/// coexist, across any number of connections and instances. Completions,
/// replays and rescues only make a key less busy and need no lock. Keyless
/// events are independent and rely on `FOR UPDATE SKIP LOCKED` alone. A hash
/// collision between two keys only makes one claim skip a key for a moment.
///
/// `window` bounds the walk ([`SEQUENTIAL_WINDOW`] or [`SPARSE_WINDOW`]);
/// past it, `keyless` also looks for keyless events ([`KEYLESS`]). Also
/// returns whether the bound cut the walk short of `max` heads.
pub(crate) async fn claim_heads(
    pool: &PgPool,
    req: &ClaimRequest,
    on_dead: OnDead,
    window: i64,
    keyless: bool,
) -> Result<(Vec<(i64, Claimed)>, bool)> {
    const CTX: &str = "claiming events";
    let (pick, by_key, take) = match on_dead {
        OnDead::Block => (
            claim_candidates!(head_block!()),
            HEADS_BY_KEY,
            claim_locked!(head_block!()),
        ),
        OnDead::Skip => (
            claim_candidates!(head_skip!()),
            HEADS_BY_KEY_SKIP_DEAD,
            claim_locked!(head_skip!()),
        ),
    };
    let max = i64::from(req.max);
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    let (cut_short, mut seqs): (bool, Vec<i64>) = sqlx::query_as(pick)
        .bind(&req.topic)
        .bind(max)
        .bind(KEY_LOCK_CLASS)
        .bind(window)
        .fetch_one(&mut *tx)
        .await
        .map_err(db(CTX))?;
    let found = i64::try_from(seqs.len()).unwrap_or(max);
    let cut_short = cut_short && found < max;
    if cut_short {
        let more: Vec<i64> = sqlx::query_scalar(by_key)
            .bind(&req.topic)
            .bind(max - found)
            .bind(&seqs)
            .bind(KEY_LOCK_CLASS)
            .fetch_all(&mut *tx)
            .await
            .map_err(db(CTX))?;
        seqs.extend(more);
        let found = i64::try_from(seqs.len()).unwrap_or(max);
        if keyless && found < max {
            let more: Vec<i64> = sqlx::query_scalar(KEYLESS)
                .bind(&req.topic)
                .bind(max - found)
                .bind(&seqs)
                .fetch_all(&mut *tx)
                .await
                .map_err(db(CTX))?;
            seqs.extend(more);
        }
    }
    if seqs.is_empty() {
        tx.rollback().await.map_err(db(CTX))?;
        return Ok((Vec::new(), cut_short));
    }
    let rows = sqlx::query(take)
        .bind(micros(req.lease))
        .bind(&req.worker)
        .bind(&seqs)
        .fetch_all(&mut *tx)
        .await
        .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    Ok((claimed_from_rows(&rows)?, cut_short))
}

/// Claimed rows (`claim_update!`'s RETURNING), oldest arrival first.
fn claimed_from_rows(rows: &[PgRow]) -> Result<Vec<(i64, Claimed)>> {
    let mut claimed = events_from_rows(rows)?;
    // RETURNING comes in no particular order.
    claimed.sort_unstable_by_key(|(seq, _)| *seq);
    claimed
        .into_iter()
        .map(|(seq, event)| {
            let lease_until = event.lease_until.ok_or_else(|| {
                StoreError::Corrupt(format!("claimed event {} has no lease", event.id))
            })?;
            let claimed = Claimed {
                token: FencingToken(event.attempts),
                lease_until,
                event,
            };
            Ok((seq, claimed))
        })
        .collect()
}

const NEXT_DUE: &str = concat!(
    "SELECT ",
    us!("MIN(e.next_attempt_at)"),
    " FROM mailroom.events e WHERE e.topic = $1 AND e.status = 'pending'"
);

/// Sequential topics: the earliest due time among the keys' heads
/// ([`heads_by_key!`]) and the keyless pending events among the first `$2`
/// pending ones, the part of the topic the next claim's walk reaches (`$2`
/// is that walk's bound). Testing the head rule on every pending event
/// instead cost a walk of the whole backlog, after every claim that came
/// back short. A keyless event past the bound cannot be claimed until the
/// walk reaches it, so it does not count here either: counting it would
/// wake the dispatcher for a claim that cannot take it.
macro_rules! next_due_by_key {
    ($dead:literal) => {
        concat!(
            heads_by_key!($dead, "10000"),
            " SELECT ",
            us!("MIN(t.due)"),
            " FROM (
                 SELECT heads.next_attempt_at AS due FROM heads
                 UNION ALL
                 SELECT w.next_attempt_at FROM (
                     SELECT c.key, c.next_attempt_at FROM mailroom.events c
                     WHERE c.topic = ANY(ARRAY[$1::text]) AND c.status = 'pending'
                     ORDER BY c.topic, c.seq LIMIT $2) w
                 WHERE w.key IS NULL) t"
        )
    };
}

/// The earliest due time of an event a claim could take; `window` is the
/// bound of a sequential topic's next walk (unused for other topics).
pub(crate) async fn next_due(
    pool: &PgPool,
    req: &ClaimRequest,
    window: i64,
) -> Result<Option<Timestamp>> {
    let sql = match req.per_key {
        None => NEXT_DUE,
        Some(OnDead::Block) => next_due_by_key!(""),
        Some(OnDead::Skip) => next_due_by_key!("AND f.status <> 'dead'"),
    };
    let mut query = sqlx::query_scalar(sql).bind(&req.topic);
    if req.per_key.is_some() {
        query = query.bind(window);
    }
    let due: Option<i64> = query
        .fetch_one(pool)
        .await
        .map_err(db("finding the next due event"))?;
    opt_ts(due)
}

/// `StaleToken` if the event exists, else `NotFound`.
async fn stale_or_missing(pool: &PgPool, id: EventId) -> StoreError {
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
pub(crate) fn completion_parts(
    c: &Completion,
) -> (Status, Option<i64>, Option<&str>, &'static str) {
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

/// One statement: the fenced update and its history row, atomically.
const COMPLETE: &str = "
    WITH ended AS (
        UPDATE mailroom.events
        SET status = $1,
            next_attempt_at = now() + $2 * interval '1 microsecond',
            lease_until = NULL,
            last_error = COALESCE($3, last_error)
        WHERE id = $4::text::uuid AND status = 'running' AND attempts = $5
        RETURNING seq, started_at, worker
    ), recorded AS (
        INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
        SELECT seq, $5, COALESCE(started_at, now()), now(), $6, $3, worker FROM ended
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) FROM ended";

pub(crate) async fn complete(
    pool: &PgPool,
    id: EventId,
    token: FencingToken,
    completion: &Completion,
) -> Result<()> {
    let (status, delay, error, outcome) = completion_parts(completion);
    let ended: i64 = sqlx::query_scalar(COMPLETE)
        .bind(status.as_str())
        .bind(delay)
        .bind(error)
        .bind(id.to_string())
        .bind(i64::from(token.0))
        .bind(outcome)
        .fetch_one(pool)
        .await
        .map_err(db("completing an attempt"))?;
    if ended == 0 {
        return Err(stale_or_missing(pool, id).await);
    }
    Ok(())
}

pub(crate) async fn extend(
    pool: &PgPool,
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

pub(crate) async fn rescue_expired(pool: &PgPool) -> Result<u64> {
    // SKIP LOCKED: a row being completed right now is not expired for long;
    // its completion wins, or the next rescue takes it.
    let rescued: i64 = sqlx::query_scalar(
        "WITH expired AS (
             SELECT seq FROM mailroom.events
             WHERE status = 'running' AND lease_until < now()
             FOR UPDATE SKIP LOCKED
         ), moved AS (
             UPDATE mailroom.events e
             SET status = CASE WHEN e.attempts >= e.max_attempts THEN 'dead' ELSE 'pending' END,
                 next_attempt_at = CASE WHEN e.attempts >= e.max_attempts THEN NULL ELSE now() END,
                 lease_until = NULL, last_error = 'lease expired'
             FROM expired x WHERE e.seq = x.seq
             RETURNING e.seq, e.attempts, e.started_at, e.worker
         ), recorded AS (
             INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
             SELECT seq, attempts, COALESCE(started_at, now()), now(), 'lease_expired', 'lease expired', worker
             FROM moved
             ON CONFLICT DO NOTHING
         )
         SELECT count(*) FROM moved",
    )
    .fetch_one(pool)
    .await
    .map_err(db("rescuing expired leases"))?;
    Ok(u64::try_from(rescued).unwrap_or(0))
}

/// Why a replay or skip of `id` changed nothing: `NotFound`, or `Conflict`
/// naming the status that refused it.
async fn refused(pool: &PgPool, id: EventId, why: impl FnOnce(Status) -> String) -> StoreError {
    match event_by_id(pool, id).await {
        Ok(None) => StoreError::NotFound,
        Ok(Some((_, e))) => StoreError::Conflict(why(e.status)),
        Err(e) => e,
    }
}

pub(crate) async fn replay(pool: &PgPool, id: EventId, budget: u32) -> Result<Event> {
    let changed = sqlx::query(
        "UPDATE mailroom.events
         SET status = 'pending', max_attempts = LEAST(attempts + $2, 4294967295),
             next_attempt_at = now(), lease_until = NULL
         WHERE id = $1::text::uuid AND status <> 'running'",
    )
    .bind(id.to_string())
    .bind(i64::from(budget))
    .execute(pool)
    .await
    .map_err(db("replaying an event"))?
    .rows_affected();
    if changed == 0 {
        return Err(refused(pool, id, |_| {
            format!("event {id} is running; wait for its attempt to end")
        })
        .await);
    }
    get(pool, id).await?.ok_or(StoreError::NotFound)
}

pub(crate) async fn replay_matching(
    pool: &PgPool,
    filter: &ListFilter,
    budget: u32,
) -> Result<u64> {
    let changed = sqlx::query(
        "UPDATE mailroom.events
         SET status = 'pending', max_attempts = LEAST(attempts + $4, 4294967295),
             next_attempt_at = now(), lease_until = NULL
         WHERE status <> 'running'
           AND ($1::text IS NULL OR topic = $1)
           AND ($2::text IS NULL OR status = $2)
           AND ($3::text IS NULL OR key = $3)",
    )
    .bind(filter.topic.as_deref())
    .bind(filter.status.map(Status::as_str))
    .bind(filter.key.as_deref())
    .bind(i64::from(budget))
    .execute(pool)
    .await
    .map_err(db("replaying events"))?
    .rows_affected();
    Ok(changed)
}

pub(crate) async fn skip(pool: &PgPool, id: EventId) -> Result<Event> {
    let changed = sqlx::query(
        "UPDATE mailroom.events SET status = 'skipped'
         WHERE id = $1::text::uuid AND status = 'dead'",
    )
    .bind(id.to_string())
    .execute(pool)
    .await
    .map_err(db("skipping an event"))?
    .rows_affected();
    if changed == 0 {
        return Err(refused(pool, id, |status| {
            format!("only dead events can be skipped; event {id} is {status}")
        })
        .await);
    }
    get(pool, id).await?.ok_or(StoreError::NotFound)
}

/// A page of events, newest first: the primary key walked backwards.
/// `$1` topic (NULL here), `$2` status, `$3` key, `$4` before this seq, `$5` limit.
const LIST_ALL: &str = concat!(
    "SELECT ",
    event_cols!(),
    " FROM mailroom.events e
     WHERE ($1::text IS NULL OR e.topic = $1)
       AND ($2::text IS NULL OR e.status = $2)
       AND ($3::text IS NULL OR e.key = $3)
       AND ($4::int8 IS NULL OR e.seq < $4)
     ORDER BY e.seq DESC LIMIT $5"
);

/// One topic's events in one `state` (a condition on `status`), newest
/// first; the filters and parameters of [`LIST_ALL`].
macro_rules! list_topic_part {
    ($state:literal) => {
        concat!(
            "(SELECT * FROM mailroom.events
              WHERE topic = $1 AND status ",
            $state,
            "
                AND ($2::text IS NULL OR status = $2)
                AND ($3::text IS NULL OR key = $3)
                AND ($4::int8 IS NULL OR seq < $4)
              ORDER BY seq DESC LIMIT $5)"
        )
    };
}

/// The same for one topic, merged from three parts, each read from its own
/// partial index: pending events from `events_claim` and finished ones from
/// `events_listing`, both backwards; running ones (at most the topics'
/// concurrency) from `events_running`. Migrations 5 and 6 explain why no
/// one index holds them all.
const LIST_TOPIC: &str = concat!(
    "SELECT ",
    event_cols!(),
    " FROM (",
    list_topic_part!("= 'pending'"),
    " UNION ALL ",
    list_topic_part!("= 'running'"),
    " UNION ALL ",
    list_topic_part!("IN ('done', 'dead', 'skipped')"),
    ") e ORDER BY e.seq DESC LIMIT $5"
);

pub(crate) async fn list(pool: &PgPool, filter: &ListFilter) -> Result<Page> {
    const CTX: &str = "listing events";
    let limit = match filter.limit {
        0 => DEFAULT_LIMIT,
        n => n.min(MAX_LIMIT),
    };
    let after_seq: Option<i64> = match filter.cursor {
        None => None,
        Some(KeyCursor(after_id)) => {
            let seq: Option<i64> =
                sqlx::query_scalar("SELECT seq FROM mailroom.events WHERE id = $1::text::uuid")
                    .bind(after_id.to_string())
                    .fetch_optional(pool)
                    .await
                    .map_err(db(CTX))?;
            Some(seq.ok_or_else(|| {
                StoreError::Invalid(format!("cursor {after_id} names no stored event"))
            })?)
        }
    };
    // One row more than the page tells whether another page follows.
    let sql = if filter.topic.is_some() {
        LIST_TOPIC
    } else {
        LIST_ALL
    };
    let rows = sqlx::query(sql)
        .bind(filter.topic.as_deref())
        .bind(filter.status.map(Status::as_str))
        .bind(filter.key.as_deref())
        .bind(after_seq)
        .bind(i64::from(limit) + 1)
        .fetch_all(pool)
        .await
        .map_err(db(CTX))?;
    let mut events: Vec<Event> = events_from_rows(&rows)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let next_cursor = if events.len() > limit as usize {
        events.truncate(limit as usize);
        events.last().map(|e| KeyCursor(e.id))
    } else {
        None
    };
    Ok(Page {
        events,
        next_cursor,
    })
}

/// See [`Store::attempt_window`](mailroom_core::Store::attempt_window): the
/// window's attempts come from the BRIN index `attempts_finished`
/// (migration 4); `percentile_disc` is the nearest-rank p95, as on SQLite.
pub(crate) async fn attempt_window(pool: &PgPool, window: Duration) -> Result<Vec<AttemptWindow>> {
    const CTX: &str = "reading recent attempts";
    let micros_of = |us: i64| Duration::from_micros(u64::try_from(us).unwrap_or(0));
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db(CTX))?;
    let rows = sqlx::query(
        "SELECT e.topic, count(*)::int8, (count(*) FILTER (WHERE a.outcome <> 'done'))::int8,
                (extract(epoch FROM percentile_disc(0.95) WITHIN GROUP
                    (ORDER BY greatest(a.finished_at - a.started_at, interval '0'))) * 1000000)::int8
         FROM mailroom.attempts a JOIN mailroom.events e ON e.seq = a.event_seq
         WHERE a.finished_at >= now() - make_interval(secs => $1::float8 / 1000000)
         GROUP BY e.topic",
    )
    .bind(micros(window))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(CTX))?;
    let mut by_topic: BTreeMap<String, AttemptWindow> = BTreeMap::new();
    for row in &rows {
        let topic: String = col(row, 0)?;
        let finished: i64 = col(row, 1)?;
        let failed: i64 = col(row, 2)?;
        let p95: Option<i64> = col(row, 3)?;
        by_topic.insert(
            topic.clone(),
            AttemptWindow {
                topic,
                finished: u64::try_from(finished).unwrap_or(0),
                failed: u64::try_from(failed).unwrap_or(0),
                p95: p95.map(micros_of),
                longest_running: None,
            },
        );
    }
    let rows = sqlx::query(concat!(
        "SELECT topic, ",
        us!("now() - min(started_at)"),
        " FROM mailroom.events WHERE status = 'running' AND started_at IS NOT NULL GROUP BY topic"
    ))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(CTX))?;
    for row in &rows {
        let topic: String = col(row, 0)?;
        let age: i64 = col(row, 1)?;
        by_topic
            .entry(topic.clone())
            .or_insert_with(|| AttemptWindow {
                topic,
                ..AttemptWindow::default()
            })
            .longest_running = Some(micros_of(age));
    }
    tx.commit().await.map_err(db(CTX))?;
    Ok(by_topic.into_values().collect())
}

pub(crate) async fn stats(pool: &PgPool) -> Result<Vec<TopicStats>> {
    const CTX: &str = "computing stats";
    // One snapshot for the three queries, so the numbers agree.
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db(CTX))?;
    let mut by_topic: BTreeMap<String, TopicStats> = BTreeMap::new();
    let rows =
        sqlx::query("SELECT topic, status, count(*) FROM mailroom.events GROUP BY topic, status")
            .fetch_all(&mut *tx)
            .await
            .map_err(db(CTX))?;
    for row in &rows {
        let topic: String = col(row, 0)?;
        let status: String = col(row, 1)?;
        let n: i64 = col(row, 2)?;
        let status: Status = status.parse().map_err(StoreError::Corrupt)?;
        by_topic
            .entry(topic.clone())
            .or_insert_with(|| TopicStats {
                topic,
                ..TopicStats::default()
            })
            .counts
            .insert(status.as_str(), u64::try_from(n).unwrap_or(0));
    }
    let rows = sqlx::query(concat!(
        "SELECT topic, ",
        us!("min(received_at)"),
        " FROM mailroom.events WHERE status = 'pending' GROUP BY topic"
    ))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(CTX))?;
    for row in &rows {
        let topic: String = col(row, 0)?;
        if let Some(stats) = by_topic.get_mut(&topic) {
            stats.oldest_pending = opt_ts(col(row, 1)?)?;
        }
    }
    // A key is blocked when its head (earliest open event) is dead.
    let rows = sqlx::query(
        "SELECT e.topic, count(DISTINCT e.key) FROM mailroom.events e
         WHERE e.status = 'dead' AND e.key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM mailroom.events p
               WHERE p.topic = e.topic AND p.key = e.key
                 AND p.status IN ('pending', 'running', 'dead') AND p.seq < e.seq)
         GROUP BY e.topic",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(db(CTX))?;
    for row in &rows {
        let topic: String = col(row, 0)?;
        let n: i64 = col(row, 1)?;
        if let Some(stats) = by_topic.get_mut(&topic) {
            stats.blocked_keys = u64::try_from(n).unwrap_or(0);
        }
    }
    tx.commit().await.map_err(db(CTX))?;
    Ok(by_topic.into_values().collect())
}

/// Applies retention in bounded statements (at most [`PURGE_CHUNK`] rows
/// each, skipping rows another transaction holds), so intake and claims keep
/// flowing meanwhile. Cutoffs are fixed once, on the database clock.
pub(crate) async fn purge(pool: &PgPool, retention: Retention) -> Result<PurgeReport> {
    const CTX: &str = "applying retention";
    let now: i64 = sqlx::query_scalar(concat!("SELECT ", us!("now()")))
        .fetch_one(pool)
        .await
        .map_err(db(CTX))?;
    let cutoff = |d: Duration| now.saturating_sub(micros(d));
    let mut report = PurgeReport::default();
    // Finished rows past the dedup window go first, with their history.
    loop {
        let deleted: i64 = sqlx::query_scalar(
            "WITH doomed AS (
                 SELECT seq FROM mailroom.events
                 WHERE status IN ('done', 'skipped')
                   AND received_at < timestamptz 'epoch' + $1 * interval '1 microsecond'
                 LIMIT $2 FOR UPDATE SKIP LOCKED
             ), history AS (
                 DELETE FROM mailroom.attempts WHERE event_seq IN (SELECT seq FROM doomed)
             ), gone AS (
                 DELETE FROM mailroom.events WHERE seq IN (SELECT seq FROM doomed) RETURNING 1
             )
             SELECT count(*) FROM gone",
        )
        .bind(cutoff(retention.dedup))
        .bind(PURGE_CHUNK)
        .fetch_one(pool)
        .await
        .map_err(db(CTX))?;
        report.rows_deleted += u64::try_from(deleted).unwrap_or(0);
        if deleted < PURGE_CHUNK {
            break;
        }
    }
    loop {
        let dropped = sqlx::query(
            "UPDATE mailroom.events SET payload = NULL
             WHERE seq IN (
                 SELECT seq FROM mailroom.events
                 WHERE payload IS NOT NULL
                   AND ((status IN ('done', 'skipped')
                         AND received_at < timestamptz 'epoch' + $1 * interval '1 microsecond')
                     OR (status = 'dead'
                         AND received_at < timestamptz 'epoch' + $2 * interval '1 microsecond'))
                 LIMIT $3 FOR UPDATE SKIP LOCKED)",
        )
        .bind(cutoff(retention.done))
        .bind(cutoff(retention.dead))
        .bind(PURGE_CHUNK)
        .execute(pool)
        .await
        .map_err(db(CTX))?
        .rows_affected();
        report.payloads_dropped += dropped;
        if dropped < PURGE_CHUNK as u64 {
            break;
        }
    }
    Ok(report)
}

/// Takes or renews the lease on `role` for `holder`. `ON CONFLICT DO UPDATE`
/// locks the existing row and re-evaluates its `WHERE` on the newest version,
/// so of several instances racing for an expired lease exactly one gets it.
pub(crate) async fn try_lead(
    pool: &PgPool,
    role: &str,
    holder: &str,
    ttl: Duration,
) -> Result<bool> {
    let won: Option<String> = sqlx::query_scalar(
        "INSERT INTO mailroom.leaders AS l (role, holder, lease_until)
         VALUES ($1, $2, now() + $3 * interval '1 microsecond')
         ON CONFLICT (role) DO UPDATE
             SET holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until
             WHERE l.holder = EXCLUDED.holder OR l.lease_until < now()
         RETURNING holder",
    )
    .bind(role)
    .bind(holder)
    .bind(micros(ttl))
    .fetch_optional(pool)
    .await
    .map_err(db("electing a leader"))?;
    Ok(won.is_some())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sqlx::postgres::PgArguments;
    use sqlx::query::QueryScalar;
    use sqlx::{Connection as _, PgConnection, Postgres};

    /// `EXPLAIN` of one of our own constant statements: nothing to inject.
    fn explain(sql: &str) -> QueryScalar<'static, Postgres, String, PgArguments> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
    }

    /// The plan of `query` (an [`explain`] with its arguments bound), as text.
    async fn plan(
        conn: &mut PgConnection,
        query: QueryScalar<'_, Postgres, String, PgArguments>,
    ) -> String {
        query.fetch_all(conn).await.unwrap().join("\n")
    }

    /// A fresh database holding a backlog of 20,000 pending events of
    /// topic `t` (256-byte payloads) spread over `keys` keys, and a
    /// connection to it.
    async fn backlog(keys: u32) -> PgConnection {
        let url = mailroom_testkit::fresh_postgres_db().await;
        let store = crate::PostgresStore::connect(crate::PostgresOptions::from_url(&url).unwrap())
            .await
            .unwrap();
        mailroom_core::Store::migrate(&store).await.unwrap();
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::query(
            "INSERT INTO mailroom.events
                 (id, source, topic, dedup_key, key, status, max_attempts, next_attempt_at, payload)
             SELECT mailroom.uuid_v7(), 's', 't', g::text, 'k' || (g % $1), 'pending', 10, now(),
                    convert_to(repeat('x', 256), 'UTF8')
             FROM generate_series(1, 20000) g",
        )
        .bind(i64::from(keys))
        .execute(&mut conn)
        .await
        .unwrap();
        conn
    }

    /// A [`backlog`] with statistics taken while every row is pending (an
    /// ANALYZE during a backlog), the ones that misled the planner before.
    async fn analysed_backlog(keys: u32) -> PgConnection {
        let mut conn = backlog(keys).await;
        sqlx::query("ANALYZE mailroom.events")
            .execute(&mut conn)
            .await
            .unwrap();
        conn
    }

    /// Marks the first 19,000 events of a [`backlog`] done, as a drain
    /// would have, without new statistics.
    async fn finish_most(conn: &mut PgConnection) {
        sqlx::query(
            "UPDATE mailroom.events SET status = 'done', next_attempt_at = NULL
             WHERE seq <= 19000",
        )
        .execute(conn)
        .await
        .unwrap();
    }

    /// The generic plan of `sql` (the one a prepared statement switches to
    /// after five runs), its parameters declared as `types` and given as
    /// the SQL literals `args`.
    async fn generic_plan(conn: &mut PgConnection, sql: &str, types: &str, args: &str) -> String {
        let prepare =
            format!("SET plan_cache_mode = force_generic_plan; PREPARE q({types}) AS {sql}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
            "EXPLAIN EXECUTE q({args})"
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap()
        .join("\n");
        sqlx::raw_sql("DEALLOCATE q; RESET plan_cache_mode")
            .execute(&mut *conn)
            .await
            .unwrap();
        plan
    }

    /// Statistics taken while every row was pending (an ANALYZE during a
    /// backlog), then most rows finished: claims still find pending rows
    /// through `events_claim`, neither walking another index over the
    /// finished ones nor scanning the table, in custom and generic plans.
    #[tokio::test]
    async fn claims_walk_the_pending_index_whatever_the_statistics_say() {
        let mut conn = analysed_backlog(50).await;
        for moment in ["all pending", "most finished"] {
            if moment == "most finished" {
                finish_most(&mut conn).await;
            }
            let single = |from: i64| {
                explain(CLAIM_ANY)
                    .bind(30_000_000_i64)
                    .bind("w")
                    .bind("t")
                    .bind(100_i64)
                    .bind(from)
            };
            let sequential = |sql| {
                explain(sql)
                    .bind("t")
                    .bind(100_i64)
                    .bind(KEY_LOCK_CLASS)
                    .bind(SEQUENTIAL_WINDOW)
            };
            let block = claim_candidates!(head_block!());
            let skip = claim_candidates!(head_skip!());
            let mut plans = vec![
                ("single", plan(&mut conn, single(0)).await),
                (
                    "single, from a floor",
                    plan(&mut conn, single(15_000)).await,
                ),
                ("sequential", plan(&mut conn, sequential(block)).await),
                (
                    "sequential, on_dead = skip",
                    plan(&mut conn, sequential(skip)).await,
                ),
            ];
            for (name, from) in [
                ("single, generic plan", 0),
                ("from a floor, generic", 15_000),
            ] {
                let args = format!("30000000, 'w', 't', 100, {from}");
                let types = "int8, text, text, int8, int8";
                plans.push((name, generic_plan(&mut conn, CLAIM_ANY, types, &args).await));
            }
            for (name, sql) in [
                ("sequential, generic plan", block),
                ("skip, generic plan", skip),
            ] {
                let generic = generic_plan(
                    &mut conn,
                    sql,
                    "text, int8, int4, int8",
                    "'t', 100, 1, 1024",
                )
                .await;
                plans.push((name, generic));
            }
            for (name, plan) in plans {
                assert!(
                    plan.contains("using events_claim on events") && !plan.contains("Seq Scan"),
                    "{moment}, {name}: the claim does not read events_claim alone:\n{plan}"
                );
            }
        }
    }

    /// Past the walk's bound, sequential claims and their next due time
    /// visit keys and heads through `events_open_keys` (a handful of probes
    /// per key), never by scanning the table or walking the pending events:
    /// in custom and generic plans, with statistics taken while every row
    /// was pending, at the start of a 10-key backlog and after most of it.
    #[tokio::test]
    async fn heads_by_key_probe_the_open_keys_index() {
        let mut conn = analysed_backlog(10).await;
        let by_key = [
            ("heads by key", HEADS_BY_KEY),
            ("heads by key, on_dead = skip", HEADS_BY_KEY_SKIP_DEAD),
        ];
        let next_due = [
            ("next due", next_due_by_key!("")),
            (
                "next due, on_dead = skip",
                next_due_by_key!("AND f.status <> 'dead'"),
            ),
        ];
        for moment in ["all pending", "most finished"] {
            if moment == "most finished" {
                finish_most(&mut conn).await;
            }
            let mut plans = Vec::new();
            for (name, sql) in by_key {
                let custom = explain(sql)
                    .bind("t")
                    .bind(100_i64)
                    .bind(vec![1_i64])
                    .bind(KEY_LOCK_CLASS);
                plans.push((name, plan(&mut conn, custom).await));
                let args = "'t', 100, '{1}', 1";
                let types = "text, int8, int8[], int4";
                plans.push((name, generic_plan(&mut conn, sql, types, args).await));
            }
            for (name, sql) in next_due {
                let custom = explain(sql).bind("t").bind(SEQUENTIAL_WINDOW);
                plans.push((name, plan(&mut conn, custom).await));
                let generic = generic_plan(&mut conn, sql, "text, int8", "'t', 1024").await;
                plans.push((name, generic));
            }
            for (name, plan) in plans {
                let probes = plan.matches("using events_open_keys on events").count();
                assert!(
                    probes >= 3 && !plan.contains("Seq Scan"),
                    "{moment}, {name}: keys and heads are not probed in events_open_keys:\n{plan}"
                );
            }
        }
    }

    /// A completion group finds its rows by id (or among the few running
    /// ones), never through an index that grows with the finished events,
    /// nor by scanning the table: in custom and generic plans, with
    /// statistics taken while every row was pending, at the start of the
    /// drain and after most of it. With `events_listing` holding running
    /// rows too (migration 5), both plans walked it.
    #[tokio::test]
    async fn completions_find_their_rows_without_walking_finished_ones() {
        let mut conn = analysed_backlog(50).await;
        for moment in ["start", "most finished"] {
            let (first, last) = match moment {
                "start" => (1, 64),
                _ => (19_001, 19_064),
            };
            sqlx::query(
                "UPDATE mailroom.events SET status = 'done', next_attempt_at = NULL
                 WHERE seq < $1",
            )
            .bind(first)
            .execute(&mut conn)
            .await
            .unwrap();
            let ids: Vec<String> = sqlx::query_scalar(
                "UPDATE mailroom.events
                 SET status = 'running', attempts = 1, next_attempt_at = NULL,
                     lease_until = now() + interval '30 seconds', started_at = now()
                 WHERE seq BETWEEN $1 AND $2 RETURNING id::text",
            )
            .bind(first)
            .bind(last)
            .fetch_all(&mut conn)
            .await
            .unwrap();
            let n = ids.len();
            let custom = explain(crate::completer::COMPLETE_MANY)
                .bind(ids.clone())
                .bind(vec![1_i64; n])
                .bind(vec!["done"; n])
                .bind(vec![0_i64; n])
                .bind(vec![None::<String>; n])
                .bind(vec!["done"; n]);
            let custom = plan(&mut conn, custom).await;
            // Our own UUIDs and constants: nothing to inject.
            let array = |items: String, ty: &str| format!("'{{{items}}}'::{ty}[]");
            let args = [
                array(ids.join(","), "text"),
                array(vec!["1"; n].join(","), "int8"),
                array(vec!["done"; n].join(","), "text"),
                array(vec!["0"; n].join(","), "int8"),
                array(vec!["NULL"; n].join(","), "text"),
                array(vec!["done"; n].join(","), "text"),
            ]
            .join(", ");
            let types = "text[], int8[], text[], int8[], text[], text[]";
            let generic =
                generic_plan(&mut conn, crate::completer::COMPLETE_MANY, types, &args).await;
            for (name, plan) in [("custom", custom), ("generic", generic)] {
                assert!(
                    (plan.contains("using events_id_key on events")
                        || plan.contains("events_running"))
                        && !plan.contains("events_listing")
                        && !plan.contains("Seq Scan on events"),
                    "{moment}, {name} plan: the completion walks finished events:\n{plan}"
                );
            }
        }
    }

    /// Listing one topic reads its pending events from `events_claim`, its
    /// running ones from `events_running` and the finished ones from
    /// `events_listing`, instead of walking the other topics' events.
    #[tokio::test]
    async fn topic_listings_read_three_partial_indexes() {
        let mut conn = backlog(50).await;
        // A rare topic among the backlog of `t`: a tenth of it running, 40%
        // finished, the rest pending, interleaved.
        sqlx::query(
            "INSERT INTO mailroom.events (id, source, topic, dedup_key, status, max_attempts)
             SELECT mailroom.uuid_v7(), 'r', 'rare', g::text,
                    CASE WHEN g % 10 = 0 THEN 'running' WHEN g % 2 = 0 THEN 'done'
                         ELSE 'pending' END, 10
             FROM generate_series(1, 300) g",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::query("ANALYZE mailroom.events")
            .execute(&mut conn)
            .await
            .unwrap();
        let query = explain(LIST_TOPIC)
            .bind("rare")
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(None::<i64>)
            .bind(101_i64);
        let plan = plan(&mut conn, query).await;
        assert!(
            plan.contains("Index Scan Backward using events_claim")
                && plan.contains("events_running")
                && plan.contains("Index Scan Backward using events_listing")
                && !plan.contains("Seq Scan"),
            "{plan}"
        );
        // And the merged page is the newest 101 events of the topic.
        let page: Vec<i64> = sqlx::query(LIST_TOPIC)
            .bind("rare")
            .bind(None::<String>)
            .bind(None::<String>)
            .bind(None::<i64>)
            .bind(101_i64)
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let expected: Vec<i64> = sqlx::query_scalar(
            "SELECT seq FROM mailroom.events WHERE topic = 'rare' ORDER BY seq DESC LIMIT 101",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(page, expected);
    }

    /// A new table under its first backlog (no statistics yet): the second
    /// step of a sequential claim finds its candidates by `seq` through the
    /// primary key, not by filtering every pending row of the topic, and
    /// nothing in it scans the table.
    #[tokio::test]
    async fn sequential_recheck_finds_candidates_by_seq_without_statistics() {
        let mut conn = backlog(1000).await;
        let seqs: Vec<i64> = (1..=120).collect();
        for sql in [claim_locked!(head_block!()), claim_locked!(head_skip!())] {
            let query = explain(sql)
                .bind(30_000_000_i64)
                .bind("w")
                .bind(seqs.clone());
            let plan = plan(&mut conn, query).await;
            assert!(
                !plan.contains("events_claim"),
                "the re-check reads the pending index:\n{plan}"
            );
            // "Is any event of this key running?" reads an index too (the
            // planner may hash the running events once per statement).
            assert!(
                !plan.contains("Seq Scan"),
                "the re-check scans the table:\n{plan}"
            );
        }
    }
}
