//! The binary against the real RabbitMQ of `MAILROOM_TEST_AMQP_URL`:
//! `mailroom amqp declare`, `serve` refusing a conflicting queue,
//! consuming with dedup and dead-lettering, surviving a `kill -9` while
//! consuming, the outbox relay, and `/readyz`. Every test uses its own
//! exchange and queue names, and a fresh PostgreSQL database as its store.

use crate::support;
use mailroom_testkit::harness::eventually;

use crate::support::{Serve, run_mailroom, write_config};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, BasicRejectOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

fn amqp_url() -> String {
    mailroom_testkit::amqp_url()
}

/// The test broker's URL as mailroom shows it: without user and password.
fn shown_url() -> String {
    mailroom::redact::url(&amqp_url())
}

async fn connect() -> Connection {
    Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("connect to the test RabbitMQ")
}

/// A name no other test (or earlier run) uses.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", support::rand_below(u64::from(u32::MAX)))
}

/// Deletes what a test declared (best effort: a failed test may not have
/// declared everything; a missing queue closes the channel, so one each).
async fn cleanup(conn: &Connection, queues: &[String], exchanges: &[String]) {
    for q in queues {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
    for e in exchanges {
        if let Ok(ch) = conn.create_channel().await {
            let _ = ch
                .exchange_delete(e.as_str().into(), ExchangeDeleteOptions::default())
                .await;
        }
    }
}

/// `queue` as a passive declare sees it now (panics if it does not exist).
async fn passive(conn: &Connection, queue: &str) -> lapin::Queue {
    let ch = conn.create_channel().await.expect("channel");
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .unwrap_or_else(|e| panic!("queue {queue} exists: {e}"));
    let _ = ch.close(200, "OK".into()).await;
    q
}

/// Ready messages in `queue`.
async fn ready(conn: &Connection, queue: &str) -> u32 {
    passive(conn, queue).await.message_count()
}

/// Publishes `messages` (routing key, properties, body) to `exchange` with
/// confirms, many in flight; all must be confirmed and routed.
async fn publish(
    ch: &Channel,
    exchange: &str,
    messages: impl IntoIterator<Item = (String, BasicProperties, Vec<u8>)>,
) {
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    for (key, props, body) in messages {
        ch.basic_publish(
            exchange.into(),
            key.as_str().into(),
            mandatory,
            &body,
            props,
        )
        .await
        .expect("publish");
    }
    let returned = ch.wait_for_confirms().await.expect("confirmed");
    assert!(
        returned.is_empty(),
        "{} messages unroutable",
        returned.len()
    );
}

/// A JSON message with `message_id = id`.
fn message(key: &str, id: &str) -> (String, BasicProperties, Vec<u8>) {
    let props = BasicProperties::default()
        .with_message_id(id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    let body = serde_json::json!({ "id": id, "n": 1 })
        .to_string()
        .into_bytes();
    (key.to_string(), props, body)
}

/// The dedup keys stored in `topic` (each row once).
async fn stored_keys(pool: &sqlx::PgPool, topic: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT dedup_key FROM mailroom.events WHERE topic = $1")
        .bind(topic)
        .fetch_all(pool)
        .await
        .unwrap_or_default()
}

async fn stored_count(pool: &sqlx::PgPool, topic: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM mailroom.events WHERE topic = $1")
        .bind(topic)
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

/// The sum of a counter's samples whose labels contain every `labels` pair.
async fn metric(base: &str, name: &str, labels: &[&str]) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

/// A config consuming `<base>.in` (bound to `<base>.events` with `in.*`,
/// dead-lettered) into the pull topic `inbox`.
fn inbound_config(base: &str, prefetch: u16) -> String {
    inbound_config_at(&amqp_url(), base, prefetch)
}

/// [`inbound_config`] on the broker at `url`.
fn inbound_config_at(url: &str, base: &str, prefetch: u16) -> String {
    format!(
        r#"
[amqp]
url = "{url}"
[[amqp.exchange]]
name = "{base}.events"
kind = "topic"
[[amqp.queue]]
name = "{base}.in"
bind = {{ exchange = "{base}.events", routing_key = "in.*" }}
ttl = "1h"
dead_letter = true

[[source]]
name = "in"
topic = "inbox"
amqp = {{ queue = "{base}.in", prefetch = {prefetch} }}

[[topic]]
name = "inbox"
"#
    )
}

fn inbound_names(base: &str) -> (Vec<String>, Vec<String>) {
    (
        vec![format!("{base}.in"), format!("{base}.in.dlq")],
        vec![format!("{base}.events"), format!("{base}.events.dlx")],
    )
}

fn start_serve(config: &Path, db: &str) -> Serve {
    let (path, db) = (config.to_path_buf(), db.to_string());
    // Serve::start blocks on the child's log; keep it off the runtime.
    std::thread::spawn(move || support::serve(&path, &db))
        .join()
        .expect("start serve")
}

/// `mailroom amqp declare` declares one topic exchange and three queues
/// with TTL, max length and a dead-letter queue each: a second client sees
/// every exchange and queue (passive declares), each queue holds exactly
/// the configured arguments (re-declaring with them is accepted, with
/// another TTL refused), the bindings route and dead-letter; declaring
/// again changes nothing (same table, messages kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_declare_is_seen_by_a_second_client_and_declaring_again_changes_nothing() {
    let b = unique("cli-declare");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            r#"
[amqp]
url = "{url}"
[[amqp.exchange]]
name = "{b}.events"
kind = "topic"
[[amqp.queue]]
name = "{b}.a"
bind = {{ exchange = "{b}.events", routing_key = "a.*" }}
ttl = "1h"
dead_letter = true
[[amqp.queue]]
name = "{b}.b"
bind = {{ exchange = "{b}.events", routing_key = "b.#" }}
ttl = "2h"
max_length = 1000
dead_letter = true
[[amqp.queue]]
name = "{b}.c"
bind = [{{ exchange = "{b}.events", routing_key = "a.created" }}, {{ exchange = "{b}.events", routing_key = "c.*" }}]
ttl = "30m"
dead_letter = true
"#,
            url = amqp_url()
        ),
    );
    let queues: Vec<String> = ["a", "b", "c"].iter().map(|q| format!("{b}.{q}")).collect();
    let all_queues: Vec<String> = queues
        .iter()
        .flat_map(|q| [q.clone(), format!("{q}.dlq")])
        .collect();
    let exchanges = vec![format!("{b}.events"), format!("{b}.events.dlx")];
    let conn = connect().await;

    let (ok, out, err) = run_mailroom(
        &config,
        "sqlite://unused.db",
        &["amqp", "declare", "--json"],
        Duration::from_secs(30),
    );
    assert!(ok, "amqp declare failed: {err}");
    let first: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(first["url"], shown_url());
    let names = |key: &str| -> BTreeSet<String> {
        first[key]
            .as_array()
            .expect("list")
            .iter()
            .map(|x| x["name"].as_str().expect("name").to_string())
            .collect()
    };
    assert_eq!(names("exchanges"), exchanges.iter().cloned().collect());
    assert_eq!(names("queues"), all_queues.iter().cloned().collect());
    assert_eq!(first["bindings"].as_array().expect("bindings").len(), 3 + 4);

    // A second client sees everything.
    let ch = conn.create_channel().await.expect("channel");
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    for e in &exchanges {
        ch.exchange_declare(
            e.as_str().into(),
            ExchangeKind::Topic,
            passive,
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|err| panic!("exchange {e} exists: {err}"));
    }
    for q in &all_queues {
        assert_eq!(ready(&conn, q).await, 0, "{q}");
    }
    // Each queue has exactly its arguments: the same declare is accepted...
    let expected = [
        ("a", 3_600_000, None),
        ("b", 7_200_000, Some(1000)),
        ("c", 1_800_000, None),
    ];
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for (q, ttl, max) in expected {
        let name = format!("{b}.{q}");
        let mut args = FieldTable::default();
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ttl));
        if let Some(n) = max {
            args.insert("x-max-length".into(), AMQPValue::LongLongInt(n));
        }
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(format!("{b}.events.dlx").into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(name.clone().into()),
        );
        let ch = conn.create_channel().await.expect("channel");
        ch.queue_declare(name.as_str().into(), durable, args)
            .await
            .unwrap_or_else(|e| panic!("{name} has exactly the configured arguments: {e}"));
    }
    // ...and another TTL is refused, so the TTL really is set.
    let mut other = FieldTable::default();
    other.insert("x-message-ttl".into(), AMQPValue::LongLongInt(5));
    let ch = conn.create_channel().await.expect("channel");
    assert!(
        ch.queue_declare(queues[0].as_str().into(), durable, other)
            .await
            .is_err(),
        "a different x-message-ttl must be refused"
    );

    // The bindings route: a.created reaches a and c, b.x.y reaches b.
    let ch = conn.create_channel().await.expect("channel");
    publish(
        &ch,
        &exchanges[0],
        [message("a.created", "m1"), message("b.x.y", "m2")],
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the messages are routed",
        || async {
            ready(&conn, &queues[0]).await == 1
                && ready(&conn, &queues[1]).await == 1
                && ready(&conn, &queues[2]).await == 1
        },
    )
    .await;
    // A rejected message is dead-lettered into <queue>.dlq.
    let got = ch
        .basic_get(queues[2].as_str().into(), BasicGetOptions::default())
        .await
        .expect("basic.get")
        .expect("a message in c");
    got.delivery
        .reject(BasicRejectOptions { requeue: false })
        .await
        .expect("reject");
    eventually(
        Duration::from_secs(10),
        "the rejected message reaches c.dlq",
        || async { ready(&conn, &format!("{}.dlq", queues[2])).await == 1 },
    )
    .await;

    // Declaring again changes nothing: the same objects, arguments and
    // bindings, and the messages are still there.
    let (ok, out, err) = run_mailroom(
        &config,
        "sqlite://unused.db",
        &["amqp", "declare", "--json"],
        Duration::from_secs(30),
    );
    assert!(ok, "second amqp declare failed: {err}");
    let second: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(second["exchanges"], first["exchanges"]);
    assert_eq!(second["bindings"], first["bindings"]);
    for (q1, q2) in first["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .zip(second["queues"].as_array().expect("queues"))
    {
        assert_eq!(
            (&q1["name"], &q1["arguments"]),
            (&q2["name"], &q2["arguments"])
        );
    }
    assert_eq!(ready(&conn, &queues[0]).await, 1);
    assert_eq!(ready(&conn, &queues[1]).await, 1);
    // The table names every queue with its arguments.
    let (ok, table, _) = run_mailroom(
        &config,
        "sqlite://unused.db",
        &["amqp", "declare"],
        Duration::from_secs(30),
    );
    assert!(ok);
    assert!(table.contains("x-message-ttl=7200000"), "{table}");
    assert!(table.contains(&format!("{b}.c.dlq")), "{table}");
    cleanup(&conn, &all_queues, &exchanges).await;
}

