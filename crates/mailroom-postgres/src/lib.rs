//! # mailroom-postgres
//!
//! mailroom's scale-out backend: the [`Store`](mailroom_core::Store) trait
//! over one PostgreSQL database that any number of mailroom instances share
//! (claims with `FOR UPDATE SKIP LOCKED`, idle instances woken by
//! `LISTEN/NOTIFY`, maintenance on one elected instance).
//!
//! - [`PostgresStore`] (`store`): a connection pool and the trait. Every
//!   time that matters (leases, due times, `received_at`) is computed by
//!   PostgreSQL's clock, never an instance's; callers pass durations.
//! - `writer`: group commit for inserts. Concurrent inserts queue up and go
//!   to the database as one multi-row `INSERT ... ON CONFLICT DO NOTHING` in
//!   one transaction with one commit; callers are answered after it.
//!   `completer` does the same for completions (one fenced `UPDATE ... FROM
//!   UNNEST` per group).
//! - `sql`: the SQL of every operation, including the race-free per-key
//!   claim of sequential topics. `schema`: versioned migrations applied under
//!   a transaction-scoped advisory lock, including the outbox SQL function
//!   `mailroom.enqueue(...)`, and [`grants`], the rights a role needs to run
//!   mailroom on a schema another role owns.
//! - [`outbox`]: [`outbox::enqueue`], the Rust face of that function, for
//!   an application's own transaction.
//! - `listen`: `LISTEN mailroom_events`, re-broadcast to
//!   [`PostgresStore::subscribe`] receivers so idle dispatchers wake up.
//! - `timeouts`: how long every operation waits for the database, the
//!   pool's bounded health checks, and the server-side session bounds.
//! - [`PostgresOptions`]: pool size, group commit, queue bounds, from a
//!   `postgres://` URL; `direct`, a direct connection for the session work
//!   when the URL is a transaction-mode pooler (PgBouncer). `db`: how
//!   statements go through such a pooler (each in its own transaction).
//!   `tls`: libpq's `sslmode`, `sslrootcert`, `sslcert`, `sslkey` checked
//!   when the URL is read, TLS failures explained.
//!
//! Durability: connections run with `synchronous_commit = on`, so a method
//! that returns `Ok` has been flushed to the WAL: nothing is acknowledged
//! before it is durable.

#![deny(missing_docs)]

mod claim;
mod completer;
mod db;
mod listen;
mod options;
pub mod outbox;
mod schema;
mod sql;
mod store;
mod timeouts;
mod tls;
mod vacuum;
mod writer;

pub use listen::ANY_TOPIC;
pub use options::PostgresOptions;
pub use schema::grants;
pub use store::PostgresStore;

/// The channel `mailroom.enqueue` and every insert notify, with the topic as payload.
pub const NOTIFY_CHANNEL: &str = "mailroom_events";
