//! What an embedder enqueues: a [`Draft`] of an event, and why
//! [`Engine::enqueue`](crate::Engine::enqueue) may store nothing.

use crate::accept::Refused;
use bytes::Bytes;
use mailroom_core::StoreError;

/// Why [`Engine::enqueue`](crate::Engine::enqueue) stored nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The event breaks its topic's rules ([`crate::accept`]); retrying
    /// the same event cannot succeed.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The store failed; nothing was stored, so retrying may succeed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What to enqueue through [`Engine::enqueue`](crate::Engine::enqueue).
#[derive(Debug, Clone)]
pub struct Draft {
    pub(crate) topic: String,
    pub(crate) payload: Bytes,
    pub(crate) content_type: Option<String>,
    pub(crate) dedup_key: Option<String>,
    pub(crate) key: Option<String>,
    pub(crate) event_type: Option<String>,
    pub(crate) correlation_id: Option<String>,
    pub(crate) causation_id: Option<String>,
    pub(crate) version: Option<String>,
    pub(crate) traceparent: Option<String>,
    pub(crate) source: String,
    pub(crate) delivery: mailroom_core::Delivery,
    pub(crate) priority: i32,
}

impl Draft {
    /// An event for `topic` with raw payload bytes.
    pub fn bytes(topic: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            payload: payload.into(),
            content_type: None,
            dedup_key: None,
            key: None,
            event_type: None,
            correlation_id: None,
            causation_id: None,
            version: None,
            traceparent: None,
            source: "api".into(),
            delivery: mailroom_core::Delivery::Now,
            priority: 0,
        }
    }

    /// An event for `topic` with a JSON payload.
    pub fn json(topic: impl Into<String>, payload: &serde_json::Value) -> Self {
        let mut d = Self::bytes(topic, serde_json::to_vec(payload).unwrap_or_default());
        d.content_type = Some("application/json".into());
        d
    }

    /// The sender's id for deduplication (default: a fresh unique id, so no dedup).
    pub fn dedup_key(mut self, k: impl Into<String>) -> Self {
        self.dedup_key = Some(k.into());
        self
    }

    /// The ordering key: in a `sequential` topic, events of one key run one
    /// at a time in arrival order; in a `batch` topic with `group_by`, the
    /// batch it joins. Without one, the topic's `default_key` applies.
    pub fn key(mut self, k: impl Into<String>) -> Self {
        self.key = Some(k.into());
        self
    }

    /// The event's type (e.g. `invoice.paid`): shown and filtered on, sent
    /// to handlers, and usable in an AMQP handler's `routing_key`.
    pub fn event_type(mut self, t: impl Into<String>) -> Self {
        self.event_type = Some(t.into());
        self
    }

    /// The id that ties this event to the others of one business flow;
    /// handlers receive it (`mailroom-correlation-id`).
    pub fn correlation_id(mut self, c: impl Into<String>) -> Self {
        self.correlation_id = Some(c.into());
        self
    }

    /// The id of the event or command that caused this one; handlers
    /// receive it.
    pub fn causation_id(mut self, c: impl Into<String>) -> Self {
        self.causation_id = Some(c.into());
        self
    }

    /// The payload's schema version (default `"1"`): an AMQP handler
    /// publishes it as `mailroom-version` and the envelope's `version`.
    pub fn version(mut self, v: impl Into<String>) -> Self {
        self.version = Some(v.into());
        self
    }

    /// A follow-up of `cause` (the event a handler is running): caused by
    /// it (`causation_id` = its id) and in its flow (its correlation id,
    /// when it has one). A correlation id set afterwards replaces the
    /// cause's.
    pub fn follows(mut self, cause: &mailroom_core::Event) -> Self {
        self.causation_id = Some(cause.id.to_string());
        if let Some(c) = &cause.correlation_id {
            self.correlation_id = Some(c.clone());
        }
        self
    }

    /// The W3C `traceparent` the event arrived with, to be forwarded (as a
    /// child) to every handler call. A malformed one is ignored, per the
    /// W3C recommendation: the event is still taken, without a trace.
    pub fn traceparent(mut self, value: &str) -> Self {
        self.traceparent = mailroom_core::TraceParent::parse(value).map(|t| t.to_string());
        self
    }

    /// The payload's media type, sent with it to HTTP handlers (default:
    /// none for [`Draft::bytes`], `application/json` for [`Draft::json`]).
    pub fn content_type(mut self, c: impl Into<String>) -> Self {
        self.content_type = Some(c.into());
        self
    }

    /// Not claimed before `at` (`deliver_at`); stored and
    /// acknowledged at once.
    pub fn deliver_at(mut self, at: jiff::Timestamp) -> Self {
        self.delivery = mailroom_core::Delivery::At(at);
        self
    }

    /// Not claimed before `delay` after it is stored, on the store's clock.
    pub fn delay(mut self, delay: std::time::Duration) -> Self {
        self.delivery = mailroom_core::Delivery::After(delay);
        self
    }

    /// Claim order within the topic: higher runs first (default 0). In a
    /// sequential topic per-key order wins over it.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Source name recorded on the event (default `api`).
    pub fn source(mut self, s: impl Into<String>) -> Self {
        self.source = s.into();
        self
    }
}
