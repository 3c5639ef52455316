use crate::{connect, delete, drain, ready, sqlite_at, sqlite_store, unique};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use mailroom::operate::ListFilter;
use mailroom::{Engine, Status, TopicSpec};
use mailroom_amqp::{AmqpSource, AmqpSourceSpec, QueueSpec, Topology, declare};
use mailroom_testkit::harness::eventually;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Declares a durable queue with a dead-letter queue; returns its name.
async fn dead_lettered_queue(conn: &Connection, base: &str) -> String {
    let mut queue = QueueSpec::new(format!("{base}.in"));
    queue.dead_letter = true;
    let topology = Topology {
        exchanges: vec![],
        queues: vec![queue],
    };
    declare(&conn.create_channel().await.expect("channel"), &topology)
        .await
        .expect("declare");
    format!("{base}.in")
}

/// A SQLite engine with topic `inbound`, a connection, and a fresh
/// dead-lettered queue named after `prefix`.
pub(crate) async fn setup(prefix: &str) -> (tempfile::TempDir, Engine, Connection, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::builder(sqlite_store(&dir).await)
        .topic(TopicSpec::new("inbound"))
        .build()
        .expect("engine");
    let conn = connect().await;
    let queue = dead_lettered_queue(&conn, &unique(prefix)).await;
    (dir, engine, conn, queue)
}

pub(crate) async fn cleanup(conn: &Connection, queue: &str) {
    delete(
        conn,
        &[queue.to_string(), format!("{queue}.dlq")],
        &[format!("{queue}.dlx")],
    )
    .await;
}

/// Publishes through the default exchange straight into `queue`, with confirms.
pub(crate) async fn publish(
    ch: &Channel,
    queue: &str,
    messages: impl IntoIterator<Item = (BasicProperties, Vec<u8>)>,
) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    for (props, body) in messages {
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            &body,
            props,
        )
        .await
        .expect("publish");
    }
    ch.wait_for_confirms().await.expect("confirmed");
}

/// Runs a source of `engine` with `spec` on a channel of its own until the
/// returned token is cancelled.
async fn start(
    conn: &Connection,
    engine: &Engine,
    spec: AmqpSourceSpec,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let source = AmqpSource::new(engine.clone(), spec).expect("source");
    let stop = CancellationToken::new();
    let token = stop.clone();
    let ch = conn.create_channel().await.expect("channel");
    let task = tokio::spawn(async move {
        source
            .consume(&ch, &token)
            .await
            .expect("consumed until shutdown");
        // consume closed the channel: every ack reached the broker.
        assert!(!ch.status().connected(), "the channel is closed");
    });
    (stop, task)
}

/// Waits up to `secs` seconds until exactly `n` events are stored.
async fn wait_stored(engine: &Engine, n: u64, secs: u64) {
    eventually(
        Duration::from_secs(secs),
        &format!("{n} events are stored"),
        || async { stored(engine).await == n },
    )
    .await;
}

/// Waits until `queue` has no ready message.
async fn wait_drained(conn: &Connection, queue: &str) {
    eventually(Duration::from_secs(10), "the queue is drained", || async {
        ready(conn, queue).await == 0
    })
    .await;
}

pub(crate) async fn stored(engine: &Engine) -> u64 {
    engine
        .operator()
        .stats()
        .await
        .expect("stats")
        .iter()
        .map(|s| s.count(Status::Pending))
        .sum()
}

