//! # mailroom-amqp
//!
//! mailroom's RabbitMQ side (AMQP 0-9-1, on `lapin`):
//!
//! * **topology**: exchanges, queues (TTL, max length, dead-letter
//!   exchange and queue) and bindings declared from configuration, at start
//!   and after every reconnect;
//! * **source**: a consumer that stores each delivery through the engine and
//!   acknowledges it only after its event has committed;
//! * **broker**: `amqp://` and `amqps://` URLs, with RabbitMQ's TLS query
//!   parameters (`cacertfile`, `certfile`, `keyfile`,
//!   `server_name_indication`, `verify`) on rustls;
//! * **handler**: a publisher with publisher confirms and `mandatory`, so a
//!   topic whose handler publishes is the outbox relay.
//!
//! Every operation's failure is an [`AmqpError`]; a broker's refusal of a
//! declare (`PRECONDITION_FAILED`) names the queue and the argument.

#![deny(missing_docs)]

mod broker;
mod confirms;
pub mod connection;
pub mod declare;
mod error;
pub mod publish;
pub mod source;

pub use broker::Broker;
pub use connection::{AmqpConnection, AmqpStatus, declare_at};
pub use declare::{
    Binding, DeadLetterRoute, Declared, ExchangeSpec, ExchangeType, Overflow, QueueArgument,
    QueueSpec, QueueType, Topology, declare,
};
pub use error::{AmqpError, Result};
pub use publish::{AmqpHandler, AmqpHandlerSpec};
pub use source::{AmqpSource, AmqpSourceSpec};
