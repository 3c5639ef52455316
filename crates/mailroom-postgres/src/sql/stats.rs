//! Stats: per-topic counts, oldest pending and blocked keys, and the recent
//! attempts that alerts judge. Each answer reads one snapshot, so its
//! numbers agree with each other.

use super::{col, db, micros, opt_ts};
use crate::db::Db;
use mailroom_core::{AttemptWindow, Result, Status, StoreError, Throughput, TopicStats};
use sqlx::{Postgres, Transaction};
use std::collections::BTreeMap;
use std::time::Duration;

type Tx = Transaction<'static, Postgres>;

/// A read-only transaction on one snapshot, for several statements.
async fn snapshot(pool: &Db, context: &'static str) -> Result<Tx> {
    pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .await
        .map_err(db(context))
}

/// A count or an age from SQL; negative ones (clock oddities) read as 0.
fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// See [`Store::attempt_window`](mailroom_core::Store::attempt_window): the
/// window's attempts come from the BRIN index `attempts_finished`
/// (`docs/src/design/postgres.md`); `percentile_disc` is the nearest-rank p95,
/// as on SQLite.
pub(crate) async fn attempt_window(pool: &Db, window: Duration) -> Result<Vec<AttemptWindow>> {
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
pub(crate) async fn stats(pool: &Db) -> Result<Vec<TopicStats>> {
    let mut tx = snapshot(pool, CTX).await?;
    let mut by_topic = counts(&mut tx).await?;
    oldest_pending(&mut tx, &mut by_topic).await?;
    blocked_keys(&mut tx, &mut by_topic).await?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(by_topic.into_values().collect())
}

/// Event counts per topic and status: the folded totals plus the changes
/// not folded yet (schema migration 12), from one snapshot.
async fn counts(tx: &mut Tx) -> Result<BTreeMap<String, TopicStats>> {
    let rows = sqlx::query(
        "SELECT topic, status, sum(n)::int8 FROM (
             SELECT topic, status, n FROM mailroom.counts
             UNION ALL
             SELECT topic, status, n FROM mailroom.count_changes
         ) c GROUP BY 1, 2 HAVING sum(n) > 0",
    )
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

/// The `received_at` of a topic's oldest pending event: the first in
/// arrival order (replays keep their place, as on SQLite). `queue_claim`
/// orders pending rows by priority first, so the first row of each
/// priority level is found by one index seek per level (a loose index
/// scan), and the earliest of those is the oldest: a few seeks, however
/// many events wait.
const OLDEST_PENDING: &str = concat!(
    "WITH RECURSIVE level (p) AS (
         (SELECT -q.priority FROM mailroom.queue q
          WHERE q.topic = $1 AND q.state = 'pending' ORDER BY -q.priority LIMIT 1)
         UNION ALL
         SELECT (SELECT -q.priority FROM mailroom.queue q
                 WHERE q.topic = $1 AND q.state = 'pending' AND -q.priority > l.p
                 ORDER BY -q.priority LIMIT 1)
         FROM level l WHERE l.p IS NOT NULL
     ), heads AS (
         SELECT (SELECT q.seq FROM mailroom.queue q
                 WHERE q.topic = $1 AND q.state = 'pending' AND -q.priority = l.p
                 ORDER BY q.seq LIMIT 1) AS seq
         FROM level l WHERE l.p IS NOT NULL
     )
     SELECT ",
    us!("e.received_at"),
    " FROM mailroom.events e WHERE e.seq = (SELECT min(seq) FROM heads)"
);

/// Sets `received_at` of each topic's oldest pending event.
async fn oldest_pending(tx: &mut Tx, by_topic: &mut BTreeMap<String, TopicStats>) -> Result<()> {
    for stats in by_topic.values_mut() {
        if stats.count(Status::Pending) == 0 {
            continue;
        }
        let oldest: Option<i64> = sqlx::query_scalar(OLDEST_PENDING)
            .bind(&stats.topic)
            .fetch_optional(&mut **tx)
            .await
            .map_err(db(CTX))?;
        stats.oldest_pending = opt_ts(oldest)?;
    }
    Ok(())
}

