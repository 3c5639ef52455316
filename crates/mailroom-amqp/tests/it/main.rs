//! Integration tests against the real RabbitMQ of `MAILROOM_TEST_AMQP_URL`
//! (and its TLS listener, `MAILROOM_TEST_AMQPS_URL`).
//! Every test declares uniquely named exchanges and queues and deletes them.

mod connection;
mod dead_letter;
mod publish;
mod relay;
mod restart;
mod source;
mod tls;
mod topology;

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Channel, Connection, ConnectionProperties};
use std::sync::Arc;

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

/// A migrated SQLite store in `dir` with group commit, as `serve` opens it.
pub async fn sqlite_store(dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    sqlite_at(&dir.path().join("m.db")).await
}

/// A migrated SQLite store at `path`, with group commit.
pub async fn sqlite_at(path: &std::path::Path) -> Arc<dyn mailroom::Store> {
    let url = format!("sqlite://{}", path.display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

/// Ready messages in `queue`, seen by a passive declare.
pub async fn ready(conn: &Connection, queue: &str) -> u32 {
    passive(conn, queue).await.message_count()
}

/// Consumers of `queue`, seen by a passive declare.
pub async fn consumers(conn: &Connection, queue: &str) -> u32 {
    passive(conn, queue).await.consumer_count()
}

async fn passive(conn: &Connection, queue: &str) -> lapin::Queue {
    let ch = conn.create_channel().await.expect("channel");
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(queue.into(), passive, lapin::types::FieldTable::default())
        .await
        .expect("queue exists");
    let _ = ch.close(200, "OK".into()).await;
    q
}

/// Takes every message waiting in `queue` (auto-ack).
pub async fn drain(conn: &Connection, queue: &str) -> Vec<lapin::message::Delivery> {
    let ch = conn.create_channel().await.expect("channel");
    let mut all = vec![];
    let options = lapin::options::BasicGetOptions { no_ack: true };
    while let Some(m) = ch
        .basic_get(queue.into(), options)
        .await
        .expect("basic.get")
    {
        all.push(m.delivery);
    }
    all
}
