//! The schema, as an ordered list of migrations.
//!
//! Operators may query these tables (`sqlite3 mailroom.db`), so columns are
//! named plainly; times are INTEGER milliseconds since the Unix epoch.

use crate::sql::db;
use mailroom_core::{Migrated, Migrations, Result, SchemaVersion, StoreError};
use rusqlite::{Connection, OptionalExtension};

/// A migration: a `.sql` file of `migrations/`, or a step that needs Rust
/// around its SQL.
enum Migration {
    Sql(&'static str),
    Code(fn(&Connection) -> Result<()>),
}
use Migration::{Code, Sql};

/// Migration `n` is `MIGRATIONS[n - 1]`; each file says what it does and
/// why. Append only; never edit a shipped one: SQLite keeps the text of
/// every `CREATE` as written, indentation and inline comments included.
const MIGRATIONS: &[Migration] = &[
    Sql(include_str!("../migrations/0001_events.sql")),
    Sql(include_str!("../migrations/0002_status_indexes.sql")),
    Sql(include_str!("../migrations/0003_attempts_finished.sql")),
    // 4: the statuses `cancelled` (withdrawn by an operator) and
    // `expired` (older than the topic's expire_after). Only the CHECK on
    // status changes, and it only widens, so the stored rows stay as they
    // are: SQLite's documented in-place edit of the table's definition
    // (sqlite.org/lang_altertable.html, "otherwise" procedure), not a copy
    // of the whole table. Their counts come from an index of their own, as
    // dead and skipped ones do.
    Code(widen_status_check),
    Sql(include_str!("../migrations/0005_traceparent.sql")),
    Sql(include_str!("../migrations/0006_scheduling.sql")),
    Sql(include_str!("../migrations/0007_counters.sql")),
    Sql(include_str!("../migrations/0008_counted_by_statements.sql")),
    Sql(include_str!("../migrations/0009_compatible_from.sql")),
    Sql(include_str!("../migrations/0010_event_version.sql")),
];

/// The migrations' count and compatibility marks (see
/// [`Migrations::compatible`]).
const SCHEMA: Migrations = Migrations {
    count: MIGRATIONS.len(),
    // Migration 9 added `schema_migrations.compatible_from`.
    compatible_from_column: 9,
    compatible: &[
        // Builds of 8 never read the column.
        (9, 8),
        // A nullable column older builds never name.
        (10, 8),
    ],
};

/// Applies the missing migrations. Runs on the writer thread inside its
/// `BEGIN IMMEDIATE` transaction, so a second process starting at the same
/// time waits for the lock and then finds nothing left to do. A schema
/// newer than this build's is left as it is (and refused unless
/// compatible).
pub(crate) fn migrate(conn: &Connection, now_ms: i64) -> Result<Migrated> {
    migrate_to(conn, now_ms, MIGRATIONS.len())
}

/// [`migrate`], up to migration `last` (tests fill older schemas with it).
fn migrate_to(conn: &Connection, now_ms: i64, last: usize) -> Result<Migrated> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version    INTEGER PRIMARY KEY,
            applied_at INTEGER NOT NULL
        )",
    )
    .map_err(db("creating schema_migrations"))?;
    let found = recorded(conn, Migrations::number(last))?;
    if let Some(done) = found.nothing_to_apply()? {
        return Ok(done);
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().take(last) {
        let version = index + 1;
        if Migrations::number(version) <= found.database {
            continue;
        }
        match sql {
            Sql(sql) => conn
                .execute_batch(sql)
                .map_err(db("applying a schema migration"))?,
            Code(step) => step(conn)?,
        }
        let recorded = match SCHEMA.compatible_from(version) {
            Some(floor) => conn.execute(
                "INSERT INTO schema_migrations (version, applied_at, compatible_from)
                 VALUES (?1, ?2, ?3)",
                (Migrations::number(version), now_ms, floor),
            ),
            None => conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                (Migrations::number(version), now_ms),
            ),
        };
        recorded.map_err(db("recording a schema migration"))?;
        tracing::info!(version, "applied SQLite schema migration");
    }
    Ok(Migrated {
        from: found.database,
        schema: recorded(conn, Migrations::number(last))?,
    })
}

