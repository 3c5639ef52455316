//! The outbox relay end to end: an application writes an event in its own
//! database transaction (PostgreSQL's `mailroom.enqueue`, SQLite's
//! documented outbox INSERT), mailroom publishes it to the exchange, and
//! consumers (lapin here, Python's pika too) read it from a bound queue.

use crate::publish::{events, exchange_and_queue, header, relay_on};
use crate::{connect, delete, drain, sqlite_at, unique};
use lapin::message::Delivery;
use lapin::types::AMQPValue;
use mailroom::{Draft, Status, TopicSpec};
use mailroom_amqp::AmqpHandlerSpec;
use mailroom_testkit::harness::eventually;
use serde_json::{Value, json};
use sqlx::Connection as _;
use std::time::{Duration, Instant};

/// Checks that `msg` is the outbox event `dedup_key` of type
/// `payment.created` in topic `payments` with body `{"amount": 42}`.
fn assert_payment(msg: &Delivery, dedup_key: &str) {
    let p = &msg.properties;
    let body: Value = serde_json::from_slice(&msg.data).expect("JSON body");
    assert_eq!(body, json!({"amount": 42}));
    assert_eq!(msg.routing_key.as_str(), "payment.created");
    assert_eq!(p.message_id().as_ref().map(|s| s.as_str()), Some(dedup_key));
    assert_eq!(
        p.kind().as_ref().map(|s| s.as_str()),
        Some("payment.created")
    );
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(p.delivery_mode(), &Some(2), "persistent");
    assert_eq!(
        header(p, "mailroom-topic"),
        Some(&AMQPValue::LongString("payments".into()))
    );
}

/// Runs `mailroom.enqueue` for `dedup_key` in a transaction of the
/// application's own connection, then commits or rolls back.
async fn pg_enqueue(app: &mut sqlx::PgConnection, dedup_key: &str, commit: bool) {
    let mut tx = app.begin().await.expect("begin");
    sqlx::query(
        "SELECT mailroom.enqueue('payments', 'payment.created', 'customer-7', $1::jsonb, $2)",
    )
    .bind(r#"{"amount": 42}"#)
    .bind(dedup_key)
    .execute(&mut *tx)
    .await
    .expect("mailroom.enqueue");
    match commit {
        true => tx.commit().await.expect("commit"),
        false => tx.rollback().await.expect("rollback"),
    }
}

/// `mailroom.enqueue` in an application's PostgreSQL transaction: a
/// rollback publishes nothing; each commit is published exactly once with
/// its properties, woken by the commit's notification (the second within a
/// second, while the fallback poll is 10 s).
#[tokio::test]
async fn a_postgres_outbox_commit_is_published_once_and_a_rollback_never() {
    let url = mailroom_testkit::fresh_postgres_db().await;
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    let conn = connect().await;
    let (exchange, queue) = exchange_and_queue(&conn, &unique("pg-outbox"), "payment.*").await;
    let spec = AmqpHandlerSpec::new(&exchange, "{type}");
    let poll = Duration::from_secs(10);
    let (engine, stop) = relay_on(store, &conn, TopicSpec::new("payments"), spec, poll).await;
    let mut app = sqlx::PgConnection::connect(&url)
        .await
        .expect("app connection");

    pg_enqueue(&mut app, "p-rolled-back", false).await;
    pg_enqueue(&mut app, "p-1", true).await;
    eventually(
        Duration::from_secs(15),
        "the first commit is published",
        || async { events(&engine, Status::Done).await.len() == 1 },
    )
    .await;
    pg_enqueue(&mut app, "p-2", true).await;
    let committed = Instant::now();
    eventually(
        Duration::from_secs(5),
        "the second commit is published",
        || async { events(&engine, Status::Done).await.len() == 2 },
    )
    .await;
    let latency = committed.elapsed();
    stop.cancel();

    assert!(
        latency < Duration::from_secs(1),
        "published {latency:?} after commit"
    );
    let mut got = drain(&conn, &queue).await;
    got.sort_by_key(|m| m.properties.message_id().as_ref().map(|s| s.to_string()));
    assert_eq!(got.len(), 2, "each commit once, the rollback never");
    assert_payment(&got[0], "p-1");
    assert_payment(&got[1], "p-2");
    delete(&conn, &[queue], &[exchange]).await;
}

/// Correlation through the outbox to the broker: an event enqueued with
/// `correlation_id` and `causation_id` is published with AMQP's
/// `correlation_id`, the `mailroom-causation-id` header and both in the
/// envelope; its follow-up, enqueued naming only its cause, arrives in the
/// same correlation, caused by the first event.
#[tokio::test]
async fn outbox_correlation_reaches_the_broker_and_follow_ups_keep_it() {
    let url = mailroom_testkit::fresh_postgres_db().await;
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    let conn = connect().await;
    let (exchange, queue) = exchange_and_queue(&conn, &unique("pg-corr"), "payment.*").await;
    let mut spec = AmqpHandlerSpec::new(&exchange, "{type}");
    spec.envelope = true;
    let poll = Duration::from_secs(10);
    let (engine, stop) = relay_on(store, &conn, TopicSpec::new("payments"), spec, poll).await;
    let mut app = sqlx::PgConnection::connect(&url)
        .await
        .expect("app connection");

    let first: String = sqlx::query_scalar(
        "SELECT mailroom.enqueue('payments', 'payment.created', 'customer-7', '{\"amount\": 42}',
                                 'p-1', correlation_id => 'flow-42', causation_id => 'cmd-1')::text",
    )
    .fetch_one(&mut app)
    .await
    .expect("mailroom.enqueue with ids");
    let second: String = sqlx::query_scalar(
        "SELECT mailroom.enqueue('payments', 'payment.settled', 'customer-7', '{\"amount\": 42}',
                                 'p-2', causation_id => $1)::text",
    )
    .bind(&first)
    .fetch_one(&mut app)
    .await
    .expect("mailroom.enqueue of the follow-up");
    eventually(
        Duration::from_secs(15),
        "both events are published",
        || async { events(&engine, Status::Done).await.len() == 2 },
    )
    .await;
    stop.cancel();

    let mut got = drain(&conn, &queue).await;
    got.sort_by_key(|m| m.properties.message_id().as_ref().map(|s| s.to_string()));
    assert_eq!(got.len(), 2);
    let causes = [("cmd-1".to_string(), first.clone()), (first, second)];
    for (msg, (cause, id)) in got.iter().zip(causes) {
        let p = &msg.properties;
        assert_eq!(
            p.correlation_id().as_ref().map(|s| s.as_str()),
            Some("flow-42")
        );
        assert_eq!(
            header(p, "mailroom-causation-id"),
            Some(&AMQPValue::LongString(cause.as_str().into()))
        );
        let body: Value = serde_json::from_slice(&msg.data).expect("JSON envelope");
        assert_eq!(body["eventId"], id);
        assert_eq!(body["correlationId"], "flow-42");
        assert_eq!(body["causationId"], cause);
    }
    delete(&conn, &[queue], &[exchange]).await;
}

