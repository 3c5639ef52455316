//! Dead letters handed to the broker: a topic whose events go dead has a
//! dead-letter topic whose AMQP publisher (`dead_letters = true`) sends
//! each death to the broker once, with its last error, while the event
//! stays dead (and replayable) in mailroom.

use crate::publish::{events, exchange_and_queue, header};
use crate::{connect, delete, drain, sqlite_at, sqlite_store, unique};
use lapin::message::Delivery;
use lapin::types::AMQPValue;
use mailroom::handler::Handler;
use mailroom::{Backoff, Draft, Engine, Event, Outcome, RetryPolicy, Status, TopicSpec};
use mailroom_amqp::{
    AmqpConnection, AmqpHandler, AmqpHandlerSpec, ExchangeSpec, ExchangeType, QueueSpec, Topology,
};
use mailroom_testkit::PrivateRabbit;
use mailroom_testkit::harness::eventually;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A handler that fails every attempt, naming it, until told to succeed.
#[derive(Debug, Default)]
struct Failing {
    succeed: AtomicBool,
}

#[async_trait::async_trait]
impl Handler for Failing {
    async fn handle(&self, event: &Event) -> Outcome {
        match self.succeed.load(Ordering::SeqCst) {
            true => Outcome::Success,
            false => Outcome::retry(format!("HTTP 500 on attempt {}", event.attempts)),
        }
    }
}

fn two_fast_attempts() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 2,
        backoff: Backoff::Schedule(vec![Duration::from_millis(20)]),
    }
}

/// An engine with topic `payments` (run by `failing`, two attempts) whose
/// dead letters go through topic `payments.dead-letter` to `publisher`.
fn engine(
    store: Arc<dyn mailroom::Store>,
    failing: Arc<Failing>,
    publisher: AmqpHandler,
) -> Engine {
    let relay = TopicSpec::new("payments.dead-letter").retry(RetryPolicy {
        max_attempts: 1000,
        backoff: Backoff::Schedule(vec![Duration::from_millis(200)]),
    });
    Engine::builder(store)
        .poll_interval(Duration::from_millis(50))
        .topic(
            TopicSpec::new("payments")
                .retry(two_fast_attempts())
                .dead_letter("payments.dead-letter"),
        )
        .handler("payments", failing)
        .topic(relay)
        .handler("payments.dead-letter", Arc::new(publisher))
        .build()
        .expect("engine")
}

fn dead_letter_spec(exchange: &str) -> AmqpHandlerSpec {
    AmqpHandlerSpec {
        dead_letters: true,
        ..AmqpHandlerSpec::new(exchange, "dead.{topic}.{type}")
    }
}

fn text<'a>(msg: &'a Delivery, name: &str) -> Option<&'a str> {
    match header(&msg.properties, name)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        _ => None,
    }
}

fn int(msg: &Delivery, name: &str) -> Option<i64> {
    match header(&msg.properties, name)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        _ => None,
    }
}

/// Waits until the broker's queue holds `n` messages and no more come
/// within a second, and takes them.
async fn settled(conn: &lapin::Connection, queue: &str, n: usize) -> Vec<Delivery> {
    let mut got = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got.len() < n && std::time::Instant::now() < deadline {
        got.extend(drain(conn, queue).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        got.len() >= n,
        "{n} dead letters reach {queue} within 30 s: {}",
        got.len()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    got.extend(drain(conn, queue).await);
    got
}

/// Whether `queue` exists (a passive declare on a fresh channel).
async fn exists(conn: &lapin::Connection, queue: &str) -> bool {
    let Ok(ch) = conn.create_channel().await else {
        return false;
    };
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), passive, lapin::types::FieldTable::default())
        .await
        .is_ok()
}

