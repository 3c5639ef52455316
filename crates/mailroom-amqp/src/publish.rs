//! The AMQP handler: publishes a topic's events to an
//! exchange, which makes a topic the outbox relay.
//!
//! Every publish is persistent and `mandatory` on a channel in publisher
//! confirm mode; an attempt succeeds only when the broker acks it. A
//! returned (unroutable) message, a nack or a lost channel is a failed
//! attempt for the topic's retry policy; a publish or confirm that does not
//! come within [`CONFIRM_LIMIT`] (or the topic's timeout, if shorter) fails
//! the attempt, which is retried: a frozen broker connection never holds a
//! topic. (The message may still reach the queue late: the retry publishes
//! it again, the at-least-once every consumer deduplicates.) Publishes are pipelined: concurrent attempts
//! share the channel and lapin matches each confirm to its publish by
//! delivery tag, and a batch publishes all its events before awaiting any
//! confirm. Returned messages are matched to their publish by the
//! sequence number each publish carries, never by the confirm lapin
//! attaches them to (see the `confirms` module).

use crate::confirms::{Confirms, SEQ_HEADER, Ticket, Verdict};
use crate::error::{AmqpError, Result, short};
use crate::source::{CAUSATION_HEADER, TRACEPARENT_HEADER, VERSION_HEADER};
use futures::future::join_all;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use mailroom::dead_letter::DeadLetter;
use mailroom::handler::{BatchOutcome, Handler};
use mailroom::{Event, Outcome};
use serde_json::{Value, json};
use std::borrow::Cow;
use std::sync::{Arc, RwLock};

/// How long a publish may wait to be written and confirmed by the broker
/// before its attempt fails and is retried. Confirms come within
/// milliseconds from a healthy broker; a broker that blocks publishers
/// (memory or disk alarm) or a frozen network withholds them.
pub const CONFIRM_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

/// An AMQP handler's settings (`handler = { amqp = { url, exchange, routing_key, envelope } }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpHandlerSpec {
    /// The exchange published to (`""`: the default exchange).
    pub exchange: String,
    /// The routing key; `{type}`, `{topic}` and `{key}` are replaced by the
    /// event's.
    pub routing_key: String,
    /// Publish the JSON envelope `{eventId, eventType, version, occurredAt,
    /// correlationId, causationId, metadata, data}` instead of the raw payload.
    pub envelope: bool,
    /// The envelope's `metadata.environment` (`[telemetry] environment`,
    /// e.g. `production`); `None`: null.
    pub environment: Option<String>,
    /// Each message's `expiration`: a queue drops (or dead-letters) it
    /// when it has waited that long. `None`: it never expires.
    pub expiration: Option<std::time::Duration>,
    /// Each message's `priority` (0 to 255), for queues with `max_priority`.
    pub priority: Option<u8>,
    /// The topic's events are dead-letter copies
    /// ([`mailroom::dead_letter`]): each publishes the dead event it
    /// carries, as this handler publishes a live one, plus its last error
    /// in `mailroom-error`, with message id `<event id>/<attempt>`.
    pub dead_letters: bool,
}

impl AmqpHandlerSpec {
    /// The concurrency a configured topic with this handler gets unless it
    /// sets one: publishes are pipelined on one channel and an attempt
    /// holds its slot until the broker confirms, so the relay's rate is
    /// about its depth over the confirm latency. At the topics' general
    /// default (16) a relay reaches about a quarter of lapin's own
    /// confirmed publish rate; at 1024 about two thirds.
    pub const DEFAULT_CONCURRENCY: u32 = 1024;

    /// Raw payloads to `exchange` under `routing_key`.
    pub fn new(exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        Self {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            envelope: false,
            environment: None,
            expiration: None,
            priority: None,
            dead_letters: false,
        }
    }
}

/// The header holding a dead letter's last error.
pub const ERROR_HEADER: &str = "mailroom-error";

