//! # mailroom
//!
//! Reliable event intake and processing — the transactional inbox and outbox
//! — as an embeddable engine. The data path, top to bottom:
//!
//! 1. **intake** ([`intake`]): a webhook request (or [`Engine::enqueue`]) is
//!    verified, its dedup key / type / ordering key read, and a
//!    [`NewEvent`] built, which must pass its topic's rules ([`accept`]: the
//!    one rule set of every door, webhooks, API, library and AMQP);
//! 2. **store** ([`mailroom_core::Store`]): the event is committed durably and
//!    deduplicated before anyone is answered (SQLite by default, grouped
//!    commits);
//! 3. **dispatcher** (`dispatch`): one loop per topic claims due events under
//!    leases with fencing tokens, up to the topic's concurrency;
//! 4. **handler** ([`handler`]): HTTP, command, or your own async closure;
//! 5. **outcome**: the handler's [`Outcome`] is resolved by the topic's
//!    [`RetryPolicy`] into done / retry-later / dead and stored with the
//!    claim's token.
//!
//! [`topology`] describes topics and sources; the engine builder validates
//! them. The `mailroom.toml` file format lives in `mailroom-config`, the HTTP
//! server in `mailroom-server`, the CLI in `mailroom-cli`.
//!
//! ```no_run
//! use mailroom::{Draft, Engine, TopicSpec, handler::handler_fn};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = mailroom::open_store("sqlite://app.db", true).await?;
//! store.migrate().await?;
//! let engine = Engine::builder(store)
//!     .topic(TopicSpec::new("emails").concurrency(8))
//!     .handler("emails", handler_fn(|event: mailroom::Event| async move {
//!         println!("sending {}", event.id);
//!         Ok::<(), String>(())
//!     }))
//!     .build()?;
//! engine.enqueue(Draft::json("emails", &serde_json::json!({"to": "a@b.c"})).dedup_key("welcome-1")).await?;
//! let shutdown = CancellationToken::new();
//! engine.run(shutdown).await;
//! # Ok(()) }
//! ```

pub mod accept;
pub mod answer;
pub mod clock;
mod dispatch;
mod engine;
pub mod handler;
pub mod intake;
mod maintenance;
pub mod metrics;
mod observe;
mod open;
pub mod otel;
#[cfg(test)]
mod stalled;
pub mod tls;
pub mod topology;

pub use accept::Refused;
pub use engine::{
    Accepted, BuildError, ClaimError, Draft, Engine, EngineBuilder, EnqueueError, ReplayProgress,
};
// The domain and the storage contract, as a user of the engine (or the
// writer of a store) meets them; `mailroom-core`'s module tree stays there.
pub use mailroom_core::{
    Alert, AlertKind, AlertRules, AlertRulesError, Attempt, AttemptOutcome, AttemptWindow, Backoff,
    BatchError, BatchSettings, ClaimLimits, ClaimRequest, Claimed, Completion, Delivery, Event,
    EventId, EventSearch, FencingToken, Grant, Inserted, KeyCursor, LimitedClaim, ListFilter, Mode,
    NewEvent, OnDead, Outcome, Page, ParseEventIdError, PurgeReport, Rate, RateError, ReplayReport,
    Result, Retention, RetryPolicy, RetryPolicyError, Status, Store, StoreError, Throughput,
    Timestamp, TopicStats, TopicStream,
};
pub use mailroom_core::{Migrated, SchemaFit, SchemaVersion};
pub use mailroom_core::{alert, duration, event, limit, redact};
pub use maintenance::AlertNotify;
pub use open::{open_store, open_store_with};
pub use topology::{Field, FieldError, SourceSpec, SourceSpecError, SpecError, TopicSpec};