/// An event that runs out of attempts reaches the broker's queue once, as
/// the relay publishes a live event (body, routing key of the dead event's
/// topic and type, message id `<id>/<attempt>`, type, correlation id,
/// `mailroom-topic`, `mailroom-attempt`) plus its last error in
/// `mailroom-error`; it stays dead in mailroom. Replayed, it dies again
/// and is published again (once per death); replayed with a healthy
/// handler it is done and nothing more is published.
#[tokio::test]
async fn a_dead_event_reaches_the_broker_once_per_death_with_its_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = connect().await;
    let (exchange, queue) = exchange_and_queue(&conn, &unique("dlq"), "dead.#").await;
    let publisher = AmqpHandler::new(dead_letter_spec(&exchange));
    publisher
        .attach(conn.create_channel().await.expect("channel"))
        .await
        .expect("attach");
    let failing = Arc::new(Failing::default());
    let engine = engine(sqlite_store(&dir).await, failing.clone(), publisher);
    let stop = CancellationToken::new();
    let (e, s) = (engine.clone(), stop.clone());
    tokio::spawn(async move { e.run(s).await });

    let draft = Draft::json("payments", &json!({"amount": 42}))
        .dedup_key("pay-1")
        .event_type("payment.created")
        .correlation_id("corr-1");
    let id = engine.enqueue(draft).await.expect("enqueue").id;

    let first = settled(&conn, &queue, 1).await;
    assert_eq!(first.len(), 1, "one death, one message");
    let msg = &first[0];
    let body: serde_json::Value = serde_json::from_slice(&msg.data).expect("JSON body");
    assert_eq!(body, json!({"amount": 42}));
    assert_eq!(msg.routing_key.as_str(), "dead.payments.payment.created");
    let p = &msg.properties;
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some(format!("{id}/2").as_str())
    );
    assert_eq!(
        p.kind().as_ref().map(|s| s.as_str()),
        Some("payment.created")
    );
    assert_eq!(
        p.correlation_id().as_ref().map(|s| s.as_str()),
        Some("corr-1")
    );
    assert_eq!(p.delivery_mode(), &Some(2), "persistent");
    assert_eq!(text(msg, "mailroom-topic"), Some("payments"));
    assert_eq!(int(msg, "mailroom-attempt"), Some(2));
    assert_eq!(text(msg, "mailroom-error"), Some("HTTP 500 on attempt 2"));
    let dead = engine
        .operator()
        .get(id)
        .await
        .expect("get")
        .expect("event");
    assert_eq!(dead.status, Status::Dead, "it stays dead in mailroom");

    engine.operator().replay(id).await.expect("replay");
    let second = settled(&conn, &queue, 1).await;
    assert_eq!(second.len(), 1, "the second death, once");
    assert_eq!(
        second[0]
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.as_str()),
        Some(format!("{id}/4").as_str())
    );
    assert_eq!(
        text(&second[0], "mailroom-error"),
        Some("HTTP 500 on attempt 4")
    );

    failing.succeed.store(true, Ordering::SeqCst);
    engine.operator().replay(id).await.expect("replay");
    eventually(
        Duration::from_secs(10),
        "the replayed event is done",
        || async {
            engine
                .operator()
                .get(id)
                .await
                .ok()
                .flatten()
                .map(|e| e.status)
                == Some(Status::Done)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        drain(&conn, &queue).await.is_empty(),
        "a success publishes nothing"
    );
    let copies = events(&engine, Status::Done)
        .await
        .into_iter()
        .filter(|e| e.topic == "payments.dead-letter")
        .count();
    assert_eq!(copies, 2, "one copy per death");
    stop.cancel();
    delete(&conn, &[queue], &[exchange]).await;
}

