//! What holds a topic's claims back, shared by every instance on the database:
//! the rate budget in `mailroom.topic_limits` (taken by
//! `mailroom.take_tokens`, migration 10), the topic pause, and
//! `max_running`, checked and filled under one advisory lock per topic.
//! None of it runs for a topic without limits.

use super::{db, micros, ts};
use crate::db::Db;
use mailroom_core::{Grant, Rate, Result, Timestamp};
use sqlx::postgres::PgConnection;
use std::time::Duration;

/// The first half of the advisory lock `max_running` claims of a topic take
/// (`pg_advisory_xact_lock(int, int)`, the second half `hashtext(topic)`):
/// a space of its own, apart from the claim locks of sequential topics
/// (`claim::claimer::CLAIM_LOCK_CLASS`) and from the one-`bigint` locks
/// (migrations).
const RUNNING_LOCK: i32 = 0x6d72_6c6d; // "mrlm"

/// Within a transaction: takes up to `want` tokens from `topic`'s budget
/// (`mailroom.take_tokens`). The budget's row stays locked until the
/// transaction ends, so no other instance takes from it before the caller
/// has claimed with the grant and [`settle_tokens`].
pub(crate) async fn take_tokens(
    conn: &mut PgConnection,
    topic: &str,
    rate: Rate,
    want: u32,
) -> Result<Grant> {
    let (granted, wait_ms): (i32, i64) =
        sqlx::query_as("SELECT granted, wait_ms FROM mailroom.take_tokens($1, $2, $3, $4)")
            .bind(topic)
            .bind(rate.per_second())
            .bind(f64::from(rate.grant()))
            .bind(i32::try_from(want).unwrap_or(i32::MAX))
            .fetch_one(conn)
            .await
            .map_err(db("taking rate tokens"))?;
    Ok(Grant {
        granted: u32::try_from(granted).unwrap_or(0),
        wait: Duration::from_millis(u64::try_from(wait_ms).unwrap_or(1)),
    })
}

/// Within the transaction of [`take_tokens`], after the claim made with
/// its `granted` tokens: spends only the `used` ones, as if they had been
/// taken when the claim was stamped (`at`, its `now()`; `None` when
/// nothing was claimed): the budget is refilled up to then, capped at one
/// grant, and the claimed events' tokens taken out. So the claims' own
/// stamps, not the moment the grant was taken, follow the bucket, and a
/// grant taken just before a window cannot claim inside it on top of that
/// window's budget.
pub(crate) async fn settle_tokens(
    conn: &mut PgConnection,
    topic: &str,
    rate: Rate,
    granted: u32,
    used: u32,
    at: Option<Timestamp>,
) -> Result<()> {
    sqlx::query(
        "UPDATE mailroom.topic_limits
         SET tokens = LEAST($3, tokens + $4 + $2 * GREATEST(0, EXTRACT(EPOCH FROM
                          timestamptz 'epoch' + $6 * interval '1 microsecond' - refilled_at
                      )::double precision)) - $5,
             refilled_at = GREATEST(refilled_at,
                                    timestamptz 'epoch' + $6 * interval '1 microsecond')
         WHERE topic = $1",
    )
    .bind(topic)
    .bind(rate.per_second())
    .bind(f64::from(rate.grant()))
    .bind(f64::from(granted))
    .bind(f64::from(used))
    .bind(at.map(Timestamp::as_microsecond))
    .execute(conn)
    .await
    .map_err(db("spending rate tokens"))?;
    Ok(())
}

/// Within a transaction: waits for `topic`'s `max_running` lock, then
/// counts its running events. The lock is held until the transaction ends,
/// so the caller claims and commits the claim before releasing it.
pub(crate) async fn lock_and_count_running(conn: &mut PgConnection, topic: &str) -> Result<u32> {
    const CTX: &str = "counting running events";
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(RUNNING_LOCK)
        .bind(topic)
        .execute(&mut *conn)
        .await
        .map_err(db(CTX))?;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM mailroom.queue WHERE topic = $1 AND state = 'running'",
    )
    .bind(topic)
    .fetch_one(&mut *conn)
    .await
    .map_err(db(CTX))?;
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Pauses `topic` until `pause` from now (or longer, if already paused
/// longer) and tells every instance; returns the end of the pause.
pub(crate) async fn pause_topic(pool: &Db, topic: &str, pause: Duration) -> Result<Timestamp> {
    let until: i64 = sqlx::query_scalar(concat!(
        "WITH p AS (
             INSERT INTO mailroom.topic_limits AS l (topic, paused_until)
             VALUES ($1, clock_timestamp() + make_interval(secs => $2::float8 / 1e6))
             ON CONFLICT (topic) DO UPDATE
             SET paused_until = GREATEST(l.paused_until, EXCLUDED.paused_until)
             RETURNING l.paused_until
         ), n AS (SELECT pg_notify('mailroom_events', $3))
         SELECT ",
        us!("p.paused_until"),
        " FROM p, n"
    ))
    .bind(topic)
    .bind(micros(pause))
    .bind(mailroom_core::pause_notice(topic))
    .fetch_one(pool)
    .await
    .map_err(db("pausing a topic"))?;
    ts(until)
}

/// How long `topic` stays paused from now, if it is.
pub(crate) async fn paused_for(pool: &Db, topic: &str) -> Result<Option<Duration>> {
    let left: Option<i64> = sqlx::query_scalar(
        "SELECT (extract(epoch FROM paused_until - clock_timestamp()) * 1000000)::int8
         FROM mailroom.topic_limits WHERE topic = $1 AND paused_until > clock_timestamp()",
    )
    .bind(topic)
    .fetch_optional(pool)
    .await
    .map_err(db("reading a topic's pause"))?;
    Ok(left.and_then(|us| u64::try_from(us).ok().map(Duration::from_micros)))
}
