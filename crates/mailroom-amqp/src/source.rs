//! The AMQP source: consumes a queue with `basic.qos(prefetch)`
//! and manual acknowledgements, stores each delivery through the engine,
//! and acknowledges it **only after its event has committed**.
//!
//! Deliveries are stored concurrently (up to `prefetch` in flight), so they
//! share the store's group commit: a prefetch of 100 is not 100 fsyncs.
//! A delivery that can never be stored (no dedup key, unusable body, or an
//! event its topic refuses: [`mailroom::accept`], e.g. keyless in a
//! sequential topic) is rejected without requeue, so the broker
//! dead-letters it, and counted `rejected`. When the store
//! cannot commit, the delivery is nacked with requeue and consuming pauses
//! with a capped, growing delay.

use crate::error::{AmqpError, Result, short};
use bytes::Bytes;
use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use mailroom::{Draft, Engine, EnqueueError, Field};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Header carrying the payload's schema version, read and written by mailroom.
pub use mailroom::event::VERSION_HEADER;

/// Header carrying the causation id, read and written by mailroom.
pub const CAUSATION_HEADER: &str = "mailroom-causation-id";
/// Header carrying the W3C `traceparent`, read with a message
/// and written (as a child) on every publish.
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// First and longest pause after a failed commit.
const PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(30));

/// How long a consumer may take to stop once its loop ends (cancel the
/// consumer, store and settle the deliveries in flight, close the channel):
/// every step waits for the broker, which may never answer (a partition, a
/// blocked connection; lapin notices a silent peer only after two heartbeat
/// intervals, 2 min by default).
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// An AMQP source's settings (`[[source]] amqp = { url, queue, prefetch }`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpSourceSpec {
    /// The source's name, recorded on its events and in metrics.
    pub name: String,
    /// The topic its events go to.
    pub topic: String,
    /// The queue consumed.
    pub queue: String,
    /// Unacknowledged deliveries the broker may send ahead (`basic.qos`),
    /// which is also how many are being stored at once. Default 10.
    pub prefetch: u16,
    /// Where the ordering key lives: an AMQP header, or a JSON pointer into
    /// the body as for webhooks. `None`: the topic's.
    pub key: Option<Field>,
    /// Where the dedup key lives (a business id: two messages with different
    /// `message_id`s but the same value here are one event). A message
    /// without it is rejected. `None`: `message_id`, else the envelope's
    /// `eventId`.
    pub id: Option<Field>,
    /// Where the event type lives. `None`: the `type` property, else the
    /// envelope's `eventType`.
    pub event_type: Option<Field>,
    /// Where an RFC 3339 time lives before which the event must not run.
    /// `None`: due at once.
    pub deliver_at: Option<Field>,
    /// Where the event's priority (an integer) lives. `None`: 0.
    pub priority: Option<Field>,
    /// Where the payload's schema version lives. `None` (or not found
    /// there): the `mailroom-version` header, else the envelope's
    /// `version`, else `"1"`.
    pub version: Option<Field>,
}

impl AmqpSourceSpec {
    /// Default `prefetch`: deliveries in flight, and so being stored, at once.
    pub const DEFAULT_PREFETCH: u16 = 10;

    /// A source named `name` storing the messages of `queue` into `topic`.
    pub fn new(
        name: impl Into<String>,
        topic: impl Into<String>,
        queue: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            topic: topic.into(),
            queue: queue.into(),
            prefetch: Self::DEFAULT_PREFETCH,
            key: None,
            id: None,
            event_type: None,
            deliver_at: None,
            priority: None,
            version: None,
        }
    }
}

/// A consumer storing a queue's messages through an [`Engine`].
#[derive(Debug, Clone)]
pub struct AmqpSource {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    spec: AmqpSourceSpec,
    engine: Engine,
    /// The key field: the source's, else the topic's.
    key: Option<Field>,
}

/// What became of one delivery.
enum Verdict {
    Stored,
    Rejected,
    /// Nacked with requeue: the store could not commit.
    StoreFailed,
    /// The ack, nack or reject could not be sent.
    ChannelLost(AmqpError),
}

impl AmqpSource {
    /// A source storing into `engine`, which must have the spec's topic.
    ///
    /// A prefetch of 0 (no limit in AMQP) is refused: it is also the
    /// bound on deliveries being stored at once.
    pub fn new(engine: Engine, spec: AmqpSourceSpec) -> Result<Self> {
        if spec.prefetch == 0 {
            return Err(AmqpError::Invalid(format!(
                "AMQP source {:?}: prefetch must be at least 1",
                spec.name
            )));
        }
        let topic = engine.topic(&spec.topic).ok_or_else(|| {
            AmqpError::Invalid(format!(
                "AMQP source {:?}: the engine has no topic {:?}",
                spec.name, spec.topic
            ))
        })?;
        let key = spec.key.clone().or_else(|| topic.key.clone());
        Ok(Self {
            inner: Arc::new(Inner { spec, engine, key }),
        })
    }

