//! Topology (`[amqp]`): exchanges, queues and bindings declared
//! from configuration, at start and after every reconnect.
//!
//! Declares are idempotent in AMQP 0-9-1: declaring what already exists with
//! the same settings changes nothing. Declaring what exists with *other*
//! settings makes the broker close the channel with `PRECONDITION_FAILED`;
//! [`declare`] turns that into [`AmqpError::Inequivalent`], naming the queue
//! or exchange and the argument, and stops there.

use crate::error::{AmqpError, Result, short};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};
use std::time::Duration;

/// Everything to declare on one broker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// Exchanges, declared first.
    pub exchanges: Vec<ExchangeSpec>,
    /// Queues with their bindings (and dead-letter exchange and queue).
    pub queues: Vec<QueueSpec>,
}

/// An exchange (`[[amqp.exchange]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeSpec {
    /// The name publishers and bindings refer to it by.
    pub name: String,
    /// How it routes a message to bound queues.
    pub kind: ExchangeType,
    /// Survives a broker restart (default true).
    pub durable: bool,
}

impl ExchangeSpec {
    /// A durable exchange of `kind`, as `[[amqp.exchange]]` declares it
    /// unless told otherwise.
    pub fn new(name: impl Into<String>, kind: ExchangeType) -> Self {
        Self {
            name: name.into(),
            kind,
            durable: true,
        }
    }
}

/// An exchange's routing (AMQP 0-9-1's four standard types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeType {
    /// Routing-key patterns with `*` and `#`.
    Topic,
    /// To the queues bound with exactly the message's routing key.
    Direct,
    /// To every bound queue, whatever the routing key.
    Fanout,
    /// Header values instead of the routing key.
    Headers,
}

impl ExchangeType {
    /// The name used in configuration and by the broker.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeType::Topic => "topic",
            ExchangeType::Direct => "direct",
            ExchangeType::Fanout => "fanout",
            ExchangeType::Headers => "headers",
        }
    }

    fn lapin(self) -> ExchangeKind {
        match self {
            ExchangeType::Topic => ExchangeKind::Topic,
            ExchangeType::Direct => ExchangeKind::Direct,
            ExchangeType::Fanout => ExchangeKind::Fanout,
            ExchangeType::Headers => ExchangeKind::Headers,
        }
    }
}

impl std::str::FromStr for ExchangeType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "topic" => Ok(ExchangeType::Topic),
            "direct" => Ok(ExchangeType::Direct),
            "fanout" => Ok(ExchangeType::Fanout),
            "headers" => Ok(ExchangeType::Headers),
            _ => Err(format!(
                "{s:?} is not an exchange kind: use topic, direct, fanout or headers"
            )),
        }
    }
}

/// A queue (`[[amqp.queue]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// The name sources consume it by.
    pub name: String,
    /// Survives a broker restart (default true).
    pub durable: bool,
    /// Messages older than this are dropped, or dead-lettered (`x-message-ttl`).
    pub ttl: Option<Duration>,
    /// At most this many ready messages; the oldest are dropped or
    /// dead-lettered (`x-max-length`).
    pub max_length: Option<u64>,
    /// Declares a direct exchange [`dead_letter_exchange`](Self::dead_letter_exchange)
    /// and a durable queue `<queue>.dlq` bound to it with the queue's name,
    /// and points the queue's `x-dead-letter-exchange` at it.
    pub dead_letter: bool,
    /// Where the queue gets its messages from.
    pub bindings: Vec<Binding>,
}

/// A queue's binding to an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The exchange the queue receives from.
    pub exchange: String,
    /// The routing key (a pattern on topic exchanges).
    pub routing_key: String,
}

impl QueueSpec {
    /// A durable queue without TTL, limit, dead-lettering or bindings.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            durable: true,
            ttl: None,
            max_length: None,
            dead_letter: false,
            bindings: vec![],
        }
    }

    /// Binds the queue to `exchange` with `routing_key` (a pattern on topic
    /// exchanges); a queue may have several bindings.
    pub fn bind(mut self, exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        self.bindings.push(Binding {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        });
        self
    }

    /// `<exchange>.dlx` after the queue's first bound exchange (so queues of
    /// one exchange share one dead-letter exchange), else `<queue>.dlx`.
    pub fn dead_letter_exchange(&self) -> String {
        match self.bindings.first() {
            Some(b) => format!("{}.dlx", b.exchange),
            None => format!("{}.dlx", self.name),
        }
    }

    /// The dead-letter queue's name, `<queue>.dlq`: where rejected and
    /// expired messages end up when `dead_letter` is on.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.name)
    }

    /// The queue's `x-` arguments, in the form the broker compares them.
    pub fn arguments(&self) -> Result<Vec<(String, AMQPValue)>> {
        let mut args = vec![];
        if let Some(ttl) = self.ttl {
            let ms = u32::try_from(ttl.as_millis()).map_err(|_| {
                AmqpError::Invalid(format!(
                    "queue {:?}: ttl {ttl:?} is longer than RabbitMQ's limit of {} ms",
                    self.name,
                    u32::MAX
                ))
            })?;
            args.push(("x-message-ttl".into(), AMQPValue::LongLongInt(ms.into())));
        }
        if let Some(n) = self.max_length {
            let n = i64::try_from(n).map_err(|_| {
                AmqpError::Invalid(format!(
                    "queue {:?}: max_length {n} is too large",
                    self.name
                ))
            })?;
            args.push(("x-max-length".into(), AMQPValue::LongLongInt(n)));
        }
        if self.dead_letter {
            args.push((
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(self.dead_letter_exchange().into()),
            ));
            args.push((
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(self.name.clone().into()),
            ));
        }
        Ok(args)
    }
}