/// 10,000 messages of which 10 % repeat an earlier `message_id` (prefetch
/// 100): exactly the 9,000 distinct ones are stored, and after the consumer
/// closes its channel the queue is empty, so every delivery was acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_message_ids_are_stored_once_and_every_delivery_is_acked() {
    let (_dir, engine, conn, queue) = setup("inbound").await;
    let messages = (0..10_000u32).map(|i| {
        let id = if i % 10 == 9 { i / 2 } else { i - i / 10 };
        let props = BasicProperties::default().with_message_id(format!("m-{id}").into());
        (props, format!("{{\"n\":{i}}}").into_bytes())
    });
    publish(
        &conn.create_channel().await.expect("channel"),
        &queue,
        messages,
    )
    .await;

    let mut spec = AmqpSourceSpec::new("rabbit", "inbound", &queue);
    spec.prefetch = 100;
    let started = Instant::now();
    let (stop, task) = start(&conn, &engine, spec).await;
    wait_stored(&engine, 9_000, 120).await;
    wait_drained(&conn, &queue).await;
    let took = started.elapsed();
    stop.cancel();
    task.await.expect("consumer task");
    println!("10,000 deliveries stored and acked in {took:?}");
    assert_eq!(
        ready(&conn, &queue).await,
        0,
        "nothing unacked went back to the queue"
    );
    assert_eq!(stored(&engine).await, 9_000);
    assert_eq!(
        ready(&conn, &format!("{queue}.dlq")).await,
        0,
        "nothing dead-lettered"
    );
    cleanup(&conn, &queue).await;
}

