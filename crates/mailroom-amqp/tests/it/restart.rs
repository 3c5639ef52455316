//! The broker process itself is stopped and started again while mailroom
//! relays and consumes: on a private node ([`PrivateRabbit`]), never the
//! shared one the other tests use.

use crate::{ready, sqlite_at};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use mailroom::{Backoff, Draft, Engine, RetryPolicy, Status, TopicSpec};
use mailroom_amqp::{
    AmqpConnection, AmqpHandler, AmqpHandlerSpec, AmqpSource, AmqpSourceSpec, ExchangeSpec,
    ExchangeType, QueueSpec, Topology, declare,
};
use mailroom_testkit::PrivateRabbit;
use mailroom_testkit::harness::eventually;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Messages waiting in the preloaded queue before mailroom starts.
const PRELOADED: u64 = 20_000;
/// Outbox events enqueued, at a steady pace across the restart.
const OUTBOX: u64 = 3_000;

/// Runs a blocking [`PrivateRabbit`] step off the runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("node step")
}

/// Publishes `PRELOADED` persistent messages (`message_id` `p-<i>`) into
/// `queue` through the default exchange, with confirms.
async fn preload(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    for i in 0..PRELOADED {
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(format!("p-{i}").into());
        let body = format!("{{\"n\":{i}}}");
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            props,
        )
        .await
        .expect("publish");
    }
    ch.wait_for_confirms().await.expect("confirmed");
}

/// Events of `topic` in `status`.
async fn count(engine: &Engine, topic: &str, status: Status) -> u64 {
    let stats = engine.operator().stats().await.expect("stats");
    stats
        .iter()
        .find(|s| s.topic == topic)
        .map_or(0, |s| s.count(status))
}

