//! # mailroom-sqlite
//!
//! mailroom's embedded default backend: the [`Store`](mailroom_core::Store)
//! trait over one SQLite file (WAL, `synchronous=FULL`, concurrent writes
//! grouped into one commit).
//!
//! - [`SqliteStore`] (`store`): opens the file (WAL, `synchronous=FULL`,
//!   `busy_timeout` so the CLI can write to the same file) and implements
//!   the trait.
//! - `writer`: the one thread that owns the write connection. Concurrent
//!   writes queue up and share one transaction and one fsync (group commit);
//!   callers are answered only after the commit.
//! - `reader`: a small pool of read connections for get, list, stats and
//!   next_due.
//! - `sql`: the SQL of every operation. `schema`: versioned migrations.
//! - [`SqliteOptions`]: how to open it, including from `sqlite://` URLs.
//!
//! The store's clock is the process clock, read inside the store: SQLite runs
//! in-process, so that is the database clock.
//!
//! # Outbox on SQLite
//!
//! An application sharing the database file enqueues an event in the same
//! transaction as its business write with [`OUTBOX_INSERT`] (named
//! parameters `:topic`, `:type`, `:key`, `:payload`, `:dedup_key`, and
//! optionally `:correlation_id` and `:causation_id`). Rollback
//! leaves nothing; after commit a running `mailroom serve` picks the event up
//! within its polling interval (1 s). A repeated `:dedup_key` is ignored.
//! Nothing checks the row against its topic's rules at INSERT time: a NULL
//! `:key` in a sequential topic makes an independent event, run outside
//! every key's order (intake would have refused it).
//!
//! ```no_run
//! # fn main() -> rusqlite::Result<()> {
//! let mut conn = rusqlite::Connection::open("mailroom.db")?;
//! conn.busy_timeout(std::time::Duration::from_secs(5))?;
//! let tx = conn.transaction()?;
//! // ... the application's own writes ...
//! tx.execute(
//!     mailroom_sqlite::OUTBOX_INSERT,
//!     rusqlite::named_params! {
//!         ":topic": "orders",
//!         ":type": "order.created",
//!         ":key": "customer-7",
//!         ":payload": r#"{"order": 42}"#,
//!         ":dedup_key": "order-42-created",
//!     },
//! )?;
//! tx.commit()?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

mod connection;
mod options;
mod reader;
mod schema;
mod sql;
mod store;
mod throttle;
mod writer;

pub use options::SqliteOptions;

/// The documented outbox INSERT for applications sharing the SQLite file
/// (the outbox): run it inside your own transaction. `:payload` is JSON text (or
/// any bytes; bind a blob for binary); `:key` and `:type` may be NULL.
/// The event is stored pending with source `outbox`, 15 attempts, and a
/// random id (mailroom orders events by arrival, not by id). Optional
/// (NULL or left unbound means the default): `:deliver_at`, not
/// claimed before this instant (milliseconds since the Unix epoch; default
/// now), `:priority` (integer, higher first; default 0), and
/// `:correlation_id` and `:causation_id`, stored and given to handlers; a
/// follow-up that names its cause (`:causation_id`, the causing event's
/// id) and no correlation id keeps the cause's correlation id.
pub const OUTBOX_INSERT: &str = "\
INSERT INTO events (id, source, topic, dedup_key, key, type, status, attempts, max_attempts,
                    next_attempt_at, received_at, content_type, payload, priority,
                    held_until, ready_at, correlation_id, causation_id)
SELECT id, 'outbox', :topic, :dedup_key, :key, :type, 'pending', 0, 15,
       COALESCE(:deliver_at, now), now, 'application/json', :payload, COALESCE(:priority, 0),
       CASE WHEN :deliver_at > now THEN :deliver_at END, COALESCE(:deliver_at, now),
       COALESCE(:correlation_id, (SELECT c.correlation_id FROM events c WHERE c.id = :causation_id)),
       :causation_id
FROM (SELECT
    lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || substr(hex(randomblob(2)), 2) || '-' ||
          substr('89ab', 1 + (abs(random()) % 4), 1) || substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6))) AS id,
    CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) AS now)
WHERE true
ON CONFLICT (source, dedup_key) DO NOTHING";
pub use store::SqliteStore;
