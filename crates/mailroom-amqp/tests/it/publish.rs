use crate::{connect, delete, drain, ready, sqlite_store, unique};
use lapin::Connection;
use lapin::message::Delivery;
use lapin::types::AMQPValue;
use mailroom::handler::Handler;
use mailroom::{
    Backoff, BatchSettings, Draft, Engine, Event, Mode, Outcome, RetryPolicy, Status, TopicSpec,
};
use mailroom_amqp::{
    AmqpHandler, AmqpHandlerSpec, ExchangeSpec, ExchangeType, QueueSpec, Topology, declare,
};
use mailroom_testkit::harness::eventually;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A topic exchange `<base>.events` and a queue `<base>.q` bound to it by `pattern`.
pub async fn exchange_and_queue(conn: &Connection, base: &str, pattern: &str) -> (String, String) {
    let (exchange, queue) = (format!("{base}.events"), format!("{base}.q"));
    let topology = Topology {
        exchanges: vec![ExchangeSpec::new(&exchange, ExchangeType::Topic)],
        queues: vec![QueueSpec::new(&queue).bind(&exchange, pattern)],
    };
    declare(&conn.create_channel().await.expect("channel"), &topology)
        .await
        .expect("declare");
    (exchange, queue)
}

/// An engine over a temp SQLite store running `topic` with an attached
/// AMQP handler; stopped by the returned token.
async fn relay(
    dir: &tempfile::TempDir,
    conn: &Connection,
    topic: TopicSpec,
    spec: AmqpHandlerSpec,
) -> (Engine, CancellationToken) {
    let store = sqlite_store(dir).await;
    relay_on(store, conn, topic, spec, Duration::from_millis(50)).await
}

/// An engine over `store` polling every `poll`, running `topic` with an
/// attached AMQP handler; stopped by the returned token.
pub async fn relay_on(
    store: Arc<dyn mailroom::Store>,
    conn: &Connection,
    topic: TopicSpec,
    spec: AmqpHandlerSpec,
    poll: Duration,
) -> (Engine, CancellationToken) {
    let handler = AmqpHandler::new(spec);
    handler
        .attach(conn.create_channel().await.expect("channel"))
        .await
        .expect("attach");
    let name = topic.name.clone();
    let engine = Engine::builder(store)
        .poll_interval(poll)
        .topic(topic)
        .handler(name, Arc::new(handler))
        .build()
        .expect("engine");
    let stop = CancellationToken::new();
    let (e, s) = (engine.clone(), stop.clone());
    tokio::spawn(async move { e.run(s).await });
    (engine, stop)
}

/// The engine's events in `status` (up to 1000).
pub async fn events(engine: &Engine, status: Status) -> Vec<Event> {
    let filter = mailroom::operate::ListFilter {
        status: Some(status),
        limit: 1000,
        ..Default::default()
    };
    engine.operator().list(&filter).await.expect("list").events
}

/// Waits until the only event is done, stops the engine, and returns the
/// one message it published into `queue`.
async fn published_once(
    engine: &Engine,
    stop: CancellationToken,
    conn: &Connection,
    queue: &str,
) -> Delivery {
    eventually(Duration::from_secs(10), "the event is done", || async {
        events(engine, Status::Done).await.len() == 1
    })
    .await;
    stop.cancel();
    let mut all = drain(conn, queue).await;
    assert_eq!(all.len(), 1, "published exactly once");
    all.remove(0)
}

fn fast_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        backoff: Backoff::Schedule(vec![Duration::from_millis(20)]),
    }
}

pub fn header<'a>(props: &'a lapin::BasicProperties, name: &str) -> Option<&'a AMQPValue> {
    props.headers().as_ref()?.inner().get(name)
}

