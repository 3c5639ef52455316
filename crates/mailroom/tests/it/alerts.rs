//! `[alerts]`: evaluated from the store's numbers, on demand and by
//! maintenance, which logs (and, with `notify`, POSTs) each alert as it
//! fires and as it resolves.

use mailroom::handler::handler_fn;
use mailroom::operate::AlertKind;
use mailroom::{AlertRules, Draft, Engine, Event, Outcome, Status, TopicSpec};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Log lines, captured by the test's subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Every threshold fires from real processing (dead letters and failures
/// of a failing topic, the backlog of a pulled topic, a slow handler), the
/// elected maintenance loop logs each once, and an alert whose cause goes
/// away is logged as resolved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_fire_from_real_processing_and_resolve() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let dir = tempfile::tempdir().expect("tempdir");
    let store = mailroom::open_store(
        &format!("sqlite://{}", dir.path().join("m.db").display()),
        true,
    )
    .await
    .expect("open");
    store.migrate().await.expect("migrate");
    let rules = AlertRules {
        dead_letter_depth: Some(20),
        backlog: Some(5),
        failure_rate: Some(0.5),
        processing_time: Some(Duration::from_millis(300)),
    };
    let engine = Engine::builder(store.clone())
        .topic(TopicSpec::new("payments"))
        .handler(
            "payments",
            handler_fn(|_e: Event| async { Outcome::permanent("card declined") }),
        )
        .topic(TopicSpec::new("reports"))
        .handler(
            "reports",
            handler_fn(|_e: Event| async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Outcome::Success
            }),
        )
        // No handler: pulled, so its events wait.
        .topic(TopicSpec::new("pulled"))
        .alerts(rules)
        .alert_interval(Duration::from_millis(100))
        .maintenance_period(Duration::from_millis(50))
        .build()
        .expect("engine");
    assert_eq!(engine.operator().alerts().await.expect("alerts"), vec![]);

    for i in 0..25 {
        engine
            .enqueue(Draft::json("payments", &serde_json::json!({ "i": i })))
            .await
            .expect("enqueue");
    }
    for i in 0..6 {
        engine
            .enqueue(Draft::json("pulled", &serde_json::json!({ "i": i })))
            .await
            .expect("enqueue");
    }
    engine
        .enqueue(Draft::json("reports", &serde_json::json!({})))
        .await
        .expect("enqueue");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });

    wait_for("25 dead payments", async || {
        store
            .stats()
            .await
            .expect("stats")
            .iter()
            .any(|s| s.topic == "payments" && s.count(Status::Dead) == 25)
    })
    .await;
    // The report has been running for more than 300 ms by now or soon.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let alerts = engine.operator().alerts().await.expect("alerts");
    let fired: Vec<(&str, AlertKind)> = alerts.iter().map(|a| (a.topic.as_str(), a.kind)).collect();
    assert_eq!(
        fired,
        vec![
            ("payments", AlertKind::DeadLetterDepth),
            ("payments", AlertKind::FailureRate),
            ("pulled", AlertKind::Backlog),
            ("reports", AlertKind::ProcessingTime),
        ],
        "{alerts:#?}"
    );
    let rate = &alerts[1];
    assert_eq!(rate.value, 1.0);
    assert!(rate.message.contains("25 of 25"), "{}", rate.message);
    // Still running (the usual case here), or finished in 1.5 s: slow either way.
    assert!(
        alerts[3].message.contains("running for") || alerts[3].message.contains("p95"),
        "{}",
        alerts[3].message
    );
    assert!(alerts[3].value > 0.3, "{}", alerts[3].value);

    // Maintenance logged each one.
    wait_for("four firing lines", async || {
        logs.text().matches("alert firing").count() >= 4
    })
    .await;
    let text = logs.text();
    for needle in [
        "alert=\"dead_letter_depth\"",
        "alert=\"failure_rate\"",
        "alert=\"backlog\"",
        "alert=\"processing_time\"",
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains("alert firing") && l.contains(needle)),
            "no firing line with {needle}:\n{text}"
        );
    }

    // Drain the pulled backlog as a pull worker would (claim, then ack):
    // the backlog alert resolves.
    let claimed = store
        .claim(&mailroom::store::ClaimRequest {
            topic: "pulled".into(),
            worker: "test".into(),
            max: 6,
            lease: Duration::from_secs(30),
            per_key: None,
            max_wait_for_priority: None,
            expire_after: None,
        })
        .await
        .expect("claim");
    for c in claimed {
        store
            .complete(c.event.id, c.token, mailroom::pull::Completion::Done)
            .await
            .expect("ack");
    }
    wait_for("the backlog alert to resolve", async || {
        logs.text()
            .lines()
            .any(|l| l.contains("alert resolved") && l.contains("alert=\"backlog\""))
    })
    .await;
    // Firing alerts are not logged again while they keep firing.
    let text = logs.text();
    let dead_lines = text
        .lines()
        .filter(|l| l.contains("alert firing") && l.contains("alert=\"dead_letter_depth\""))
        .count();
    assert_eq!(dead_lines, 1, "{text}");

    shutdown.cancel();
    run.await.expect("engine stopped");
}

