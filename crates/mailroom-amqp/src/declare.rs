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
    /// (unless the topology declares it) and a durable queue `<queue>.dlq`
    /// bound to it with [`dead_letter_routing_key`](Self::dead_letter_routing_key),
    /// and points the queue's `x-dead-letter-exchange` at it.
    pub dead_letter: bool,
    /// The dead-letter exchange's and routing key's names, when not the
    /// defaults (`<exchange>.dlx` and the queue's name).
    pub dead_letter_route: DeadLetterRoute,
    /// Where the queue gets its messages from.
    pub bindings: Vec<Binding>,
    /// `x-queue-type`; `None`: the broker's default (classic), no argument.
    pub queue_type: Option<QueueType>,
    /// Deliveries of one message before a quorum queue dead-letters (or
    /// drops) it (`x-delivery-limit`).
    pub delivery_limit: Option<u32>,
    /// Priorities the queue orders by, 1 to 255 (`x-max-priority`; classic).
    pub max_priority: Option<u8>,
    /// What a full queue does with a new message (`x-overflow`).
    pub overflow: Option<Overflow>,
    /// Used by one connection only, deleted when it closes.
    pub exclusive: bool,
    /// Deleted when its last consumer leaves.
    pub auto_delete: bool,
    /// Further arguments, as given (names not set by the keys above).
    pub extra: Vec<(String, QueueArgument)>,
}

/// A further queue argument's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueArgument {
    /// A boolean.
    Bool(bool),
    /// An integer (sent as a signed 64-bit integer).
    Int(i64),
    /// Text (sent as a long string).
    Text(String),
}

impl QueueArgument {
    fn amqp(&self) -> AMQPValue {
        match self {
            QueueArgument::Bool(b) => AMQPValue::Boolean(*b),
            QueueArgument::Int(n) => AMQPValue::LongLongInt(*n),
            QueueArgument::Text(t) => AMQPValue::LongString(t.clone().into()),
        }
    }
}

/// Where a queue's dead letters go: `None`s mean the defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterRoute {
    /// The dead-letter exchange (`x-dead-letter-exchange`).
    pub exchange: Option<String>,
    /// The routing key dead letters are published with
    /// (`x-dead-letter-routing-key`).
    pub routing_key: Option<String>,
}

/// A queue's type (`x-queue-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueType {
    /// The classic queue.
    Classic,
    /// A replicated queue (Raft); durable, never exclusive or auto-deleted.
    Quorum,
    /// An append-only log; consumers need a prefetch.
    Stream,
}

impl QueueType {
    /// The name used in configuration and by the broker.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
            QueueType::Stream => "stream",
        }
    }
}

impl std::str::FromStr for QueueType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "classic" => Ok(QueueType::Classic),
            "quorum" => Ok(QueueType::Quorum),
            "stream" => Ok(QueueType::Stream),
            _ => Err(format!(
                "{s:?} is not a queue type: use classic, quorum or stream"
            )),
        }
    }
}

/// What a full queue (`max_length`) does with a new message (`x-overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overflow {
    /// Drops (or dead-letters) the oldest message.
    DropHead,
    /// Refuses the new one (a publisher with confirms gets a nack).
    RejectPublish,
    /// Refuses the new one and dead-letters it (classic queues).
    RejectPublishDlx,
}

impl Overflow {
    /// The name used in configuration and by the broker.
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::DropHead => "drop-head",
            Overflow::RejectPublish => "reject-publish",
            Overflow::RejectPublishDlx => "reject-publish-dlx",
        }
    }
}

impl std::str::FromStr for Overflow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "drop-head" => Ok(Overflow::DropHead),
            "reject-publish" => Ok(Overflow::RejectPublish),
            "reject-publish-dlx" => Ok(Overflow::RejectPublishDlx),
            _ => Err(format!(
                "{s:?} is not an overflow behaviour: use drop-head, reject-publish or reject-publish-dlx"
            )),
        }
    }
}

