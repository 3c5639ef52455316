//! The outbox on SQLite: an application's own transaction writes the event.

use mailroom::handler::handler_fn;
use mailroom::{Engine, Event, Outcome, TopicSpec};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn app_insert(tx: &rusqlite::Transaction<'_>, dedup: &str) {
    tx.execute("INSERT INTO app_orders (id) VALUES (?1)", [dedup])
        .expect("business write");
    tx.execute(
        mailroom_sqlite::OUTBOX_INSERT,
        rusqlite::named_params! {
            ":topic": "orders",
            ":type": "order.created",
            ":key": "customer-7",
            ":payload": format!("{{\"order\":\"{dedup}\"}}"),
            ":dedup_key": dedup,
        },
    )
    .expect("outbox insert");
}

/// Rolled back, the outbox INSERT leaves nothing; committed (twice, same
/// dedup key), it is delivered exactly once by a running engine that polls
/// the shared file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_leaves_nothing_and_commit_delivers_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.db");
    let store = mailroom::open_store(&format!("sqlite://{}", path.display()), true)
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let delivered: Arc<Mutex<Vec<Event>>> = Arc::default();
    let engine = Engine::builder(store.clone())
        .topic(TopicSpec::new("orders"))
        .poll_interval(Duration::from_millis(100))
        .handler("orders", {
            let delivered = delivered.clone();
            handler_fn(move |e: Event| {
                let delivered = delivered.clone();
                async move {
                    delivered.lock().expect("lock").push(e);
                    Outcome::Success
                }
            })
        })
        .build()
        .expect("engine");
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });

    let mut conn = rusqlite::Connection::open(&path).expect("app connection");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    conn.execute("CREATE TABLE app_orders (id TEXT PRIMARY KEY)", [])
        .expect("app table");
    {
        let tx = conn.transaction().expect("tx");
        app_insert(&tx, "order-1");
        tx.rollback().expect("rollback");
    }
    for _ in 0..2 {
        let tx = conn.transaction().expect("tx");
        tx.execute("DELETE FROM app_orders", []).expect("reset");
        app_insert(&tx, "order-2");
        tx.commit().expect("commit");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.lock().expect("lock").is_empty() {
        assert!(
            Instant::now() < deadline,
            "the committed outbox event was not delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    shutdown.cancel();
    let delivered = delivered.lock().expect("lock").clone();
    assert_eq!(delivered.len(), 1, "delivered once");
    let e = &delivered[0];
    assert_eq!(
        (e.topic.as_str(), e.source.as_str(), e.dedup_key.as_str()),
        ("orders", "outbox", "order-2")
    );
    assert_eq!(e.key.as_deref(), Some("customer-7"));
    assert_eq!(e.event_type.as_deref(), Some("order.created"));
    assert_eq!(e.payload.as_deref(), Some(&br#"{"order":"order-2"}"#[..]));
    let object = serde_json::to_value(mailroom::answer::EventObject::summary(e)).expect("json");
    assert_eq!(object["payload"]["order"], "order-2");
    let all = store
        .list(&mailroom::operate::ListFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(all.events.len(), 1, "the rolled-back event must not exist");
}

/// The SQLite outbox INSERT's optional `:priority` and `:deliver_at`
/// (milliseconds since the epoch): claims take the higher
/// priority first and hold a later one until it is due; rows written
/// without them get the defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_insert_takes_priority_and_deliver_at() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.db");
    let store = mailroom::open_store(&format!("sqlite://{}", path.display()), true)
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let conn = rusqlite::Connection::open(&path).expect("app connection");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let due = store.now().await.expect("now") + Duration::from_millis(1500);
    let rows: [(&str, Option<i64>, Option<i64>); 3] = [
        ("plain", None, None),
        ("high", Some(5), None),
        ("later", Some(9), Some(due.as_millisecond())),
    ];
    for (dedup, priority, deliver_at) in rows {
        let mut stmt = conn
            .prepare(mailroom_sqlite::OUTBOX_INSERT)
            .expect("prepare");
        let mut bind = |name: &str, value: &dyn rusqlite::ToSql| {
            let i = stmt.parameter_index(name).expect("name").expect("present");
            stmt.raw_bind_parameter(i, value).expect("bind");
        };
        bind(":topic", &"orders");
        bind(":type", &"order.created");
        bind(":payload", &"{}");
        bind(":dedup_key", &dedup);
        // Left unbound (NULL) when not given, as an application that
        // predates them would.
        if let Some(p) = priority {
            bind(":priority", &p);
        }
        if let Some(at) = deliver_at {
            bind(":deliver_at", &at);
        }
        assert_eq!(stmt.raw_execute().expect("insert"), 1);
    }
    let req = mailroom::store::ClaimRequest::new("orders", "w", 10, Duration::from_secs(30));
    let dedup = |c: &[mailroom::pull::Claimed]| -> Vec<String> {
        c.iter().map(|c| c.event.dedup_key.clone()).collect()
    };
    assert_eq!(
        dedup(&store.claim(&req).await.expect("claim")),
        ["high", "plain"]
    );
    while store.now().await.expect("now") < due {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let later = store.claim(&req).await.expect("claim");
    assert_eq!(dedup(&later), ["later"]);
    assert_eq!(later[0].event.priority, 9);
}

/// The SQLite outbox INSERT's `:correlation_id` and `:causation_id` are
/// stored and handed to the handler; a follow-up naming only its cause (the
/// causing event's id) keeps the cause's correlation id, and one built
/// with `Draft::follows` in a closure handler does too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_correlation_is_handed_to_handlers_and_kept_by_follow_ups() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("app.db");
    let store = mailroom::open_store(&format!("sqlite://{}", path.display()), true)
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    let delivered: Arc<Mutex<Vec<Event>>> = Arc::default();
    let engine = Arc::new(std::sync::OnceLock::<Engine>::new());
    let built = Engine::builder(store.clone())
        .topic(TopicSpec::new("orders"))
        .topic(TopicSpec::new("invoices"))
        .poll_interval(Duration::from_millis(50))
        .handler("orders", {
            let engine = engine.clone();
            handler_fn(move |e: Event| {
                let engine = engine.clone();
                async move {
                    // The handler's follow-up, in the order's flow.
                    let Some(engine) = engine.get() else {
                        return Outcome::retry("engine not set");
                    };
                    let draft = mailroom::Draft::json("invoices", &serde_json::json!({}))
                        .dedup_key(format!("invoice-for-{}", e.dedup_key))
                        .follows(&e);
                    match engine.enqueue(draft).await {
                        Ok(_) => Outcome::Success,
                        Err(err) => Outcome::retry(err.to_string()),
                    }
                }
            })
        })
        .handler("invoices", {
            let delivered = delivered.clone();
            handler_fn(move |e: Event| {
                let delivered = delivered.clone();
                async move {
                    delivered.lock().expect("lock").push(e);
                    Outcome::Success
                }
            })
        })
        .build()
        .expect("engine");
    engine.set(built.clone()).expect("set once");
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move { built.run(shutdown).await }
    });

    let conn = rusqlite::Connection::open(&path).expect("app connection");
    conn.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let insert = |topic: &str, dedup: &str, correlation: Option<&str>, cause: Option<&str>| {
        conn.execute(
            mailroom_sqlite::OUTBOX_INSERT,
            rusqlite::named_params! {
                ":topic": topic,
                ":type": "order.placed",
                ":key": None::<String>,
                ":payload": "{}",
                ":dedup_key": dedup,
                ":correlation_id": correlation,
                ":causation_id": cause,
            },
        )
        .expect("outbox insert");
        conn.query_row("SELECT id FROM events WHERE dedup_key = ?1", [dedup], |r| {
            r.get::<_, String>(0)
        })
        .expect("the stored id")
    };
    let order = insert("orders", "o-1", Some("flow-1"), Some("cmd-9"));
    // The application's own follow-up of the order, naming only its cause.
    insert("invoices", "i-app", None, Some(&order));
    insert("invoices", "i-own", Some("flow-2"), Some(&order));

    let deadline = Instant::now() + Duration::from_secs(10);
    while delivered.lock().expect("lock").len() < 3 {
        assert!(
            Instant::now() < deadline,
            "the invoices were not all delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let mut got: Vec<(String, Option<String>, Option<String>)> = delivered
        .lock()
        .expect("lock")
        .iter()
        .map(|e| {
            (
                e.dedup_key.clone(),
                e.correlation_id.clone(),
                e.causation_id.clone(),
            )
        })
        .collect();
    got.sort();
    let flow = |c: &str| Some(c.to_string());
    assert_eq!(
        got,
        [
            ("i-app".into(), flow("flow-1"), flow(&order)),
            ("i-own".into(), flow("flow-2"), flow(&order)),
            ("invoice-for-o-1".into(), flow("flow-1"), flow(&order)),
        ]
    );
    let stored = store
        .get(mailroom::EventId::parse_stored(&order).expect("id"))
        .await
        .expect("get")
        .expect("the order");
    assert_eq!(stored.causation_id.as_deref(), Some("cmd-9"));
}
