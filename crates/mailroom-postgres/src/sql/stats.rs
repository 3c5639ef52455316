//! Stats: per-topic counts, oldest pending and blocked keys, and the recent
//! attempts that alerts judge. Each answer reads one snapshot, so its
//! numbers agree with each other.

use super::{col, db, micros, opt_ts};
use mailroom_core::{AttemptWindow, EventId, Result, Status, StoreError, Throughput, TopicStats};
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::BTreeMap;
use std::time::Duration;

type Tx = Transaction<'static, Postgres>;

/// A read-only transaction on one snapshot, for several statements.
async fn snapshot(pool: &PgPool, context: &'static str) -> Result<Tx> {
    let mut tx = pool.begin().await.map_err(db(context))?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db(context))?;
    Ok(tx)
}

/// A count or an age from SQL; negative ones (clock oddities) read as 0.
fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// See [`Store::attempt_window`](mailroom_core::Store::attempt_window): the
/// window's attempts come from the BRIN index `attempts_finished`
/// (`docs/perf/postgres.md`); `percentile_disc` is the nearest-rank p95,
/// as on SQLite.
pub(crate) async fn attempt_window(pool: &PgPool, window: Duration) -> Result<Vec<AttemptWindow>> {
    const CTX: &str = "reading recent attempts";
    let mut tx = snapshot(pool, CTX).await?;
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
        let p95: Option<i64> = col(row, 3)?;
        by_topic.insert(
            topic.clone(),
            AttemptWindow {
                topic,
                finished: unsigned(col(row, 1)?),
                failed: unsigned(col(row, 2)?),
                p95: p95.map(|us| Duration::from_micros(unsigned(us))),
                longest_running: None,
            },
        );
    }
    longest_running(&mut tx, &mut by_topic).await?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(by_topic.into_values().collect())
}

/// Sets, per topic, the age of the oldest attempt still running.
async fn longest_running(
    tx: &mut Tx,
    by_topic: &mut BTreeMap<String, AttemptWindow>,
) -> Result<()> {
    let rows = sqlx::query(concat!(
        "SELECT q.topic, ",
        us!("now() - min(e.started_at)"),
        " FROM mailroom.queue q JOIN mailroom.events e ON e.seq = q.seq
         WHERE q.state = 'running' AND e.started_at IS NOT NULL GROUP BY q.topic"
    ))
    .fetch_all(&mut **tx)
    .await
    .map_err(db("reading recent attempts"))?;
    for row in &rows {
        let topic: String = col(row, 0)?;
        let age: i64 = col(row, 1)?;
        by_topic
            .entry(topic.clone())
            .or_insert_with(|| AttemptWindow {
                topic,
                ..AttemptWindow::default()
            })
            .longest_running = Some(Duration::from_micros(unsigned(age)));
    }
    Ok(())
}

/// What [`stats`] is doing, for its errors.
const CTX: &str = "computing stats";

/// Per-topic counts by status, oldest pending and blocked keys.
pub(crate) async fn stats(pool: &PgPool) -> Result<Vec<TopicStats>> {
    let mut tx = snapshot(pool, CTX).await?;
    let mut by_topic = counts(&mut tx).await?;
    oldest_pending(&mut tx, &mut by_topic).await?;
    blocked_keys(&mut tx, &mut by_topic).await?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(by_topic.into_values().collect())
}

/// Event counts per topic and status.
async fn counts(tx: &mut Tx) -> Result<BTreeMap<String, TopicStats>> {
    let rows =
        sqlx::query("SELECT topic, status, count(*) FROM mailroom.events GROUP BY topic, status")
            .fetch_all(&mut **tx)
            .await
            .map_err(db(CTX))?;
    let mut by_topic: BTreeMap<String, TopicStats> = BTreeMap::new();
    for row in &rows {
        let topic: String = col(row, 0)?;
        let status: String = col(row, 1)?;
        let status: Status = status.parse().map_err(StoreError::Corrupt)?;
        by_topic
            .entry(topic.clone())
            .or_insert_with(|| TopicStats {
                topic,
                ..TopicStats::default()
            })
            .counts
            .insert(status.as_str(), unsigned(col(row, 2)?));
    }
    Ok(by_topic)
}