/// A queue that already exists with another TTL: `serve` exits non-zero
/// before listening, and both it and `amqp declare` name the queue and the
/// argument that differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_to_start_on_a_conflicting_queue() {
    let b = unique("cli-conflict");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &inbound_config(&b, 10));
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(1000));
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(format!("{b}.in").as_str().into(), durable, args)
        .await
        .expect("pre-existing queue");

    let db = mailroom_testkit::fresh_postgres_db().await;
    let (ok, _, err) = run_mailroom(
        &config,
        &db,
        &["serve", "--listen", "127.0.0.1:0"],
        Duration::from_secs(30),
    );
    assert!(!ok, "serve must refuse to start: {err}");
    assert!(
        err.contains(&format!("\"{b}.in\"")),
        "names the queue: {err}"
    );
    assert!(err.contains("x-message-ttl"), "names the argument: {err}");
    assert!(!err.contains("mailroom is serving"), "{err}");

    let (ok, _, err) = run_mailroom(&config, &db, &["amqp", "declare"], Duration::from_secs(30));
    assert!(!ok);
    assert!(
        err.contains(&format!("\"{b}.in\"")) && err.contains("x-message-ttl"),
        "{err}"
    );
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// `serve` consumes 10,000 messages of which 1,000 repeat an earlier
/// `message_id`: exactly the 9,000 distinct ones are stored, each once,
/// the repeats are counted as duplicates, the queue ends empty; a JSON
/// message without id and a non-JSON one end in the dead-letter queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stores_each_distinct_message_once_and_dead_letters_the_unusable() {
    let b = unique("cli-inbound");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &inbound_config(&b, 100));
    let db = mailroom_testkit::fresh_postgres_db().await;
    let pool = sqlx::PgPool::connect(&db).await.expect("pool");
    let mut serve = start_serve(&config, &db);
    let conn = connect().await;

    let distinct: Vec<String> = (0..9_000).map(|i| format!("{b}-m{i}")).collect();
    let mut messages: Vec<_> = distinct
        .iter()
        .map(|id| message("in.created", id))
        .collect();
    // Every tenth message repeats an earlier id.
    for i in 0..1_000 {
        let repeat = message("in.created", &distinct[i * 9]);
        messages.insert(i * 10 + 9, repeat);
    }
    assert_eq!(messages.len(), 10_000);
    let no_id = (
        "in.created".to_string(),
        BasicProperties::default(),
        br#"{"no":"id"}"#.to_vec(),
    );
    let not_json = (
        "in.created".to_string(),
        BasicProperties::default(),
        b"\x00not json".to_vec(),
    );
    messages.insert(5_000, no_id);
    messages.push(not_json);
    let ch = conn.create_channel().await.expect("channel");
    publish(&ch, &format!("{b}.events"), messages).await;

    eventually(
        Duration::from_secs(120),
        "9,000 events are stored and the queue is empty",
        || async {
            stored_count(&pool, "inbox").await == 9_000
                && ready(&conn, &format!("{b}.in")).await == 0
        },
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the two unusable messages are dead-lettered",
        || async { ready(&conn, &format!("{b}.in.dlq")).await == 2 },
    )
    .await;
    let received = |outcome: &'static str| {
        let base = serve.base.clone();
        async move {
            metric(
                &base,
                "mailroom_events_received_total",
                &["source=\"in\"", outcome],
            )
            .await
        }
    };
    assert_eq!(received("outcome=\"accepted\"").await, 9_000.0);
    assert_eq!(received("outcome=\"duplicate\"").await, 1_000.0);
    assert_eq!(received("outcome=\"rejected\"").await, 2.0);
    assert!(
        serve.terminate().expect("SIGTERM"),
        "serve stops cleanly on SIGTERM"
    );
    // Nothing was left unacknowledged (it would be back in the queue now).
    assert_eq!(ready(&conn, &format!("{b}.in")).await, 0);
    let stored: BTreeSet<String> = stored_keys(&pool, "inbox").await.into_iter().collect();
    assert_eq!(stored.len(), 9_000);
    assert_eq!(stored, distinct.into_iter().collect::<BTreeSet<_>>());
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// The messages of a backlog consuming test.
const N: usize = 20_000;

