//! # mailroom-sqlite
//!
//! mailroom's embedded default backend: the [`Store`](mailroom_core::Store)
//! trait over one SQLite file (SPEC §11).
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

mod options;
mod reader;
mod schema;
mod sql;
mod store;
mod writer;

pub use options::SqliteOptions;
pub use store::SqliteStore;
