//! Pull workers over HTTP: exclusive claims, fencing, redelivery.

use mailroom::{Draft, Engine, TopicSpec};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Server {
    base: String,
    engine: Engine,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

async fn start() -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("jobs"))
        .maintenance_period(Duration::from_millis(50))
        .build()
        .expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let router = mailroom_server::router(engine.clone(), mailroom_server::ServerOptions::default());
    tokio::spawn(mailroom_server::serve(listener, router, shutdown.clone()));
    tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    Server {
        base,
        engine,
        shutdown,
        _dir: dir,
    }
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Two workers claiming concurrently from one topic never receive the same
/// event, and between them they process every event once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_never_share_an_event() {
    let s = start().await;
    for i in 0..300 {
        s.engine
            .enqueue(Draft::json("jobs", &json!({ "i": i })))
            .await
            .expect("enqueue");
    }
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..2 {
        let (base, seen) = (s.base.clone(), seen.clone());
        workers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            loop {
                let (status, body) = post(
                    &client,
                    format!("{base}/v1/topics/jobs/claim"),
                    json!({ "max": 7, "lease": "30s", "worker": format!("w{w}") }),
                )
                .await;
                assert_eq!(status, 200, "{body}");
                let events = body["events"].as_array().cloned().unwrap_or_default();
                if events.is_empty() {
                    break;
                }
                for e in events {
                    let id = e["id"].as_str().expect("id").to_string();
                    seen.lock().expect("lock").push(id.clone());
                    let (status, body) = post(
                        &client,
                        format!("{base}/v1/events/{id}/ack"),
                        json!({ "token": e["token"] }),
                    )
                    .await;
                    assert_eq!(status, 200, "{body}");
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let seen = seen.lock().expect("lock").clone();
    let unique: HashSet<_> = seen.iter().collect();
    assert_eq!(
        seen.len(),
        unique.len(),
        "an event was handed to two workers"
    );
    assert_eq!(unique.len(), 300);
    s.shutdown.cancel();
}

/// Huge, negative or tiny numbers of seconds for `lease` (claim, extend) and
/// `retry_in` (nack) are answered 400 naming the field and the range, and
/// the server keeps serving: none of them panics the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_durations_are_refused_naming_the_field() {
    let s = start().await;
    let id = s
        .engine
        .enqueue(Draft::json("jobs", &json!({ "x": 1 })))
        .await
        .expect("enqueue")
        .id
        .to_string();
    let client = reqwest::Client::new();
    let claim = format!("{}/v1/topics/jobs/claim", s.base);
    for lease in [
        json!(1e308),
        json!(1e300),
        json!(3601),
        json!(-1),
        json!(0.0000001),
    ] {
        let (status, body) =
            post(&client, claim.clone(), json!({ "max": 1, "lease": lease })).await;
        assert_eq!(status, 400, "lease {lease}: {body}");
        assert_eq!(
            body["detail"], "lease must be between 1ms and 1h",
            "lease {lease}"
        );
    }
    let (status, claimed) = post(&client, claim.clone(), json!({ "lease": 30 })).await;
    assert_eq!(status, 200, "{claimed}");
    assert_eq!(
        claimed["events"][0]["id"], id,
        "the server is alive and the event unclaimed"
    );
    let token = claimed["events"][0]["token"].clone();
    let (status, body) = post(
        &client,
        format!("{}/v1/events/{id}/extend", s.base),
        json!({ "token": token, "lease": 1e300 }),
    )
    .await;
    assert_eq!(
        (status, &body["detail"]),
        (400, &json!("lease must be between 1ms and 1h"))
    );
    let (status, body) = post(
        &client,
        format!("{}/v1/events/{id}/nack", s.base),
        json!({ "token": token, "retry_in": 1e300 }),
    )
    .await;
    assert_eq!(
        (status, &body["detail"]),
        (400, &json!("retry_in must be between 1ms and 1h"))
    );
    let (status, body) = post(
        &client,
        format!("{}/v1/events/{id}/ack", s.base),
        json!({ "token": token }),
    )
    .await;
    assert_eq!(
        status, 200,
        "the claim is still held and can be acked: {body}"
    );
    s.shutdown.cancel();
}

/// A worker that lets its lease expire cannot ack (409); the event goes back
/// to pending, is redelivered with a new token, and the lost attempt counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_claim_cannot_ack_and_is_redelivered() {
    let s = start().await;
    let id = s
        .engine
        .enqueue(Draft::json("jobs", &json!({ "x": 1 })))
        .await
        .expect("enqueue")
        .id
        .to_string();
    let client = reqwest::Client::new();
    let (_, first) = post(
        &client,
        format!("{}/v1/topics/jobs/claim", s.base),
        json!({ "lease": "200ms" }),
    )
    .await;
    assert_eq!(first["events"][0]["id"], id);
    assert_eq!(first["events"][0]["token"], 1);
    tokio::time::sleep(Duration::from_millis(600)).await;

    let (status, body) = post(
        &client,
        format!("{}/v1/events/{id}/ack", s.base),
        json!({ "token": 1 }),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let (_, again) = post(
        &client,
        format!("{}/v1/topics/jobs/claim", s.base),
        json!({ "lease": "30s" }),
    )
    .await;
    assert_eq!(again["events"][0]["id"], id, "the event is redelivered");
    assert_eq!(again["events"][0]["token"], 2);
    let (status, _) = post(
        &client,
        format!("{}/v1/events/{id}/extend", s.base),
        json!({ "token": 2, "lease": "60s" }),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = post(
        &client,
        format!("{}/v1/events/{id}/nack", s.base),
        json!({ "token": 2, "error": "disk full", "retry_in": "100ms" }),
    )
    .await;
    assert_eq!((status, body["status"].clone()), (200, json!("pending")));

    let event: Value = client
        .get(format!("{}/v1/events/{id}", s.base))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let outcomes: Vec<&str> = event["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|a| a["outcome"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(outcomes, ["lease_expired", "retry"]);
    assert_eq!(event["last_error"], "disk full");
    s.shutdown.cancel();
}

/// A topic with a built-in handler cannot be claimed by pull workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_with_a_handler_are_not_pullable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("auto"))
        .handler(
            "auto",
            mailroom::handler::handler_fn(|_e: mailroom::Event| async {
                mailroom::Outcome::Success
            }),
        )
        .build()
        .expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    tokio::spawn(mailroom_server::serve(
        listener,
        mailroom_server::router(engine, Default::default()),
        shutdown.clone(),
    ));
    let (status, _) = post(
        &reqwest::Client::new(),
        format!("{base}/v1/topics/auto/claim"),
        json!({}),
    )
    .await;
    assert_eq!(status, 409);
    shutdown.cancel();
}

/// One Prometheus recorder for this test binary (a recorder is process-global).
fn prometheus() -> &'static metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("install the recorder")
    })
}