    /// The source's settings.
    pub fn spec(&self) -> &AmqpSourceSpec {
        &self.inner.spec
    }

    /// Consumes on `channel` until `shutdown` (then `Ok`, after the
    /// deliveries in flight are stored and acknowledged and `channel` is
    /// closed, so the broker has seen every ack) or until the
    /// channel or connection is lost (then `Err`; unacknowledged deliveries
    /// return to the queue and are deduplicated when redelivered).
    pub async fn consume(&self, channel: &Channel, shutdown: &CancellationToken) -> Result<()> {
        let spec = &self.inner.spec;
        // A broker that stops answering before the consume-ok must not hold
        // a shutdown: nothing was delivered yet, the channel closes with
        // its connection.
        let mut consumer = tokio::select! {
            started = self.start(channel) => started?,
            () = shutdown.cancelled() => return Ok(()),
        };
        let mut in_flight = JoinSet::new();
        let mut pause = Pause::default();
        let ended = loop {
            tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                () = pause.wait() => pause.resume(),
                next = consumer.next(), if !pause.active() => match next {
                    Some(Ok(delivery)) => {
                        in_flight.spawn(self.clone().store(delivery));
                    }
                    Some(Err(e)) => break Err(AmqpError::broker("receiving deliveries", e)),
                    None => break Err(AmqpError::Invalid(format!(
                        "the broker cancelled the consumer of queue {:?}", spec.queue
                    ))),
                },
                Some(done) = in_flight.join_next() => match done {
                    Ok(Verdict::StoreFailed) => pause.after_failure(),
                    Ok(Verdict::Stored) => pause.after_success(),
                    Ok(Verdict::Rejected) => {}
                    Ok(Verdict::ChannelLost(e)) => break Err(e),
                    Err(e) => tracing::error!(source = %spec.name, error = %e, "a delivery's task failed"),
                },
            }
        };
        let wind_down = self.wind_down(channel, consumer.tag(), &mut in_flight, ended.is_ok());
        if tokio::time::timeout(STOP_GRACE, wind_down).await.is_err() {
            // A broker that stopped answering (or a store that cannot
            // commit): the deliveries still in flight are dropped unacked,
            // so they return to the queue and are deduplicated when
            // redelivered.
            tracing::warn!(source = %spec.name, grace = ?STOP_GRACE, "the consumer did not stop cleanly in time; unacknowledged deliveries return to the queue");
        }
        ended
    }

    /// Sets the prefetch and starts consuming the queue.
    async fn start(&self, channel: &Channel) -> Result<lapin::Consumer> {
        let spec = &self.inner.spec;
        let queue = short("queue", &spec.queue)?;
        channel
            .basic_qos(spec.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| AmqpError::broker("setting the prefetch", e))?;
        let consumer = channel
            .basic_consume(
                queue,
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| AmqpError::broker(format!("consuming queue {:?}", spec.queue), e))?;
        tracing::info!(source = %spec.name, queue = %spec.queue, prefetch = spec.prefetch, "consuming");
        Ok(consumer)
    }

    /// After the consume loop: on a graceful stop, cancels the consumer;
    /// lets the deliveries in flight be stored and settled; then, on a
    /// graceful stop, closes `channel` and waits for the broker's close-ok,
    /// which it sends only after the acks before it (closing the
    /// connection at once let the broker requeue acked deliveries: dozens
    /// of each 200 in flight at a SIGTERM were redelivered, though stored).
    /// Each step waits for the broker: [`Self::consume`] bounds the whole.
    async fn wind_down(
        &self,
        channel: &Channel,
        tag: lapin::types::ShortString,
        in_flight: &mut JoinSet<Verdict>,
        graceful: bool,
    ) {
        if graceful {
            // Stop deliveries; those already buffered go back to the queue
            // when the channel closes.
            let _ = channel
                .basic_cancel(tag, BasicCancelOptions::default())
                .await;
        }
        while in_flight.join_next().await.is_some() {}
        if graceful {
            let _ = channel.close(200, "OK".into()).await;
        }
    }

    /// Stores one delivery, then acks, rejects or nacks it.
    async fn store(self, delivery: Delivery) -> Verdict {
        let spec = &self.inner.spec;
        let draft = match self.draft(&delivery.properties, &delivery.data) {
            Ok(draft) => draft,
            Err(why) => {
                tracing::warn!(source = %spec.name, topic = %spec.topic, reason = %why, "rejected an unusable AMQP message; the broker dead-letters it");
                metrics::counter!(mailroom::metrics::EVENTS_RECEIVED, "source" => spec.name.clone(), "topic" => spec.topic.clone(), "outcome" => "rejected")
                    .increment(1);
                return settle(&delivery, Settle::Reject, Verdict::Rejected).await;
            }
        };
        match self.inner.engine.enqueue(draft).await {
            Ok(inserted) => {
                tracing::debug!(source = %spec.name, topic = %spec.topic, id = %inserted.id, duplicate = inserted.duplicate, "stored an AMQP delivery");
                settle(&delivery, Settle::Ack, Verdict::Stored).await
            }
            // Counted `rejected` by the engine.
            Err(EnqueueError::Refused(why)) => {
                tracing::warn!(source = %spec.name, topic = %spec.topic, reason = %why, "the topic refused an AMQP message; rejected, the broker dead-letters it");
                settle(&delivery, Settle::Reject, Verdict::Rejected).await
            }
            Err(e) => {
                tracing::warn!(source = %spec.name, topic = %spec.topic, error = %e, "could not store an AMQP delivery; requeued");
                settle(&delivery, Settle::Requeue, Verdict::StoreFailed).await
            }
        }
    }

    /// Reads a delivery into a [`Draft`], or says why it can never be stored.
    fn draft(&self, props: &BasicProperties, body: &[u8]) -> Result<Draft, String> {
        let inner = &self.inner;
        let spec = &inner.spec;
        let message = Message::new(props, body);
        let dedup_key = match &spec.id {
            Some(field) => message
                .field(field, "dedup key")?
                .ok_or_else(|| format!("no dedup key at {}", describe(field)))?,
            None => message
                .property(props.message_id())
                .or_else(|| message.envelope("eventId"))
                .ok_or_else(|| match &message.json {
                    Some(Err(e)) => format!("no message_id, and the body is not JSON ({e})"),
                    _ => "no message_id property and no eventId in the body".to_string(),
                })?,
        };
        let key = match &inner.key {
            Some(field) => message.field(field, "key")?,
            None => None,
        };
        // Lengths, the key a sequential topic needs: the engine's rules
        // (mailroom::accept), applied by `enqueue`.
        let mut draft = Draft::bytes(spec.topic.clone(), Bytes::copy_from_slice(body))
            .source(spec.name.clone())
            .dedup_key(dedup_key);
        if let Some(k) = key {
            draft = draft.key(k);
        }
        let event_type = match &spec.event_type {
            Some(field) => message.field(field, "type")?,
            None => message
                .property(props.kind())
                .or_else(|| message.envelope("eventType")),
        };
        if let Some(t) = event_type {
            draft = draft.event_type(t);
        }
        if let Some(field) = &spec.deliver_at {
            if let Some(text) = message.field(field, "deliver_at")? {
                let at = text.parse::<jiff::Timestamp>().map_err(|_| {
                    format!(
                        "deliver_at ({}): {text:?} is not an RFC 3339 time",
                        describe(field)
                    )
                })?;
                draft = draft.deliver_at(at);
            }
        }
        if let Some(field) = &spec.priority {
            if let Some(text) = message.field(field, "priority")? {
                let priority = text.parse::<i32>().map_err(|_| {
                    format!("priority ({}): {text:?} is not an integer", describe(field))
                })?;
                draft = draft.priority(priority);
            }
        }
        let version = match &spec.version {
            Some(field) => message.field(field, "version")?,
            None => None,
        };
        let version = version
            .or_else(|| message.header(VERSION_HEADER))
            .or_else(|| message.envelope("version"));
        if let Some(v) = version {
            draft = draft.version(v);
        }
        let correlation = message.property(props.correlation_id());
        if let Some(c) = correlation.or_else(|| message.envelope("correlationId")) {
            draft = draft.correlation_id(c);
        }
        let causation = message.header(CAUSATION_HEADER);
        if let Some(c) = causation.or_else(|| message.envelope("causationId")) {
            draft = draft.causation_id(c);
        }
        if let Some(t) = message.header(TRACEPARENT_HEADER) {
            draft = draft.traceparent(&t);
        }
        match message.property(props.content_type()) {
            Some(ct) => draft = draft.content_type(ct),
            None if matches!(message.json, Some(Ok(_))) => {
                draft = draft.content_type("application/json")
            }
            None => {}
        }
        Ok(draft)
    }
}

