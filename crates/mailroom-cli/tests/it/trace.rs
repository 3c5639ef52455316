//! W3C trace propagation through the real binary: a
//! `traceparent` received with an event is stored, shown in the event
//! object, and sent on with every handler call as a child of the same trace.

use crate::support;
use crate::support::write_config;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    (format!("{}/handle", on_loopback(app).await), calls)
}

/// Serves `app` on a free loopback port: its base URL.
async fn on_loopback(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
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
            "[[source]]\nname = \"payments\"\n\n\
             [[topic]]\nname = \"payments\"\nretry = {{ max_attempts = 5, base = \"50ms\" }}\n\
             handler = {{ http = {{ url = \"{url}\" }} }}\n"
        ),
    );
    let store = format!("sqlite://{}", dir.path().join("m.db").display());
    let mut serve = support::serve(&config, &store);
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
    assert!(serve.terminate().expect("SIGTERM"), "serve stopped cleanly");
}

/// Spans an OTLP/HTTP collector received: (trace id, span id, parent span
/// id, name), ids in lower-case hex (an empty parent for a root).
type Spans = Arc<Mutex<Vec<(String, String, String, String)>>>;

/// A collector on loopback: `POST /v1/traces` with an OTLP protobuf body.
async fn collector() -> (String, Spans) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let spans: Spans = Arc::default();
    let log = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let log = log.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut all = log.lock().expect("spans");
                for span in request
                    .resource_spans
                    .iter()
                    .flat_map(|r| &r.scope_spans)
                    .flat_map(|s| &s.spans)
                {
                    all.push((
                        hex(&span.trace_id),
                        hex(&span.span_id),
                        hex(&span.parent_span_id),
                        span.name.clone(),
                    ));
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    (on_loopback(app).await, spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// With `[telemetry] otlp_endpoint`, the intake, each attempt and each
/// handler call are exported as spans of the event's trace: intake and
/// attempts children of the received `traceparent`, a handler call child
/// of its attempt, and the handler receives the handler call span itself
/// as its parent. An event that came without a `traceparent` gets the
/// trace its intake span began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_collector_in_the_events_trace() {
    let (url, calls) = receiver().await;
    let (otlp, spans) = collector().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            "[telemetry]\notlp_endpoint = \"{otlp}\"\n\n\
             [[source]]\nname = \"payments\"\n\n\
             [[topic]]\nname = \"payments\"\nretry = {{ max_attempts = 5, base = \"50ms\" }}\n\
             handler = {{ http = {{ url = \"{url}\" }} }}\n"
        ),
    );
    let store = format!("sqlite://{}", dir.path().join("m.db").display());
    let mut serve = support::serve(&config, &store);
    let http = reqwest::Client::new();
    let mut ids = vec![];
    for (body, traceparent) in [(r#"{"id": "t1"}"#, Some(SENT)), (r#"{"id": "t2"}"#, None)] {
        let mut post = http
            .post(format!("{}/webhooks/payments", serve.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = traceparent {
            post = post.header("traceparent", t);
        }
        let answer = post.send().await.expect("post");
        assert_eq!(answer.status(), 200);
        let answer: serde_json::Value = answer.json().await.expect("json");
        ids.push(answer["id"].as_str().expect("id").to_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while calls
        .lock()
        .expect("calls")
        .values()
        .map(Vec::len)
        .sum::<usize>()
        < 4
    {
        assert!(Instant::now() < deadline, "handler calls: {calls:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let stored: serde_json::Value = http
        .get(format!("{}/v1/events?limit=10", serve.base))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    // The last batch of spans is exported when serve stops.
    assert!(serve.terminate().expect("SIGTERM"), "serve stopped cleanly");
    let spans = spans.lock().expect("spans").clone();
    let calls = calls.lock().expect("calls").clone();
    let named = |name: &str, trace: &str| -> Vec<(String, String)> {
        spans
            .iter()
            .filter(|s| s.3 == name && s.0 == trace)
            .map(|s| (s.1.clone(), s.2.clone()))
            .collect()
    };

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let intake = named("intake", trace);
    assert_eq!(intake.len(), 1, "{spans:?}");
    assert_eq!(
        intake[0].1, "00f067aa0ba902b7",
        "intake: child of the sender's span"
    );
    let attempts = named("attempt", trace);
    assert_eq!(attempts.len(), 2, "{spans:?}");
    assert!(
        attempts.iter().all(|a| a.1 == "00f067aa0ba902b7"),
        "{attempts:?}"
    );
    let handler_calls = named("handler call", trace);
    assert_eq!(handler_calls.len(), 2, "{spans:?}");
    for (id, parent) in &handler_calls {
        assert!(
            attempts.iter().any(|a| &a.0 == parent),
            "a handler call inside an attempt"
        );
        let forwarded = format!("00-{trace}-{id}-01");
        assert!(
            calls[&ids[0]]
                .iter()
                .any(|t| t.as_deref() == Some(forwarded.as_str())),
            "the handler got the handler call span: {forwarded} in {:?}",
            calls[&ids[0]]
        );
    }

    // t2 came without a traceparent: its trace began at intake.
    let roots: Vec<_> = spans
        .iter()
        .filter(|s| s.3 == "intake" && s.2.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "{spans:?}");
    let (began, intake_id) = (&roots[0].0, &roots[0].1);
    let events = stored["events"].as_array().expect("events");
    let t2 = events
        .iter()
        .find(|e| e["dedup_key"] == "t2")
        .expect("t2 stored");
    assert_eq!(
        t2["traceparent"],
        format!("00-{began}-{intake_id}-01"),
        "{t2}"
    );
    assert_eq!(named("attempt", began).len(), 2, "{spans:?}");
    for t in &calls[&ids[1]] {
        let t = t.as_deref().expect("a traceparent forwarded");
        assert!(t.starts_with(&format!("00-{began}-")), "{t}");
    }
}
