//! AMQP over TLS against the test broker's TLS listener
//! (`MAILROOM_TEST_AMQPS_URL`; its certificate is signed by the test CA in
//! `MAILROOM_TEST_TLS_DIR`, and it checks a client certificate when one is
//! presented). Queues are declared and read back over the plain listener.

use crate::publish::{events, exchange_and_queue};
use crate::source::{cleanup, publish, setup, stored};
use crate::{connect, delete, drain, ready, sqlite_store, unique};
use lapin::BasicProperties;
use mailroom::{Backoff, Draft, Engine, RetryPolicy, Status, TopicSpec};
use mailroom_amqp::{
    AmqpConnection, AmqpHandler, AmqpHandlerSpec, AmqpSource, AmqpSourceSpec, Topology, declare_at,
};
use mailroom_testkit::harness::eventually;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Messages or events each test sends.
const N: usize = 50;

/// A file of the test CA directory, as a URL parameter value.
fn tls_file(name: &str) -> String {
    mailroom_testkit::tls_dir().join(name).display().to_string()
}

/// The TLS listener's URL with `params`.
fn amqps(params: &str) -> String {
    format!("{}?{params}", mailroom_testkit::amqps_url())
}

/// The TLS listener, trusting the test CA.
fn trusted() -> String {
    amqps(&format!("cacertfile={}", tls_file("ca.pem")))
}

/// `n` JSON messages with distinct `message_id`s.
fn messages(n: usize) -> impl Iterator<Item = (BasicProperties, Vec<u8>)> {
    (0..n).map(|i| {
        let props = BasicProperties::default().with_message_id(format!("m-{i}").into());
        (props, format!("{{\"n\":{i}}}").into_bytes())
    })
}

/// A relay engine over SQLite: topic `outbox` publishing to `exchange`
/// with routing key `e.{type}`, retried every 100 ms, and topic `inbound`.
async fn relay_engine(dir: &tempfile::TempDir, exchange: &str) -> (Engine, AmqpHandler) {
    let handler = AmqpHandler::new(AmqpHandlerSpec::new(exchange, "e.{type}"));
    let retry = RetryPolicy {
        max_attempts: 1000,
        backoff: Backoff::Schedule(vec![Duration::from_millis(100)]),
    };
    let engine = Engine::builder(sqlite_store(dir).await)
        .poll_interval(Duration::from_millis(50))
        .topic(
            TopicSpec::new("outbox")
                .retry(retry)
                .timeout(Duration::from_secs(5)),
        )
        .handler("outbox", Arc::new(handler.clone()))
        .topic(TopicSpec::new("inbound"))
        .build()
        .expect("engine");
    (engine, handler)
}

async fn enqueue_outbox(engine: &Engine, n: usize) {
    for i in 0..n {
        let draft = Draft::json("outbox", &serde_json::json!({"i": i}))
            .event_type("made")
            .dedup_key(format!("ev-{i}"));
        engine.enqueue(draft).await.expect("enqueue");
    }
}

/// A source over `amqps://...?cacertfile=<test CA>` consumes every message
/// of its queue: each of the 50 is stored once, and all are acked (the
/// queue ends empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_over_amqps_stores_each_message_once() {
    let (_dir, engine, conn, queue) = setup("tls-in").await;
    let ch = conn.create_channel().await.expect("channel");
    publish(&ch, &queue, messages(N)).await;
    let source = AmqpSource::new(
        engine.clone(),
        AmqpSourceSpec::new("rabbit", "inbound", &queue),
    )
    .expect("source");
    let connection = AmqpConnection::new(&trusted())
        .expect("amqps URL")
        .source(source);
    let status = connection.status();
    let stop = CancellationToken::new();
    let running = tokio::spawn(connection.run(stop.clone()));
    eventually(
        Duration::from_secs(10),
        "the TLS connection is up",
        || async { status.is_up() },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "every message is stored",
        || async { stored(&engine).await == N as u64 },
    )
    .await;
    eventually(Duration::from_secs(10), "the queue is drained", || async {
        ready(&conn, &queue).await == 0
    })
    .await;
    stop.cancel();
    running.await.expect("connection task");
    assert_eq!(stored(&engine).await, N as u64, "each message once");
    cleanup(&conn, &queue).await;
}