/// Sets each topic's blocked keys: those whose head (earliest open event)
/// is dead. The earlier open events are looked for in `queue_keys`, which
/// holds no running row, and in `queue_running`.
async fn blocked_keys(tx: &mut Tx, by_topic: &mut BTreeMap<String, TopicStats>) -> Result<()> {
    let rows = sqlx::query(
        "SELECT e.topic, count(DISTINCT e.key) FROM mailroom.queue e
         WHERE e.state = 'dead' AND e.key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM mailroom.queue p
               WHERE p.topic = e.topic AND p.key = e.key AND p.key IS NOT NULL
                 AND p.state <> 'running' AND p.seq < e.seq)
           AND NOT EXISTS (SELECT 1 FROM mailroom.queue r
               WHERE r.topic = e.topic AND r.key = e.key AND r.state = 'running'
                 AND r.seq < e.seq)
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

/// How long the per-minute counters are kept (maintenance drops older
/// minutes): the dashboard charts the last 30.
const TRAFFIC_KEPT: Duration = Duration::from_secs(2 * 3600);

/// See [`Store::throughput`](mailroom_core::Store::throughput): the folded
/// per-minute counters plus the changes not folded yet (schema migration
/// 10), from one snapshot; the minute that holds the window's start
/// counts whole.
pub(crate) async fn throughput(pool: &Db, window: Duration) -> Result<Vec<Throughput>> {
    const CTX: &str = "reading throughput";
    let mut tx = snapshot(pool, CTX).await?;
    let rows = sqlx::query(
        "WITH since AS (
             SELECT floor(extract(epoch FROM now() - make_interval(secs => $1::float8 / 1000000))
                          / 60)::int8 AS minute
         )
         SELECT topic, minute, sum(received)::int8, sum(done)::int8, sum(failed)::int8 FROM (
             SELECT topic, minute, received, done, failed FROM mailroom.traffic
             WHERE minute >= (SELECT minute FROM since)
             UNION ALL
             SELECT topic, minute, received, done, failed FROM mailroom.traffic_changes
             WHERE minute >= (SELECT minute FROM since)
         ) t GROUP BY 1, 2
         HAVING sum(received) > 0 OR sum(done) > 0 OR sum(failed) > 0",
    )
    .bind(micros(window))
    .fetch_all(&mut *tx)
    .await
    .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    let mut by_minute: BTreeMap<(String, i64), Throughput> = BTreeMap::new();
    for row in &rows {
        let minute: i64 = col(row, 1)?;
        let entry = minute_entry(&mut by_minute, col(row, 0)?, minute.saturating_mul(60))?;
        entry.received = unsigned(col(row, 2)?);
        entry.done = unsigned(col(row, 3)?);
        entry.failed = unsigned(col(row, 4)?);
    }
    Ok(by_minute.into_values().collect())
}

/// See [`Store::fold_counters`](mailroom_core::Store::fold_counters): moves
/// the change rows into the totals, each statement in one go (a change
/// row is deleted and added once: a concurrent fold skips the rows this one
/// deleted), and drops minutes older than [`TRAFFIC_KEPT`].
pub(crate) async fn fold_counters(pool: &Db) -> Result<()> {
    const CTX: &str = "folding the stats counters";
    sqlx::query(
        "WITH moved AS (DELETE FROM mailroom.count_changes RETURNING topic, status, n)
         INSERT INTO mailroom.counts AS c (topic, status, n)
         SELECT topic, status, sum(n) FROM moved GROUP BY 1, 2
         ON CONFLICT (topic, status) DO UPDATE SET n = c.n + EXCLUDED.n",
    )
    .execute(pool)
    .await
    .map_err(db(CTX))?;
    sqlx::query(
        "WITH moved AS (
             DELETE FROM mailroom.traffic_changes RETURNING topic, minute, received, done, failed
         )
         INSERT INTO mailroom.traffic AS t (topic, minute, received, done, failed)
         SELECT topic, minute, sum(received), sum(done), sum(failed) FROM moved GROUP BY 1, 2
         ON CONFLICT (topic, minute) DO UPDATE
         SET received = t.received + EXCLUDED.received, done = t.done + EXCLUDED.done,
             failed = t.failed + EXCLUDED.failed",
    )
    .execute(pool)
    .await
    .map_err(db(CTX))?;
    sqlx::query(
        "DELETE FROM mailroom.traffic
         WHERE minute < floor(extract(epoch FROM now() - make_interval(secs => $1::float8 / 1000000))
                              / 60)::int8",
    )
    .bind(micros(TRAFFIC_KEPT))
    .execute(pool)
    .await
    .map_err(db(CTX))?;
    Ok(())
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