/// An enqueued event is published once, persistent, with message_id = its
/// dedup key, correlation id, type, content type and the mailroom headers,
/// and is `done` only after the broker's confirm.
#[tokio::test]
async fn an_enqueued_event_arrives_once_with_its_properties() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = connect().await;
    let base = unique("relay");
    let (exchange, queue) = exchange_and_queue(&conn, &base, "order.*").await;
    let spec = AmqpHandlerSpec::new(&exchange, "{type}");
    let (engine, stop) = relay(&dir, &conn, TopicSpec::new("outbox"), spec).await;
    let payload = json!({"order": 42});
    let draft = Draft::json("outbox", &payload)
        .dedup_key("order-42")
        .event_type("order.created")
        .correlation_id("corr-1")
        .causation_id("cause-1");
    engine.enqueue(draft).await.expect("enqueue");
    let msg = published_once(&engine, stop, &conn, &queue).await;
    let p = &msg.properties;
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&msg.data).expect("json"),
        payload
    );
    assert_eq!(msg.routing_key.as_str(), "order.created");
    assert_eq!(p.delivery_mode(), &Some(2), "persistent");
    assert_eq!(
        p.message_id().as_ref().map(|s| s.as_str()),
        Some("order-42")
    );
    assert_eq!(
        p.correlation_id().as_ref().map(|s| s.as_str()),
        Some("corr-1")
    );
    assert_eq!(p.kind().as_ref().map(|s| s.as_str()), Some("order.created"));
    assert_eq!(
        p.content_type().as_ref().map(|s| s.as_str()),
        Some("application/json")
    );
    assert_eq!(
        header(p, "mailroom-causation-id"),
        Some(&AMQPValue::LongString("cause-1".into()))
    );
    assert_eq!(
        header(p, "mailroom-topic"),
        Some(&AMQPValue::LongString("outbox".into()))
    );
    assert_eq!(
        header(p, "mailroom-version"),
        Some(&AMQPValue::LongString("1".into())),
        "an event without a version is version \"1\""
    );
    assert_eq!(
        header(p, "mailroom-attempt"),
        Some(&AMQPValue::LongLongInt(1))
    );
    delete(&conn, &[queue], &[exchange]).await;
}

/// With `envelope = true` the body is `{eventId, eventType, version,
/// occurredAt, correlationId, causationId, metadata, data}` around the
/// payload: the version the event was given (`mailroom-version` too), the
/// default `"1"` without one, and `metadata` naming its source, topic and
/// the configured environment.
#[tokio::test]
async fn envelope_wraps_the_payload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = connect().await;
    let base = unique("envelope");
    let (exchange, queue) = exchange_and_queue(&conn, &base, "#").await;
    let mut spec = AmqpHandlerSpec::new(&exchange, "{topic}.{type}");
    spec.envelope = true;
    spec.environment = Some("staging".into());
    let (engine, stop) = relay(&dir, &conn, TopicSpec::new("outbox"), spec).await;
    let inserted = engine
        .enqueue(
            Draft::json("outbox", &json!({"a": 1}))
                .event_type("t")
                .correlation_id("c")
                .version("2.1")
                .source("billing"),
        )
        .await
        .expect("enqueue");
    let msg = published_once(&engine, stop, &conn, &queue).await;
    let body: serde_json::Value = serde_json::from_slice(&msg.data).expect("json");
    assert_eq!(msg.routing_key.as_str(), "outbox.t");
    assert_eq!(body["eventId"], inserted.id.to_string());
    assert_eq!(body["eventType"], "t");
    assert_eq!(body["version"], "2.1");
    assert_eq!(
        header(&msg.properties, "mailroom-version"),
        Some(&AMQPValue::LongString("2.1".into()))
    );
    assert_eq!(
        body["metadata"],
        json!({"source": "billing", "topic": "outbox", "environment": "staging"})
    );
    assert_eq!(body["correlationId"], "c");
    assert_eq!(body["causationId"], serde_json::Value::Null);
    assert_eq!(body["data"], json!({"a": 1}));
    assert!(
        body["occurredAt"]
            .as_str()
            .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok())
    );
    delete(&conn, &[queue], &[exchange]).await;
}

/// A routing key no binding matches: every attempt is returned by the
/// broker, and after its attempts the event is dead with the error
/// "unroutable: exchange X, routing key Y".
#[tokio::test]
async fn an_unroutable_event_retries_then_dies_with_the_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = connect().await;
    let base = unique("unroutable");
    let (exchange, queue) = exchange_and_queue(&conn, &base, "order.*").await;
    let topic = TopicSpec::new("outbox").retry(fast_retries(3));
    let (engine, stop) = relay(
        &dir,
        &conn,
        topic,
        AmqpHandlerSpec::new(&exchange, "x.{type}"),
    )
    .await;
    engine
        .enqueue(Draft::json("outbox", &json!({})).event_type("y"))
        .await
        .expect("enqueue");
    eventually(Duration::from_secs(10), "the event is dead", || async {
        events(&engine, Status::Dead).await.len() == 1
    })
    .await;
    stop.cancel();

    let dead = &events(&engine, Status::Dead).await[0];
    assert_eq!(dead.attempts, 3);
    assert_eq!(
        dead.last_error.as_deref(),
        Some(format!("unroutable: exchange {exchange}, routing key x.y").as_str())
    );
    assert_eq!(ready(&conn, &queue).await, 0);
    delete(&conn, &[queue], &[exchange]).await;
}

