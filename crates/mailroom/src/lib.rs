//! # mailroom
//!
//! Reliable event intake and processing — the transactional inbox and the
//! transactional outbox — as a library you embed in a Rust program.
//! mailroom commits every event durably and deduplicated *before* it
//! answers, then hands it to your handler asynchronously: under a lease,
//! with retries and exponential backoff, per-key ordering or batching, and
//! a dead-letter store you can inspect and replay. The `mailroom` binary
//! (webhooks, RabbitMQ, an HTTP API and a dashboard) runs this same engine;
//! embedded, your program gets the engine without a server.
//!
//! ## Embedding it
//!
//! 1. **Open a store.** [`open_store`] takes `sqlite://path` (one file, the
//!    default) or a `postgres://` URL (any number of instances sharing one
//!    database); [`Store::migrate`] creates or updates its schema.
//! 2. **Declare topics.** A [`TopicSpec`] per stream of events: its
//!    [`Mode`] (`single`, `sequential` per key, or `batch`), concurrency,
//!    [`RetryPolicy`], attempt timeout and lease.
//! 3. **Give each topic a handler.** An async closure through
//!    [`handler::handler_fn`] that returns an [`Outcome`] (or a `Result`:
//!    `Ok` is done, `Err` a retry with backoff), or your own
//!    [`handler::Handler`]; the built-in HTTP and command handlers are in
//!    [`handler`] too. A topic without a handler is left to pull workers
//!    ([`Engine::pull`]).
//! 4. **Run.** [`Engine::run`] starts one loop per topic, which claims due
//!    events and runs their handler, plus the maintenance (lease rescue,
//!    retention, alerts), until the [`CancellationToken`] it was given is
//!    cancelled.
//! 5. **Enqueue.** [`Engine::enqueue`] takes a [`Draft`]; when it returns
//!    `Ok`, the event is committed. A dedup key already stored answers the
//!    stored event's id with `duplicate: true` and changes nothing, so
//!    retrying the call is safe.
//! 6. **Stop.** Cancel the token: `run` returns once the attempts in flight
//!    have finished, each bounded by its topic's timeout. Events not yet
//!    done stay in the store for the next run.
//!
//! ```
//! use mailroom::handler::handler_fn;
//! use mailroom::{Draft, Engine, Event, Status, TopicSpec};
//! use std::time::Duration;
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A store: one SQLite file (here in a throwaway directory), migrated.
//! let dir = tempfile::tempdir()?;
//! let url = format!("sqlite://{}", dir.path().join("app.db").display());
//! let store = mailroom::open_store(&url, true).await?;
//! store.migrate().await?;
//!
//! // A topic and its handler: `Ok` marks the event done, `Err` retries it.
//! let engine = Engine::builder(store)
//!     .topic(TopicSpec::new("emails").concurrency(8))
//!     .handler(
//!         "emails",
//!         handler_fn(|event: Event| async move {
//!             let body = String::from_utf8_lossy(event.payload.as_deref().unwrap_or_default());
//!             println!("sending {body} (attempt {})", event.attempts);
//!             Ok::<(), String>(())
//!         }),
//!     )
//!     .build()?;
//!
//! // Run it until `shutdown` is cancelled.
//! let shutdown = CancellationToken::new();
//! let running = tokio::spawn({
//!     let (engine, shutdown) = (engine.clone(), shutdown.clone());
//!     async move { engine.run(shutdown).await }
//! });
//!
//! // Enqueue: durable when it returns. The same dedup key again is a duplicate.
//! let welcome = Draft::json("emails", &serde_json::json!({"to": "ada@example.com"}))
//!     .dedup_key("welcome-ada");
//! let stored = engine.enqueue(welcome.clone()).await?;
//! let again = engine.enqueue(welcome).await?;
//! assert!(!stored.duplicate && again.duplicate);
//! assert_eq!(again.id, stored.id);
//!
//! // The handler runs soon after; its outcome is stored with the event.
//! tokio::time::timeout(Duration::from_secs(10), async {
//!     while engine.operator().get(stored.id).await?.map(|e| e.status) != Some(Status::Done) {
//!         tokio::time::sleep(Duration::from_millis(20)).await;
//!     }
//!     Ok::<_, mailroom::StoreError>(())
//! })
//! .await??;
//!
//! // Stop: `run` returns once the attempts in flight have ended.
//! shutdown.cancel();
//! running.await?;
//! # Ok(())
//! # }
//! ```
//!
//! `crates/mailroom/examples` has longer programs: a `single` topic whose
//! handler fails first attempts (the retry path), a `sequential` topic
//! (per-key order) and a `batch` topic. The book's embedding guide
//! (`docs/src/guides/embedding.md`) walks through them.
//!
//! ## One door per audience
//!
//! The crate root is the embedder's: [`Engine`], [`EngineBuilder`],
//! [`Draft`], the [`handler`]s and the types they name. Each other
//! audience has a view of the engine and a module holding it with the types
//! it names:
//!
//! - **Operators** ([`operate`], [`Engine::operator`]): `get`, `list`,
//!   `search`, `stats`, `replay`, `skip`, `cancel`, `purge`, `alerts`:
//!   what the HTTP API, the dashboard and the CLI call.
//! - **Pull workers** ([`pull`], [`Engine::pull`]): `claim`, `extend` and
//!   `finish` for processes that fetch events themselves, with the claim's
//!   [`FencingToken`](pull::FencingToken).
//! - **The server and the CLI** ([`hooks`], [`Engine::hooks`]): webhook
//!   intake for a declared [`SourceSpec`], body limits, and `enqueue` in
//!   its two halves (`accept`, then `insert`).
//! - **The outbox**: applications write events in their own database
//!   transaction (`mailroom_postgres::outbox::enqueue`, or the SQLite
//!   INSERT `mailroom_sqlite::OUTBOX_INSERT`); a running engine picks them
//!   up like any other.
//!
//! ## The data path
//!
//! 1. **intake** ([`intake`]): a webhook request (or [`Engine::enqueue`]) is
//!    verified, its dedup key / type / ordering key read, and a
//!    [`NewEvent`](hooks::NewEvent) built, which must pass its topic's rules ([`accept`]: the
//!    one rule set of every door, webhooks, API, library and AMQP);
//! 2. **store** ([`Store`]): the event is committed durably and
//!    deduplicated before anyone is answered (SQLite by default, grouped
//!    commits);
//! 3. **dispatcher**: one loop per topic claims due events under leases
//!    with fencing tokens, up to the topic's concurrency;
//! 4. **handler** ([`handler`]): HTTP, command, or your own async closure;
//! 5. **outcome**: the handler's [`Outcome`] is resolved by the topic's
//!    [`RetryPolicy`] into done / retry-later / dead and stored with the
//!    claim's token.
//!
//! [`spec`] describes topics and sources; the engine builder validates
//! them. The `mailroom.toml` file format lives in `mailroom-config`, the
//! HTTP server in `mailroom-server`, the CLI in `mailroom-cli`.
//!
//! [`CancellationToken`]: tokio_util::sync::CancellationToken

