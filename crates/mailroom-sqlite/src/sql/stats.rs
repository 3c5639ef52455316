//! Stats: per-topic counts, oldest pending and blocked keys, and the recent
//! attempts that alerts judge, and the traffic per minute the dashboard
//! charts. Reads run in one transaction (see
//! `reader`), so the numbers of one answer agree with each other.

use super::{before, col, db, now_ms, opt_ts, ts};
use mailroom_core::{AttemptWindow, Result, Status, StoreError, Throughput, TopicStats};
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

/// Event counts per topic and status, from the counters the triggers of
/// schema migration 7 keep (`topic_counts`): one row per topic and status,
/// whatever the number of events.
fn counts(conn: &Connection) -> Result<BTreeMap<String, TopicStats>> {
    let mut stmt = conn
        .prepare_cached("SELECT topic, status, n FROM topic_counts WHERE n > 0")
        .map_err(db(CTX))?;
    let mut rows = stmt.query([]).map_err(db(CTX))?;
    let mut by_topic: BTreeMap<String, TopicStats> = BTreeMap::new();
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let topic: String = col(row, 0)?;
        let status: String = col(row, 1)?;
        let status: Status = status.parse().map_err(StoreError::Corrupt)?;
        let n: i64 = col(row, 2)?;
        by_topic
            .entry(topic.clone())
            .or_insert_with(|| TopicStats {
                topic,
                ..TopicStats::default()
            })
            .counts
            .insert(status.as_str(), n.unsigned_abs());
    }
    Ok(by_topic)
}

/// A status change that its statement counts (schema migration 8), not
/// the trigger.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Moved {
    /// pending → running: a claim.
    Claimed,
    /// running → done: a completion; also an attempt done this minute.
    Done,
}

/// Counts `n` events of `topic` moved as `moved` by the statement just
/// run, in its transaction: `topic_counts` (and `traffic` for `Done`, in
/// the minute the trigger would have used), set-based.
pub(crate) fn count_moved(conn: &Connection, topic: &str, moved: Moved, n: usize) -> Result<()> {
    const CTX: &str = "counting status changes";
    if n == 0 {
        return Ok(());
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    let (from, to) = match moved {
        Moved::Claimed => ("pending", "running"),
        Moved::Done => ("running", "done"),
    };
    conn.prepare_cached("UPDATE topic_counts SET n = n - ?3 WHERE topic = ?1 AND status = ?2")
        .map_err(db(CTX))?
        .execute((topic, from, n))
        .map_err(db(CTX))?;
    conn.prepare_cached(
        "INSERT INTO topic_counts (topic, status, n) VALUES (?1, ?2, ?3)
         ON CONFLICT (topic, status) DO UPDATE SET n = n + excluded.n",
    )
    .map_err(db(CTX))?
    .execute((topic, to, n))
    .map_err(db(CTX))?;
    if let Moved::Done = moved {
        conn.prepare_cached(
            "INSERT INTO traffic (topic, minute, done, failed)
             VALUES (?1, CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER), ?2, 0)
             ON CONFLICT (topic, minute) DO UPDATE SET done = done + excluded.done",
        )
        .map_err(db(CTX))?
        .execute((topic, n))
        .map_err(db(CTX))?;
    }
    Ok(())
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
/// (`docs/src/design/sqlite.md`); the p95 is the nearest rank, `ceil(0.95 n)`-th
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

/// How long the per-minute counters are kept (maintenance drops older
/// minutes): the dashboard charts the last 30.
pub(crate) const TRAFFIC_KEPT: Duration = Duration::from_secs(2 * 3600);

/// See [`Store::throughput`](mailroom_core::Store::throughput), from the
/// per-minute counters (`traffic`, schema migration 7): the minute that
/// holds the window's start counts whole.
pub(crate) fn throughput(conn: &Connection, window: Duration) -> Result<Vec<Throughput>> {
    const CTX: &str = "reading throughput";
    let since = before(now_ms(), window).div_euclid(MINUTE_MS);
    let mut by_minute: BTreeMap<(String, i64), Throughput> = BTreeMap::new();
    let mut stmt = conn
        .prepare_cached(
            "SELECT topic, minute, received, done, failed FROM traffic
             WHERE minute >= ?1 AND (received > 0 OR done > 0 OR failed > 0)",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([since]).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let (received, done, failed): (i64, i64, i64) = (col(row, 2)?, col(row, 3)?, col(row, 4)?);
        let entry = minute_entry(&mut by_minute, col(row, 0)?, col(row, 1)?)?;
        entry.received = received.unsigned_abs();
        entry.done = done.unsigned_abs();
        entry.failed = failed.unsigned_abs();
    }
    Ok(by_minute.into_values().collect())
}

/// Drops the per-minute counters older than [`TRAFFIC_KEPT`].
pub(crate) fn prune_traffic(conn: &Connection, now: i64) -> Result<()> {
    conn.prepare_cached("DELETE FROM traffic WHERE minute < ?1")
        .map_err(db("pruning traffic counters"))?
        .execute([before(now, TRAFFIC_KEPT).div_euclid(MINUTE_MS)])
        .map_err(db("pruning traffic counters"))?;
    Ok(())
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