/// A backlog of [`N`] messages published into a declared inbound topology,
/// and a `serve` that has stored at least 3,000 of them.
struct Backlog {
    b: String,
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
    db: String,
    pool: sqlx::PgPool,
    conn: Connection,
    ids: Vec<String>,
    first: Serve,
}

async fn backlog_under_way(prefix: &str, tag: &str) -> Backlog {
    let b = unique(prefix);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &inbound_config(&b, 200));
    let db = mailroom_testkit::fresh_postgres_db().await;
    let pool = sqlx::PgPool::connect(&db).await.expect("pool");
    let conn = connect().await;
    let (ok, _, err) = run_mailroom(&config, &db, &["amqp", "declare"], Duration::from_secs(30));
    assert!(ok, "{err}");
    let ids: Vec<String> = (0..N).map(|i| format!("{b}-{tag}{i}")).collect();
    let ch = conn.create_channel().await.expect("channel");
    publish(
        &ch,
        &format!("{b}.events"),
        ids.iter().map(|id| message("in.x", id)),
    )
    .await;
    let first = start_serve(&config, &db);
    eventually(
        Duration::from_secs(60),
        "consuming is under way",
        || async { stored_count(&pool, "inbox").await >= 3_000 },
    )
    .await;
    Backlog {
        b,
        _dir: dir,
        config,
        db,
        pool,
        conn,
        ids,
        first,
    }
}

