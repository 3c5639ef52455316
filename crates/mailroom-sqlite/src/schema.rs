//! The schema, as an ordered list of migrations.
//!
//! Operators may query these tables (`sqlite3 mailroom.db`), so columns are
//! named plainly; times are INTEGER milliseconds since the Unix epoch.

use crate::sql::db;
use mailroom_core::{Result, StoreError};
use rusqlite::Connection;

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
    // 4: the statuses of SPEC §13, `cancelled` (withdrawn by an operator)
    // and `expired` (older than the topic's expire_after). Only the CHECK on
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
    // 6: scheduling (SPEC §13): priorities, events delivered later kept out
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
];

/// Applies the missing migrations. Runs on the writer thread inside its
/// `BEGIN IMMEDIATE` transaction, so a second process starting at the same
/// time waits for the lock and then finds nothing left to do.
pub(crate) fn migrate(conn: &Connection, now_ms: i64) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
            version    INTEGER PRIMARY KEY,
            applied_at INTEGER NOT NULL
        )",
    )
    .map_err(db("creating schema_migrations"))?;
    let current: i64 = conn
        .query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )
        .map_err(db("reading the schema version"))?;
    for (index, sql) in MIGRATIONS.iter().enumerate() {
        let version = i64::try_from(index).unwrap_or(i64::MAX).saturating_add(1);
        if version <= current {
            continue;
        }
        match sql {
            Sql(sql) => conn
                .execute_batch(sql)
                .map_err(db("applying a schema migration"))?,
            Code(step) => step(conn)?,
        }
        conn.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            (version, now_ms),
        )
        .map_err(db("recording a schema migration"))?;
        tracing::info!(version, "applied SQLite schema migration");
    }
    Ok(())
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
