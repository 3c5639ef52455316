//! Typed answers: the JSON that the HTTP API, the CLI's `--json` and batch
//! deliveries print, each shape built in one place, so every door shows
//! the same fields.
//!
//! - [`EventObject`]: the event object (API reads, `events show --json`,
//!   batch arrays, replays and skips); [`ClaimObject`] adds a pull claim's
//!   `token` and `lease_until`.
//! - [`EventList`]: `{"events": [...], "next_cursor": ... | null}`.
//! - [`StatsAnswer`]: `GET /v1/stats` and `mailroom status --json`: per
//!   topic counts by status, oldest pending age, blocked keys, rates over
//!   the last [`RATE_WINDOW`]; the alerts firing ([`AlertObject`]).
//!
//! With the `openapi` feature each shape also derives its JSON schema, which
//! mailroom-server's `/openapi.json` is built from.

use jiff::Timestamp;
use mailroom_core::{Alert, Attempt, AttemptWindow, Claimed, Event, EventId, Page, Status};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The window [`Rates`] are measured over.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

/// The event object, as every JSON door shows an event (times RFC 3339
/// UTC). `payload` is the JSON value when the body
/// is JSON, else null with `payload_base64` set (both null once retention
/// purged it); `history` appears on single-event reads only.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventObject<'a> {
    /// The event's id (a UUIDv7), as the API's routes take it.
    pub id: EventId,
    /// Where it came from: a webhook source's name, `api`, `outbox`, or an
    /// AMQP source's name.
    pub source: &'a str,
    /// The topic whose handler processes it.
    pub topic: &'a str,
    /// The sender's id, unique per source.
    pub dedup_key: &'a str,
    /// The ordering key (sequential topics) or grouping key (batch topics
    /// with `group_by`).
    pub key: Option<&'a str>,
    /// The event's type as the sender named it (e.g. `invoice.paid`).
    #[serde(rename = "type")]
    pub event_type: Option<&'a str>,
    /// Claim order within the topic: higher first (default 0).
    pub priority: i32,
    /// Where it is in its life: `pending`, `running`, `done`, `dead`,
    /// `skipped`, `cancelled` or `expired`.
    pub status: Status,
    /// Attempts started so far (a replay keeps counting).
    pub attempts: u32,
    /// The attempt number after which a failure makes it `dead`.
    pub max_attempts: u32,
    /// When the next attempt may start.
    pub next_attempt_at: Option<Timestamp>,
    /// When intake committed it.
    pub received_at: Timestamp,
    /// The id tying it to the other events of one business flow.
    pub correlation_id: Option<&'a str>,
    /// The id of the event or command that caused it.
    pub causation_id: Option<&'a str>,
    /// W3C `traceparent` received with the event (absent when none was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<&'a str>,
    /// The payload's media type as received (HTTP handlers send it on).
    pub content_type: Option<&'a str>,
    /// The payload as JSON, or null.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Value>))]
    pub payload: Value,
    /// The payload in base64 when it is not JSON.
    pub payload_base64: Option<String>,
    /// Error text of the last failed attempt.
    pub last_error: Option<&'a str>,
    /// Attempt history, oldest first (single-event reads).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<Attempt>>))]
    pub history: Option<&'a [Attempt]>,
}

impl<'a> EventObject<'a> {
    /// The object without `history` (lists, batches, claims, writes).
    pub fn summary(e: &'a Event) -> Self {
        let (payload, payload_base64) = match &e.payload {
            None => (Value::Null, None),
            Some(bytes) => match serde_json::from_slice::<Value>(bytes) {
                Ok(v) => (v, None),
                Err(_) => (
                    Value::Null,
                    Some(mailroom_core::event::base64_encode(bytes)),
                ),
            },
        };
        Self {
            id: e.id,
            source: &e.source,
            topic: &e.topic,
            dedup_key: &e.dedup_key,
            key: e.key.as_deref(),
            event_type: e.event_type.as_deref(),
            priority: e.priority,
            status: e.status,
            attempts: e.attempts,
            max_attempts: e.max_attempts,
            next_attempt_at: e.next_attempt_at,
            received_at: e.received_at,
            correlation_id: e.correlation_id.as_deref(),
            causation_id: e.causation_id.as_deref(),
            traceparent: e.traceparent.as_deref(),
            content_type: e.content_type.as_deref(),
            payload,
            payload_base64,
            last_error: e.last_error.as_deref(),
            history: None,
        }
    }