/// `serve` is killed with SIGKILL while consuming a 20,000-message backlog
/// at full speed, then started again: every message ends stored exactly
/// once (a delivery is acked only after its commit; the unacked ones are
/// redelivered and deduplicated) and the queue ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_killed_while_consuming_stores_every_message_once_after_restart() {
    let Backlog {
        b,
        _dir,
        config,
        db,
        pool,
        conn,
        ids,
        mut first,
    } = backlog_under_way("cli-kill9", "k").await;
    first.kill9();
    let at_kill = stored_count(&pool, "inbox").await;
    assert!(
        (at_kill as usize) < N,
        "killed mid-stream ({at_kill} stored)"
    );

    let mut second = start_serve(&config, &db);
    eventually(
        Duration::from_secs(120),
        "every message is stored and the queue is empty",
        || async {
            stored_count(&pool, "inbox").await == N as i64
                && ready(&conn, &format!("{b}.in")).await == 0
        },
    )
    .await;
    let redelivered = metric(
        &second.base,
        "mailroom_events_received_total",
        &["source=\"in\"", "outcome=\"duplicate\""],
    )
    .await;
    assert!(
        second.terminate().expect("SIGTERM"),
        "serve stops cleanly on SIGTERM"
    );
    assert_eq!(
        ready(&conn, &format!("{b}.in")).await,
        0,
        "nothing left unacked"
    );
    assert_eq!(
        ready(&conn, &format!("{b}.in.dlq")).await,
        0,
        "nothing dead-lettered"
    );
    let stored = stored_keys(&pool, "inbox").await;
    assert_eq!(stored.len(), N, "each stored once");
    assert_eq!(
        stored.into_iter().collect::<BTreeSet<_>>(),
        ids.into_iter().collect::<BTreeSet<_>>()
    );
    eprintln!(
        "killed with {at_kill} of {N} stored; {redelivered} redeliveries of stored messages deduplicated; all {N} stored exactly once after restart"
    );
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// The outbox relay through the binary: an event posted to `POST
/// /v1/events` in a topic whose handler is `amqp` arrives once on the
/// queue bound for its type, persistent, with message_id = its dedup key,
/// correlation id, type, content type and causation/topic headers;
/// `/readyz` lists the connection by its URL without credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_publishes_an_api_event_once_with_its_properties() {
    let b = unique("cli-relay");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            r#"
