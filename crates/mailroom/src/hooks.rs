//! The server's and the CLI's hooks into an engine's intake
//! ([`Engine::hooks`](crate::Engine::hooks)): webhook intake, the body limit
//! a server reads before it, the count of an oversized one, and the two
//! halves of [`Engine::enqueue`](crate::Engine::enqueue) for doors that
//! answer between them (check, then store). Every event passes the one rule
//! set of [`crate::accept`] before the store sees it; only an [`Accepted`]
//! event is ever stored.

use crate::accept::{self, Refused};
use crate::draft::Draft;
use crate::intake;
use crate::shared::Shared;
use crate::spec::{SourceSpec, TopicSpec};
use bytes::Bytes;
use http::HeaderMap;
use mailroom_core::{EventId, Inserted, StoreError};
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

pub use crate::intake::IntakeError;
pub use mailroom_core::NewEvent;

/// An event that passed its topic's rules ([`crate::accept::check`]): the
/// only kind [`Hooks::insert`] stores.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted(NewEvent);

impl Accepted {
    /// The event as it will be stored (default key and budget filled in).
    pub fn event(&self) -> &NewEvent {
        &self.0
    }
}

/// The intake doors of one engine for a server or a CLI. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Hooks {
    shared: Arc<Shared>,
}

impl Hooks {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Builds the event of `draft` and checks it against its topic's rules
    /// ([`crate::accept`]). A refusal is counted as a `rejected` intake.
    pub fn accept(&self, draft: Draft) -> Result<Accepted, Refused> {
        accept_draft(&self.shared, draft)
    }

    /// Stores an accepted event durably and wakes its topic, in an `intake`
    /// span: a child of the event's `traceparent`; with span export on
    /// ([`crate::otel`]) an event that came without one gets the span's,
    /// so its attempts join the trace that began here.
    pub async fn insert(&self, accepted: Accepted) -> Result<Inserted, StoreError> {
        insert(&self.shared, accepted).await
    }

    /// The limit on a source's body (the default for undeclared sources).
    pub fn max_body(&self, source: &str) -> u64 {
        self.shared
            .sources
            .get(source)
            .map(|s| s.max_body)
            .unwrap_or(crate::spec::DEFAULT_MAX_BODY)
    }

    /// Counts a webhook whose body was over its source's `max_body` (the
    /// server answers 413 before the body reaches [`Hooks::ingest_webhook`])
    /// as a `rejected` intake of that source's topic. Unknown sources are
    /// not counted, as they are not elsewhere.
    pub fn count_oversized_webhook(&self, source: &str) {
        match self.shared.sources.get(source) {
            Some(spec) => count_received(&spec.name, &spec.topic, "rejected"),
            None if takes_undeclared(&self.shared, source) => {
                count_received(source, source, "rejected")
            }
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
        let spec = match self.shared.sources.get(source) {
            Some(s) => s,
            None if takes_undeclared(&self.shared, source) => {
                implicit = SourceSpec::new(source, source);
                &implicit
            }
            None => return Err(IntakeError::UnknownSource(source.to_string())),
        };
        intake::verify::check(spec, headers, &body)?;
        let topic = self.shared.spec_or_default(&spec.topic);
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
        Ok(insert(&self.shared, accepted).await?)
    }
}

/// [`Hooks::accept`], for [`Engine::enqueue`](crate::Engine::enqueue) too.
pub(crate) fn accept_draft(shared: &Shared, draft: Draft) -> Result<Accepted, Refused> {
    let Some(topic) = shared.topic(&draft.topic) else {
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
        version: draft.version,
        traceparent: draft.traceparent,
        content_type: draft.content_type,
        payload: draft.payload,
        max_attempts: topic.retry.max_attempts,
        delivery: draft.delivery,
        priority: draft.priority,
    };
    admit(topic, event)
}

/// [`Hooks::insert`], for [`Engine::enqueue`](crate::Engine::enqueue) too.
pub(crate) async fn insert(shared: &Shared, accepted: Accepted) -> Result<Inserted, StoreError> {
    let mut event = accepted.0;
    let topic = event.topic.clone();
    let source = event.source.clone();
    let span = tracing::info_span!("intake", topic = %topic, source = %source);
    crate::otel::adopt(&span, event.traceparent.as_deref());
    if event.traceparent.is_none() {
        event.traceparent = crate::otel::traceparent_of(&span);
    }
    let started = Instant::now();
    let result = shared.store.insert(event).instrument(span).await;
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
            shared.wake(&topic);
        }
    }
    result
}

/// Whether an undeclared source `name` is taken (into a topic of the
/// same name): only when the builder allows it, and never into a topic
/// the engine knows, declared or named by a declared source, which
/// would let unsigned events reach that topic's handler.
fn takes_undeclared(shared: &Shared, name: &str) -> bool {
    shared.accept_undeclared && valid_source_name(name) && !shared.topics.contains_key(name)
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