    /// The object with its attempt history (single-event reads).
    pub fn full(e: &'a Event) -> Self {
        Self {
            history: Some(&e.history),
            ..Self::summary(e)
        }
    }
}

/// A pull claim: the event object plus the claim's fencing `token` and the
/// end of its lease.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimObject<'a> {
    /// The claimed event, its fields at the top level of the object.
    #[serde(flatten)]
    pub event: EventObject<'a>,
    /// The fencing token to answer with.
    pub token: u32,
    /// When the lease ends (store clock).
    pub lease_until: Timestamp,
}

impl<'a> ClaimObject<'a> {
    /// The JSON shape of claim `c`.
    pub fn new(c: &'a Claimed) -> Self {
        Self {
            event: EventObject::summary(&c.event),
            token: c.token.0,
            lease_until: c.lease_until,
        }
    }
}

/// One page of a listing, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventList<'a> {
    /// The events, without history.
    pub events: Vec<EventObject<'a>>,
    /// Pass as `cursor` for the next page; null on the last one.
    pub next_cursor: Option<EventId>,
}

impl<'a> EventList<'a> {
    /// The JSON shape of `page`, its events without history.
    pub fn new(page: &'a Page) -> Self {
        Self {
            events: page.events.iter().map(EventObject::summary).collect(),
            next_cursor: page.next_cursor.map(|c| c.0),
        }
    }
}

/// What a bulk cancel did, or would do (`dry_run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CancelReport {
    /// Pending events that matched the filter when it was read.
    pub matching: u64,
    /// Events cancelled (0 on a dry run; may be fewer than `matching` if
    /// some started meanwhile).
    pub cancelled: u64,
}

/// Numbers per topic and the alerts firing.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StatsAnswer {
    /// Every declared topic and every topic with stored events, by name.
    pub topics: Vec<TopicAnswer>,
    /// The alerts firing now.
    #[serde(serialize_with = "alerts_json")]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<AlertObject>))]
    pub alerts: Vec<Alert>,
}

/// One topic's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TopicAnswer {
    /// The topic's name.
    pub topic: String,
    /// `single`, `sequential` or `batch` (`single` for an undeclared topic).
    pub mode: &'static str,
    /// `built-in` or `pull`.
    pub handler: &'static str,
    /// Events per status, every status present.
    pub counts: BTreeMap<&'static str, u64>,
    /// Seconds since the oldest pending event was received.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Keys held back by a dead head.
    pub blocked_keys: u64,
    /// Attempts finished lately.
    pub rates: Rates,
    /// Its scheduling limits and their use; null without limits
    /// or a pause.
    pub limits: Option<LimitsAnswer>,
}

/// A topic's scheduling limits (`rate`, `max_running`, a 429 pause) and
/// their use now.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitsAnswer {
    /// `rate` as configured (`"50/s"`), attempts started per period.
    pub rate: Option<String>,
    /// Attempts finished per second over the rate window (close to the
    /// started rate while the topic is busy); null where not read.
    pub attempts_per_second: Option<f64>,
    /// `max_running`: events running at once across instances.
    pub max_running: Option<u32>,
    /// Events running now (every instance).
    pub running: u64,
    /// Seconds left of a pause a handler's 429 + `Retry-After` asked for.
    pub paused_seconds: Option<f64>,
}

impl LimitsAnswer {
    /// One line for a human: `rate 50/s (48.2/s lately), max_running 4 (3
    /// running), paused 12.0s`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(rate) = &self.rate {
            parts.push(match self.attempts_per_second {
                Some(now) => format!("rate {rate} ({now:.1}/s lately)"),
                None => format!("rate {rate}"),
            });
        }
        if let Some(max) = self.max_running {
            parts.push(format!("max_running {max} ({} running)", self.running));
        }
        if let Some(p) = self.paused_seconds {
            parts.push(format!("paused {p:.1}s (429 Retry-After)"));
        }
        parts.join(", ")
    }
}

/// Attempts that finished over the last [`RATE_WINDOW`], per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rates {
    /// The window's length.
    pub window_seconds: u64,
    /// Attempts that ended `done`.
    pub done_per_second: f64,
    /// Attempts that failed (retried or dead).
    pub failed_per_second: f64,
}