[amqp]
url = "{url}"
[[amqp.exchange]]
name = "{b}.events"
kind = "topic"
[[amqp.queue]]
name = "{b}.orders"
bind = {{ exchange = "{b}.events", routing_key = "order.*" }}
dead_letter = true

[[topic]]
name = "outbox"
handler = {{ amqp = {{ exchange = "{b}.events", routing_key = "{{type}}" }} }}
"#,
            url = amqp_url()
        ),
    );
    let db = mailroom_testkit::fresh_postgres_db().await;
    let serve = start_serve(&config, &db);
    let conn = connect().await;
    let http = reqwest::Client::new();

    let ready_body: serde_json::Value = {
        let mut body = serde_json::Value::Null;
        for _ in 0..100 {
            let resp = http
                .get(format!("{}/readyz", serve.base))
                .send()
                .await
                .expect("readyz");
            let ok = resp.status() == 200;
            body = resp.json().await.expect("json");
            if ok {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        body
    };
    assert_eq!(
        ready_body,
        serde_json::json!({"ready": true, "store": {"up": true},
            "amqp": [{"connection": shown_url(), "up": true}]})
    );
    assert!(
        !ready_body.to_string().contains("guest"),
        "no credentials shown"
    );

    let payload = serde_json::json!({"order": "o-1", "total": 12.5});
    let resp = http
        .post(format!("{}/v1/events", serve.base))
        .header("Idempotency-Key", format!("{b}-relay-1"))
        .json(
            &serde_json::json!({"topic": "outbox", "type": "order.created", "key": "cust-1",
            "payload": payload, "correlation_id": "corr-1", "causation_id": "cause-1"}),
        )
        .send()
        .await
        .expect("POST /v1/events");
    assert_eq!(resp.status(), 201);
    let event: serde_json::Value = resp.json().await.expect("event");
    let queue = format!("{b}.orders");
    eventually(
        Duration::from_secs(10),
        "the event is published",
        || async { ready(&conn, &queue).await == 1 },
    )
    .await;
    let ch = conn.create_channel().await.expect("channel");
    let got = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
        .expect("the message");
    let p = &got.delivery.properties;
    let text = |v: &Option<lapin::types::ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    assert_eq!(text(p.message_id()), Some(format!("{b}-relay-1")));
    assert_eq!(text(p.correlation_id()), Some("corr-1".into()));
    assert_eq!(text(p.kind()), Some("order.created".into()));
    assert_eq!(text(p.content_type()), Some("application/json".into()));
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    let headers = p.headers().as_ref().expect("headers");
    let header = |k: &str| match headers.inner().get(k) {
        Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        Some(AMQPValue::ShortString(s)) => Some(s.as_str().to_string()),
        _ => None,
    };
    assert_eq!(header("mailroom-causation-id").as_deref(), Some("cause-1"));
    assert_eq!(header("mailroom-topic").as_deref(), Some("outbox"));
    let body: serde_json::Value = serde_json::from_slice(&got.delivery.data).expect("JSON body");
    assert_eq!(body, payload);

    let id = event["id"].as_str().expect("id");
    eventually(Duration::from_secs(10), "the event is done", || async {
        let e: serde_json::Value = http
            .get(format!("{}/v1/events/{id}", serve.base))
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
        e["status"] == "done"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ready(&conn, &queue).await, 0, "published once");
    cleanup(
        &conn,
        &[queue.clone(), format!("{queue}.dlq")],
        &[format!("{b}.events"), format!("{b}.events.dlx")],
    )
    .await;
}

/// A broker that cannot be reached does not stop `serve` (the connection
/// keeps trying); `/readyz` answers 503 and shows that connection down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_shows_an_unreachable_broker_down() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            r#"
[amqp]
url = "amqp://user:secret@127.0.0.1:{port}/%2f"
[[amqp.exchange]]
name = "never.declared"
kind = "topic"
[[source]]
name = "in"
topic = "inbox"
amqp = {{ queue = "never.consumed" }}
"#
        ),
    );
    let db = mailroom_testkit::fresh_postgres_db().await;
    let serve = start_serve(&config, &db);
    let resp = reqwest::get(format!("{}/readyz", serve.base))
        .await
        .expect("readyz");
    assert_eq!(resp.status(), 503);
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(
        body,
        serde_json::json!({"ready": false, "store": {"up": true},
            "amqp": [{"connection": format!("amqp://127.0.0.1:{port}/%2f"), "up": false}]})
    );
}

