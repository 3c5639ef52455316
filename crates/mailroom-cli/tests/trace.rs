//! W3C trace propagation through the real binary (SPEC §13): a
//! `traceparent` received with an event is stored, shown in the event
//! object, and sent on with every handler call as a child of the same trace.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{Serve, write_config};

const SENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Calls per `webhook-id`, each with its `traceparent` header (if any).
type Calls = Arc<Mutex<HashMap<String, Vec<Option<String>>>>>;

/// A handler endpoint that fails each event's first call (500), so every
/// event is attempted twice, and records the `traceparent` of every call.
async fn receiver() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let log = calls.clone();
    let app = axum::Router::new().route(
        "/handle",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let log = log.clone();
            async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let mut all = log.lock().expect("calls");
                let seen = all.entry(h("webhook-id").unwrap_or_default()).or_default();
                seen.push(h("traceparent"));
                if seen.len() == 1 {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/handle", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, calls)
}

/// A webhook's `traceparent` reaches the HTTP handler on every attempt with
/// the same trace id and flags and a new span id per attempt; it is shown
/// in the event object. A malformed one is ignored (the webhook is still
/// taken, and nothing is forwarded); `POST /v1/events` takes one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_traceparent_reaches_the_http_handler_in_the_same_trace() {
    let (url, calls) = receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            "[[topic]]\nname = \"payments\"\nretry = {{ max_attempts = 5, base = \"50ms\" }}\n\
             handler = {{ http = {{ url = \"{url}\" }} }}\n"
        ),
    );
    let store = format!("sqlite://{}", dir.path().join("m.db").display());
    let mut serve = Serve::start(&config, &store);
    let http = reqwest::Client::new();
    let post = |body: &'static str, traceparent: &'static str| {
        http.post(format!("{}/webhooks/payments", serve.base))
            .header("content-type", "application/json")
            .header("traceparent", traceparent)
            .body(body)
            .send()
    };
    let traced: serde_json::Value = post(r#"{"id": "t1"}"#, SENT)
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    let resp = post(r#"{"id": "t2"}"#, "00-not-a-traceparent-01")
        .await
        .expect("post");
    assert_eq!(
        resp.status(),
        200,
        "a malformed traceparent is ignored, not refused"
    );
    let untraced: serde_json::Value = resp.json().await.expect("json");
    let (traced, untraced) = (
        traced["id"].as_str().expect("id"),
        untraced["id"].as_str().expect("id"),
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    while calls
        .lock()
        .expect("calls")
        .values()
        .map(Vec::len)
        .sum::<usize>()
        < 4
    {
        assert!(
            Instant::now() < deadline,
            "handler calls: {:?}",
            calls.lock().expect("calls")
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let calls = calls.lock().expect("calls").clone();
    let got: Vec<&str> = calls[traced]
        .iter()
        .map(|t| t.as_deref().expect("traceparent sent"))
        .collect();
    assert_eq!(got.len(), 2, "{calls:?}");
    for t in &got {
        let parts: Vec<&str> = t.split('-').collect();
        assert_eq!(parts.len(), 4, "{t}");
        assert_eq!(parts[0], "00");
        assert_eq!(
            parts[1], "4bf92f3577b34da6a3ce929d0e0e4736",
            "same trace id"
        );
        assert_ne!(
            parts[2], "00f067aa0ba902b7",
            "a child span, not the sender's"
        );
        assert_eq!(parts[2].len(), 16);
        assert_eq!(parts[3], "01", "same flags");
    }
    assert_ne!(got[0], got[1], "a span per attempt");
    assert_eq!(
        calls[untraced],
        vec![None, None],
        "nothing forwarded for a malformed one"
    );

    let show = |id: &str| http.get(format!("{}/v1/events/{id}", serve.base)).send();
    let event: serde_json::Value = show(traced).await.expect("get").json().await.expect("json");
    assert_eq!(event["traceparent"], SENT);
    assert_eq!(event["attempts"], 2);
    let event: serde_json::Value = show(untraced)
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert!(event.get("traceparent").is_none(), "{event}");

    let created: serde_json::Value = http
        .post(format!("{}/v1/events", serve.base))
        .header("idempotency-key", "k1")
        .header("traceparent", SENT)
        .json(&serde_json::json!({"topic": "payments", "payload": {"n": 1}}))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert_eq!(created["traceparent"], SENT, "{created}");
    assert!(serve.terminate(), "serve stopped cleanly");
}