/// Rows of `topic` in the SQLite file and their distinct dedup keys.
fn rows_and_keys(path: &Path, topic: &str) -> (u64, HashSet<String>) {
    let db = rusqlite::Connection::open(path).expect("open the store file");
    let mut stmt = db
        .prepare("SELECT dedup_key FROM events WHERE topic = ?1")
        .expect("prepare");
    let keys: Vec<String> = stmt
        .query_map([topic], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    (keys.len() as u64, keys.into_iter().collect())
}

fn expected(prefix: &str, n: u64) -> HashSet<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// The topology: a topic exchange, the relay's queue bound to it (consumed
/// back into topic `relayed`), and a queue preloaded by another client
/// (consumed into topic `preloaded`).
fn topology() -> Topology {
    Topology {
        exchanges: vec![ExchangeSpec::new("restart.events", ExchangeType::Topic)],
        queues: vec![
            QueueSpec::new("restart.relayed").bind("restart.events", "e.#"),
            QueueSpec::new("restart.preloaded"),
        ],
    }
}

/// An engine with the relay topic `outbox` (an `amqp` handler, retried
/// every 200 ms) and the two inbound topics, and the supervised connection
/// running the handler and both sources.
fn mailroom_on(store: Arc<dyn mailroom::Store>, url: &str) -> (Engine, AmqpConnection) {
    let handler = AmqpHandler::new(AmqpHandlerSpec::new("restart.events", "e.{type}"));
    let retry = RetryPolicy {
        max_attempts: 1000,
        backoff: Backoff::Schedule(vec![Duration::from_millis(200)]),
    };
    let outbox = TopicSpec::new("outbox")
        .retry(retry)
        .timeout(Duration::from_secs(5));
    let engine = Engine::builder(store)
        .poll_interval(Duration::from_millis(100))
        .topic(outbox)
        .handler("outbox", Arc::new(handler.clone()))
        .topic(TopicSpec::new("relayed"))
        .topic(TopicSpec::new("preloaded"))
        .build()
        .expect("engine");
    let source = |name: &str| {
        let spec = AmqpSourceSpec::new(name, name, format!("restart.{name}"));
        AmqpSource::new(engine.clone(), spec).expect("source")
    };
    let connection = AmqpConnection::new(url)
        .expect("broker URL")
        .topology(topology())
        .source(source("relayed"))
        .source(source("preloaded"))
        .handler(handler);
    (engine, connection)
}

/// Enqueues `OUTBOX` outbox events, 30 every 100 ms (about 10 s).
async fn produce(engine: Engine) {
    for i in 0..OUTBOX {
        let draft = Draft::json("outbox", &serde_json::json!({"i": i}))
            .event_type("made")
            .dedup_key(format!("o-{i}"));
        engine.enqueue(draft).await.expect("enqueue");
        if i % 30 == 29 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A private RabbitMQ node is stopped (SIGTERM) and started again while a
/// relay publishes a steady stream of outbox events into a queue that a
/// source consumes back, and another source works through 20,000 preloaded
/// messages. With no help, mailroom reconnects, re-declares and resumes:
/// every outbox event is published (none dead), every message of both
/// queues is stored exactly once (redeliveries deduplicated by
/// `message_id`), and once mailroom has closed its connection both queues
/// are empty, so nothing is left unacknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_and_consumer_recover_from_a_broker_restart_under_load() {
    let rabbit = Arc::new(blocking(PrivateRabbit::start).await);
    let url = rabbit.url().to_string();
    let setup = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect to the private node");
    declare(&setup.create_channel().await.expect("channel"), &topology())
        .await
        .expect("declare");
    preload(&setup, "restart.preloaded").await;
    let _ = setup.close(200, "OK".into()).await;

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.db");
    let (engine, connection) = mailroom_on(sqlite_at(&path).await, &url);
    let status = connection.status();
    let stop = CancellationToken::new();
    let supervisor = tokio::spawn(connection.run(stop.clone()));
    let (e, s) = (engine.clone(), stop.clone());
    let dispatcher = tokio::spawn(async move { e.run(s).await });
    eventually(Duration::from_secs(20), "the connection is up", || async {
        status.is_up()
    })
    .await;
    let producer = tokio::spawn(produce(engine.clone()));

    eventually(
        Duration::from_secs(60),
        "both the relay and the consumer are at work",
        || async {
            count(&engine, "outbox", Status::Done).await >= 300
                && count(&engine, "preloaded", Status::Pending).await >= 2_000
        },
    )
    .await;
    let r = rabbit.clone();
    blocking(move || r.stop()).await;
    eventually(
        Duration::from_secs(10),
        "the status shows the broker gone",
        || async { !status.is_up() },
    )
    .await;
    let stored_at_stop = count(&engine, "preloaded", Status::Pending).await;
    let published_at_stop = count(&engine, "outbox", Status::Done).await;
    assert!(
        stored_at_stop < PRELOADED,
        "the consumer had finished before the broker stopped: the test proves nothing"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = rabbit.clone();
    blocking(move || r.start_again()).await;
    eventually(
        Duration::from_secs(60),
        "the connection is back by itself",
        || async { status.is_up() },
    )
    .await;

    producer.await.expect("producer");
    eventually(
        Duration::from_secs(120),
        "every event is published and stored",
        || async {
            count(&engine, "outbox", Status::Done).await == OUTBOX
                && count(&engine, "relayed", Status::Pending).await == OUTBOX
                && count(&engine, "preloaded", Status::Pending).await == PRELOADED
        },
    )
    .await;
    eprintln!(
        "at the stop: {stored_at_stop} of {PRELOADED} preloaded stored, {published_at_stop} of {OUTBOX} published"
    );
    stop.cancel();
    supervisor.await.expect("supervisor");
    dispatcher.await.expect("dispatcher");

    assert_eq!(count(&engine, "outbox", Status::Dead).await, 0);
    for (topic, prefix, n) in [("relayed", "o", OUTBOX), ("preloaded", "p", PRELOADED)] {
        let (rows, keys) = rows_and_keys(&path, topic);
        assert_eq!(rows, n, "{topic}: one row per message");
        assert_eq!(keys, expected(prefix, n), "{topic}: every message, once");
    }
    let check = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect after the run");
    for queue in ["restart.relayed", "restart.preloaded"] {
        assert_eq!(ready(&check, queue).await, 0, "{queue} is not empty");
    }
    let _ = check.close(200, "OK".into()).await;
    blocking(move || drop(rabbit)).await;
}
