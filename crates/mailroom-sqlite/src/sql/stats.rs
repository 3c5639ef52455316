//! Stats: per-topic counts, oldest pending and blocked keys, and the recent
//! attempts that alerts judge, and the traffic per minute the dashboard
//! charts. Reads run in one transaction (see
//! `reader`), so the numbers of one answer agree with each other.

use super::{before, col, db, now_ms, opt_ts, ts};
use mailroom_core::{AttemptWindow, EventId, Result, Status, StoreError, Throughput, TopicStats};
use rusqlite::{Connection, OptionalExtension};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// What [`stats`] is doing, for its errors.
const CTX: &str = "computing stats";

/// Per-topic counts by status, oldest pending and blocked keys.
pub(crate) fn stats(conn: &Connection) -> Result<Vec<TopicStats>> {
    let mut by_topic = counts(conn)?;
    for stats in by_topic.values_mut() {
        // Arrival order: the first pending row is the oldest (replays keep
        // their place). Events delivered later and not yet due do not wait.
        let oldest: Option<i64> = conn
            .prepare_cached(
                "SELECT received_at FROM events INDEXED BY events_pending
                 WHERE topic = ?1 AND status = 'pending' AND held_until IS NULL
                 ORDER BY seq LIMIT 1",
            )
            .map_err(db(CTX))?
            .query_row([&stats.topic], |r| r.get(0))
            .optional()
            .map_err(db(CTX))?;
        stats.oldest_pending = opt_ts(oldest)?;
        if stats.count(Status::Dead) > 0 {
            stats.blocked_keys = blocked_keys(conn, &stats.topic)?;
        }
    }
    Ok(by_topic.into_values().collect())
}

/// `(topic, status, count)` rows of a counting statement.
fn count_by(conn: &Connection, sql: &str) -> Result<Vec<(String, String, u64)>> {
    let mut stmt = conn.prepare_cached(sql).map_err(db(CTX))?;
    let mut rows = stmt.query([]).map_err(db(CTX))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let count: i64 = col(row, 2)?;
        out.push((
            col(row, 0)?,
            col(row, 1)?,
            u64::try_from(count).unwrap_or(0),
        ));
    }
    Ok(out)
}

/// Event counts per topic and status. Each status but done is counted
/// from an index holding only it; done is what is left of the total
/// (`docs/perf/sqlite.md`).
fn counts(conn: &Connection) -> Result<BTreeMap<String, TopicStats>> {
    let totals = count_by(
        conn,
        "SELECT topic, 'all', COUNT(*) FROM events GROUP BY topic",
    )?;
    let mut parts = count_by(
        conn,
        "SELECT topic, 'pending', COUNT(*) FROM events WHERE status = 'pending' GROUP BY topic",
    )?;
    parts.extend(count_by(
        conn,
        "SELECT topic, 'running', COUNT(*) FROM events WHERE status = 'running' GROUP BY topic",
    )?);
    parts.extend(count_by(
        conn,
        "SELECT topic, status, COUNT(*) FROM events
         WHERE status IN ('dead', 'skipped') GROUP BY topic, status",
    )?);
    parts.extend(count_by(
        conn,
        "SELECT topic, status, COUNT(*) FROM events
         WHERE status IN ('cancelled', 'expired') GROUP BY topic, status",
    )?);
    let mut by_topic: BTreeMap<String, TopicStats> = totals
        .into_iter()
        .map(|(topic, _, total)| {
            let mut stats = TopicStats {
                topic: topic.clone(),
                ..TopicStats::default()
            };
            stats.counts.insert(Status::Done.as_str(), total);
            (topic, stats)
        })
        .collect();
    for (topic, status, count) in parts {
        let status: Status = status.parse().map_err(StoreError::Corrupt)?;
        let Some(stats) = by_topic.get_mut(&topic) else {
            continue;
        };
        if let Some(done) = stats.counts.get_mut(Status::Done.as_str()) {
            *done = done.saturating_sub(count);
        }
        stats.counts.insert(status.as_str(), count);
    }
    for stats in by_topic.values_mut() {
        stats.counts.retain(|_, n| *n > 0);
    }
    Ok(by_topic)
}

/// Keys of `topic` whose earliest open event (pending, running or dead) is
/// dead. Pending rows are walked in arrival order only as far as the last
/// such dead event.
fn blocked_keys(conn: &Connection, topic: &str) -> Result<u64> {
    const CTX: &str = "counting blocked keys";
    let earliest = |status: &str| -> Result<HashMap<String, i64>> {
        let mut stmt = conn
            .prepare_cached(
                "SELECT key, MIN(seq) FROM events
                 WHERE topic = ?1 AND status = ?2 AND key IS NOT NULL GROUP BY key",
            )
            .map_err(db(CTX))?;
        let rows = stmt
            .query_map((topic, status), |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(db(CTX))?;
        rows.collect::<rusqlite::Result<_>>().map_err(db(CTX))
    };
    let dead = earliest("dead")?;
    let Some(&last) = dead.values().max() else {
        return Ok(0);
    };
    let running = earliest("running")?;
    let mut first_pending: HashMap<String, i64> = HashMap::new();
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, key FROM events INDEXED BY events_pending
             WHERE topic = ?1 AND status = 'pending' AND held_until IS NULL AND seq < ?2
             ORDER BY seq",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query((topic, last)).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let seq: i64 = col(row, 0)?;
        if let Some(key) = col::<Option<String>>(row, 1)?
            && dead.contains_key(&key)
        {
            first_pending.entry(key).or_insert(seq);
        }
    }
    let before =
        |m: &HashMap<String, i64>, key: &str, seq: i64| m.get(key).is_some_and(|s| *s < seq);
    Ok(dead
        .iter()
        .filter(|(key, seq)| !before(&running, key, **seq) && !before(&first_pending, key, **seq))
        .count() as u64)
}

