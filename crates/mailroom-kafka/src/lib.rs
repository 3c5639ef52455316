//! # mailroom-kafka
//!
//! mailroom's Kafka side, on librdkafka (`rdkafka`):
//!
//! * **connection**: [`KafkaConnection`], the `[kafka]` settings every
//!   client of one cluster shares (`brokers`).
//!
//! Every operation's failure is a [`KafkaError`].

#![deny(missing_docs)]

mod connection;
mod error;

pub use connection::KafkaConnection;
pub use error::{KafkaError, Result};
