//! # mailroom-core
//!
//! The domain of mailroom, in plain Rust with no I/O:
//!
//! - [`event`]: the event envelope ([`NewEvent`], [`Event`]), its [`Status`]
//!   machine and its attempt history ([`Attempt`]).
//! - [`retry`]: the [`RetryPolicy`] (exponential backoff with jitter, or an
//!   explicit schedule) that turns a failed attempt into a delay or `dead`.
//! - [`lease`]: claims, leases and fencing tokens ([`Claimed`], [`FencingToken`]).
//! - [`outcome`]: what a handler answers ([`Outcome`]) and what the store is
//!   told to record ([`Completion`]).
//! - [`mode`]: per-topic processing modes ([`Mode`]).
//! - [`store`]: the [`Store`] trait every storage backend implements, and the
//!   query/stats types it speaks.
//! - [`event_row`]: a stored event's columns, in the order both stores
//!   select them, and their one decoding.
//! - [`schema`]: schema versions ([`SchemaVersion`]): whether a build may
//!   run against a database's schema, and what a migration runner records
//!   ([`Migrations`]).
//! - [`cron`]: five-field UTC schedules for batch topics.
//! - [`alert`]: the `[alerts]` thresholds ([`AlertRules`]) and [`evaluate`](alert::evaluate).
//! - [`redact`]: URLs without their secrets and text without control
//!   characters, for everything shown to people and logs.
//! - [`duration`]: the `"100ms" | "2s" | "5m" | "1h" | "7d"` format used in
//!   configuration and on the command line.
//!
//! Everything that touches a disk, a socket or a clock lives in other crates;
//! the one exception is [`Timestamp::now`]-style helpers being *passed in*.

#![deny(missing_docs)]

pub mod alert;
pub mod cron;
pub mod duration;
pub mod error;
pub mod event;
pub mod event_row;
pub mod lease;
pub mod limit;
pub mod mode;
pub mod outcome;
pub mod redact;
pub mod retry;
pub mod schema;
pub mod store;
pub mod trace;

pub use alert::{Alert, AlertKind, AlertRules, AlertRulesError, AttemptWindow};
pub use error::{Result, StoreError};
pub use event::{
    Attempt, AttemptOutcome, Delivery, Event, EventId, NewEvent, ParseEventIdError, Status,
};
pub use jiff::Timestamp;
pub use lease::{Claimed, FencingToken};
pub use limit::{Grant, Rate, RateError};
pub use mode::{BatchError, BatchSettings, Mode, OnDead};
pub use outcome::{Completion, Outcome};
pub use retry::{Backoff, RetryPolicy, RetryPolicyError};
pub use schema::{Migrated, Migrations, SchemaFit, SchemaVersion};
pub use store::{
    ClaimLimits, ClaimRequest, EventSearch, Inserted, KeyCursor, LimitedClaim, ListFilter, Page,
    PurgeReport, ReplayReport, Retention, Store, Throughput, TopicStats, TopicStream,
    expiry_reason, pause_notice, paused_topic,
};
pub use trace::TraceParent;