/// See [`Store::attempt_window`](mailroom_core::Store::attempt_window).
/// The window's attempts come from the index `attempts_finished`
/// (`docs/perf/sqlite.md`); the p95 is the nearest rank, `ceil(0.95 n)`-th
/// shortest.
pub(crate) fn attempt_window(conn: &Connection, window: Duration) -> Result<Vec<AttemptWindow>> {
    const CTX: &str = "reading recent attempts";
    let now = now_ms();
    let mut by_topic: BTreeMap<String, AttemptWindow> = BTreeMap::new();
    let mut stmt = conn
        .prepare_cached(
            "WITH w AS (
                 SELECT e.topic AS topic, a.outcome <> 'done' AS failed,
                        MAX(a.finished_at - a.started_at, 0) AS ms
                 FROM attempts a JOIN events e ON e.seq = a.event_seq
                 WHERE a.finished_at >= ?1),
             r AS (
                 SELECT topic, failed, ms,
                        ROW_NUMBER() OVER (PARTITION BY topic ORDER BY ms) AS rank,
                        COUNT(*) OVER (PARTITION BY topic) AS n
                 FROM w)
             SELECT topic, MAX(n), SUM(failed),
                    MAX(CASE WHEN rank = (95 * n + 99) / 100 THEN ms END)
             FROM r GROUP BY topic",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([before(now, window)]).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
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
                p95: p95.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
                longest_running: None,
            },
        );
    }
    longest_running(conn, now, &mut by_topic)?;
    Ok(by_topic.into_values().collect())
}

/// Sets, per topic, the age at `now` of the oldest attempt still running.
fn longest_running(
    conn: &Connection,
    now: i64,
    by_topic: &mut BTreeMap<String, AttemptWindow>,
) -> Result<()> {
    const CTX: &str = "reading recent attempts";
    let mut stmt = conn
        .prepare_cached(
            "SELECT topic, MIN(started_at) FROM events
             WHERE status = 'running' AND started_at IS NOT NULL GROUP BY topic",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([]).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let topic: String = col(row, 0)?;
        let started: i64 = col(row, 1)?;
        let age = Duration::from_millis(u64::try_from(now.saturating_sub(started)).unwrap_or(0));
        by_topic
            .entry(topic.clone())
            .or_insert_with(|| AttemptWindow {
                topic,
                ..AttemptWindow::default()
            })
            .longest_running = Some(age);
    }
    Ok(())
}

/// A minute's number (milliseconds since the epoch / 60,000).
const MINUTE_MS: i64 = 60_000;

/// See [`Store::throughput`](mailroom_core::Store::throughput): events
/// received per minute (found through the `id` index: ids are UUIDv7, so
/// time-ordered; the bound leaves a margin for the time between an id's
/// making and its commit), and attempts finished (`attempts_finished`).
pub(crate) fn throughput(conn: &Connection, window: Duration) -> Result<Vec<Throughput>> {
    const CTX: &str = "reading throughput";
    let since = before(now_ms(), window);
    let first_id = ts(before(since, Duration::from_secs(300)))
        .map(EventId::first_at)
        .map(|id| id.to_string())
        .unwrap_or_default();
    let mut by_minute: BTreeMap<(String, i64), Throughput> = BTreeMap::new();
    let mut received = conn
        .prepare_cached(
            "SELECT topic, received_at / ?3, COUNT(*) FROM events
             WHERE id >= ?1 AND received_at >= ?2 GROUP BY 1, 2",
        )
        .map_err(db(CTX))?;
    let mut rows = received
        .query(rusqlite::params![first_id, since, MINUTE_MS])
        .map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let n: i64 = col(row, 2)?;
        minute_entry(&mut by_minute, col(row, 0)?, col(row, 1)?)?.received = n.unsigned_abs();
    }
    let mut finished = conn
        .prepare_cached(
            "SELECT e.topic, a.finished_at / ?2, SUM(a.outcome = 'done'), SUM(a.outcome <> 'done')
             FROM attempts a JOIN events e ON e.seq = a.event_seq
             WHERE a.finished_at >= ?1 GROUP BY 1, 2",
        )
        .map_err(db(CTX))?;
    let mut rows = finished.query([since, MINUTE_MS]).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let (done, failed): (i64, i64) = (col(row, 2)?, col(row, 3)?);
        let entry = minute_entry(&mut by_minute, col(row, 0)?, col(row, 1)?)?;
        entry.done = done.unsigned_abs();
        entry.failed = failed.unsigned_abs();
    }
    Ok(by_minute.into_values().collect())
}

fn minute_entry(
    by_minute: &mut BTreeMap<(String, i64), Throughput>,
    topic: String,
    minute: i64,
) -> Result<&mut Throughput> {
    let start = ts(minute.saturating_mul(MINUTE_MS))?;
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