/// What one attempt publishes: the event itself, or for a dead-letter
/// copy the dead event it carries, its error and its death's id.
struct Message<'a> {
    event: Cow<'a, Event>,
    error: Option<String>,
    message_id: Option<String>,
}

impl<'a> Message<'a> {
    fn of(spec: &AmqpHandlerSpec, event: &'a Event) -> Result<Message<'a>, Outcome> {
        if !spec.dead_letters {
            return Ok(Message {
                event: Cow::Borrowed(event),
                error: None,
                message_id: None,
            });
        }
        let letter = DeadLetter::decode(event).map_err(|e| Outcome::permanent(e.to_string()))?;
        Ok(Message {
            event: Cow::Owned(
                letter
                    .event()
                    .map_err(|e| Outcome::permanent(e.to_string()))?,
            ),
            error: letter.error.clone(),
            message_id: Some(letter.death_id()),
        })
    }
}

/// Publishes events with confirms. Cheap to clone; register it for a topic
/// with [`mailroom::EngineBuilder::handler`] (as `Arc::new(handler)`).
///
/// It publishes on the channel last given to [`attach`](Self::attach);
/// until then, and after [`detach`](Self::detach), attempts fail with
/// "AMQP connection down" and are retried later.
#[derive(Debug, Clone)]
pub struct AmqpHandler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    spec: AmqpHandlerSpec,
    channel: RwLock<Option<Publisher>>,
}

/// A channel in confirm mode and the ledger of its publishes.
#[derive(Debug, Clone)]
struct Publisher {
    channel: Channel,
    confirms: Confirms,
}

impl AmqpHandler {
    /// A handler with no channel yet.
    pub fn new(spec: AmqpHandlerSpec) -> Self {
        Self {
            inner: Arc::new(Inner {
                spec,
                channel: RwLock::new(None),
            }),
        }
    }

    /// The handler's settings.
    pub fn spec(&self) -> &AmqpHandlerSpec {
        &self.inner.spec
    }

