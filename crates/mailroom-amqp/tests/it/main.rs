//! Integration tests against the real RabbitMQ of `MAILROOM_TEST_AMQP_URL`.
//! Every test declares uniquely named exchanges and queues and deletes them.

mod topology;

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Channel, Connection, ConnectionProperties};

/// A fresh connection to the test broker.
pub async fn connect() -> Connection {
    Connection::connect(
        &mailroom_testkit::amqp_url(),
        ConnectionProperties::default(),
    )
    .await
    .expect("connect to the test RabbitMQ")
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// Deletes queues and exchanges a test declared (on a fresh channel, since
/// the test's may have been closed by the broker).
pub async fn delete(conn: &Connection, queues: &[String], exchanges: &[String]) {
    let ch: Channel = conn.create_channel().await.expect("channel");
    for q in queues {
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
            .expect("delete queue");
    }
    for e in exchanges {
        ch.exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .expect("delete exchange");
    }
}