/// Sets `received_at` of each topic's oldest pending event.
async fn oldest_pending(tx: &mut Tx, by_topic: &mut BTreeMap<String, TopicStats>) -> Result<()> {
    let rows = sqlx::query(concat!(
        "SELECT q.topic, ",
        us!("min(e.received_at)"),
        " FROM mailroom.queue q JOIN mailroom.events e ON e.seq = q.seq
         WHERE q.state = 'pending' GROUP BY q.topic"
    ))
    .fetch_all(&mut **tx)
    .await
    .map_err(db(CTX))?;
    for row in &rows {
        let topic: String = col(row, 0)?;
        if let Some(stats) = by_topic.get_mut(&topic) {
            stats.oldest_pending = opt_ts(col(row, 1)?)?;
        }
    }
    Ok(())
}

/// Sets each topic's blocked keys: those whose head (earliest open event)
/// is dead.
async fn blocked_keys(tx: &mut Tx, by_topic: &mut BTreeMap<String, TopicStats>) -> Result<()> {
    let rows = sqlx::query(
        "SELECT e.topic, count(DISTINCT e.key) FROM mailroom.queue e
         WHERE e.state = 'dead' AND e.key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM mailroom.queue p
               WHERE p.topic = e.topic AND p.key = e.key AND p.key IS NOT NULL
                 AND p.seq < e.seq)
         GROUP BY e.topic",
    )
    .fetch_all(&mut **tx)
    .await
    .map_err(db(CTX))?;
    for row in &rows {
        let topic: String = col(row, 0)?;
        if let Some(stats) = by_topic.get_mut(&topic) {
            stats.blocked_keys = unsigned(col(row, 1)?);
        }
    }
    Ok(())
}

/// See [`Store::throughput`](mailroom_core::Store::throughput): events
/// received per minute, found through the `id` index (ids are UUIDv7, so
/// time-ordered; the bound leaves a margin for clock skew and the time
/// between an id's making and its commit), and attempts finished (the BRIN
/// index `attempts_finished`), from one snapshot.
pub(crate) async fn throughput(pool: &PgPool, window: Duration) -> Result<Vec<Throughput>> {
    const CTX: &str = "reading throughput";
    let margin = window + Duration::from_secs(300);
    let first_id = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::try_from(margin).unwrap_or_default())
        .map(EventId::first_at)
        .unwrap_or_else(|_| EventId(uuid::Uuid::nil()));
    let mut tx = snapshot(pool, CTX).await?;
    let received = sqlx::query(
        "SELECT topic, extract(epoch FROM date_trunc('minute', received_at))::int8, count(*)::int8
         FROM mailroom.events
         WHERE id >= $1::text::uuid
           AND received_at >= now() - make_interval(secs => $2::float8 / 1000000)
         GROUP BY 1, 2",
    )
    .bind(first_id.to_string())
    .bind(micros(window))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(CTX))?;
    let finished = sqlx::query(
        "SELECT e.topic, extract(epoch FROM date_trunc('minute', a.finished_at))::int8,
                (count(*) FILTER (WHERE a.outcome = 'done'))::int8,
                (count(*) FILTER (WHERE a.outcome <> 'done'))::int8
         FROM mailroom.attempts a JOIN mailroom.events e ON e.seq = a.event_seq
         WHERE a.finished_at >= now() - make_interval(secs => $1::float8 / 1000000)
         GROUP BY 1, 2",
    )
    .bind(micros(window))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    let mut by_minute: BTreeMap<(String, i64), Throughput> = BTreeMap::new();
    for row in &received {
        minute_entry(&mut by_minute, col(row, 0)?, col(row, 1)?)?.received = unsigned(col(row, 2)?);
    }
    for row in &finished {
        let entry = minute_entry(&mut by_minute, col(row, 0)?, col(row, 1)?)?;
        entry.done = unsigned(col(row, 2)?);
        entry.failed = unsigned(col(row, 3)?);
    }
    Ok(by_minute.into_values().collect())
}

fn minute_entry(
    by_minute: &mut BTreeMap<(String, i64), Throughput>,
    topic: String,
    minute: i64,
) -> Result<&mut Throughput> {
    let start = jiff::Timestamp::from_second(minute)
        .map_err(|e| StoreError::Corrupt(format!("minute {minute} out of range: {e}")))?;
    Ok(by_minute
        .entry((topic.clone(), minute))
        .or_insert_with(|| Throughput {
            topic,
            minute: start,
            received: 0,
            done: 0,
            failed: 0,
        }))
}