/// A copy enqueued by hand into a dead-letter topic that is not a dead
/// letter fails for good, naming why, instead of publishing garbage.
#[tokio::test]
async fn a_dead_letter_publisher_refuses_what_is_not_a_dead_letter() {
    let conn = connect().await;
    let (exchange, queue) = exchange_and_queue(&conn, &unique("dlq-bad"), "dead.#").await;
    let publisher = AmqpHandler::new(dead_letter_spec(&exchange));
    publisher
        .attach(conn.create_channel().await.expect("channel"))
        .await
        .expect("attach");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite_store(&dir).await;
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("x"))
        .build()
        .expect("engine");
    engine
        .enqueue(Draft::json("x", &json!({"not": "a dead letter"})).dedup_key("k"))
        .await
        .expect("enqueue");
    let event = &events(&engine, Status::Pending).await[0];
    let outcome = publisher.handle(event).await;
    let Outcome::Permanent { error } = outcome else {
        panic!("expected a permanent failure, got {outcome:?}");
    };
    assert!(error.contains("not a dead-letter copy"), "{error}");
    assert!(drain(&conn, &queue).await.is_empty());
    delete(&conn, &[queue], &[exchange]).await;
}

/// The broker is down (a private node, stopped) while events go dead: they
/// stay dead in mailroom, their copies wait, and once the node is back
/// every dead event reaches the queue exactly once. A restart of mailroom
/// in between (its in-memory notices lost) still hands on the deaths it
/// had not yet handed on, from the store.
#[tokio::test]
async fn dead_events_reach_the_broker_after_an_outage_and_a_restart() {
    let rabbit = Arc::new(
        tokio::task::spawn_blocking(PrivateRabbit::start)
            .await
            .expect("node"),
    );
    let url = rabbit.url().to_string();
    let topology = Topology {
        exchanges: vec![ExchangeSpec::new("dl.events", ExchangeType::Topic)],
        queues: vec![QueueSpec::new("dl.q").bind("dl.events", "dead.#")],
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.db");
    let start = |store: Arc<dyn mailroom::Store>| {
        let publisher = AmqpHandler::new(dead_letter_spec("dl.events"));
        let engine = engine(store, Arc::new(Failing::default()), publisher.clone());
        let connection = AmqpConnection::new(&url)
            .expect("URL")
            .topology(topology.clone())
            .handler(publisher);
        let stop = CancellationToken::new();
        tokio::spawn(connection.run(stop.clone()));
        let (e, s) = (engine.clone(), stop.clone());
        let run = tokio::spawn(async move { e.run(s).await });
        (engine, stop, run)
    };
    let (engine, stop, run) = start(sqlite_at(&path).await);
    let consumer = lapin::Connection::connect(&url, Default::default())
        .await
        .expect("connect");
    eventually(
        Duration::from_secs(20),
        "the topology is declared",
        || async { exists(&consumer, "dl.q").await },
    )
    .await;
    drop(consumer);

    let r = rabbit.clone();
    tokio::task::spawn_blocking(move || r.stop())
        .await
        .expect("stop");
    for i in 0..5 {
        let draft = Draft::json("payments", &json!({ "n": i }))
            .dedup_key(format!("d-{i}"))
            .event_type("t");
        engine.enqueue(draft).await.expect("enqueue");
    }
    let dead_copies = || async {
        let dead = events(&engine, Status::Dead).await;
        let waiting = events(&engine, Status::Pending).await;
        let copies = waiting
            .iter()
            .filter(|e| e.topic == "payments.dead-letter")
            .count();
        dead.len() == 5 && copies == 5
    };
    eventually(
        Duration::from_secs(20),
        "five events die and five copies wait",
        dead_copies,
    )
    .await;

    // mailroom restarts while the broker is down; then the broker returns.
    stop.cancel();
    run.await.expect("engine stopped");
    let (engine, stop, _run) = start(sqlite_at(&path).await);
    let r = rabbit.clone();
    tokio::task::spawn_blocking(move || r.start_again())
        .await
        .expect("start again");
    let conn = lapin::Connection::connect(&url, Default::default())
        .await
        .expect("connect");
    let got = settled(&conn, "dl.q", 5).await;
    let mut ids: Vec<String> = got
        .iter()
        .filter_map(|m| m.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(got.len(), 5, "every dead event once: {ids:?}");
    assert_eq!(ids.len(), 5, "five distinct deaths");
    assert_eq!(events(&engine, Status::Dead).await.len(), 5, "still dead");
    stop.cancel();
}