#![deny(missing_docs)]

pub mod accept;
pub mod answer;
pub mod clock;
pub mod dead_letter;
mod dispatch;
mod draft;
mod engine;
pub mod handler;
pub mod hooks;
pub mod intake;
mod maintenance;
pub mod metrics;
mod observe;
mod open;
pub mod operate;
pub mod otel;
pub mod pull;
mod shared;
pub mod spec;
#[cfg(test)]
mod stalled;
pub mod tls;

pub use accept::Refused;
pub use draft::{Draft, EnqueueError};
pub use engine::{BuildError, Engine, EngineBuilder};
// The domain and the storage contract as an embedder meets them; what only
// operators or pull workers name is in `operate` and `pull`, what only a
// store's writer names stays in `mailroom-core`.
pub use mailroom_core::{
    AlertRules, AlertRulesError, Attempt, AttemptOutcome, Backoff, BatchError, BatchSettings,
    Delivery, Event, EventId, Inserted, Mode, OnDead, Outcome, ParseEventIdError, Rate, RateError,
    Result, Retention, RetryPolicy, RetryPolicyError, Status, Store, StoreError, Timestamp,
};
pub use mailroom_core::{Migrated, SchemaFit, SchemaVersion};
pub use mailroom_core::{alert, duration, event, limit, redact};
pub use maintenance::AlertNotify;
pub use open::{open_store, open_store_with};
pub use spec::{Field, FieldError, SourceSpec, SourceSpecError, SpecError, TopicSpec};

/// The storage contract's own types, for a program that implements or
/// wraps a [`Store`] (the trait's doc comments are the contract); the
/// events, reports and claims its methods also name are at the root and
/// in [`operate`] and [`pull`].
pub mod store {
    pub use mailroom_core::{ClaimLimits, ClaimRequest, Grant, LimitedClaim, TopicStream};
}