/// Runs the SQLite outbox INSERT for `dedup_key` in a transaction of the
/// application's own connection to the database file, then commits or rolls back.
fn sqlite_enqueue(path: &std::path::Path, dedup_key: &str, commit: bool) {
    let mut app = rusqlite::Connection::open(path).expect("open the database file");
    app.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let tx = app.transaction().expect("begin");
    tx.execute(
        mailroom_sqlite::OUTBOX_INSERT,
        rusqlite::named_params! {
            ":topic": "payments",
            ":type": "payment.created",
            ":key": "customer-7",
            ":payload": r#"{"amount": 42}"#,
            ":dedup_key": dedup_key,
        },
    )
    .expect("outbox insert");
    match commit {
        true => tx.commit().expect("commit"),
        false => tx.rollback().expect("rollback"),
    }
}

/// The SQLite outbox INSERT in an application's transaction on the shared
/// file: a rollback publishes nothing, a commit is published exactly once
/// with its properties.
#[tokio::test]
async fn a_sqlite_outbox_commit_is_published_once_and_a_rollback_never() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.db");
    let store = sqlite_at(&path).await;
    let conn = connect().await;
    let (exchange, queue) = exchange_and_queue(&conn, &unique("sqlite-outbox"), "payment.*").await;
    let spec = AmqpHandlerSpec::new(&exchange, "{type}");
    let poll = Duration::from_millis(50);
    let (engine, stop) = relay_on(store, &conn, TopicSpec::new("payments"), spec, poll).await;

    sqlite_enqueue(&path, "s-rolled-back", false);
    sqlite_enqueue(&path, "s-1", true);
    eventually(
        Duration::from_secs(10),
        "the commit is published",
        || async { events(&engine, Status::Done).await.len() == 1 },
    )
    .await;
    // A few poll ticks more: the rolled-back event must not appear late.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();

    let got = drain(&conn, &queue).await;
    assert_eq!(got.len(), 1, "the commit once, the rollback never");
    assert_payment(&got[0], "s-1");
    delete(&conn, &[queue], &[exchange]).await;
}

/// The system interpreter, to which apt's `python3-pika` belongs (`python3`
/// on PATH may be another one, e.g. pyenv's).
fn python() -> &'static str {
    match std::path::Path::new("/usr/bin/python3").exists() {
        true => "/usr/bin/python3",
        false => "python3",
    }
}

/// A consumer written in Python with pika reads what the relay published:
/// the JSON payloads, message ids, type, correlation id, content type,
/// persistence and the mailroom-topic header, in order.
#[tokio::test]
async fn a_python_pika_consumer_reads_what_the_relay_published() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = sqlite_at(&dir.path().join("m.db")).await;
    let conn = connect().await;
    let (exchange, queue) = exchange_and_queue(&conn, &unique("pika"), "order.#").await;
    let spec = AmqpHandlerSpec::new(&exchange, "{type}");
    let topic = TopicSpec::new("orders");
    let poll = Duration::from_millis(50);
    let (engine, stop) = relay_on(store, &conn, topic, spec, poll).await;
    for i in 0..3 {
        let draft = Draft::json("orders", &json!({"order": i, "note": "é ✓"}))
            .dedup_key(format!("order-{i}"))
            .event_type("order.created")
            .correlation_id(format!("corr-{i}"));
        engine.enqueue(draft).await.expect("enqueue");
        eventually(
            Duration::from_secs(10),
            "the event is published",
            || async { events(&engine, Status::Done).await.len() == i + 1 },
        )
        .await;
    }
    stop.cancel();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/pika_consumer.py");
    let out = tokio::process::Command::new(python())
        .args([script, &mailroom_testkit::amqp_url(), &queue, "3"])
        .output()
        .await
        .expect("run python3 (apt package python3-pika)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the pika consumer failed: {stderr}");
    let read: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let expected: Vec<Value> = (0..3)
        .map(|i| {
            json!({
                "routing_key": "order.created",
                "message_id": format!("order-{i}"),
                "type": "order.created",
                "correlation_id": format!("corr-{i}"),
                "content_type": "application/json",
                "delivery_mode": 2,
                "topic": "orders",
                "body": {"order": i, "note": "é ✓"},
            })
        })
        .collect();
    assert_eq!(read, expected);
    delete(&conn, &[queue], &[exchange]).await;
}