/// A JSON message without `message_id` nor `eventId`, and a non-JSON message
/// without `message_id`, are rejected into the dead-letter queue; the good
/// message beside them is stored.
#[tokio::test]
async fn unidentifiable_messages_end_in_the_dead_letter_queue() {
    let (_dir, engine, conn, queue) = setup("reject").await;
    let good = BasicProperties::default().with_message_id("ok-1".into());
    publish(
        &conn.create_channel().await.expect("channel"),
        &queue,
        [
            (BasicProperties::default(), br#"{"hello":"no id"}"#.to_vec()),
            (BasicProperties::default(), b"not json at all".to_vec()),
            (good, br#"{"fine":true}"#.to_vec()),
        ],
    )
    .await;

    let (stop, task) = start(
        &conn,
        &engine,
        AmqpSourceSpec::new("rabbit", "inbound", &queue),
    )
    .await;
    wait_stored(&engine, 1, 10).await;
    let dlq = format!("{queue}.dlq");
    eventually(
        Duration::from_secs(10),
        "two messages are dead-lettered",
        || async { ready(&conn, &dlq).await == 2 },
    )
    .await;
    stop.cancel();
    task.await.expect("consumer task");

    let mut dead: Vec<String> = drain(&conn, &dlq)
        .await
        .into_iter()
        .map(|m| String::from_utf8(m.data).expect("utf-8"))
        .collect();
    dead.sort();
    assert_eq!(dead, ["not json at all", r#"{"hello":"no id"}"#]);
    cleanup(&conn, &queue).await;
}

/// The engine's rules hold on this door too (`mailroom::accept`): a
/// message without an ordering key for a sequential topic is rejected
/// without requeue (it reaches the dead-letter queue), counted
/// `outcome="rejected"`, and never stored; the keyed one beside it is.
#[tokio::test]
async fn a_keyless_message_for_a_sequential_topic_is_rejected_and_counted() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    // A current-thread runtime: the source's tasks record on this thread.
    let _local = metrics::set_default_local_recorder(&recorder);
    let dir = tempfile::tempdir().expect("tempdir");
    let topic = TopicSpec::new("inbound")
        .mode(mailroom::Mode::Sequential {
            on_dead: mailroom::OnDead::Block,
        })
        .key(mailroom::Field::Json("/customer".into()));
    let engine = Engine::builder(sqlite_store(&dir).await)
        .topic(topic)
        .build()
        .expect("engine");
    let conn = connect().await;
    let queue = dead_lettered_queue(&conn, &unique("keyless")).await;
    let id = |m: &str| BasicProperties::default().with_message_id(m.into());
    publish(
        &conn.create_channel().await.expect("channel"),
        &queue,
        [
            (id("no-key"), br#"{"n":1}"#.to_vec()),
            (id("keyed"), br#"{"customer":"c-1"}"#.to_vec()),
        ],
    )
    .await;
    let spec = AmqpSourceSpec::new("rabbit", "inbound", &queue);
    let (stop, task) = start(&conn, &engine, spec).await;
    wait_stored(&engine, 1, 10).await;
    let dlq = format!("{queue}.dlq");
    eventually(
        Duration::from_secs(10),
        "the keyless message is dead-lettered",
        || async { ready(&conn, &dlq).await == 1 },
    )
    .await;
    stop.cancel();
    task.await.expect("consumer task");
    let dead = drain(&conn, &dlq).await;
    assert_eq!(dead[0].data, br#"{"n":1}"#);
    let text = metrics.render();
    assert!(
        text.lines()
            .any(|l| l.starts_with("mailroom_events_received_total")
                && l.contains(r#"outcome="rejected""#)
                && l.contains(r#"source="rabbit""#)
                && l.ends_with(" 1")),
        "{text}"
    );
    assert_eq!(stored(&engine).await, 1);
    cleanup(&conn, &queue).await;
}

/// Without properties, a JSON envelope supplies the dedup key, type,
/// correlation and causation ids and version; properties and headers
/// (`mailroom-version`) win over the envelope when present; the body is
/// stored as received; the key is read by pointer.
#[tokio::test]
async fn ids_come_from_properties_else_from_the_envelope() {
    let (_dir, engine, conn, queue) = setup("envelope").await;
    let envelope = br#"{"eventId":"ev-1","eventType":"order.created","correlationId":"corr-1","causationId":"cause-1","version":3,"data":{"order":{"customer":"c-9"}}}"#;
    let mut headers = FieldTable::default();
    headers.insert(
        "mailroom-causation-id".into(),
        AMQPValue::LongString("cause-p".into()),
    );
    headers.insert("mailroom-version".into(), AMQPValue::LongString("2".into()));
    let props = BasicProperties::default()
        .with_message_id("msg-2".into())
        .with_type("order.paid".into())
        .with_correlation_id("corr-p".into())
        .with_headers(headers);
    publish(
        &conn.create_channel().await.expect("channel"),
        &queue,
        [
            (BasicProperties::default(), envelope.to_vec()),
            (props, envelope.to_vec()),
        ],
    )
    .await;

    let mut spec = AmqpSourceSpec::new("rabbit", "inbound", &queue);
    spec.key = Some(mailroom::Field::Json("/data/order/customer".into()));
    let (stop, task) = start(&conn, &engine, spec).await;
    wait_stored(&engine, 2, 10).await;
    stop.cancel();
    task.await.expect("consumer task");

    let filter = ListFilter {
        topic: Some("inbound".into()),
        limit: 10,
        ..Default::default()
    };
    let mut events = engine.operator().list(&filter).await.expect("list").events;
    events.sort_by(|a, b| a.dedup_key.cmp(&b.dedup_key));
    let seen: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.dedup_key.as_str(),
                e.event_type.as_deref(),
                e.correlation_id.as_deref(),
                e.causation_id.as_deref(),
                e.key.as_deref(),
                e.source.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "ev-1",
                Some("order.created"),
                Some("corr-1"),
                Some("cause-1"),
                Some("c-9"),
                "rabbit"
            ),
            (
                "msg-2",
                Some("order.paid"),
                Some("corr-p"),
                Some("cause-p"),
                Some("c-9"),
                "rabbit"
            ),
        ]
    );
    assert_eq!(
        events[0].payload.as_deref(),
        Some(&envelope[..]),
        "the body as received"
    );
    assert_eq!(events[0].content_type.as_deref(), Some("application/json"));
    let versions: Vec<_> = events.iter().map(|e| e.version.as_deref()).collect();
    assert_eq!(versions, [Some("3"), Some("2")]);
    cleanup(&conn, &queue).await;
}

/// While the store cannot commit (another connection holds SQLite's write
/// lock), no delivery is acknowledged: nothing is stored and nothing is
/// lost. Once the lock is released the paused consumer resumes within
/// seconds (the pause grows once per pause, not once per failed delivery)
/// and every message is stored and acked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_requeued_while_the_store_cannot_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.db");
    let mut options = mailroom_sqlite::SqliteOptions::new(&path);
    options.busy_timeout = std::time::Duration::from_millis(50);
    let store = std::sync::Arc::new(mailroom_sqlite::SqliteStore::open(options).expect("open"));
    mailroom::Store::migrate(store.as_ref())
        .await
        .expect("migrate");
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("inbound"))
        .build()
        .expect("engine");
    let conn = connect().await;
    let queue = dead_lettered_queue(&conn, &unique("locked")).await;

    let lock = rusqlite::Connection::open(&path).expect("second connection");
    lock.execute_batch("BEGIN EXCLUSIVE").expect("write lock");
    let messages = (0..20).map(|i| {
        let props = BasicProperties::default().with_message_id(format!("l-{i}").into());
        (props, b"{}".to_vec())
    });
    publish(
        &conn.create_channel().await.expect("channel"),
        &queue,
        messages,
    )
    .await;
    let spec = AmqpSourceSpec::new("rabbit", "inbound", &queue);
    let (stop, task) = start(&conn, &engine, spec).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(stored(&engine).await, 0, "nothing could commit");
    assert_eq!(
        ready(&conn, &format!("{queue}.dlq")).await,
        0,
        "nothing was rejected"
    );

    lock.execute_batch("COMMIT").expect("release");
    wait_stored(&engine, 20, 5).await;
    wait_drained(&conn, &queue).await;
    stop.cancel();
    task.await.expect("consumer task");
    assert_eq!(ready(&conn, &queue).await, 0, "every delivery was acked");
    cleanup(&conn, &queue).await;
}

/// Where [`consumer_process`] finds its store and queue.
const CHILD_DB: &str = "MAILROOM_AMQP_TEST_CHILD_DB";
const CHILD_QUEUE: &str = "MAILROOM_AMQP_TEST_CHILD_QUEUE";

/// Not a test by itself: the consumer process that
/// `a_consumer_killed_mid_stream_loses_nothing` starts and kills with
/// SIGKILL. Without its environment it returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "started as a child process by a_consumer_killed_mid_stream_loses_nothing"]
async fn consumer_process() {
    let (Ok(db), Ok(queue)) = (std::env::var(CHILD_DB), std::env::var(CHILD_QUEUE)) else {
        return;
    };
    let engine = Engine::builder(sqlite_at(std::path::Path::new(&db)).await)
        .topic(TopicSpec::new("inbound"))
        .build()
        .expect("engine");
    let mut spec = AmqpSourceSpec::new("rabbit", "inbound", &queue);
    spec.prefetch = 100;
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let source = AmqpSource::new(engine, spec).expect("source");
    source
        .consume(&ch, &CancellationToken::new())
        .await
        .expect("consume");
}

/// Ack after commit under a crash: a consumer process is killed with
/// SIGKILL while storing 5,000 messages at full speed. Right after, every
/// message is stored or back in the queue (none was acked unstored); a new
/// consumer then stores the rest, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_killed_mid_stream_loses_nothing() {
    let (dir, engine, conn, queue) = setup("killed").await;
    let messages = (0..5_000).map(|i| {
        let props = BasicProperties::default().with_message_id(format!("k-{i}").into());
        (props, format!("{{\"i\":{i}}}").into_bytes())
    });
    publish(
        &conn.create_channel().await.expect("channel"),
        &queue,
        messages,
    )
    .await;

    let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["source::consumer_process", "--exact", "--ignored"])
        .env(CHILD_DB, dir.path().join("m.db"))
        .env(CHILD_QUEUE, &queue)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the consumer process");
    eventually(
        Duration::from_secs(60),
        "the child has stored 1,000",
        || async { stored(&engine).await >= 1_000 },
    )
    .await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let at_kill = stored(&engine).await;
    eventually(
        Duration::from_secs(10),
        "the broker has requeued the unacked",
        || async { u64::from(ready(&conn, &queue).await) + at_kill >= 5_000 },
    )
    .await;
    assert!(at_kill < 5_000, "killed mid-stream ({at_kill} stored)");
    println!("{at_kill} stored when the consumer was killed");

    let (stop, task) = start(
        &conn,
        &engine,
        AmqpSourceSpec::new("rabbit", "inbound", &queue),
    )
    .await;
    wait_stored(&engine, 5_000, 60).await;
    wait_drained(&conn, &queue).await;
    stop.cancel();
    task.await.expect("consumer task");
    assert_eq!(stored(&engine).await, 5_000);
    cleanup(&conn, &queue).await;
}

/// A source reading its dedup key from the body (a business id), its
/// type, priority and due time from headers: two messages with different
/// `message_id`s and one business id are one event; the priority and the
/// due time are the headers'; a message without the business id, and one
/// whose priority is not an integer, are dead-lettered.
#[tokio::test]
async fn business_id_dedup_and_priority_and_due_time_from_headers() {
    let (_dir, engine, conn, queue) = setup("extract").await;
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1);
    let later = later.round(jiff::Unit::Second).expect("round");
    let headers = |pairs: &[(&str, AMQPValue)]| {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert((*k).into(), v.clone());
        }
        t
    };
    let props = |id: &str, h: FieldTable| {
        BasicProperties::default()
            .with_message_id(id.into())
            .with_headers(h)
    };
    publish(
        &conn.create_channel().await.expect("channel"),
        &queue,
        [
            (
                props(
                    "m-1",
                    headers(&[
                        ("x-priority", AMQPValue::LongInt(5)),
                        (
                            "x-deliver-at",
                            AMQPValue::LongString(later.to_string().into()),
                        ),
                        ("x-type", AMQPValue::LongString("simulation.created".into())),
                    ]),
                ),
                br#"{"simulation_id":"sim-7"}"#.to_vec(),
            ),
            (
                props("m-2", headers(&[])),
                br#"{"simulation_id":"sim-7","again":true}"#.to_vec(),
            ),
            (
                props(
                    "m-3",
                    headers(&[("x-priority", AMQPValue::LongString("-2".into()))]),
                ),
                br#"{"simulation_id":8}"#.to_vec(),
            ),
            (props("m-4", headers(&[])), br#"{"other":1}"#.to_vec()),
            (
                props(
                    "m-5",
                    headers(&[("x-priority", AMQPValue::LongString("high".into()))]),
                ),
                br#"{"simulation_id":"sim-9"}"#.to_vec(),
            ),
        ],
    )
    .await;
    let mut spec = AmqpSourceSpec::new("rabbit", "inbound", &queue);
    spec.id = Some(mailroom::Field::Json("/simulation_id".into()));
    spec.event_type = Some(mailroom::Field::Header("x-type".into()));
    spec.priority = Some(mailroom::Field::Header("x-priority".into()));
    spec.deliver_at = Some(mailroom::Field::Header("x-deliver-at".into()));
    let (stop, task) = start(&conn, &engine, spec).await;
    let dlq = format!("{queue}.dlq");
    eventually(
        Duration::from_secs(10),
        "two messages are dead-lettered",
        || async { ready(&conn, &dlq).await == 2 },
    )
    .await;
    wait_drained(&conn, &queue).await;
    stop.cancel();
    task.await.expect("consumer task");

    let filter = ListFilter {
        topic: Some("inbound".into()),
        limit: 10,
        ..Default::default()
    };
    let mut events = engine.operator().list(&filter).await.expect("list").events;
    events.sort_by(|a, b| a.dedup_key.cmp(&b.dedup_key));
    let seen: Vec<_> = events
        .iter()
        .map(|e| (e.dedup_key.as_str(), e.priority, e.event_type.as_deref()))
        .collect();
    assert_eq!(
        seen,
        [("8", -2, None), ("sim-7", 5, Some("simulation.created"))],
        "one event per business id, with the headers' priority and type"
    );
    assert_eq!(
        events[1].next_attempt_at,
        Some(later),
        "not due before the header's time"
    );
    let due_now = events[0].next_attempt_at.expect("a due time");
    assert!(
        due_now < later - jiff::SignedDuration::from_mins(50),
        "{due_now}"
    );
    let mut dead: Vec<String> = drain(&conn, &dlq)
        .await
        .into_iter()
        .map(|m| String::from_utf8(m.data).expect("utf-8"))
        .collect();
    dead.sort();
    assert_eq!(dead, [r#"{"other":1}"#, r#"{"simulation_id":"sim-9"}"#]);
    cleanup(&conn, &queue).await;
}