/// What exists after [`declare`], dead-letter exchanges and queues included,
/// in declaration order (for `mailroom amqp declare`'s table).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    /// The exchanges declared, dead-letter exchanges included.
    pub exchanges: Vec<ExchangeSpec>,
    /// Queues, with what the broker reported about them.
    pub queues: Vec<DeclaredQueue>,
    /// The bindings declared, each queue's after the queue.
    pub bindings: Vec<DeclaredBinding>,
}

/// A queue as the broker reported it after its declare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredQueue {
    /// The queue's name.
    pub name: String,
    /// Whether it survives a broker restart.
    pub durable: bool,
    /// Its `x-` arguments, values rendered as text.
    pub arguments: Vec<(String, String)>,
    /// Ready messages at the time of the declare.
    pub messages: u32,
    /// Consumers at the time of the declare.
    pub consumers: u32,
}

/// A binding that exists after the declare: messages published to
/// `exchange` with a matching routing key reach `queue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredBinding {
    /// The exchange messages come from.
    pub exchange: String,
    /// The queue they reach.
    pub queue: String,
    /// The routing key (or pattern) that selects them.
    pub routing_key: String,
}

/// Declares `topology` on `channel`: exchanges, then each queue's
/// dead-letter exchange and queue, the queue itself, then its bindings.
/// Declaring twice changes nothing. On `PRECONDITION_FAILED` the broker has
/// closed `channel`; the error names what differs.
pub async fn declare(channel: &Channel, topology: &Topology) -> Result<Declared> {
    let mut declared = Declared::default();
    for exchange in &topology.exchanges {
        declare_exchange(channel, exchange).await?;
        declared.exchanges.push(exchange.clone());
    }
    for queue in &topology.queues {
        if queue.dead_letter {
            let dlx = ExchangeSpec::new(queue.dead_letter_exchange(), ExchangeType::Direct);
            if !declared.exchanges.contains(&dlx) {
                declare_exchange(channel, &dlx).await?;
                declared.exchanges.push(dlx.clone());
            }
            let dlq = QueueSpec::new(queue.dead_letter_queue()).bind(&dlx.name, &queue.name);
            declare_queue(channel, &dlq, &mut declared).await?;
        }
        declare_queue(channel, queue, &mut declared).await?;
    }
    Ok(declared)
}

async fn declare_exchange(channel: &Channel, spec: &ExchangeSpec) -> Result<()> {
    let options = ExchangeDeclareOptions {
        durable: spec.durable,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            short("exchange", &spec.name)?,
            spec.kind.lapin(),
            options,
            FieldTable::default(),
        )
        .await
        .map_err(|e| AmqpError::broker(format!("declaring exchange {:?}", spec.name), e))
}

async fn declare_queue(channel: &Channel, spec: &QueueSpec, declared: &mut Declared) -> Result<()> {
    let name = short("queue", &spec.name)?;
    let arguments = spec.arguments()?;
    let mut table = FieldTable::default();
    for (k, v) in &arguments {
        table.insert(k.as_str().into(), v.clone());
    }
    let options = QueueDeclareOptions {
        durable: spec.durable,
        ..QueueDeclareOptions::default()
    };
    let queue = channel
        .queue_declare(name.clone(), options, table)
        .await
        .map_err(|e| AmqpError::broker(format!("declaring queue {:?}", spec.name), e))?;
    declared.queues.push(DeclaredQueue {
        name: spec.name.clone(),
        durable: spec.durable,
        arguments: arguments
            .iter()
            .map(|(k, v)| (k.clone(), render(v)))
            .collect(),
        messages: queue.message_count(),
        consumers: queue.consumer_count(),
    });
    for b in &spec.bindings {
        channel
            .queue_bind(
                name.clone(),
                short("exchange", &b.exchange)?,
                short("routing key", &b.routing_key)?,
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| {
                AmqpError::broker(
                    format!("binding queue {:?} to exchange {:?}", spec.name, b.exchange),
                    e,
                )
            })?;
        declared.bindings.push(DeclaredBinding {
            exchange: b.exchange.clone(),
            queue: spec.name.clone(),
            routing_key: b.routing_key.clone(),
        });
    }
    Ok(())
}

fn render(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}
