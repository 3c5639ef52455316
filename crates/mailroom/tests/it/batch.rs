//! Batch topics: size, wait, schedule, group_by, partial failure, HTTP contract.

use mailroom::clock::OffsetClock;
use mailroom::handler::{BatchOutcome, batch_handler_fn};
use mailroom::{
    Backoff, BatchSettings, Draft, Engine, Event, Mode, Outcome, RetryPolicy, Status, TopicSpec,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

fn batch_topic(settings: BatchSettings) -> TopicSpec {
    TopicSpec::new("reports")
        .mode(Mode::Batch(settings))
        .retry(RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Schedule(vec![Duration::from_millis(50)]),
        })
}

async fn done_count(store: &Arc<dyn mailroom::Store>) -> u64 {
    store
        .stats()
        .await
        .expect("stats")
        .iter()
        .map(|s| s.count(Status::Done))
        .sum()
}

async fn wait_done(store: &Arc<dyn mailroom::Store>, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    while done_count(store).await < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} done",
            done_count(store).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn run(engine: &Engine) -> CancellationToken {
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    shutdown
}

/// 1,050 waiting events with max_size 100 go out as 10 full batches and one
/// partial batch of 50, which waits for max_wait measured from its oldest event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_batches_then_a_partial_one_after_max_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let batches: Arc<Mutex<Vec<(usize, jiff::Timestamp, jiff::Timestamp)>>> = Arc::default();
    let max_wait = Duration::from_millis(1500);
    let engine = Engine::builder(store.clone())
        .topic(batch_topic(BatchSettings {
            max_size: 100,
            max_wait,
            ..BatchSettings::default()
        }))
        .handler("reports", {
            let batches = batches.clone();
            batch_handler_fn(move |events: Vec<Event>| {
                let batches = batches.clone();
                async move {
                    let oldest = events
                        .iter()
                        .map(|e| e.received_at)
                        .min()
                        .unwrap_or_default();
                    batches.lock().expect("lock").push((
                        events.len(),
                        oldest,
                        jiff::Timestamp::now(),
                    ));
                    Outcome::Success
                }
            })
        })
        .build()
        .expect("engine");
    let mut producers = Vec::new();
    for p in 0..10 {
        let engine = engine.clone();
        producers.push(tokio::spawn(async move {
            for i in 0..105 {
                engine
                    .enqueue(Draft::json(
                        "reports",
                        &serde_json::json!({ "p": p, "i": i }),
                    ))
                    .await
                    .expect("enqueue");
            }
        }));
    }
    for p in producers {
        p.await.expect("producer");
    }
    let shutdown = run(&engine);
    wait_done(&store, 1050, Duration::from_secs(20)).await;
    shutdown.cancel();
    let batches = batches.lock().expect("lock").clone();
    let mut sizes: Vec<usize> = batches.iter().map(|b| b.0).collect();
    sizes.sort_unstable();
    let mut expected = vec![100; 10];
    expected.insert(0, 50);
    assert_eq!(sizes, expected);
    let (_, oldest, delivered) = batches
        .iter()
        .find(|b| b.0 == 50)
        .copied()
        .expect("partial batch");
    let waited = delivered.as_millisecond() - oldest.as_millisecond();
    assert!(
        waited >= max_wait.as_millis() as i64 - 50,
        "partial batch flushed after {waited} ms, before max_wait"
    );
}

/// A nightly schedule ("0 0 * * *") fires at midnight UTC of the injected
/// clock — here started 800 ms before midnight — delivering what waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_batch_fires_at_its_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let fired: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let midnight: jiff::Timestamp = "2026-11-22T00:00:00Z".parse().expect("ts");
    let clock = OffsetClock::starting_at(midnight - jiff::SignedDuration::from_millis(800));
    let started = Instant::now();
    let engine = Engine::builder(store.clone())
        .clock(Arc::new(clock))
        .topic(batch_topic(BatchSettings {
            max_size: 100,
            schedule: Some("0 0 * * *".into()),
            ..BatchSettings::default()
        }))
        .handler("reports", {
            let fired = fired.clone();
            batch_handler_fn(move |events: Vec<Event>| {
                let fired = fired.clone();
                async move {
                    fired
                        .lock()
                        .expect("lock")
                        .push((events.len(), Instant::now()));
                    Outcome::Success
                }
            })
        })
        .build()
        .expect("engine");
    for i in 0..5 {
        engine
            .enqueue(Draft::json("reports", &serde_json::json!({ "i": i })))
            .await
            .expect("enqueue");
    }
    let shutdown = run(&engine);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        fired.lock().expect("lock").is_empty(),
        "fired before midnight"
    );
    wait_done(&store, 5, Duration::from_secs(5)).await;
    shutdown.cancel();
    let fired = fired.lock().expect("lock").clone();
    assert_eq!(fired.len(), 1, "one scheduled delivery");
    assert_eq!(fired[0].0, 5);
    let at = fired[0].1.duration_since(started);
    assert!(
        at >= Duration::from_millis(700),
        "fired {at:?} after start, midnight was at 800ms"
    );
}