/// A relay over amqps publishes 50 events with confirms: each is done only
/// once the broker confirmed it, and the bound queue holds each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_over_amqps_publishes_every_event_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = connect().await;
    let (exchange, queue) = exchange_and_queue(&conn, &unique("tls-relay"), "e.#").await;
    let (engine, handler) = relay_engine(&dir, &exchange).await;
    let connection = AmqpConnection::new(&trusted())
        .expect("amqps URL")
        .handler(handler);
    let status = connection.status();
    let stop = CancellationToken::new();
    tokio::spawn(connection.run(stop.clone()));
    let (e, s) = (engine.clone(), stop.clone());
    tokio::spawn(async move { e.run(s).await });
    eventually(
        Duration::from_secs(10),
        "the TLS connection is up",
        || async { status.is_up() },
    )
    .await;
    enqueue_outbox(&engine, N).await;
    eventually(
        Duration::from_secs(30),
        "every event is published",
        || async { events(&engine, Status::Done).await.len() == N },
    )
    .await;
    stop.cancel();
    let got = drain(&conn, &queue).await;
    let ids: BTreeSet<String> = got
        .iter()
        .filter_map(|m| m.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    assert_eq!(got.len(), N, "each event published once");
    assert_eq!(ids.len(), N, "distinct events");
    delete(&conn, &[queue], &[exchange]).await;
}

/// A broker whose certificate another CA signed is refused within seconds,
/// with the reason (`UnknownIssuer`) and without the password; a
/// connection to it never comes up, so nothing is consumed (the queue keeps
/// its messages) and nothing is published (no outbox event is done).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_of_another_ca_is_refused_and_nothing_flows() {
    let wrong = amqps(&format!("cacertfile={}", tls_file("other-ca.pem")));
    let started = Instant::now();
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        declare_at(&wrong, &Topology::default()),
    )
    .await
    .expect("an answer within 10 s")
    .expect_err("the broker's certificate is not trusted");
    let text = refused.to_string();
    assert!(
        text.contains("UnknownIssuer"),
        "the reason is named: {text}"
    );
    assert!(!text.contains("guest:guest"), "no credentials: {text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused quickly"
    );

    let (dir, _, conn, queue) = setup("tls-wrong-ca").await;
    let ch = conn.create_channel().await.expect("channel");
    publish(&ch, &queue, messages(5)).await;
    let (exchange, bound) = exchange_and_queue(&conn, &unique("tls-wrong-ca"), "e.#").await;
    let (engine, handler) = relay_engine(&dir, &exchange).await;
    let source = AmqpSource::new(
        engine.clone(),
        AmqpSourceSpec::new("rabbit", "inbound", &queue),
    )
    .expect("source");
    let connection = AmqpConnection::new(&wrong)
        .expect("a readable CA file")
        .source(source)
        .handler(handler);
    let status = connection.status();
    let stop = CancellationToken::new();
    tokio::spawn(connection.run(stop.clone()));
    let (e, s) = (engine.clone(), stop.clone());
    tokio::spawn(async move { e.run(s).await });
    enqueue_outbox(&engine, 5).await;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(!status.is_up(), "an unverified connection never comes up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let inbound = mailroom::operate::ListFilter {
        topic: Some("inbound".into()),
        limit: 1000,
        ..Default::default()
    };
    let consumed = engine.operator().list(&inbound).await.expect("list").events;
    assert!(consumed.is_empty(), "nothing consumed");
    assert_eq!(ready(&conn, &queue).await, 5, "the messages stay queued");
    assert!(
        events(&engine, Status::Done).await.is_empty(),
        "nothing published"
    );
    assert_eq!(ready(&conn, &bound).await, 0, "nothing arrived");
    stop.cancel();
    cleanup(&conn, &queue).await;
    delete(&conn, &[bound], &[exchange]).await;
}

/// `verify=verify_none` connects to a broker whose certificate the system
/// roots cannot verify (the same URL without it is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_none_connects_without_checking_the_certificate() {
    let unverified = tokio::time::timeout(
        Duration::from_secs(10),
        declare_at(&mailroom_testkit::amqps_url(), &Topology::default()),
    )
    .await
    .expect("an answer within 10 s");
    assert!(
        unverified.is_err(),
        "the system roots do not know the test CA"
    );
    let connection =
        AmqpConnection::new(&amqps("verify=verify_none")).expect("verify_none is understood");
    let status = connection.status();
    let stop = CancellationToken::new();
    tokio::spawn(connection.run(stop.clone()));
    eventually(Duration::from_secs(10), "the connection is up", || async {
        status.is_up()
    })
    .await;
    stop.cancel();
}

/// A client certificate (`certfile`/`keyfile`) is presented and checked by
/// the broker: the test CA's client certificate connects, a certificate of
/// another CA is refused by the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_and_checked_by_the_broker() {
    let with = |cert: &str, key: &str| {
        format!(
            "{}&certfile={}&keyfile={}",
            trusted(),
            tls_file(cert),
            tls_file(key)
        )
    };
    let declare = |url: String| async move {
        tokio::time::timeout(
            Duration::from_secs(10),
            declare_at(&url, &Topology::default()),
        )
        .await
        .expect("an answer within 10 s")
    };
    declare(with("client.pem", "client.key"))
        .await
        .expect("the test CA's client certificate is accepted");
    let refused = declare(with("other-ca.pem", "other-ca.key"))
        .await
        .expect_err("a client certificate of another CA is refused");
    println!("refused: {refused}");
}