    /// Puts `channel` in confirm mode and publishes on it from now on.
    pub async fn attach(&self, channel: Channel) -> Result<()> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| AmqpError::broker("enabling publisher confirms", e))?;
        *self
            .inner
            .channel
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(Publisher {
            channel,
            confirms: Confirms::spawn(),
        });
        Ok(())
    }

    /// Stops publishing (the connection is gone); attempts fail until the
    /// next [`attach`](Self::attach).
    pub fn detach(&self) {
        *self
            .inner
            .channel
            .write()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn publisher(&self) -> Option<Publisher> {
        self.inner
            .channel
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// [`send`](Self::send), failed if it is not written within
    /// [`CONFIRM_LIMIT`] (a connection whose socket no longer drains).
    async fn send_within(&self, publisher: &Publisher, event: &Event) -> Result<Pending, Outcome> {
        match tokio::time::timeout(CONFIRM_LIMIT, self.send(publisher, event)).await {
            Ok(sent) => sent,
            Err(_) => Err(failed(event, "error", no_confirm())),
        }
    }

    /// Sends one publish and returns the broker's future confirm (without
    /// waiting for it), or the attempt's failure.
    async fn send(&self, publisher: &Publisher, event: &Event) -> Result<Pending, Outcome> {
        let spec = &self.inner.spec;
        let message = Message::of(spec, event)?;
        let routing_key =
            routing_key(&spec.routing_key, &message.event).map_err(Outcome::permanent)?;
        let body = match spec.envelope {
            true => envelope(&message.event, spec.environment.as_deref()),
            false => message
                .event
                .payload
                .as_deref()
                .unwrap_or_default()
                .to_vec(),
        };
        let options = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let exchange =
            short("exchange", &spec.exchange).map_err(|e| Outcome::permanent(e.to_string()))?;
        let key =
            short("routing key", &routing_key).map_err(|e| Outcome::permanent(e.to_string()))?;
        let ticket: Ticket = publisher.confirms.register();
        let properties = self.properties(&message, ticket.seq());
        let confirm = publisher
            .channel
            .basic_publish(exchange, key, options, &body, properties)
            .await
            .map_err(|e| failed(event, "error", format!("publish failed: {e}")))?;
        Ok(Pending {
            verdict: ticket.sent(confirm),
            routing_key,
        })
    }

    fn properties(&self, message: &Message<'_>, seq: u64) -> BasicProperties {
        let event = &message.event;
        let mut headers = FieldTable::default();
        // Sequence numbers stay far below i64::MAX; saturate rather than wrap.
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        headers.insert(SEQ_HEADER.into(), AMQPValue::LongLongInt(seq));
        let text = |s: &str| AMQPValue::LongString(s.into());
        headers.insert(VERSION_HEADER.into(), text(version(event)));
        headers.insert("mailroom-topic".into(), text(&event.topic));
        headers.insert(
            "mailroom-attempt".into(),
            AMQPValue::LongLongInt(event.attempts.into()),
        );
        if let Some(c) = &event.causation_id {
            headers.insert(CAUSATION_HEADER.into(), text(c));
        }
        if let Some(t) = mailroom::handler::outgoing_traceparent(event) {
            headers.insert(TRACEPARENT_HEADER.into(), text(&t));
        }
        if let Some(e) = &message.error {
            headers.insert(ERROR_HEADER.into(), text(e));
        }
        let content_type = match self.inner.spec.envelope {
            true => Some("application/json".to_string()),
            false => event.content_type.clone(),
        };
        // message_id is a short string: a dedup key over 255 bytes gives way to the event id.
        let message_id =
            ShortString::try_new(message.message_id.as_deref().unwrap_or(&event.dedup_key))
                .ok()
                .filter(|s| !s.as_str().is_empty())
                .unwrap_or_else(|| event.id.to_string().into());
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(message_id)
            .with_timestamp(event.received_at.as_second().max(0).unsigned_abs())
            .with_headers(headers);
        if let Some(v) = short_opt(event.correlation_id.as_deref()) {
            props = props.with_correlation_id(v);
        }
        if let Some(v) = short_opt(event.event_type.as_deref()) {
            props = props.with_type(v);
        }
        if let Some(v) = short_opt(content_type.as_deref()) {
            props = props.with_content_type(v);
        }
        if let Some(e) = self.inner.spec.expiration {
            props = props.with_expiration(e.as_millis().to_string().into());
        }
        if let Some(p) = self.inner.spec.priority {
            props = props.with_priority(p);
        }
        props
    }
}

/// An optional property; values over 255 bytes are left out rather than cut.
fn short_opt(value: Option<&str>) -> Option<ShortString> {
    value.and_then(|v| ShortString::try_new(v).ok())
}

/// A publish awaiting its verdict.
struct Pending {
    verdict: tokio::sync::oneshot::Receiver<Verdict>,
    routing_key: String,
}

impl Pending {
    /// Waits for the broker's verdict.
    async fn outcome(self, exchange: &str, event: &Event) -> Outcome {
        let verdict = match tokio::time::timeout(CONFIRM_LIMIT, self.verdict).await {
            Ok(verdict) => verdict
                .unwrap_or_else(|_| Verdict::Failed("the channel's confirm ledger is gone".into())),
            Err(_) => Verdict::Failed(no_confirm()),
        };
        match verdict {
            Verdict::Confirmed => {
                metrics::counter!(mailroom::metrics::PUBLISHED, "topic" => event.topic.clone(), "outcome" => "confirmed")
                    .increment(1);
                Outcome::Success
            }
            Verdict::Returned => failed(
                event,
                "returned",
                format!(
                    "unroutable: exchange {exchange}, routing key {}",
                    self.routing_key
                ),
            ),
            Verdict::Nacked => failed(event, "nacked", "the broker nacked the publish".into()),
            Verdict::Failed(error) => failed(event, "error", error),
        }
    }
}

fn no_confirm() -> String {
    format!(
        "no confirm from the broker within {} s",
        CONFIRM_LIMIT.as_secs()
    )
}

/// Counts a failed publish and makes it a retryable outcome.
fn failed(event: &Event, outcome: &'static str, error: String) -> Outcome {
    metrics::counter!(mailroom::metrics::PUBLISHED, "topic" => event.topic.clone(), "outcome" => outcome)
        .increment(1);
    Outcome::retry(error)
}

#[async_trait::async_trait]
impl Handler for AmqpHandler {
    async fn handle(&self, event: &Event) -> Outcome {
        let Some(publisher) = self.publisher() else {
            return failed(event, "error", "AMQP connection down".into());
        };
        match self.send_within(&publisher, event).await {
            Ok(pending) => pending.outcome(&self.inner.spec.exchange, event).await,
            Err(outcome) => outcome,
        }
    }

    async fn handle_batch(&self, events: &[Event]) -> BatchOutcome {
        let Some(publisher) = self.publisher() else {
            let each = events
                .iter()
                .map(|e| (e.id, failed(e, "error", "AMQP connection down".into())));
            return BatchOutcome::Each(each.collect());
        };
        let mut sent = Vec::with_capacity(events.len());
        for event in events {
            sent.push(self.send_within(&publisher, event).await);
        }
        let exchange = &self.inner.spec.exchange;
        let verdicts = events.iter().zip(sent).map(|(event, sent)| async move {
            let outcome = match sent {
                Ok(pending) => pending.outcome(exchange, event).await,
                Err(outcome) => outcome,
            };
            (event.id, outcome)
        });
        BatchOutcome::Each(join_all(verdicts).await)
    }
}

/// Fills `{type}`, `{topic}` and `{key}`; an event lacking a value the
/// template needs cannot be routed (a permanent failure).
fn routing_key(template: &str, event: &Event) -> Result<String, String> {
    let mut out = template.replace("{topic}", &event.topic);
    for (placeholder, value, what) in [
        ("{type}", event.event_type.as_deref(), "type"),
        ("{key}", event.key.as_deref(), "key"),
    ] {
        if out.contains(placeholder) {
            let value = value.ok_or_else(|| {
                format!("the routing key {template:?} needs the event's {what}, and it has none")
            })?;
            out = out.replace(placeholder, value);
        }
    }
    Ok(out)
}

/// An event's version: the sender's, else `"1"`.
fn version(event: &Event) -> &str {
    event
        .version
        .as_deref()
        .unwrap_or(mailroom::event::DEFAULT_VERSION)
}

/// The envelope of `envelope = true`: `{"eventId", "eventType", "version",
/// "occurredAt", "correlationId", "causationId", "metadata": {"source",
/// "topic", "environment"}, "data"}`. `data` is the payload's JSON value; a
/// payload that is not JSON travels as `dataBase64` with `data` null.
fn envelope(event: &Event, environment: Option<&str>) -> Vec<u8> {
    let payload = event.payload.as_deref().unwrap_or_default();
    let (data, data_base64) = match serde_json::from_slice::<Value>(payload) {
        Ok(v) => (v, None),
        Err(_) if payload.is_empty() => (Value::Null, None),
        Err(_) => (Value::Null, Some(mailroom::event::base64_encode(payload))),
    };
    let mut doc = json!({
        "eventId": event.id.to_string(),
        "eventType": event.event_type,
        "version": version(event),
        "occurredAt": event.received_at.to_string(),
        "correlationId": event.correlation_id,
        "causationId": event.causation_id,
        "metadata": {
            "source": event.source,
            "topic": event.topic,
            "environment": environment,
        },
        "data": data,
    });
    if let Some(b) = data_base64 {
        doc["dataBase64"] = Value::String(b);
    }
    serde_json::to_vec(&doc).unwrap_or_default()
}
