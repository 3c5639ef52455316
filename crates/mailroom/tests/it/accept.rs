//! One rule set on every door (`mailroom::accept`): a keyless event in a
//! sequential topic is refused by the library and by webhook intake alike,
//! and nothing is stored; the outbox, which cannot be refused, stores such an
//! event and it runs as an independent event.

use bytes::Bytes;
use http::HeaderMap;
use mailroom::handler::handler_fn;
use mailroom::intake::IntakeError;
use mailroom::operate::ListFilter;
use mailroom::{
    Draft, Engine, EnqueueError, Event, Field, Mode, OnDead, Outcome, Refused, SourceSpec, Status,
    TopicSpec,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

fn sequential(name: &str) -> TopicSpec {
    TopicSpec::new(name)
        .mode(Mode::Sequential {
            on_dead: OnDead::Block,
        })
        .key(Field::Json("/customer".into()))
}

async fn stored(engine: &Engine) -> usize {
    engine
        .operator()
        .list(&ListFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("list")
        .events
        .len()
}

/// `Engine::enqueue` (the library, the API, AMQP sources) refuses a keyless
/// event in a sequential topic without a default key, with a typed error,
/// and stores nothing; with a key, or in a topic with a `default_key`, it
/// is stored.
#[tokio::test]
async fn enqueue_refuses_a_keyless_event_in_a_sequential_topic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut defaulted = sequential("defaulted");
    defaulted.default_key = Some("none".into());
    let engine = Engine::builder(store(&dir).await)
        .topic(sequential("orders"))
        .topic(defaulted)
        .build()
        .expect("engine");
    let err = engine
        .enqueue(Draft::json("orders", &serde_json::json!({"n": 1})))
        .await
        .expect_err("a keyless event in a sequential topic is refused");
    assert!(
        matches!(&err, EnqueueError::Refused(Refused::KeyRequired { topic, .. }) if topic == "orders"),
        "{err:?}"
    );
    assert_eq!(stored(&engine).await, 0, "nothing was stored");

    engine
        .enqueue(Draft::json("orders", &serde_json::json!({})).key("c-1"))
        .await
        .expect("keyed");
    let id = engine
        .enqueue(Draft::json("defaulted", &serde_json::json!({})))
        .await
        .expect("the default key applies")
        .id;
    let event = engine
        .operator()
        .get(id)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(event.key.as_deref(), Some("none"));
    let err = engine
        .enqueue(Draft::json("nowhere", &serde_json::json!({})))
        .await
        .expect_err("unknown topic");
    assert!(matches!(
        err,
        EnqueueError::Refused(Refused::UnknownTopic(_))
    ));
}

/// Webhook intake applies the same rules: a body without the key, or an
/// oversized dedup key, is refused (400 on the wire) and nothing is stored.
#[tokio::test]
async fn webhook_intake_refuses_a_keyless_event_in_a_sequential_topic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::builder(store(&dir).await)
        .topic(sequential("orders"))
        .source(SourceSpec::new("shop", "orders"))
        .build()
        .expect("engine");
    let body = Bytes::from_static(br#"{"id":"evt-1"}"#);
    let err = engine
        .hooks()
        .ingest_webhook("shop", &HeaderMap::new(), body)
        .await
        .expect_err("refused");
    match &err {
        IntakeError::Refused(Refused::KeyRequired { hint, .. }) => {
            assert!(
                hint.as_deref().is_some_and(|h| h.contains("/customer")),
                "{err}"
            );
        }
        other => panic!("expected a KeyRequired refusal, got {other:?}"),
    }
    let mut headers = HeaderMap::new();
    let long = "x".repeat(mailroom::accept::MAX_FIELD_LEN + 1);
    headers.insert("webhook-id", long.parse().expect("header"));
    let body = Bytes::from_static(br#"{"customer":"c-1"}"#);
    let err = engine
        .hooks()
        .ingest_webhook("shop", &headers, body)
        .await
        .expect_err("an oversized dedup key is refused");
    assert!(
        matches!(
            err,
            IntakeError::Refused(Refused::FieldLength {
                field: "dedup key",
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(stored(&engine).await, 0);
}

/// Control characters (CR, LF, NUL, ESC, DEL, C1) in the key, type, dedup
/// key, correlation or causation id are refused on the library door and on
/// webhook intake, naming the field, and nothing is stored: such values
/// would break every delivery's headers and reach terminals raw.
#[tokio::test]
async fn control_characters_in_envelope_fields_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = Engine::builder(store(&dir).await)
        .topic(TopicSpec::new("plain").key(Field::Json("/customer".into())))
        .source(SourceSpec::new("shop", "plain"))
        .build()
        .expect("engine");
    let draft = || Draft::json("plain", &serde_json::json!({}));
    for (draft, field) in [
        (draft().key("k\r\nX-Evil: 1"), "key"),
        (draft().event_type("t\0"), "type"),
        (draft().event_type("t\u{1b}[31m"), "type"),
        (draft().dedup_key("d\u{7f}"), "dedup key"),
        (draft().correlation_id("c\u{85}"), "correlation_id"),
        (draft().causation_id("c\n"), "causation_id"),
    ] {
        let err = engine.enqueue(draft).await.expect_err("refused");
        assert!(
            matches!(&err, EnqueueError::Refused(Refused::ControlCharacter { field: f, .. }) if *f == field),
            "{field}: {err:?}"
        );
        assert!(err.to_string().starts_with(field), "{err}");
    }
    let body = Bytes::from_static(b"{\"customer\":\"c-1\\r\\nX-Injected: yes\"}");
    let err = engine
        .hooks()
        .ingest_webhook("shop", &HeaderMap::new(), body)
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err,
            IntakeError::Refused(Refused::ControlCharacter { field: "key", .. })
        ),
        "{err:?}"
    );
    assert_eq!(stored(&engine).await, 0, "nothing was stored");
    engine
        .enqueue(draft().key("c-1 ünïcode").event_type("order.paid"))
        .await
        .expect("printable text, non-ASCII included, is accepted");
}

/// The outbox cannot be refused: a keyless row an application INSERTs into
/// a sequential topic is processed as an independent event, even while
/// every keyed event is held back behind its key's dead head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_outbox_row_in_a_sequential_topic_runs_independently() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.db");
    let engine = Engine::builder(store(&dir).await)
        .topic(sequential("orders"))
        .poll_interval(Duration::from_millis(50))
        .handler(
            "orders",
            handler_fn(|e: Event| async move {
                match e.event_type.as_deref() {
                    Some("bad") => Outcome::Permanent { error: "no".into() },
                    _ => Outcome::Success,
                }
            }),
        )
        .build()
        .expect("engine");
    let conn = rusqlite::Connection::open(&path).expect("app connection");
    conn.busy_timeout(Duration::from_secs(5)).expect("busy");
    for (dedup, key, kind) in [
        ("a1", Some("A"), "bad"),
        ("a2", Some("A"), "ok"),
        ("n", None, "ok"),
    ] {
        conn.execute(
            mailroom_sqlite::OUTBOX_INSERT,
            rusqlite::named_params! {
                ":topic": "orders", ":type": kind, ":key": key,
                ":payload": "{}", ":dedup_key": dedup,
            },
        )
        .expect("outbox insert");
    }
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    let status = async |dedup: &str| {
        let filter = ListFilter {
            limit: 10,
            ..Default::default()
        };
        let page = engine.operator().list(&filter).await.expect("list");
        page.events
            .into_iter()
            .find(|e| e.dedup_key == dedup)
            .expect("stored")
            .status
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while status("n").await != Status::Done || status("a1").await != Status::Dead {
        assert!(Instant::now() < deadline, "the keyless event never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status("a2").await, Status::Pending, "A stays blocked");
    shutdown.cancel();
    run.await.expect("engine");
}
