//! The event envelope, its status machine and its attempt history.
//!
//! ```text
//!            claim                 handler ok
//! pending ─────────► running ─────────────────► done
//!    ▲                 │ failure, attempts left
//!    └─────────────────┤ (next_attempt_at = now + backoff)
//!                      │ lease expired (rescue; the attempt counts)
//!                      │
//!                      └ attempts exhausted / permanent failure ──► dead
//! dead ──replay──► pending          dead ──skip──► skipped (sequential topics)
//! pending ──cancel──► cancelled ──replay──► pending
//! pending ──older than the topic's expire_after──► expired ──replay──► pending
//! ```

use bytes::Bytes;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

/// An event's id: a UUIDv7, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(value_type = uuid::Uuid))]
pub struct EventId(pub Uuid);

impl EventId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }
}

impl EventId {
    /// The smallest id that [`EventId::new`] can make at `t` or later (a
    /// UUIDv7 is its millisecond timestamp, then random bits): a bound for
    /// index range scans by creation time.
    pub fn first_at(t: jiff::Timestamp) -> Self {
        let ms = u128::try_from(t.as_millisecond()).unwrap_or(0) & ((1 << 48) - 1);
        Self(Uuid::from_u128(ms << 80))
    }

    /// Parses an id read back from a store: one that does not parse means
    /// the stored data is [`Corrupt`](crate::StoreError::Corrupt).
    pub fn parse_stored(text: &str) -> crate::Result<Self> {
        text.parse()
            .map_err(|e: ParseEventIdError| crate::StoreError::Corrupt(e.to_string()))
    }
}