/// When the handler fails only some events, only those are retried; each
/// event keeps its own history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_failure_retries_only_the_failed_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let engine = Engine::builder(store.clone())
        .topic(batch_topic(BatchSettings {
            max_size: 10,
            max_wait: Duration::from_millis(100),
            ..BatchSettings::default()
        }))
        .handler(
            "reports",
            batch_handler_fn(|events: Vec<Event>| async move {
                // Odd-numbered events fail on their first attempt.
                BatchOutcome::Each(
                    events
                        .iter()
                        .filter(|e| e.attempts == 1 && e.event_type.as_deref() == Some("odd"))
                        .map(|e| (e.id, Outcome::retry("odd one out")))
                        .collect(),
                )
            }),
        )
        .build()
        .expect("engine");
    let mut ids = Vec::new();
    for i in 0..10 {
        let t = if i % 2 == 1 { "odd" } else { "even" };
        ids.push((
            t,
            engine
                .enqueue(Draft::json("reports", &serde_json::json!({ "i": i })).event_type(t))
                .await
                .expect("enqueue")
                .id,
        ));
    }
    let shutdown = run(&engine);
    wait_done(&store, 10, Duration::from_secs(10)).await;
    shutdown.cancel();
    for (t, id) in ids {
        let e = store.get(id).await.expect("get").expect("event");
        let outcomes: Vec<&str> = e.history.iter().map(|a| a.outcome.as_str()).collect();
        if t == "odd" {
            assert_eq!(outcomes, ["retry", "done"], "{id}");
        } else {
            assert_eq!(outcomes, ["done"], "{id}");
        }
    }
}

/// The HTTP handler POSTs a batch as a JSON array of event objects, and a
/// `{"failed": [ids]}` answer fails only those; group_by splits deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_batches_are_json_arrays_and_may_fail_some_ids() {
    use axum::routing::post;
    let received: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let app = axum::Router::new().route(
        "/batch",
        post({
            let received = received.clone();
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let received = received.clone();
                async move {
                    assert_eq!(headers["content-type"], "application/json");
                    let array: serde_json::Value =
                        serde_json::from_slice(&body).expect("json array");
                    let failed: Vec<String> = array
                        .as_array()
                        .expect("array")
                        .iter()
                        .filter(|e| e["attempts"] == 1 && e["payload"]["fail"] == true)
                        .map(|e| e["id"].as_str().unwrap_or("").to_string())
                        .collect();
                    received.lock().expect("lock").push(array);
                    axum::Json(serde_json::json!({ "failed": failed }))
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let handler =
        mailroom::handler::http::HttpHandler::new(mailroom::handler::http::HttpHandlerSettings {
            url: format!("http://{addr}/batch").parse().expect("url"),
            timeout: Duration::from_secs(30),
            secret: None,
            headers: Default::default(),
            permanent_statuses: vec![410],
            tls: Default::default(),
        })
        .expect("http handler");
    let mut topic = batch_topic(BatchSettings {
        max_size: 50,
        max_wait: Duration::from_millis(200),
        schedule: None,
        group_by: Some("/shop".into()),
    });
    topic.retry.max_attempts = 3;
    let engine = Engine::builder(store.clone())
        .topic(topic)
        .handler("reports", Arc::new(handler))
        .build()
        .expect("engine");
    for i in 0..6 {
        let shop = if i < 3 { "a" } else { "b" };
        engine
            .enqueue(Draft::json(
                "reports",
                &serde_json::json!({ "shop": shop, "fail": i == 4 }),
            ))
            .await
            .expect("enqueue");
    }
    let shutdown = run(&engine);
    wait_done(&store, 6, Duration::from_secs(10)).await;
    shutdown.cancel();
    let received = received.lock().expect("lock").clone();
    // First round: one delivery per shop (3 + 3); then the failed one alone.
    let mut sizes: Vec<usize> = received
        .iter()
        .map(|a| a.as_array().map_or(0, Vec::len))
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [1, 3, 3]);
    for array in &received {
        let shops: std::collections::HashSet<_> = array
            .as_array()
            .expect("array")
            .iter()
            .map(|e| e["payload"]["shop"].clone())
            .collect();
        assert_eq!(shops.len(), 1, "a delivery mixes group_by values");
        assert!(array[0]["id"].is_string() && array[0]["topic"] == "reports");
    }
    let retried = &received
        .iter()
        .find(|a| a.as_array().map_or(0, Vec::len) == 1)
        .expect("retry delivery")[0];
    assert_eq!(retried["payload"]["fail"], true);
    assert_eq!(retried["attempts"], 2);
}
