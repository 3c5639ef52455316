//! The name of every metric mailroom records, so each is spelled once
//! (`docs/src/reference/metrics.md` lists them for users). Call sites pass
//! these to the `metrics` crate's macros with the labels documented beside
//! each; labels stay bounded (source, topic, status,
//! outcome, alert, reason: never event ids). The binary installs the
//! exporter (`mailroom_server::prometheus`), which renders every
//! `_seconds` histogram as a Prometheus histogram (buckets 1 ms to 60 s).

/// Counter, labels `source`, `topic`, `outcome` (`accepted`, `duplicate`,
/// `rejected`): events offered to intake. `rejected`: refused by the
/// topic's rules, unusable (no dedup key), or not stored; a failed
/// signature counts in [`VERIFICATION_FAILURES`] instead.
pub const EVENTS_RECEIVED: &str = "mailroom_events_received_total";
/// Histogram, label `source`: from request to durable acknowledgement.
pub const INGEST_DURATION: &str = "mailroom_ingest_duration_seconds";
/// Counter, labels `topic`, `outcome` (`done`, `retry`, `dead`): attempts
/// ended.
pub const EVENTS_PROCESSED: &str = "mailroom_events_processed_total";
/// Counter, label `topic`: pending events that became `expired` (older
/// than their topic's `expire_after`).
pub const EVENTS_EXPIRED: &str = "mailroom_events_expired_total";
/// Histogram, label `topic`: how long attempts took.
pub const PROCESSING_DURATION: &str = "mailroom_processing_duration_seconds";
/// Gauge, labels `topic`, `status`: events per status.
pub const QUEUE_DEPTH: &str = "mailroom_queue_depth";
/// Gauge, label `topic`: dead events.
pub const DEAD_LETTER_DEPTH: &str = "mailroom_dead_letter_depth";
/// Gauge, label `topic`: age of the oldest pending event, in seconds.
pub const OLDEST_PENDING_AGE: &str = "mailroom_oldest_pending_age_seconds";
/// Gauge, label `topic`: keys held back by a dead head.
pub const BLOCKED_KEYS: &str = "mailroom_blocked_keys";
/// Counter, labels `topic`, `outcome` (`confirmed`, `returned`, `nacked`,
/// `error`): events published to a broker by a publishing handler.
pub const PUBLISHED: &str = "mailroom_published_total";
/// Gauge, labels `topic`, `alert`: 1 while the alert fires, else 0.
pub const ALERT_FIRING: &str = "mailroom_alert_firing";
/// Counter, label `source`: webhook requests refused by the source's rate
/// limit.
pub const RATE_LIMITED: &str = "mailroom_rate_limited_total";
/// Counter, labels `source`, `reason`: webhook signatures that failed
/// verification.
pub const VERIFICATION_FAILURES: &str = "mailroom_verification_failures_total";
/// Counter, labels `route` (`api`, `dashboard`, `login`) and `reason`
/// (`wrong_token`; `rate_limited`: refused unseen after too many wrong
/// ones from the same client): failed attempts to authenticate with the
/// API token. Never labelled by client.
pub const AUTH_FAILURES: &str = "mailroom_auth_failures_total";
/// Counter: HTTP requests shed because too many were in flight.
pub const HTTP_SHED: &str = "mailroom_http_shed_total";
/// Gauge, label `connection` (the broker URL without credentials): 1 while
/// the AMQP connection is up with its topology declared, else 0.
pub const AMQP_CONNECTED: &str = "mailroom_amqp_connected";