/// The `x-` arguments the typed keys of [`QueueSpec`] set.
pub const TYPED_ARGUMENTS: [&str; 8] = [
    "x-queue-type",
    "x-message-ttl",
    "x-max-length",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-delivery-limit",
    "x-max-priority",
    "x-overflow",
];

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
            dead_letter_route: DeadLetterRoute::default(),
            bindings: vec![],
            queue_type: None,
            delivery_limit: None,
            max_priority: None,
            overflow: None,
            exclusive: false,
            auto_delete: false,
            extra: vec![],
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

    /// The dead-letter exchange: the route's, else `<exchange>.dlx` after
    /// the queue's first bound exchange (so queues of one exchange share one
    /// dead-letter exchange), else `<queue>.dlx`.
    pub fn dead_letter_exchange(&self) -> String {
        if let Some(x) = &self.dead_letter_route.exchange {
            return x.clone();
        }
        match self.bindings.first() {
            Some(b) => format!("{}.dlx", b.exchange),
            None => format!("{}.dlx", self.name),
        }
    }

    /// The routing key dead letters carry: the route's, else the queue's name.
    pub fn dead_letter_routing_key(&self) -> String {
        self.dead_letter_route
            .routing_key
            .clone()
            .unwrap_or_else(|| self.name.clone())
    }

    /// The dead-letter queue's name, `<queue>.dlq`: where rejected and
    /// expired messages end up when `dead_letter` is on.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.name)
    }

    /// The queue's `x-` arguments, in the form the broker compares them.
    pub fn arguments(&self) -> Result<Vec<(String, AMQPValue)>> {
        let mut args = vec![];
        if let Some(t) = self.queue_type {
            args.push((
                "x-queue-type".into(),
                AMQPValue::LongString(t.as_str().into()),
            ));
        }
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
                AMQPValue::LongString(self.dead_letter_routing_key().into()),
            ));
        }
        if let Some(n) = self.delivery_limit {
            args.push(("x-delivery-limit".into(), AMQPValue::LongLongInt(n.into())));
        }
        if let Some(n) = self.max_priority {
            args.push(("x-max-priority".into(), AMQPValue::LongLongInt(n.into())));
        }
        if let Some(o) = self.overflow {
            args.push((
                "x-overflow".into(),
                AMQPValue::LongString(o.as_str().into()),
            ));
        }
        for (k, v) in &self.extra {
            if TYPED_ARGUMENTS.contains(&k.as_str()) {
                return Err(AmqpError::Invalid(format!(
                    "queue {:?}: argument {k:?} is set by its own key",
                    self.name
                )));
            }
            args.push((k.clone(), v.amqp()));
        }
        self.check()?;
        Ok(args)
    }

    /// What RabbitMQ refuses for the queue's type, said before the broker
    /// closes a channel over it.
    fn check(&self) -> Result<()> {
        let refuse = |why: &str| Err(AmqpError::Invalid(format!("queue {:?}: {why}", self.name)));
        if self.max_priority == Some(0) {
            return refuse("max_priority must be 1 to 255");
        }
        match self.queue_type {
            Some(QueueType::Quorum | QueueType::Stream) => {
                let t = self.queue_type.map_or("", QueueType::as_str);
                if !self.durable || self.exclusive || self.auto_delete {
                    return refuse(&format!(
                        "a {t} queue is durable, never exclusive or auto-deleted"
                    ));
                }
                if self.max_priority.is_some() {
                    return refuse(&format!("a {t} queue has no max_priority"));
                }
                if self.queue_type == Some(QueueType::Stream) {
                    if self.dead_letter || self.delivery_limit.is_some() || self.overflow.is_some()
                    {
                        return refuse(
                            "a stream queue has no dead_letter, delivery_limit or overflow",
                        );
                    }
                } else if self.overflow == Some(Overflow::RejectPublishDlx) {
                    return refuse("a quorum queue has no reject-publish-dlx overflow");
                }
            }
            Some(QueueType::Classic) | None => {
                if self.delivery_limit.is_some() {
                    return refuse("delivery_limit needs type = \"quorum\"");
                }
            }
        }
        Ok(())
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
            let name = queue.dead_letter_exchange();
            // A dead-letter exchange the topology declares keeps its kind.
            if !declared.exchanges.iter().any(|x| x.name == name) {
                let dlx = ExchangeSpec::new(&name, ExchangeType::Direct);
                declare_exchange(channel, &dlx).await?;
                declared.exchanges.push(dlx);
            }
            let dlq = QueueSpec::new(queue.dead_letter_queue())
                .bind(&name, queue.dead_letter_routing_key());
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
        exclusive: spec.exclusive,
        auto_delete: spec.auto_delete,
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
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::Double(f) => f.to_string(),
        other => format!("{other:?}"),
    }
}