/// Events already due when `serve` starts (enqueued in PostgreSQL while it
/// was stopped) are published on their first attempt: dispatch waits for
/// the AMQP connection instead of failing them with "connection down".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_due_at_start_are_published_on_their_first_attempt() {
    let b = unique("cli-due");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            r#"
[amqp]
url = "{url}"
[[amqp.exchange]]
name = "{b}.events"
kind = "topic"
[[amqp.queue]]
name = "{b}.orders"
bind = {{ exchange = "{b}.events", routing_key = "order.*" }}

[[topic]]
name = "outbox"
handler = {{ amqp = {{ exchange = "{b}.events", routing_key = "{{type}}" }} }}
"#,
            url = amqp_url()
        ),
    );
    let db = mailroom_testkit::fresh_postgres_db().await;
    let (ok, _, err) = run_mailroom(&config, &db, &["migrate"], Duration::from_secs(30));
    assert!(ok, "{err}");
    let pool = sqlx::PgPool::connect(&db).await.expect("pool");
    for i in 0..20 {
        sqlx::query("SELECT mailroom.enqueue('outbox', 'order.created', NULL, $1::jsonb, $2)")
            .bind(serde_json::json!({ "n": i }).to_string())
            .bind(format!("{b}-due-{i}"))
            .execute(&pool)
            .await
            .expect("enqueue");
    }
    let serve = start_serve(&config, &db);
    let conn = connect().await;
    let queue = format!("{b}.orders");
    eventually(Duration::from_secs(15), "all 20 are published", || async {
        ready(&conn, &queue).await == 20
    })
    .await;
    let attempts: Vec<i64> = sqlx::query_scalar(
        "SELECT attempts::bigint FROM mailroom.events WHERE topic = 'outbox' ORDER BY attempts",
    )
    .fetch_all(&pool)
    .await
    .expect("attempts");
    assert_eq!(attempts, vec![1; 20], "each published on its first attempt");
    drop(serve);
    cleanup(&conn, &[queue], &[format!("{b}.events")]).await;
}

/// SIGTERM while `serve` consumes a 20,000-message backlog at full speed:
/// it exits 0, and every message is either stored (and acked) or back in
/// the queue, never both and never neither; a restart stores the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_consuming_acks_what_is_stored_and_returns_the_rest() {
    let Backlog {
        b,
        _dir,
        config,
        db,
        pool,
        conn,
        ids: _,
        mut first,
    } = backlog_under_way("cli-sigterm", "t").await;
    assert!(
        first.terminate().expect("SIGTERM"),
        "serve exits 0 on SIGTERM"
    );
    let stored = stored_count(&pool, "inbox").await as usize;
    let queue = format!("{b}.in");
    let back = ready(&conn, &queue).await as usize;
    assert!(stored < N, "stopped mid-stream ({stored} stored)");
    if stored + back != N {
        // Let the log reader catch up with the exited process.
        tokio::time::sleep(Duration::from_millis(500)).await;
        panic!(
            "{stored} stored + {back} back in the queue; warnings: {:?}",
            first.problem_summary()
        );
    }

    let mut second = start_serve(&config, &db);
    eventually(Duration::from_secs(120), "the rest is stored", || async {
        stored_count(&pool, "inbox").await == N as i64 && ready(&conn, &queue).await == 0
    })
    .await;
    assert!(second.terminate().expect("SIGTERM"));
    assert_eq!(stored_keys(&pool, "inbox").await.len(), N);
    eprintln!("SIGTERM with {stored} stored and {back} back in the queue");
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// Consumers of `queue` at this moment.
async fn consumers(conn: &Connection, queue: &str) -> u32 {
    passive(conn, queue).await.consumer_count()
}