/// A batch topic publishes a whole batch and waits for all its confirms,
/// with a verdict per event: the routable events are done and arrive once
/// each, the unroutable ones are retried alone until dead.
#[tokio::test]
async fn a_batch_gets_one_verdict_per_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = connect().await;
    let base = unique("batch");
    let (exchange, queue) = exchange_and_queue(&conn, &base, "k.ok").await;
    let settings = BatchSettings {
        max_size: 50,
        max_wait: Duration::from_millis(50),
        ..Default::default()
    };
    let topic = TopicSpec::new("outbox")
        .mode(Mode::Batch(settings))
        .retry(fast_retries(2));
    let (engine, stop) = relay(
        &dir,
        &conn,
        topic,
        AmqpHandlerSpec::new(&exchange, "k.{key}"),
    )
    .await;
    for i in 0..100 {
        let key = if i % 10 == 0 { "bad" } else { "ok" };
        let draft = Draft::json("outbox", &json!({"i": i}))
            .key(key)
            .dedup_key(format!("b-{i}"));
        engine.enqueue(draft).await.expect("enqueue");
    }
    eventually(Duration::from_secs(20), "90 done and 10 dead", || async {
        events(&engine, Status::Done).await.len() == 90
            && events(&engine, Status::Dead).await.len() == 10
    })
    .await;
    stop.cancel();

    let mut ids: Vec<String> = drain(&conn, &queue)
        .await
        .iter()
        .map(|m| {
            m.properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
        .collect();
    ids.sort();
    let received = ids.len();
    ids.dedup();
    assert_eq!(
        (received, ids.len()),
        (90, 90),
        "each routable event arrived exactly once"
    );
    assert!(
        events(&engine, Status::Dead)
            .await
            .iter()
            .all(|e| e.key.as_deref() == Some("bad"))
    );
    delete(&conn, &[queue], &[exchange]).await;
}

/// An event as the dispatcher hands it to a handler, keyed `key`.
fn event_keyed(key: &str, n: usize) -> Event {
    Event {
        id: mailroom::EventId::new(),
        source: "test".into(),
        topic: "outbox".into(),
        dedup_key: format!("{key}-{n}"),
        key: Some(key.into()),
        event_type: None,
        priority: 0,
        status: Status::Running,
        attempts: 1,
        max_attempts: 1,
        next_attempt_at: None,
        received_at: jiff::Timestamp::now(),
        correlation_id: None,
        causation_id: None,
        version: None,
        traceparent: None,
        content_type: None,
        payload: Some(bytes::Bytes::from(vec![b'x'; 64])),
        last_error: None,
        lease_until: None,
        history: vec![],
    }
}

/// Whether `outcome` is the verdict an event keyed `key` deserves: `ok`
/// is routed and confirmed, anything else is returned as unroutable.
fn deserved(key: &str, outcome: &Outcome) -> bool {
    match (key, outcome) {
        ("ok", Outcome::Success) => true,
        ("ok", _) => false,
        (_, Outcome::Retry { error, .. }) => error.starts_with("unroutable:"),
        _ => false,
    }
}

/// Many concurrent single publishes and batches share one channel, mixing
/// routable and unroutable keys: every event's verdict is its own (an
/// unroutable one is never confirmed, a routed one never reported
/// returned), however the broker groups its acks and returns.
#[tokio::test]
async fn concurrent_publishes_each_get_their_own_verdict() {
    let conn = connect().await;
    let base = unique("attribution");
    let (exchange, queue) = exchange_and_queue(&conn, &base, "k.ok").await;
    let handler = AmqpHandler::new(AmqpHandlerSpec::new(&exchange, "k.{key}"));
    handler
        .attach(conn.create_channel().await.expect("channel"))
        .await
        .expect("attach");
    let key = |n: usize| if n % 7 == 3 { "bad" } else { "ok" };
    let mut wrong = vec![];
    for round in 0..10 {
        let singles = (0..1000).map(|n| {
            let (h, e) = (handler.clone(), event_keyed(key(n), round * 1000 + n));
            async move { (e.key.clone(), h.handle(&e).await) }
        });
        let batches = (0..10).map(|b| {
            let h = handler.clone();
            let batch: Vec<Event> = (0..40).map(|n| event_keyed(key(n + b), n)).collect();
            async move {
                let verdicts = h.handle_batch(&batch).await;
                let each = batch
                    .iter()
                    .map(|e| (e.key.clone(), verdicts.for_event(e.id)));
                each.collect::<Vec<_>>()
            }
        });
        let (singles, batches) = tokio::join!(
            futures::future::join_all(singles),
            futures::future::join_all(batches)
        );
        let all = singles.into_iter().chain(batches.into_iter().flatten());
        wrong.extend(all.filter(|(k, o)| !deserved(k.as_deref().unwrap_or(""), o)));
    }
    let first: Vec<_> = wrong.iter().take(5).collect();
    assert!(
        wrong.is_empty(),
        "{} misattributed verdicts, e.g. {first:?}",
        wrong.len()
    );
    delete(&conn, &[queue], &[exchange]).await;
}

/// A publish whose connection freezes (packets held, connection left open,
/// no confirm ever) fails its attempt for a retry within the confirm limit,
/// rather than holding its topic for as long as the broker stays silent.
#[tokio::test]
async fn a_confirm_that_never_comes_fails_the_attempt_in_time() {
    use mailroom_amqp::publish::CONFIRM_LIMIT;
    use mailroom_testkit::{Freeze, FreezeProxy};
    let conn = connect().await;
    let base = unique("frozen-confirm");
    let (exchange, queue) = exchange_and_queue(&conn, &base, "k.ok").await;
    let url = mailroom_testkit::amqp_url();
    let broker = url.split_once('@').map_or(url.as_str(), |(_, r)| r);
    let proxy = FreezeProxy::start(broker.split('/').next().expect("host:port"))
        .await
        .expect("proxy");
    // No heartbeat: only the confirm limit can end the wait.
    let frozen = lapin::Connection::connect(
        &format!("{}?heartbeat=0", proxy.url_for(&url)),
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("connect through the proxy");
    let handler = AmqpHandler::new(AmqpHandlerSpec::new(&exchange, "k.{key}"));
    handler
        .attach(frozen.create_channel().await.expect("channel"))
        .await
        .expect("attach");
    assert!(matches!(
        handler.handle(&event_keyed("ok", 0)).await,
        Outcome::Success
    ));

    proxy.set(Freeze::Hold);
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(
        CONFIRM_LIMIT + Duration::from_secs(5),
        handler.handle(&event_keyed("ok", 1)),
    )
    .await
    .expect("the publish still waits for its confirm");
    assert!(
        matches!(&outcome, Outcome::Retry { error, .. } if error.contains("no confirm")),
        "{outcome:?}"
    );
    assert!(started.elapsed() >= CONFIRM_LIMIT - Duration::from_secs(1));
    drop(proxy);
    delete(&conn, &[queue], &[exchange]).await;
}

/// `expiration` and `priority` of an AMQP handler are set on each message
/// it publishes.
#[tokio::test]
async fn each_message_carries_the_handlers_expiration_and_priority() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = connect().await;
    let base = unique("props");
    let (exchange, queue) = exchange_and_queue(&conn, &base, "#").await;
    let mut spec = AmqpHandlerSpec::new(&exchange, "x");
    spec.expiration = Some(Duration::from_secs(60));
    spec.priority = Some(7);
    let (engine, stop) = relay(&dir, &conn, TopicSpec::new("outbox"), spec).await;
    let draft = Draft::json("outbox", &json!({"n": 1})).dedup_key("p-1");
    engine.enqueue(draft).await.expect("enqueue");
    let msg = published_once(&engine, stop, &conn, &queue).await;
    assert_eq!(
        msg.properties.expiration().as_ref().map(|s| s.as_str()),
        Some("60000")
    );
    assert_eq!(msg.properties.priority(), &Some(7));
    delete(&conn, &[queue], &[exchange]).await;
}
