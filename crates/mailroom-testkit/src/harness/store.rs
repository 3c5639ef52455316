//! Reads of the store the checker compares with the record: only the
//! documented columns of `events` (SQLite) / `mailroom.events` (PostgreSQL).

use super::HarnessError;
use super::check::Row;
use sqlx::{Connection, PgConnection};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Every event row, with the attempts mailroom cut at its timeout.
pub async fn rows(url: &str) -> Result<Vec<Row>, HarnessError> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        let path = path.to_owned();
        return tokio::task::spawn_blocking(move || sqlite_rows(&path))
            .await
            .map_err(|e| store("reading SQLite", e))?
            .map_err(|e| store("reading SQLite", e));
    }
    let mut c = PgConnection::connect(url)
        .await
        .map_err(|e| store("connecting to PostgreSQL", e))?;
    let rows: Vec<(String, String, String, Option<String>, String, i64)> = sqlx::query_as(
        "SELECT id::text, dedup_key, topic, key, status, attempts::bigint FROM mailroom.events",
    )
    .fetch_all(&mut c)
    .await
    .map_err(|e| store("reading mailroom.events", e))?;
    let cut: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT e.id::text, a.attempt::bigint FROM mailroom.attempts a \
         JOIN mailroom.events e ON e.seq = a.event_seq WHERE {TIMED_OUT}"
    )))
    .fetch_all(&mut c)
    .await
    .map_err(|e| store("reading mailroom.attempts", e))?;
    let _ = c.close().await;
    let rows = rows
        .into_iter()
        .map(|(id, dedup_key, topic, key, status, attempts)| Row {
            id,
            dedup_key,
            topic,
            key,
            status,
            attempts,
            timed_out: Vec::new(),
        })
        .collect();
    Ok(with_timeouts(rows, cut))
}

/// The attempts whose outcome mailroom recorded as a retry because its
/// timeout cut the handler (whatever the handler side saw): the attempt's
/// own "timed out after 2s", or the HTTP client's timeout (set to the
/// topic's) inside "request to ... failed: ...".
const TIMED_OUT: &str = "a.outcome = 'retry' AND a.error LIKE '%timed out%'";

fn with_timeouts(mut rows: Vec<Row>, cut: Vec<(String, i64)>) -> Vec<Row> {
    let mut by_id: HashMap<String, Vec<i64>> = HashMap::new();
    for (id, attempt) in cut {
        by_id.entry(id).or_default().push(attempt);
    }
    for r in &mut rows {
        r.timed_out = by_id.remove(&r.id).unwrap_or_default();
    }
    rows
}

fn store(what: &str, e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Store(format!("{what}: {e}"))
}

fn sqlite_rows(path: &str) -> rusqlite::Result<Vec<Row>> {
    let db =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    db.busy_timeout(Duration::from_secs(10))?;
    let mut st = db.prepare("SELECT id, dedup_key, topic, key, status, attempts FROM events")?;
    let rows = st
        .query_map([], |r| {
            Ok(Row {
                id: r.get(0)?,
                dedup_key: r.get(1)?,
                topic: r.get(2)?,
                key: r.get(3)?,
                status: r.get(4)?,
                attempts: r.get(5)?,
                timed_out: Vec::new(),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut st = db.prepare(&format!(
        "SELECT e.id, a.attempt FROM attempts a JOIN events e ON e.seq = a.event_seq WHERE {TIMED_OUT}"
    ))?;
    let cut = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(with_timeouts(rows, cut))
}

/// `PRAGMA integrity_check` of a SQLite store: `ok` or what it found.
pub fn sqlite_integrity(url: &str) -> Result<String, HarnessError> {
    let path = url
        .strip_prefix("sqlite://")
        .ok_or_else(|| HarnessError::Store(format!("not a SQLite URL: {url}")))?;
    let check = || -> rusqlite::Result<Vec<String>> {
        let db = rusqlite::Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?;
        let mut st = db.prepare("PRAGMA integrity_check")?;
        st.query_map([], |r| r.get(0))?.collect()
    };
    Ok(check()
        .map_err(|e| store("PRAGMA integrity_check", e))?
        .join("; "))
}

/// Waits until `settled(rows)` holds (or `limit` passes); how long it
/// took, `None` on time-out.
pub async fn settle(
    url: &str,
    settled: impl Fn(&[Row]) -> bool,
    limit: Duration,
) -> Result<Option<Duration>, HarnessError> {
    let started = Instant::now();
    loop {
        if settled(&rows(url).await?) {
            return Ok(Some(started.elapsed()));
        }
        if started.elapsed() > limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// No row is pending or running.
pub fn all_final(rows: &[Row]) -> bool {
    !rows
        .iter()
        .any(|r| r.status == "pending" || r.status == "running")
}