impl Default for EventId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Why a text is not an [`EventId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an event id (a UUID such as 0190a5c4-7e1b-7c3a-9f00-3b6d2a1e4c55)")]
pub struct ParseEventIdError {
    /// The text, cut to 64 characters.
    pub text: String,
}

/// Parses the hyphenated UUID form that ids are shown in (any UUID form
/// `uuid` accepts); the one parser for ids from URLs, the CLI and stores.
impl FromStr for EventId {
    type Err = ParseEventIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self).map_err(|_| ParseEventIdError {
            text: s.chars().take(64).collect(),
        })
    }
}

/// Where an event is in its life. See the module docs for the transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Status {
    /// Waiting to be claimed once `next_attempt_at` has passed.
    Pending,
    /// Leased to one worker, under a fencing token.
    Running,
    /// Processed successfully; final.
    Done,
    /// Attempts exhausted or failure declared permanent; waits for an operator.
    Dead,
    /// A dead head of a sequential key that an operator chose to skip.
    Skipped,
    /// A pending event an operator withdrew before it ran.
    Cancelled,
    /// A pending event not run because it waited longer than its topic's
    /// `expire_after`; `last_error` says so. Final, like `done`, and
    /// replayable.
    Expired,
}

impl Status {
    /// Every status, in display order.
    pub const ALL: [Status; 7] = [
        Status::Pending,
        Status::Running,
        Status::Done,
        Status::Dead,
        Status::Skipped,
        Status::Cancelled,
        Status::Expired,
    ];

    /// The lowercase name used in APIs, SQL and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Done => "done",
            Status::Dead => "dead",
            Status::Skipped => "skipped",
            Status::Cancelled => "cancelled",
            Status::Expired => "expired",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                format!("unknown status {s:?} (expected pending, running, done, dead, skipped, cancelled or expired)")
            })
    }
}

/// When a new event may first be claimed: a sender's `deliver_at` (an
/// instant) or `delay` (a duration from now), else at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// As soon as it is stored.
    #[default]
    Now,
    /// Not before this instant.
    At(Timestamp),
    /// Not before this long after it is stored, on the store's clock.
    After(std::time::Duration),
}

/// The version of an event whose sender gave none.
pub const DEFAULT_VERSION: &str = "1";

/// The header (HTTP or AMQP) an event's version is read from when its
/// source names no `version` extractor, and AMQP handlers publish it in.
pub const VERSION_HEADER: &str = "mailroom-version";

/// An event as intake hands it to the store: everything but the processing state.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Fresh id; kept only if the dedup key is new.
    pub id: EventId,
    /// Where it came from: a webhook source name, an AMQP source, `api`, `outbox`.
    pub source: String,
    /// The topic that processes it.
    pub topic: String,
    /// The sender's id for the event; unique per source.
    pub dedup_key: String,
    /// Ordering / grouping key inside the topic.
    pub key: Option<String>,
    /// The sender's event type (e.g. `payment.created`).
    pub event_type: Option<String>,
    /// Correlation id carried along to handlers and logs.
    pub correlation_id: Option<String>,
    /// Id of the event that caused this one.
    pub causation_id: Option<String>,
    /// The payload's schema version, as the sender gave it (a source's
    /// `version` extractor, else its `mailroom-version` header); `None`
    /// is version `"1"` ([`DEFAULT_VERSION`]).
    pub version: Option<String>,
    /// W3C `traceparent` received with it (valid: see [`TraceParent`](crate::TraceParent)).
    pub traceparent: Option<String>,
    /// Content type of `payload`, as received.
    pub content_type: Option<String>,
    /// The payload bytes, exactly as received.
    pub payload: Bytes,
    /// Attempt budget, from the topic's retry policy.
    pub max_attempts: u32,
    /// When it may first be claimed (its first `next_attempt_at`).
    pub delivery: Delivery,
    /// Claim order within its topic: higher first (default 0).
    pub priority: i32,
}

/// One finished (or abandoned) attempt in an event's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    /// 1-based attempt number; keeps counting across replays.
    pub attempt: u32,
    /// When the claim started (store clock).
    pub started_at: Timestamp,
    /// When the outcome was recorded; `None` while it runs.
    pub finished_at: Option<Timestamp>,
    /// Done, retry, dead, or lease expired.
    pub outcome: AttemptOutcome,
    /// Error text, if it failed (a command's stderr tail, an HTTP status
    /// and body excerpt, ...).
    pub error: Option<String>,
    /// The worker id of the process that ran it (`hostname:pid` unless
    /// set), so an operator can tell instances apart.
    pub worker: Option<String>,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum AttemptOutcome {
    /// The handler succeeded; the event is done.
    Done,
    /// The handler failed; the event was rescheduled.
    Retry,
    /// The handler failed for the last time, or permanently.
    Dead,
    /// The lease ran out before an outcome arrived (the worker died or hung).
    LeaseExpired,
}

impl AttemptOutcome {
    /// The snake_case name used in APIs and SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Done => "done",
            AttemptOutcome::Retry => "retry",
            AttemptOutcome::Dead => "dead",
            AttemptOutcome::LeaseExpired => "lease_expired",
        }
    }
}

impl FromStr for AttemptOutcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "done" => Ok(Self::Done),
            "retry" => Ok(Self::Retry),
            "dead" => Ok(Self::Dead),
            "lease_expired" => Ok(Self::LeaseExpired),
            other => Err(format!("unknown attempt outcome {other:?}")),
        }
    }
}

/// A stored event with its processing state.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Time-ordered id (UUIDv7), assigned at intake.
    pub id: EventId,
    /// Where it came from: a webhook source name, an AMQP source, `api`,
    /// `outbox`.
    pub source: String,
    /// The topic whose handler processes it.
    pub topic: String,
    /// Sender's id, unique per source: a repeat is answered as a duplicate.
    pub dedup_key: String,
    /// Ordering key (sequential topics) or grouping key (batch topics with
    /// `group_by`).
    pub key: Option<String>,
    /// The sender's event type (e.g. `payment.created`).
    pub event_type: Option<String>,
    /// Claim order within its topic: higher first (default 0).
    pub priority: i32,
    /// Where it is in its life (pending, running, done, dead, ...).
    pub status: Status,
    /// Attempts started so far (the current one included while running).
    pub attempts: u32,
    /// Attempt budget; a replay raises it to `attempts + policy.max_attempts`.
    pub max_attempts: u32,
    /// When the next attempt may start (pending events).
    pub next_attempt_at: Option<Timestamp>,
    /// When intake committed it.
    pub received_at: Timestamp,
    /// Correlation id carried along to handlers and logs.
    pub correlation_id: Option<String>,
    /// Id of the event that caused this one.
    pub causation_id: Option<String>,
    /// The payload's schema version, as the sender gave it (a source's
    /// `version` extractor, else its `mailroom-version` header); `None`
    /// is version `"1"` ([`DEFAULT_VERSION`]).
    pub version: Option<String>,
    /// W3C `traceparent` received with it, forwarded (as a child) to every
    /// handler call.
    pub traceparent: Option<String>,
    /// Content type of the payload, as received.
    pub content_type: Option<String>,
    /// Payload bytes; `None` once retention purged them (the row stays for dedup).
    pub payload: Option<Bytes>,
    /// Error text of the last failed attempt.
    pub last_error: Option<String>,
    /// While running: when the lease ends (database clock).
    pub lease_until: Option<Timestamp>,
    /// Attempt history, oldest first; filled on single-event reads only.
    pub history: Vec<Attempt>,
}

/// Standard base64 with padding, without pulling a dependency into the domain.
pub fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_round_trip() {
        for st in Status::ALL {
            assert_eq!(st.as_str().parse::<Status>(), Ok(st));
        }
        assert!("paused".parse::<Status>().is_err());
    }

    #[test]
    fn ids_are_time_ordered() {
        let a = EventId::new();
        let b = EventId::new();
        assert!(a < b);
        assert_eq!(a.to_string().parse::<EventId>().ok(), Some(a));
        let err = "nope".parse::<EventId>().unwrap_err();
        assert_eq!(err.text, "nope");
        assert!(err.to_string().contains("is not an event id"), "{err}");
    }

    #[test]
    fn base64_matches_rfc4648_examples() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    }
}