/// SIGTERM stops consuming at once, even while an attempt keeps the engine
/// draining for seconds: the queue loses its consumer while `serve` is
/// still running, messages published after that stay in the queue for
/// another instance, and the attempt in flight still finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_consuming_at_once_while_attempts_drain() {
    let b = unique("cli-intake-stop");
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "{}\n[[topic]]\nname = \"slow\"\ntimeout = \"30s\"\nhandler = {{ command = [\"sleep\", \"4\"] }}\n",
        inbound_config(&b, 20)
    );
    let config = write_config(dir.path(), &text);
    let db = mailroom_testkit::fresh_postgres_db().await;
    let pool = sqlx::PgPool::connect(&db).await.expect("pool");
    let conn = connect().await;
    let mut serve = start_serve(&config, &db);
    let queue = format!("{b}.in");
    eventually(Duration::from_secs(20), "the source consumes", || async {
        consumers(&conn, &queue).await == 1
    })
    .await;
    let ch = conn.create_channel().await.expect("channel");
    let before: Vec<String> = (0..50).map(|i| format!("{b}-before{i}")).collect();
    let events = format!("{b}.events");
    publish(&ch, &events, before.iter().map(|id| message("in.x", id))).await;
    eventually(
        Duration::from_secs(20),
        "the first messages are stored",
        || async { stored_count(&pool, "inbox").await == 50 },
    )
    .await;
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/events", serve.base))
        .header("Idempotency-Key", format!("{b}-slow"))
        .json(&serde_json::json!({"topic": "slow", "payload": {"n": 1}}))
        .send()
        .await
        .expect("POST /v1/events");
    assert_eq!(resp.status(), 201);
    eventually(Duration::from_secs(20), "the slow attempt runs", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM mailroom.events WHERE topic = 'slow' AND attempts = 1",
        )
        .fetch_one(&pool)
        .await
        .expect("count")
            == 1
    })
    .await;

    serve.signal_term().expect("SIGTERM");
    let signalled = Instant::now();
    eventually(Duration::from_secs(3), "the consumer is gone", || async {
        consumers(&conn, &queue).await == 0
    })
    .await;
    assert!(
        serve.alive(),
        "still draining the slow attempt {:?} after SIGTERM, and no longer consuming",
        signalled.elapsed()
    );
    let after: Vec<String> = (0..30).map(|i| format!("{b}-after{i}")).collect();
    publish(&ch, &events, after.iter().map(|id| message("in.x", id))).await;
    assert!(
        serve
            .wait_exit(Duration::from_secs(30))
            .expect("exit")
            .success(),
        "serve exits 0 once the attempt is done"
    );
    assert_eq!(
        stored_count(&pool, "inbox").await,
        50,
        "nothing consumed after SIGTERM"
    );
    assert_eq!(ready(&conn, &queue).await, 30, "left for another instance");
    let slow: String =
        sqlx::query_scalar("SELECT status FROM mailroom.events WHERE topic = 'slow'")
            .fetch_one(&pool)
            .await
            .expect("slow event");
    assert_eq!(
        slow, "done",
        "the attempt in flight finished during the drain"
    );
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// A file of the test CA directory (`MAILROOM_TEST_TLS_DIR`).
fn tls_file(name: &str) -> String {
    mailroom_testkit::tls_dir().join(name).display().to_string()
}

/// The test broker's TLS listener with `params`.
fn amqps(params: &str) -> String {
    format!("{}?{params}", mailroom_testkit::amqps_url())
}

/// `url` as mailroom shows it: without user and password, query values masked.
fn shown(url: &str) -> String {
    mailroom::redact::url(url)
}