/// The schema's version, read without changing anything
/// ([`Store::schema`](mailroom_core::Store::schema)): a database without
/// `schema_migrations` is version 0.
pub(crate) fn version(conn: &Connection) -> Result<SchemaVersion> {
    let build = SCHEMA.build();
    let exists: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_schema
                            WHERE type = 'table' AND name = 'schema_migrations')",
            [],
            |r| r.get(0),
        )
        .map_err(db("reading the schema version"))?;
    if !exists {
        return Ok(SchemaVersion::empty(build));
    }
    recorded(conn, build)
}

/// The newest recorded migration and its `compatible_from`, a column that
/// schemas before [`Migrations::compatible_from_column`] lack.
fn recorded(conn: &Connection, build: u32) -> Result<SchemaVersion> {
    const CTX: &str = "reading the schema version";
    let has_floor: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('schema_migrations')
                            WHERE name = 'compatible_from')",
            [],
            |r| r.get(0),
        )
        .map_err(db(CTX))?;
    let sql = if has_floor {
        "SELECT version, compatible_from FROM schema_migrations ORDER BY version DESC LIMIT 1"
    } else {
        "SELECT version, NULL FROM schema_migrations ORDER BY version DESC LIMIT 1"
    };
    let row: Option<(i64, Option<i64>)> = conn
        .query_row(sql, [], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(db(CTX))?;
    SchemaVersion::recorded(row, build)
}