/// Where a field is read from, for messages about it.
fn describe(field: &Field) -> String {
    match field {
        Field::Header(name) => format!("header {name}"),
        Field::Json(pointer) => format!("JSON pointer {pointer}"),
        Field::BodySha256 => "the body's SHA-256".to_string(),
    }
}

/// A delivery's headers and its body parsed as JSON (once).
struct Message<'a> {
    headers: Option<&'a FieldTable>,
    json: Option<Result<Value, String>>,
}

impl<'a> Message<'a> {
    fn new(props: &'a BasicProperties, body: &[u8]) -> Self {
        // A failed parse of a non-JSON body stops at its first bytes.
        let json =
            (!body.is_empty()).then(|| serde_json::from_slice(body).map_err(|e| e.to_string()));
        Self {
            headers: props.headers().as_ref(),
            json,
        }
    }

    fn property(&self, p: &Option<lapin::types::ShortString>) -> Option<String> {
        p.as_ref()
            .map(|s| s.as_str().trim())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    fn header(&self, name: &str) -> Option<String> {
        let value = self.headers?.inner().get(name)?;
        let text = match value {
            AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            AMQPValue::ShortString(s) => s.as_str().to_owned(),
            AMQPValue::LongLongInt(n) => n.to_string(),
            AMQPValue::LongInt(n) => n.to_string(),
            AMQPValue::LongUInt(n) => n.to_string(),
            AMQPValue::ShortInt(n) => n.to_string(),
            AMQPValue::ShortUInt(n) => n.to_string(),
            AMQPValue::ShortShortInt(n) => n.to_string(),
            AMQPValue::ShortShortUInt(n) => n.to_string(),
            AMQPValue::Timestamp(n) => n.to_string(),
            _ => return None,
        };
        Some(text.trim().to_owned()).filter(|s| !s.is_empty())
    }

    /// A top-level string (or number) field of a JSON envelope body.
    fn envelope(&self, name: &str) -> Option<String> {
        match self.json.as_ref()?.as_ref().ok()?.get(name)? {
            Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_owned()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// A field (`what`: the dedup key, key, type...): a header, or a JSON
    /// pointer into the body.
    fn field(&self, field: &Field, what: &str) -> Result<Option<String>, String> {
        match field {
            Field::Header(name) => Ok(self.header(name)),
            Field::Json(pointer) => match &self.json {
                Some(Ok(doc)) => Ok(match doc.pointer(pointer) {
                    Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
                    Some(Value::Number(n)) => Some(n.to_string()),
                    _ => None,
                }),
                Some(Err(e)) => Err(format!(
                    "the {what} is read from {pointer}, but the body is not JSON ({e})"
                )),
                None => Err(format!(
                    "the {what} is read from {pointer}, but the body is not JSON"
                )),
            },
            Field::BodySha256 => Ok(None),
        }
    }
}

enum Settle {
    Ack,
    /// Reject without requeue: the broker dead-letters it.
    Reject,
    /// Nack with requeue: redelivered later.
    Requeue,
}

async fn settle(delivery: &Delivery, how: Settle, verdict: Verdict) -> Verdict {
    let sent = match how {
        Settle::Ack => delivery.ack(BasicAckOptions::default()).await,
        Settle::Reject => delivery.reject(BasicRejectOptions { requeue: false }).await,
        Settle::Requeue => {
            let options = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            delivery.nack(options).await
        }
    };
    match sent {
        Ok(_) => verdict,
        Err(e) => Verdict::ChannelLost(AmqpError::broker("settling a delivery", e)),
    }
}

/// Consuming paused after failed commits: 100 ms, doubling up to 30 s, back
/// to nothing after a commit succeeds.
#[derive(Debug, Default)]
struct Pause {
    until: Option<Instant>,
    next: Option<Duration>,
}

impl Pause {
    fn active(&self) -> bool {
        self.until.is_some()
    }

    async fn wait(&self) {
        match self.until {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    }

    fn resume(&mut self) {
        self.until = None;
    }

    /// Deliveries in flight fail together: only the first failure of a
    /// pause sets (and grows) it.
    fn after_failure(&mut self) {
        if self.until.is_some() {
            return;
        }
        let delay = self.next.unwrap_or(PAUSE.0);
        self.next = Some((delay * 2).min(PAUSE.1));
        self.until = Some(Instant::now() + delay);
        tracing::warn!(pause = ?delay, "the store cannot commit; consuming paused");
    }

    fn after_success(&mut self) {
        self.next = None;
    }
}