impl Rates {
    /// The rates of one topic's attempt `window` over the last
    /// [`RATE_WINDOW`] (`None`: none finished).
    pub fn new(window: Option<&AttemptWindow>) -> Self {
        let secs = RATE_WINDOW.as_secs_f64();
        let (finished, failed) = window.map_or((0, 0), |w| (w.finished, w.failed));
        Self {
            window_seconds: RATE_WINDOW.as_secs(),
            done_per_second: finished.saturating_sub(failed) as f64 / secs,
            failed_per_second: failed as f64 / secs,
        }
    }
}

impl TopicAnswer {
    /// How many of the topic's events are in `status` (0 when none).
    pub fn count(&self, status: Status) -> u64 {
        self.counts.get(status.as_str()).copied().unwrap_or(0)
    }
}

/// An alert firing, as `/v1/stats` and `mailroom status --json` show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AlertObject<'a> {
    /// The topic the alert is about.
    pub topic: &'a str,
    /// The `[alerts]` key crossed: `dead_letter_depth`, `backlog`,
    /// `failure_rate` or `processing_time`.
    pub alert: &'static str,
    /// The measured value (seconds for `processing_time`).
    pub value: f64,
    /// The configured threshold (seconds for `processing_time`).
    pub threshold: f64,
    /// One line for a human: what crossed which threshold.
    pub message: &'a str,
}

impl<'a> AlertObject<'a> {
    /// The JSON shape of `alert`.
    pub fn new(alert: &'a Alert) -> Self {
        Self {
            topic: &alert.topic,
            alert: alert.kind.as_str(),
            value: alert.value,
            threshold: alert.threshold,
            message: &alert.message,
        }
    }
}

fn alerts_json<S: serde::Serializer>(alerts: &[Alert], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(alerts.iter().map(AlertObject::new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn sample(payload: &[u8]) -> Event {
        Event {
            id: EventId::new(),
            source: "s".into(),
            topic: "t".into(),
            dedup_key: "d".into(),
            key: None,
            event_type: Some("created".into()),
            priority: 0,
            status: Status::Pending,
            attempts: 0,
            max_attempts: 15,
            next_attempt_at: None,
            received_at: Timestamp::UNIX_EPOCH,
            correlation_id: None,
            causation_id: None,
            version: None,
            traceparent: None,
            content_type: None,
            payload: Some(Bytes::copy_from_slice(payload)),
            last_error: None,
            lease_until: None,
            history: vec![],
        }
    }

    /// `status` and the dashboard show what each limit is and how much of
    /// it is used, leaving out what is not set.
    #[test]
    fn limits_read_as_one_line() {
        let all = LimitsAnswer {
            rate: Some("50/s".into()),
            attempts_per_second: Some(48.25),
            max_running: Some(4),
            running: 3,
            paused_seconds: Some(12.0),
        };
        assert_eq!(
            all.summary(),
            "rate 50/s (48.2/s lately), max_running 4 (3 running), paused 12.0s (429 Retry-After)"
        );
        let capped = LimitsAnswer {
            rate: None,
            attempts_per_second: None,
            paused_seconds: None,
            ..all
        };
        assert_eq!(capped.summary(), "max_running 4 (3 running)");
    }

    /// Every field of the event object is present; a JSON payload is
    /// inlined, a binary one base64-encoded; `history` only on full reads.
    #[test]
    fn the_event_object_has_every_documented_field() {
        let e = sample(br#"{"a":1}"#);
        let j = serde_json::to_value(EventObject::summary(&e)).unwrap();
        let mut keys: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "attempts",
                "causation_id",
                "content_type",
                "correlation_id",
                "dedup_key",
                "id",
                "key",
                "last_error",
                "max_attempts",
                "next_attempt_at",
                "payload",
                "payload_base64",
                "priority",
                "received_at",
                "source",
                "status",
                "topic",
                "type"
            ]
        );
        assert_eq!(j["payload"]["a"], 1);
        assert_eq!(j["id"], e.id.to_string());
        assert_eq!(j["type"], "created");
        assert_eq!(j["status"], "pending");
        assert_eq!(j["received_at"], "1970-01-01T00:00:00Z");
        assert!(j["payload_base64"].is_null());
        let b = sample(b"\xff\x00");
        let j = serde_json::to_value(EventObject::full(&b)).unwrap();
        assert!(j["payload"].is_null());
        assert_eq!(j["payload_base64"], "/wA=");
        assert!(j["history"].is_array());
    }
}