/// Migration 4: `events.status` may also be `cancelled` or `expired`.
fn widen_status_check(conn: &Connection) -> Result<()> {
    const CTX: &str = "widening events.status";
    const OLD: &str = "CHECK (status IN ('pending', 'running', 'done', 'dead', 'skipped'))";
    const NEW: &str = "CHECK (status IN ('pending', 'running', 'done', 'dead', 'skipped', 'cancelled', 'expired'))";
    let version: i64 = conn
        .query_row("PRAGMA schema_version", [], |r| r.get(0))
        .map_err(db(CTX))?;
    conn.execute_batch("PRAGMA writable_schema = ON")
        .map_err(db(CTX))?;
    let edited = conn.execute(
        "UPDATE sqlite_schema SET sql = replace(sql, ?1, ?2) WHERE type = 'table' AND name = 'events'",
        (OLD, NEW),
    );
    // Every connection re-reads the schema when its version changes.
    let bumped = conn.execute_batch(&format!("PRAGMA schema_version = {}", version + 1));
    conn.execute_batch("PRAGMA writable_schema = OFF")
        .map_err(db(CTX))?;
    edited.map_err(db(CTX))?;
    bumped.map_err(db(CTX))?;
    let widened: bool = conn
        .query_row(
            "SELECT instr(sql, ?1) > 0 FROM sqlite_schema WHERE type = 'table' AND name = 'events'",
            [NEW],
            |r| r.get(0),
        )
        .map_err(db(CTX))?;
    if !widened {
        return Err(StoreError::Corrupt(
            "events.status: its CHECK constraint is not the one mailroom created".into(),
        ));
    }
    conn.execute_batch(
        "CREATE INDEX events_withdrawn ON events (topic, status)
             WHERE status IN ('cancelled', 'expired')",
    )
    .map_err(db(CTX))?;
    let ok: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(db(CTX))?;
    if ok != "ok" {
        return Err(StoreError::Corrupt(format!(
            "the database is not sound after widening events.status: {ok}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::migrate_to;
    use crate::{SqliteOptions, SqliteStore};
    use mailroom_core::{EventSearch, ListFilter, Status, Store};
    use std::time::Duration;

    /// The counters of migration 7 start from the rows already stored:
    /// a database of schema 5 with events in six statuses and their
    /// attempts migrates to stats, dead letters and traffic that count
    /// them.
    #[tokio::test]
    async fn the_counters_migration_counts_the_events_already_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let now = jiff::Timestamp::now().as_millisecond();
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            migrate_to(&conn, now, 5).unwrap();
            conn.execute_batch(&format!(
                "INSERT INTO events (id, source, topic, dedup_key, status, attempts, max_attempts,
                                     received_at)
                 SELECT 'id-' || n, 's', t, 'd-' || n, st, a, 3, {now} - 60000 * n
                 FROM (SELECT 1 AS n, 'a' AS t, 'pending' AS st, 0 AS a
                       UNION ALL SELECT 2, 'a', 'pending', 0 UNION ALL SELECT 3, 'a', 'done', 1
                       UNION ALL SELECT 4, 'a', 'dead', 3 UNION ALL SELECT 5, 'b', 'skipped', 3
                       UNION ALL SELECT 6, 'b', 'cancelled', 0 UNION ALL SELECT 7, 'b', 'running', 1
                       UNION ALL SELECT 8, 'b', 'dead', 3);
                 INSERT INTO attempts (event_seq, attempt, started_at, finished_at, outcome)
                 SELECT seq, 1, {now} - 1000, {now} - 500, CASE status WHEN 'done' THEN 'done' ELSE 'retry' END
                 FROM events WHERE attempts > 0;"
            ))
            .unwrap();
        }
        let store = SqliteStore::open(SqliteOptions::new(&path)).unwrap();
        store.migrate().await.unwrap();
        let stats = store.stats().await.unwrap();
        let counts: Vec<(String, Vec<(&str, u64)>)> = stats
            .iter()
            .map(|t| {
                let of = Status::ALL.iter().map(|s| (s.as_str(), t.count(*s)));
                (t.topic.clone(), of.filter(|(_, n)| *n > 0).collect())
            })
            .collect();
        assert_eq!(
            counts,
            [
                (
                    "a".to_owned(),
                    vec![("pending", 2), ("done", 1), ("dead", 1)]
                ),
                (
                    "b".to_owned(),
                    vec![
                        ("running", 1),
                        ("dead", 1),
                        ("skipped", 1),
                        ("cancelled", 1)
                    ]
                ),
            ]
        );
        let dead = EventSearch {
            filter: ListFilter {
                status: Some(Status::Dead),
                ..ListFilter::default()
            },
            ..EventSearch::default()
        };
        assert_eq!(store.count(&dead).await.unwrap(), 2);
        let traffic = store.throughput(Duration::from_secs(3600)).await.unwrap();
        let sum = traffic.iter().fold((0, 0, 0), |(r, d, f), t| {
            (r + t.received, d + t.done, f + t.failed)
        });
        assert_eq!(sum, (8, 1, 4), "received, attempts done, attempts failed");
    }

    /// The compatibility marks only ever name older builds, and only on
    /// migrations that record them.
    #[test]
    fn compatibility_marks_name_older_builds_only() {
        assert_eq!(super::SCHEMA.check(), Ok(()));
    }

    /// Schema versions across builds on SQLite: an empty file and an older
    /// schema read as behind (refused under `migrate = "never"`) without
    /// being changed, and migrate from their version; a newer schema (a
    /// higher version recorded) is refused, by `migrate` too, unless its
    /// newer migrations are marked compatible with this build.
    #[tokio::test]
    async fn schema_versions_are_read_refused_and_migrated() {
        use mailroom_core::{SchemaFit, StoreError};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.db");
        let build = super::MIGRATIONS.len() as u32;
        let store = SqliteStore::open(SqliteOptions::new(&path)).unwrap();
        let empty = store.schema().await.unwrap();
        assert_eq!((empty.database, empty.fit()), (0, SchemaFit::Behind));
        assert_eq!(
            store.schema().await.unwrap(),
            empty,
            "reading created nothing"
        );
        drop(store);

        let now = jiff::Timestamp::now().as_millisecond();
        migrate_to(&rusqlite::Connection::open(&path).unwrap(), now, 8).unwrap();
        let store = SqliteStore::open(SqliteOptions::new(&path)).unwrap();
        let older = store.schema().await.unwrap();
        assert_eq!((older.database, older.fit()), (8, SchemaFit::Behind));
        let msg = older.require_runnable().unwrap_err().to_string();
        assert!(
            msg.contains("mailroom migrate") && msg.contains("version 8"),
            "{msg}"
        );
        let m = store.migrate().await.unwrap();
        assert_eq!((m.from, m.schema.database, m.applied()), (8, build, true));
        assert_eq!(store.schema().await.unwrap().fit(), SchemaFit::Current);
        drop(store);

        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 0)",
            [build + 1],
        )
        .unwrap();
        let store = SqliteStore::open(SqliteOptions::new(&path)).unwrap();
        assert_eq!(store.schema().await.unwrap().fit(), SchemaFit::TooNew);
        let err = store.migrate().await.unwrap_err();
        assert!(matches!(err, StoreError::Schema(_)), "{err:?}");
        conn.execute(
            "UPDATE schema_migrations SET compatible_from = ?1 WHERE version = ?2",
            [build, build + 1],
        )
        .unwrap();
        let m = store.migrate().await.unwrap();
        assert_eq!(m.schema.fit(), SchemaFit::NewerCompatible);
        assert!(!m.applied());
    }
}
