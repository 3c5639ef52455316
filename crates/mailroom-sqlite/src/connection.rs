//! Opening a connection to the store's file, with the settings every
//! mailroom connection needs (the writer's and the readers' alike).

use crate::sql::db;
use mailroom_core::{Result, StoreError};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::time::Duration;

/// Opens a connection with the pragmas every mailroom connection needs.
pub(crate) fn open_connection(path: &Path, busy: Duration, read_only: bool) -> Result<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI
    } else {
        OpenFlags::default()
    };
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| StoreError::Unavailable(format!("sqlite: opening {}: {e}", path.display())))?;
    conn.busy_timeout(busy)
        .map_err(db("setting busy_timeout"))?;
    conn.set_prepared_statement_cache_capacity(64);
    // Plan each cached statement once. Without the query planner stability
    // guarantee, SQLite (built with STAT4) recompiles a statement whenever a
    // new value is bound to a parameter that may steer its plan, such as a
    // claim's `LIMIT ?` and `next_attempt_at <= ?`: a parse and plan on
    // every claim. The claims name their index, so a value cannot improve
    // their plan.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(db("enabling the query planner stability guarantee"))?;
    if !read_only {
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(db("enabling WAL"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unavailable(format!(
                "sqlite: {} refused WAL mode (journal_mode is {mode})",
                path.display()
            )));
        }
    }
    // FULL: a commit is on disk (WAL fsynced) before anyone is told.
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = OFF;
         PRAGMA temp_store = MEMORY;
         PRAGMA cache_size = -16000;",
    )
    .map_err(db("setting pragmas"))?;
    Ok(conn)
}
