//! The doors into the store: [`Engine::enqueue`] for the library,
//! the API and AMQP sources, [`Engine::ingest_webhook`] for webhooks. Both
//! pass every event through the one rule set of [`crate::accept`] before
//! the store sees it; only an [`Accepted`] event is ever stored.

use super::Engine;
use crate::accept::{self, Refused};
use crate::intake::{self, IntakeError};
use crate::spec::{SourceSpec, TopicSpec};
use bytes::Bytes;
use http::HeaderMap;
use mailroom_core::{EventId, Inserted, NewEvent, StoreError};
use std::time::Instant;
use tracing::Instrument;

/// Why [`Engine::enqueue`] stored nothing.
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

/// An event that passed its topic's rules ([`crate::accept::check`]): the
/// only kind [`Engine::insert`] stores.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted(NewEvent);

impl Accepted {
    /// The event as it will be stored (default key and budget filled in).
    pub fn event(&self) -> &NewEvent {
        &self.0
    }
}

/// What to enqueue through [`Engine::enqueue`].
#[derive(Debug, Clone)]
pub struct Draft {
    topic: String,
    payload: Bytes,
    content_type: Option<String>,
    dedup_key: Option<String>,
    key: Option<String>,
    event_type: Option<String>,
    correlation_id: Option<String>,
    causation_id: Option<String>,
    traceparent: Option<String>,
    source: String,
    delivery: mailroom_core::Delivery,
    priority: i32,
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

impl Engine {
    /// Builds the event of `draft` and checks it against its topic's rules
    /// ([`crate::accept`]). A refusal is counted as a `rejected` intake.
    pub fn accept(&self, draft: Draft) -> Result<Accepted, Refused> {
        let Some(topic) = self.topic(&draft.topic) else {
            count_received(&draft.source, &draft.topic, "rejected");
            return Err(Refused::UnknownTopic(draft.topic));
        };
        let id = EventId::new();
        let event = NewEvent {
            id,
            source: draft.source,
            topic: draft.topic,
            dedup_key: draft.dedup_key.unwrap_or_else(|| id.to_string()),
            key: draft.key,
            event_type: draft.event_type,
            correlation_id: draft.correlation_id,
            causation_id: draft.causation_id,
            traceparent: draft.traceparent,
            content_type: draft.content_type,
            payload: draft.payload,
            max_attempts: topic.retry.max_attempts,
            delivery: draft.delivery,
            priority: draft.priority,
        };
        admit(topic, event)
    }

    /// Checks `draft` ([`Engine::accept`]), stores it durably (the call
    /// returns after the commit) and wakes its topic. Deduplicated by
    /// (source, dedup key).
    pub async fn enqueue(&self, draft: Draft) -> Result<Inserted, EnqueueError> {
        let accepted = self.accept(draft)?;
        Ok(self.insert(accepted).await?)
    }

    /// Stores an accepted event durably and wakes its topic, in an `intake`
    /// span: a child of the event's `traceparent`; with span export on
    /// ([`crate::otel`]) an event that came without one gets the span's,
    /// so its attempts join the trace that began here.
    pub async fn insert(&self, accepted: Accepted) -> Result<Inserted, StoreError> {
        let mut event = accepted.0;
        let topic = event.topic.clone();
        let source = event.source.clone();
        let span = tracing::info_span!("intake", topic = %topic, source = %source);
        crate::otel::adopt(&span, event.traceparent.as_deref());
        if event.traceparent.is_none() {
            event.traceparent = crate::otel::traceparent_of(&span);
        }
        let started = Instant::now();
        let result = self.inner.store.insert(event).instrument(span).await;
        let outcome = match &result {
            Ok(i) if i.duplicate => "duplicate",
            Ok(_) => "accepted",
            Err(_) => "rejected",
        };
        count_received(&source, &topic, outcome);
        metrics::histogram!(crate::metrics::INGEST_DURATION, "source" => source)
            .record(started.elapsed().as_secs_f64());
        if let Ok(i) = &result {
            if !i.duplicate {
                self.wake(&topic);
            }
        }
        result
    }

    /// Counts a webhook whose body was over its source's `max_body` (the
    /// server answers 413 before the body reaches [`Engine::ingest_webhook`])
    /// as a `rejected` intake of that source's topic. Unknown sources are
    /// not counted, as they are not elsewhere.
    pub fn count_oversized_webhook(&self, source: &str) {
        match self.inner.sources.get(source) {
            Some(spec) => count_received(&spec.name, &spec.topic, "rejected"),
            None if self.takes_undeclared(source) => count_received(source, source, "rejected"),
            None => {}
        }
    }

    /// Webhook intake: resolves the source, verifies the signature (first),
    /// extracts the envelope, checks it ([`crate::accept`]), stores durably.
    /// The caller answers 2xx only on `Ok`.
    pub async fn ingest_webhook(
        &self,
        source: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Inserted, IntakeError> {
        let implicit;
        let spec = match self.inner.sources.get(source) {
            Some(s) => s,
            None if self.takes_undeclared(source) => {
                implicit = SourceSpec::new(source, source);
                &implicit
            }
            None => return Err(IntakeError::UnknownSource(source.to_string())),
        };
        intake::verify::check(spec, headers, &body)?;
        let topic = self.inner.spec_or_default(&spec.topic);
        // An unusable body (no dedup key, bad JSON where a field is read)
        // is a rejected event, as an unusable AMQP message is; a failed
        // signature is not: it counts in `mailroom_verification_failures_total`.
        let event = intake::build_event(spec, &topic, headers, body)
            .inspect_err(|_| count_received(&spec.name, &topic.name, "rejected"))?;
        let accepted = admit(&topic, event).map_err(|refused| {
            let key_field = spec.key.as_ref().or(topic.key.as_ref());
            match key_field {
                Some(f) => refused.with_key_hint(intake::describe(f)),
                None => refused.with_key_hint("the topic has no key configured"),
            }
        })?;
        Ok(self.insert(accepted).await?)
    }
}

impl Engine {
    /// Whether an undeclared source `name` is taken (into a topic of the
    /// same name): only when the builder allows it, and never into a topic
    /// the engine knows, declared or named by a declared source, which
    /// would let unsigned events reach that topic's handler.
    fn takes_undeclared(&self, name: &str) -> bool {
        self.inner.accept_undeclared
            && valid_source_name(name)
            && !self.inner.topics.contains_key(name)
    }
}

/// [`accept::check`], counting a refusal as a `rejected` intake.
fn admit(topic: &TopicSpec, event: NewEvent) -> Result<Accepted, Refused> {
    let (source, name) = (event.source.clone(), event.topic.clone());
    accept::check(topic, event)
        .map(Accepted)
        .inspect_err(|refused| {
            tracing::debug!(source = %source, topic = %name, reason = %refused, "event refused");
            count_received(&source, &name, "rejected");
        })
}

fn count_received(source: &str, topic: &str, outcome: &'static str) {
    metrics::counter!(crate::metrics::EVENTS_RECEIVED, "source" => source.to_owned(), "topic" => topic.to_owned(), "outcome" => outcome)
        .increment(1);
}

fn valid_source_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}
