//! The SQL of every store operation, as plain async functions of a pool,
//! one file per concern: [`rows`] (insert, get, list), [`claims`],
//! [`completions`] (complete, extend), [`admin`] (replay, skip),
//! [`maintenance`] (rescue, retention, election) and
//! [`stats`](mod@stats). This file holds what they share: error mapping,
//! time conversion and row decoding.
//!
//! Times cross the wire as `bigint` microseconds since the Unix epoch (the
//! resolution of `timestamptz`), so no date-time crate is needed between
//! PostgreSQL and [`jiff`]. Every instant that matters is computed by
//! PostgreSQL (`now()`: the transaction's start; `statement_timestamp()`
//! for claims' leases; `clock_timestamp()` for
//! [`Store::now`](mailroom_core::Store::now)); Rust only passes durations.
//! Why the statements are spelled as they are (index choice, generic
//! plans) is told in `docs/src/design/postgres.md`
//! and `docs/src/design/sequential.md`; the `plans` tests check it.

use crate::db::Db;
use bytes::Bytes;
use jiff::Timestamp;
use mailroom_core::{Event, EventId, Result, StoreError};
use sqlx::Row;
use sqlx::postgres::PgRow;
use std::time::Duration;

/// Longest duration passed to SQL (200 years): keeps `now() + d` inside
/// both `timestamptz` and [`Timestamp`], and exact as a `float8` of microseconds.
const MAX_DURATION_US: i64 = 200 * 366 * 86_400 * 1_000_000;

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
            us!("e.lease_until"),
            ", e.traceparent, e.priority"
        )
    };
}

mod admin;
#[macro_use]
mod claims;
mod completions;
mod limits;
mod maintenance;
#[cfg(test)]
mod plans;
mod rows;
mod stats;

pub(crate) use admin::{
    cancel, cancel_matching, count_matching, replay, replay_matching, search, skip,
};
pub(crate) use claims::{
    CLAIM_IDLE_LIMIT, CLAIM_LOCK_CLASS, Position, SEQUENTIAL_WINDOW, SPARSE_WINDOW, claim_from,
    claim_heads, claim_order, next_due, raise_waiting,
};
pub(crate) use completions::{complete, complete_many, extend};
pub(crate) use limits::{
    lock_and_count_running, pause_topic, paused_for, settle_tokens, take_tokens,
};
pub(crate) use maintenance::{expire, purge, rescue_expired, try_lead};
pub(crate) use rows::{get, insert_batch, list};
pub(crate) use stats::{attempt_window, fold_counters, stats, throughput};

/// Maps a database error to a [`StoreError`], saying what was being done.
/// Data exceptions (SQLSTATE class 22: bad text encoding, out-of-range
/// values) are the caller's input; everything else means the database could
/// not do its part, and intake must answer 503 / nack.
pub(crate) fn db(context: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |e| match &e {
        sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("22")) => {
            StoreError::Invalid(format!("postgres: {context}: {e}"))
        }
        _ => StoreError::Unavailable(format!("postgres: {context}: {}", crate::tls::describe(&e))),
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

pub(super) fn opt_ts(us: Option<i64>) -> Result<Option<Timestamp>> {
    us.map(ts).transpose()
}

pub(super) fn col<'r, T>(row: &'r PgRow, i: usize) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(i)
        .map_err(|e| StoreError::Corrupt(format!("column {i}: {e}")))
}

pub(super) fn count(row: &PgRow, i: usize) -> Result<u32> {
    let n: i64 = col(row, i)?;
    u32::try_from(n).map_err(|_| StoreError::Corrupt(format!("count {n} out of range")))
}

/// How many columns `event_cols!()` selects.
pub(super) const EVENT_COLS: usize = 20;

/// Decodes a row selected with `event_cols!()`; returns its `seq` too.
pub(super) fn event_from_row(row: &PgRow) -> Result<(i64, Event)> {
    let id: String = col(row, 1)?;
    let status: String = col(row, 7)?;
    let event = Event {
        id: EventId::parse_stored(&id)?,
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
        traceparent: col(row, 18)?,
        priority: col(row, 19)?,
        history: Vec::new(),
    };
    Ok((col(row, 0)?, event))
}

pub(super) fn events_from_rows(rows: &[PgRow]) -> Result<Vec<(i64, Event)>> {
    rows.iter().map(event_from_row).collect()
}

pub(crate) async fn now(pool: &Db) -> Result<Timestamp> {
    let us: i64 = sqlx::query_scalar(concat!("SELECT ", us!("clock_timestamp()")))
        .fetch_one(pool)
        .await
        .map_err(db("reading the database clock"))?;
    ts(us)
}