/// Starts a server over one pull topic, `spec`, with `/metrics` served.
async fn start_pull(spec: TopicSpec) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    let engine = Engine::builder(store).topic(spec).build().expect("engine");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let handle = prometheus();
    let options = mailroom_server::ServerOptions {
        metrics: Some(Arc::new(move || handle.render())),
        ..Default::default()
    };
    let router = mailroom_server::router(engine.clone(), options);
    tokio::spawn(mailroom_server::serve(listener, router, shutdown.clone()));
    Server {
        base,
        engine,
        shutdown,
        _dir: dir,
    }
}

/// The value of `mailroom_events_processed_total{topic, outcome}` in a scrape.
fn processed(scrape: &str, topic: &str, outcome: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| l.starts_with("mailroom_events_processed_total{"))
        .filter(|l| l.contains(&format!("topic=\"{topic}\"")))
        .find(|l| l.contains(&format!("outcome=\"{outcome}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A pull worker's ack and permanent nack are counted in
/// `mailroom_events_processed_total` like a built-in handler's outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_outcomes_are_counted_in_the_processing_metrics() {
    let s = start_pull(TopicSpec::new("counted")).await;
    for i in 0..2 {
        s.engine
            .enqueue(Draft::json("counted", &json!({ "i": i })))
            .await
            .expect("enqueue");
    }
    let client = reqwest::Client::new();
    let (_, claimed) = post(
        &client,
        format!("{}/v1/topics/counted/claim", s.base),
        json!({ "max": 2 }),
    )
    .await;
    let events = claimed["events"].as_array().expect("events").clone();
    assert_eq!(events.len(), 2);
    let verdicts = [
        ("ack", json!({ "token": events[0]["token"] })),
        (
            "nack",
            json!({ "token": events[1]["token"], "permanent": true }),
        ),
    ];
    for (e, (verb, body)) in events.iter().zip(verdicts) {
        let id = e["id"].as_str().expect("id");
        let (status, body) = post(&client, format!("{}/v1/events/{id}/{verb}", s.base), body).await;
        assert_eq!(status, 200, "{body}");
    }
    let scrape = client
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    assert_eq!(processed(&scrape, "counted", "done"), Some(1.0), "{scrape}");
    assert_eq!(processed(&scrape, "counted", "dead"), Some(1.0), "{scrape}");
    s.shutdown.cancel();
}

/// `extend` without a lease renews the claim for the topic's lease, not a
/// fixed 35 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_without_a_lease_uses_the_topic_lease() {
    let s = start_pull(TopicSpec::new("long").lease(Duration::from_secs(600))).await;
    let id = s
        .engine
        .enqueue(Draft::json("long", &json!({ "x": 1 })))
        .await
        .expect("enqueue")
        .id;
    let client = reqwest::Client::new();
    let (_, claimed) = post(
        &client,
        format!("{}/v1/topics/long/claim", s.base),
        json!({ "lease": "5s" }),
    )
    .await;
    let token = claimed["events"][0]["token"].clone();
    let (status, body) = post(
        &client,
        format!("{}/v1/events/{id}/extend", s.base),
        json!({ "token": token }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let until: jiff::Timestamp = body["lease_until"]
        .as_str()
        .expect("lease_until")
        .parse()
        .expect("timestamp");
    let left = until.as_second() - jiff::Timestamp::now().as_second();
    assert!(
        (590..=600).contains(&left),
        "the lease ends in {left}s, not the topic's 600s"
    );
    s.shutdown.cancel();
}
