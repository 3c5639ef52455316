//! The schema, as an ordered list of migrations.
//!
//! Operators may query these tables (`sqlite3 mailroom.db`), so columns are
//! named plainly; times are INTEGER milliseconds since the Unix epoch.

use crate::sql::db;
use mailroom_core::{Migrated, Result, SchemaVersion, StoreError};
use rusqlite::{Connection, OptionalExtension};

/// A migration: SQL, or a step that needs Rust around its SQL.
enum Migration {
    Sql(&'static str),
    Code(fn(&Connection) -> Result<()>),
}
use Migration::{Code, Sql};

/// Migration `n` is `MIGRATIONS[n - 1]`. Append only; never edit a shipped one.
const MIGRATIONS: &[Migration] = &[
    // 1: events and their attempt history.
    Sql("
    CREATE TABLE events (
        seq             INTEGER PRIMARY KEY AUTOINCREMENT, -- arrival (= commit) order
        id              TEXT    NOT NULL UNIQUE,           -- UUIDv7
        source          TEXT    NOT NULL,
        topic           TEXT    NOT NULL,
        dedup_key       TEXT    NOT NULL,
        key             TEXT,
        type            TEXT,
        status          TEXT    NOT NULL
                        CHECK (status IN ('pending', 'running', 'done', 'dead', 'skipped')),
        attempts        INTEGER NOT NULL DEFAULT 0,
        max_attempts    INTEGER NOT NULL,
        next_attempt_at INTEGER,                           -- set while pending
        received_at     INTEGER NOT NULL,
        lease_until     INTEGER,                           -- set while running
        started_at      INTEGER,                           -- start of the current/last attempt
        worker          TEXT,                              -- worker of the current/last attempt
        correlation_id  TEXT,
        causation_id    TEXT,
        content_type    TEXT,
        payload         BLOB,                              -- NULL once retention dropped it
        last_error      TEXT,
        UNIQUE (source, dedup_key)
    );
    -- Claims scan one topic's pending events in arrival order.
    CREATE INDEX events_claim ON events (topic, status, seq, next_attempt_at);
    -- Sequential topics: the open events of a key, to find its head.
    CREATE INDEX events_open_keys ON events (topic, key, seq)
        WHERE key IS NOT NULL AND status IN ('pending', 'running', 'dead');
    -- Running events only: lease rescue, and 'is this key busy?'.
    CREATE INDEX events_running ON events (topic, key) WHERE status = 'running';

    CREATE TABLE attempts (
        event_seq   INTEGER NOT NULL,                      -- events.seq
        attempt     INTEGER NOT NULL,                      -- 1-based, keeps counting across replays
        started_at  INTEGER NOT NULL,
        finished_at INTEGER,
        outcome     TEXT    NOT NULL
                    CHECK (outcome IN ('done', 'retry', 'dead', 'lease_expired')),
        error       TEXT,
        worker      TEXT,
        PRIMARY KEY (event_seq, attempt)
    ) WITHOUT ROWID;
    "),
    // 2: an event changes status twice on its way to done; keep each change
    // cheap. A row is in an index whose WHERE names its status only while it
    // has that status, so a status change moves just the entries of the two
    // statuses involved. events_claim held every row under its status, and
    // events_open_keys every open one, so each change used to move both.
    // Claims now walk pending rows only, in arrival order; for sequential
    // topics that walk also finds each key's head (its first pending row),
    // so pending rows need no per-key index, whose entries landed on a
    // different page for every key. Running and dead rows of a key have
    // their own indexes. `stats` counts each status from its index
    // (done = all − the others).
    Sql("
    DROP INDEX events_claim;
    DROP INDEX events_open_keys;
    CREATE INDEX events_pending ON events (topic, seq, next_attempt_at, key)
        WHERE status = 'pending';
    CREATE INDEX events_dead_keys ON events (topic, key, seq)
        WHERE key IS NOT NULL AND status = 'dead';
    -- Every event by topic (and seq, the rowid): per-topic totals and listings.
    CREATE INDEX events_topic ON events (topic);
    CREATE INDEX events_settled ON events (topic, status) WHERE status IN ('dead', 'skipped');
    "),
    // 3: the attempts of the last minutes, for the failure_rate and
    // processing_time alerts (finished_at only grows: appends at the end).
    Sql("
    CREATE INDEX attempts_finished ON attempts (finished_at);
    "),
    // 4: the statuses `cancelled` (withdrawn by an operator) and
    // `expired` (older than the topic's expire_after). Only the CHECK on
    // status changes, and it only widens, so the stored rows stay as they
    // are: SQLite's documented in-place edit of the table's definition
    // (sqlite.org/lang_altertable.html, "otherwise" procedure), not a copy
    // of the whole table. Their counts come from an index of their own, as
    // dead and skipped ones do.
    Code(widen_status_check),
    // 5: the W3C traceparent received with an event, forwarded (as a child)
    // to its handler calls. NULL for events that came without one.
    Sql("
    ALTER TABLE events ADD COLUMN traceparent TEXT;
    "),
    // 6: scheduling: priorities, events delivered later kept out
    // of the claims' way, and the expiry clock.
    // - `priority`: claims take higher first. Most events keep the default
    //   0, so only the others have entries in `events_ranked`; claims of a
    //   topic without any walk `events_pending` alone, as before.
    // - `held_until`: the due time of an event delivered later (deliver_at,
    //   delay), NULL once a claim has found it due. It is the second column
    //   of `events_pending`, so the rows still held sort after the due ones
    //   (NULLs first): a claim walks `held_until IS NULL` in arrival order
    //   and never steps over the backlog of held rows, and the rows that
    //   fall due are one range (`held_until <= now`) of the same index.
    //   Rows stored under schema 5 with a later due time keep NULL and are
    //   claimed when due, as before.
    // - `ready_at`: when the expiry clock (`expire_after`) started: the
    //   first due time, or the last replay; NULL (rows stored before) means
    //   `received_at`.
    Sql("
    ALTER TABLE events ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE events ADD COLUMN held_until INTEGER;
    ALTER TABLE events ADD COLUMN ready_at INTEGER;
    DROP INDEX events_pending;
    CREATE INDEX events_pending ON events (topic, held_until, seq, next_attempt_at, priority, key)
        WHERE status = 'pending';
    CREATE INDEX events_ranked ON events (topic, priority DESC, seq)
        WHERE status = 'pending' AND priority <> 0 AND held_until IS NULL;
    -- Sequential topics: a held event holds back the later events of its key.
    CREATE INDEX events_held_keys ON events (topic, key, seq)
        WHERE held_until IS NOT NULL AND key IS NOT NULL;
    "),
    // 7: the dashboard's numbers without scans (the overview
    // page in under 100 ms with 1,000,000 events stored). Counting statuses read
    // an index entry per stored event and the traffic chart every event of
    // the last half hour; both now read counters that triggers keep in the
    // transaction of every change (the writer's group commit), so they are
    // exact whichever statement changes a status (claims, completions,
    // replay, skip, cancel, expiry, rescue, retention). SQLite triggers run
    // per row, inside the writer: no other writer waits on them.
    // - `topic_counts`: events per topic and status (backfilled here).
    // - `traffic`: per topic and minute, events received (by
    //   `received_at`) and attempts finished, done or failed: an attempt
    //   finishes exactly when its event leaves `running`, so the status
    //   change counts it, in the minute it happens. Maintenance drops
    //   minutes older than the store keeps (`sql::stats::TRAFFIC_KEPT`).
    // - `events_dead`: dead letters across topics (their page and count)
    //   without walking every event.
    Sql("
    CREATE TABLE topic_counts (
        topic  TEXT    NOT NULL,
        status TEXT    NOT NULL,
        n      INTEGER NOT NULL,
        PRIMARY KEY (topic, status)
    ) WITHOUT ROWID;
    INSERT INTO topic_counts (topic, status, n)
    SELECT topic, status, COUNT(*) FROM events GROUP BY topic, status;

    CREATE TABLE traffic (
        topic    TEXT    NOT NULL,
        minute   INTEGER NOT NULL,                   -- milliseconds since the epoch / 60,000
        received INTEGER NOT NULL DEFAULT 0,
        done     INTEGER NOT NULL DEFAULT 0,
        failed   INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (topic, minute)
    ) WITHOUT ROWID;
    INSERT INTO traffic (topic, minute, received)
    SELECT topic, received_at / 60000, COUNT(*) FROM events
    WHERE received_at >= (CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER) - 120) * 60000
    GROUP BY 1, 2;
    INSERT INTO traffic (topic, minute, done, failed)
    SELECT e.topic, a.finished_at / 60000, SUM(a.outcome = 'done'), SUM(a.outcome <> 'done')
    FROM attempts a JOIN events e ON e.seq = a.event_seq
    WHERE a.finished_at >= (CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER) - 120) * 60000
    GROUP BY 1, 2
    ON CONFLICT (topic, minute) DO UPDATE SET done = excluded.done, failed = excluded.failed;

    CREATE TRIGGER events_counted AFTER INSERT ON events BEGIN
        INSERT INTO topic_counts (topic, status, n) VALUES (new.topic, new.status, 1)
            ON CONFLICT (topic, status) DO UPDATE SET n = n + 1;
        INSERT INTO traffic (topic, minute, received) VALUES (new.topic, new.received_at / 60000, 1)
            ON CONFLICT (topic, minute) DO UPDATE SET received = received + 1;
    END;
    CREATE TRIGGER events_recounted AFTER UPDATE OF status ON events
    WHEN old.status <> new.status BEGIN
        UPDATE topic_counts SET n = n - 1 WHERE topic = old.topic AND status = old.status;
        INSERT INTO topic_counts (topic, status, n) VALUES (new.topic, new.status, 1)
            ON CONFLICT (topic, status) DO UPDATE SET n = n + 1;
        INSERT INTO traffic (topic, minute, done, failed)
        SELECT new.topic, CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER),
               new.status = 'done', new.status <> 'done'
        WHERE old.status = 'running'
        ON CONFLICT (topic, minute) DO UPDATE
            SET done = done + excluded.done, failed = failed + excluded.failed;
    END;
    CREATE TRIGGER events_uncounted AFTER DELETE ON events BEGIN
        UPDATE topic_counts SET n = n - 1 WHERE topic = old.topic AND status = old.status;
    END;

    CREATE INDEX events_dead ON events (seq) WHERE status = 'dead';
    "),
    // 8: the two status changes every event makes on its way to done —
    // pending → running (claims) and running → done (completions) — are
    // counted by the statements that make them, once per statement
    // (`sql::stats::count_moved`), instead of by the trigger once per row:
    // in a relay that trigger ran five statements per event, a tenth of
    // the writer's CPU. No other statement makes these two changes; every
    // other change is still counted by the trigger, so the counters stay
    // exact whichever statement changes a status.
    Sql("
    DROP TRIGGER events_recounted;
    CREATE TRIGGER events_recounted AFTER UPDATE OF status ON events
    WHEN old.status <> new.status
         AND NOT (old.status = 'pending' AND new.status = 'running')
         AND NOT (old.status = 'running' AND new.status = 'done') BEGIN
        UPDATE topic_counts SET n = n - 1 WHERE topic = old.topic AND status = old.status;
        INSERT INTO topic_counts (topic, status, n) VALUES (new.topic, new.status, 1)
            ON CONFLICT (topic, status) DO UPDATE SET n = n + 1;
        INSERT INTO traffic (topic, minute, done, failed)
        SELECT new.topic, CAST((julianday('now') - 2440587.5) * 1440 AS INTEGER),
               new.status = 'done', new.status <> 'done'
        WHERE old.status = 'running'
        ON CONFLICT (topic, minute) DO UPDATE
            SET done = done + excluded.done, failed = failed + excluded.failed;
    END;
    "),
    // 9: each recorded version says which older builds still run against
    // the schema it made (`compatible_from`; NULL: only builds that know
    // it), so a build that meets a newer schema than its own knows whether
    // to run or to refuse (`SchemaVersion`).
    Sql("
    ALTER TABLE schema_migrations ADD COLUMN compatible_from INTEGER;
    "),
];

/// Migrations that builds which do not know them still run against: the
/// version, and the oldest build version that runs against the schema it
/// makes (recorded as `compatible_from`). A migration not listed needs a
/// build that knows it. Only migrations that older builds cannot notice
/// qualify (a new table or index they do not use, a column with a default
/// that their statements do not name); never a dropped or renamed object,
/// a tightened constraint or a changed trigger. Listed versions are at
/// least [`COMPATIBLE_FROM_COLUMN`].
const COMPATIBLE_FROM: &[(usize, u32)] = &[
    // Builds of 8 never read the column.
    (9, 8),
];

/// The migration that added `schema_migrations.compatible_from`.
const COMPATIBLE_FROM_COLUMN: usize = 9;

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
    let found = recorded(conn, version_of(last))?;
    if found.database >= found.build {
        found.require_runnable()?;
        return Ok(Migrated {
            from: found.database,
            schema: found,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().take(last) {
        let version = index + 1;
        if version_of(version) <= found.database {
            continue;
        }
        match sql {
            Sql(sql) => conn
                .execute_batch(sql)
                .map_err(db("applying a schema migration"))?,
            Code(step) => step(conn)?,
        }
        let recorded = match compatible_from(version).filter(|_| version >= COMPATIBLE_FROM_COLUMN)
        {
            Some(floor) => conn.execute(
                "INSERT INTO schema_migrations (version, applied_at, compatible_from)
                 VALUES (?1, ?2, ?3)",
                (version_of(version), now_ms, floor),
            ),
            None => conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                (version_of(version), now_ms),
            ),
        };
        recorded.map_err(db("recording a schema migration"))?;
        tracing::info!(version, "applied SQLite schema migration");
    }
    Ok(Migrated {
        from: found.database,
        schema: recorded(conn, version_of(last))?,
    })
}

/// The schema's version, read without changing anything
/// ([`Store::schema`](mailroom_core::Store::schema)): a database without
/// `schema_migrations` is version 0.
pub(crate) fn version(conn: &Connection) -> Result<SchemaVersion> {
    let build = version_of(MIGRATIONS.len());
    let exists: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_schema
                            WHERE type = 'table' AND name = 'schema_migrations')",
            [],
            |r| r.get(0),
        )
        .map_err(db("reading the schema version"))?;
    if !exists {
        return Ok(SchemaVersion {
            database: 0,
            compatible_from: 0,
            build,
        });
    }
    recorded(conn, build)
}

/// The newest recorded migration and its `compatible_from`, a column that
/// schemas before [`COMPATIBLE_FROM_COLUMN`] lack.
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
    let (database, floor) = row.unwrap_or((0, None));
    let database = u32::try_from(database)
        .map_err(|_| StoreError::Corrupt(format!("schema version {database} out of range")))?;
    let compatible_from = floor
        .and_then(|f| u32::try_from(f).ok())
        .map_or(database, |f| f.min(database));
    Ok(SchemaVersion {
        database,
        compatible_from,
        build,
    })
}

/// Migration `n`'s number as recorded (`n` is at most a few dozen).
fn version_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The oldest build version that runs against the schema migration
/// `version` makes, when older than the migration itself.
fn compatible_from(version: usize) -> Option<u32> {
    COMPATIBLE_FROM
        .iter()
        .find(|(v, _)| *v == version)
        .map(|(_, floor)| *floor)
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
        use super::{COMPATIBLE_FROM, COMPATIBLE_FROM_COLUMN, MIGRATIONS};
        for &(version, floor) in COMPATIBLE_FROM {
            assert!(version >= COMPATIBLE_FROM_COLUMN && version <= MIGRATIONS.len());
            assert!((floor as usize) < version, "{version} marked from {floor}");
        }
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