/// `/readyz`'s status and body once `ready` says `up`, or after 10 s.
async fn readyz_until(base: &str, up: bool) -> (u16, serde_json::Value) {
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..100 {
        let resp = reqwest::get(format!("{base}/readyz"))
            .await
            .expect("readyz");
        let status = resp.status().as_u16();
        last = (status, resp.json().await.expect("json"));
        if (status == 200) == up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// Over `amqps://...?cacertfile=<test CA>`: `mailroom amqp declare`
/// declares the topology (a plain client sees it), and `serve` comes up
/// ready, with the connection's gauge at 1, and stores each of 50
/// published messages once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_declare_and_serve_work_over_amqps() {
    let b = unique("cli-amqps");
    let url = amqps(&format!("cacertfile={}", tls_file("ca.pem")));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &inbound_config_at(&url, &b, 10));
    let conn = connect().await;
    let (ok, out, err) = run_mailroom(
        &config,
        "sqlite://unused.db",
        &["amqp", "declare", "--json"],
        Duration::from_secs(30),
    );
    assert!(ok, "amqp declare over amqps failed: {err}");
    let declared: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(declared["url"], shown(&url));
    assert!(!out.contains("guest:guest") && !err.contains("guest:guest"));
    passive(&conn, &format!("{b}.in")).await;

    let db = mailroom_testkit::fresh_postgres_db().await;
    let pool = sqlx::PgPool::connect(&db).await.expect("pool");
    let serve = start_serve(&config, &db);
    let (status, body) = readyz_until(&serve.base, true).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["amqp"],
        serde_json::json!([{"connection": shown(&url), "up": true}])
    );
    assert_eq!(
        metric(&serve.base, "mailroom_amqp_connected", &[]).await,
        1.0
    );
    let ids: Vec<String> = (0..50).map(|i| format!("{b}-{i}")).collect();
    let ch = conn.create_channel().await.expect("channel");
    publish(
        &ch,
        &format!("{b}.events"),
        ids.iter().map(|id| message("in.x", id)),
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "the 50 messages are stored",
        || async { stored_count(&pool, "inbox").await == 50 },
    )
    .await;
    let keys: BTreeSet<String> = stored_keys(&pool, "inbox").await.into_iter().collect();
    assert_eq!(keys, ids.iter().cloned().collect(), "each message once");
    eventually(Duration::from_secs(10), "the queue is drained", || async {
        ready(&conn, &format!("{b}.in")).await == 0
    })
    .await;
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// A broker whose certificate another CA signed: `serve` starts (as with an
/// unreachable broker) but the connection stays down in `/readyz` and in
/// `mailroom_amqp_connected`, the log says why (`UnknownIssuer`) without
/// the password, and nothing is consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_shows_a_broker_of_another_ca_down_with_the_reason() {
    let b = unique("cli-amqps-wrong");
    let url = amqps(&format!("cacertfile={}", tls_file("other-ca.pem")));
    let (dir, plain_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let config = write_config(dir.path(), &inbound_config_at(&url, &b, 10));
    // Declared over the plain listener, so that messages wait in the queue.
    let plain = write_config(plain_dir.path(), &inbound_config(&b, 10));
    let (ok, _, err) = run_mailroom(
        &plain,
        "sqlite://unused.db",
        &["amqp", "declare"],
        Duration::from_secs(30),
    );
    assert!(ok, "{err}");
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let ids: Vec<String> = (0..5).map(|i| format!("{b}-{i}")).collect();
    publish(
        &ch,
        &format!("{b}.events"),
        ids.iter().map(|id| message("in.x", id)),
    )
    .await;

    let db = mailroom_testkit::fresh_postgres_db().await;
    let pool = sqlx::PgPool::connect(&db).await.expect("pool");
    let serve = start_serve(&config, &db);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, body) = readyz_until(&serve.base, false).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body["amqp"],
        serde_json::json!([{"connection": shown(&url), "up": false}])
    );
    assert_eq!(
        metric(&serve.base, "mailroom_amqp_connected", &[]).await,
        0.0
    );
    let problems = serve.problems().join("\n");
    assert!(
        problems.contains("UnknownIssuer"),
        "the reason is logged: {problems}"
    );
    assert!(!problems.contains("guest:guest"), "{problems}");
    assert_eq!(stored_count(&pool, "inbox").await, 0, "nothing consumed");
    assert_eq!(
        ready(&conn, &format!("{b}.in")).await,
        5,
        "all still queued"
    );
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// `verify=verify_none` connects to a broker it cannot verify, and `serve`
/// says so at start: a WARN naming the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_none_connects_and_warns_at_start() {
    let b = unique("cli-amqps-none");
    let url = amqps("verify=verify_none");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &inbound_config_at(&url, &b, 10));
    let db = mailroom_testkit::fresh_postgres_db().await;
    let serve = start_serve(&config, &db);
    let (status, body) = readyz_until(&serve.base, true).await;
    assert_eq!(status, 200, "{body}");
    let problems = serve.problems().clone();
    let warned = problems
        .iter()
        .any(|l| l.contains("\"WARN\"") && l.contains("verify_none") && l.contains(&shown(&url)));
    assert!(warned, "a WARN names the connection: {problems:?}");
    let (ok, _, err) = run_mailroom(&config, &db, &["amqp", "declare"], Duration::from_secs(30));
    assert!(ok, "{err}");
    assert!(err.contains("verify_none"), "amqp declare warns too: {err}");
    let conn = connect().await;
    let (queues, exchanges) = inbound_names(&b);
    cleanup(&conn, &queues, &exchanges).await;
}

/// A CA file that does not exist stops `amqp declare` and `serve` at
/// start, naming the config key, the parameter and the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ca_file_stops_the_start_naming_key_and_file() {
    let missing = "/nonexistent/mailroom/ca.pem";
    let url = amqps(&format!("cacertfile={missing}"));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), &inbound_config_at(&url, "never", 10));
    for args in [
        &["amqp", "declare"][..],
        &["serve", "--listen", "127.0.0.1:0"][..],
    ] {
        let (ok, _, err) =
            run_mailroom(&config, "sqlite://unused.db", args, Duration::from_secs(30));
        assert!(!ok, "{args:?} must fail");
        assert!(
            err.contains("amqp.url") && err.contains(&format!("cacertfile={missing}")),
            "{args:?}: {err}"
        );
        assert!(!err.contains("guest:guest"), "{err}");
    }
}