/// What the alert receiver got: every request's headers and body, and
/// whether it was answered 2xx.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(http::HeaderMap, bytes::Bytes, bool)>>>);

impl Received {
    fn accepted(&self) -> Vec<(http::HeaderMap, serde_json::Value)> {
        let all = self.0.lock().expect("received");
        all.iter()
            .filter(|(_, _, ok)| *ok)
            .map(|(h, b, _)| (h.clone(), serde_json::from_slice(b).expect("JSON body")))
            .collect()
    }
}

/// A receiver on loopback that refuses its first request with 503 and
/// accepts the rest, verifying nothing itself (the test does).
async fn alert_receiver() -> (reqwest::Url, Received) {
    let received = Received::default();
    let log = received.clone();
    let app = axum::Router::new().route(
        "/alerts",
        axum::routing::post(move |headers: http::HeaderMap, body: bytes::Bytes| {
            let log = log.clone();
            async move {
                let mut all = log.0.lock().expect("received");
                let ok = !all.is_empty();
                all.push((headers, body, ok));
                if ok {
                    http::StatusCode::NO_CONTENT
                } else {
                    http::StatusCode::SERVICE_UNAVAILABLE
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/alerts", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url.parse().expect("url"), received)
}

/// With `notify`, the elected maintenance loop POSTs one "firing" when an
/// alert starts and one "resolved" when it ends, each signed so that a
/// Standard Webhooks verifier accepts it; a refused delivery is retried
/// with the same `webhook-id`, and an alert that keeps firing is not sent
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_notifications_are_signed_and_sent_once_per_transition() {
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (url, received) = alert_receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = mailroom::open_store(
        &format!("sqlite://{}", dir.path().join("m.db").display()),
        true,
    )
    .await
    .expect("open");
    store.migrate().await.expect("migrate");
    let mut notify = mailroom::AlertNotify::new(
        url,
        Some(mailroom::handler::http::HttpHandler::decode_secret(SECRET).expect("secret")),
    );
    notify.retry_base = Duration::from_millis(50);
    let engine = Engine::builder(store.clone())
        .topic(TopicSpec::new("pulled"))
        .alerts(AlertRules {
            backlog: Some(2),
            ..AlertRules::default()
        })
        .alert_notify(notify)
        .alert_interval(Duration::from_millis(50))
        .maintenance_period(Duration::from_millis(20))
        .build()
        .expect("engine");
    for i in 0..3 {
        engine
            .enqueue(Draft::json("pulled", &serde_json::json!({ "i": i })))
            .await
            .expect("enqueue");
    }
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    wait_for("the firing notification", async || {
        received.accepted().len() == 1
    })
    .await;
    // Several more evaluations while it keeps firing: nothing new is sent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(received.accepted().len(), 1);

    let claimed = store
        .claim(&mailroom::store::ClaimRequest {
            topic: "pulled".into(),
            worker: "test".into(),
            max: 3,
            lease: Duration::from_secs(30),
            per_key: None,
            max_wait_for_priority: None,
            expire_after: None,
        })
        .await
        .expect("claim");
    for c in claimed {
        store
            .complete(c.event.id, c.token, mailroom::pull::Completion::Done)
            .await
            .expect("ack");
    }
    wait_for("the resolved notification", async || {
        received.accepted().len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    shutdown.cancel();
    run.await.expect("engine stopped");

    let verifier = mailroom_signatures::Verifier::new(
        mailroom_signatures::Scheme::StandardWebhooks,
        [SECRET],
        mailroom_signatures::DEFAULT_TOLERANCE,
    )
    .expect("verifier");
    let now = jiff::Timestamp::now().as_second();
    let all = received.0.lock().expect("received").clone();
    assert_eq!(all.len(), 3, "one refused, then firing and resolved");
    for (headers, body, _) in &all {
        verifier
            .verify(headers, body, now)
            .expect("signature verifies");
    }
    assert_eq!(
        all[0].0["webhook-id"], all[1].0["webhook-id"],
        "a retry keeps its id"
    );
    assert_ne!(all[1].0["webhook-id"], all[2].0["webhook-id"]);
    let bodies: Vec<serde_json::Value> = received.accepted().into_iter().map(|(_, b)| b).collect();
    assert_eq!(bodies[0]["state"], "firing");
    assert_eq!(bodies[0]["alert"], "backlog");
    assert_eq!(bodies[0]["topic"], "pulled");
    assert_eq!(bodies[0]["value"], 3.0);
    assert_eq!(bodies[0]["threshold"], 2.0);
    assert_eq!(bodies[1]["state"], "resolved");
    assert_eq!(bodies[1]["alert"], "backlog");
    assert!(bodies[1]["value"].is_null());
    for b in &bodies {
        b["at"]
            .as_str()
            .expect("at")
            .parse::<jiff::Timestamp>()
            .expect("RFC 3339 at");
    }
}

/// Alert notifications never follow a redirect: a receiver answering `307`
/// to another address gets the notification retried, and the address it
/// points to receives nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_notifications_do_not_follow_redirects() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let serve = |app: axum::Router| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    };
    let reached = Arc::new(AtomicUsize::new(0));
    let target = serve(axum::Router::new().route(
        "/elsewhere",
        axum::routing::post({
            let reached = reached.clone();
            move || async move {
                reached.fetch_add(1, Ordering::SeqCst);
                http::StatusCode::NO_CONTENT
            }
        }),
    ))
    .await;
    let redirected = Arc::new(AtomicUsize::new(0));
    let redirector = serve(axum::Router::new().route(
        "/alerts",
        axum::routing::post({
            let redirected = redirected.clone();
            move || async move {
                redirected.fetch_add(1, Ordering::SeqCst);
                (
                    http::StatusCode::TEMPORARY_REDIRECT,
                    [("location", format!("http://{target}/elsewhere"))],
                )
            }
        }),
    ))
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = mailroom::open_store(
        &format!("sqlite://{}", dir.path().join("m.db").display()),
        true,
    )
    .await
    .expect("open");
    store.migrate().await.expect("migrate");
    let mut notify = mailroom::AlertNotify::new(
        format!("http://{redirector}/alerts").parse().expect("url"),
        None,
    );
    notify.retry_base = Duration::from_millis(50);
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("pulled"))
        .alerts(AlertRules {
            backlog: Some(2),
            ..AlertRules::default()
        })
        .alert_notify(notify)
        .alert_interval(Duration::from_millis(50))
        .maintenance_period(Duration::from_millis(20))
        .build()
        .expect("engine");
    for i in 0..3 {
        engine
            .enqueue(Draft::json("pulled", &serde_json::json!({ "i": i })))
            .await
            .expect("enqueue");
    }
    let shutdown = CancellationToken::new();
    let run = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    wait_for("a retried notification", async || {
        redirected.load(Ordering::SeqCst) >= 2
    })
    .await;
    shutdown.cancel();
    run.await.expect("engine stopped");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the redirect target received nothing"
    );
}
