//! The `http` handler, configured from TOML, against a real receiver.

use crate::support::{Db, outcomes, start_with};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use mailroom_config::{Config, Topology};
use mailroom_server::ServerOptions;
use mailroom_signatures::{DEFAULT_TOLERANCE, Scheme, Verifier};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    at: Instant,
    headers: HeaderMap,
    body: Bytes,
}

type Log = Arc<Mutex<Vec<Received>>>;

/// `/ok` answers 200; `/flaky` 500 with `Retry-After: 1` the first time,
/// then 200; `/gone` 410.
async fn receive(
    State(log): State<Log>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let earlier = {
        let mut log = log.lock().expect("lock");
        let earlier = log.iter().filter(|r| r.path == path).count();
        log.push(Received {
            path: path.clone(),
            at: Instant::now(),
            headers,
            body,
        });
        earlier
    };
    match (path.as_str(), earlier) {
        ("flaky", 0) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("retry-after", "1")],
            "overloaded, come back in a second",
        )
            .into_response(),
        ("gone", _) => (StatusCode::GONE, "this endpoint was removed").into_response(),
        _ => StatusCode::OK.into_response(),
    }
}

async fn start_receiver(shutdown: CancellationToken) -> (String, Log) {
    let log: Log = Arc::default();
    let app = Router::new()
        .route("/{path}", post(receive))
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .expect("receiver");
    });
    (base, log)
}

fn requests_to(log: &Log, path: &str) -> Vec<Received> {
    log.lock()
        .expect("lock")
        .iter()
        .filter(|r| r.path == path)
        .cloned()
        .collect()
}

fn header<'a>(r: &'a Received, name: &str) -> &'a str {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("header {name} missing from {:?}", r.headers))
}

/// A topic with `handler = { http = { url, secret } }` from `mailroom.toml`
/// POSTs the original bytes and content type with Standard Webhooks
/// signature and the `mailroom-*` headers; a 500 with `Retry-After: 1` is
/// retried about a second later; a 410 sends the event straight to `dead`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_handler_delivers_signed_original_bytes_and_honours_status() {
    let receiver_stop = CancellationToken::new();
    let (receiver, log) = start_receiver(receiver_stop.clone()).await;
    let toml = format!(
        r#"
[[source]]
name = "shop"
topic = "orders"

[[source]]
name = "flaky"
topic = "flaky"

[[source]]
name = "gone"
topic = "gone"

[[topic]]
name = "orders"
handler = {{ http = {{ url = "{receiver}/ok", secret = "{SECRET}" }} }}

[[topic]]
name = "flaky"
# Only Retry-After can explain a retry within seconds.
retry = {{ max_attempts = 5, schedule = ["30s"] }}
handler = {{ http = {{ url = "{receiver}/flaky" }} }}

[[topic]]
name = "gone"
retry = {{ max_attempts = 5, schedule = ["50ms"] }}
handler = {{ http = {{ url = "{receiver}/gone" }} }}
"#
    );
    let config = Config::from_toml("mailroom.toml", &toml, &|_| None).expect("config");
    let server = start_with(
        Db::fresh().await,
        "127.0.0.1:0",
        ServerOptions::default(),
        |store| {
            Topology::from_config(&config)
                .expect("topology from config")
                .into_builder(store)
                .poll_interval(Duration::from_millis(200))
        },
    )
    .await;

    // Odd spacing and key order: only the original bytes verify.
    let original: &[u8] = b"{\"total\": 12.50,  \"id\" : \"ord_1\"}\n";
    let content_type = "application/vnd.shop+json; charset=utf-8";
    let resp = server
        .webhook(
            "shop",
            &[("webhook-id", "msg_shop_1"), ("content-type", content_type)],
            original,
        )
        .await;
    assert_eq!(resp.status(), 200);
    let id = resp.json::<serde_json::Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    let done = server.event_with_status(&id, "done").await;
    assert_eq!(done["attempts"], 1);

    let got = requests_to(&log, "ok");
    assert_eq!(got.len(), 1, "delivered once");
    let r = &got[0];
    assert_eq!(&r.body[..], original, "the original bytes");
    assert_eq!(header(r, "content-type"), content_type);
    assert_eq!(header(r, "webhook-id"), id, "webhook-id is the event id");
    assert_eq!(header(r, "mailroom-topic"), "orders");
    assert_eq!(header(r, "mailroom-attempt"), "1");
    assert_eq!(header(r, "mailroom-source"), "shop");
    assert_eq!(header(r, "mailroom-dedup-key"), "msg_shop_1");
    let ts: i64 = header(r, "webhook-timestamp")
        .parse()
        .expect("unix seconds");
    assert!((ts - jiff::Timestamp::now().as_second()).abs() < 60);
    assert!(header(r, "webhook-signature").starts_with("v1,"));
    let verifier =
        Verifier::new(Scheme::StandardWebhooks, [SECRET], DEFAULT_TOLERANCE).expect("verifier");
    verifier
        .verify(&r.headers, &r.body, jiff::Timestamp::now().as_second())
        .expect("the signature verifies with the topic's secret");
    let other = Verifier::new(
        Scheme::StandardWebhooks,
        ["whsec_dGhpcyBpcyBub3QgdGhlIHNlY3JldA=="],
        DEFAULT_TOLERANCE,
    )
    .expect("verifier");
    assert!(
        other
            .verify(&r.headers, &r.body, jiff::Timestamp::now().as_second())
            .is_err(),
        "another secret does not verify"
    );

    // 500 + Retry-After: 1 → the next attempt about a second later.
    let flaky = server
        .accept("flaky", "f-1", &serde_json::json!({"n": 1}))
        .await;
    let done = server.event_with_status(&flaky, "done").await;
    assert_eq!(outcomes(&done), ["retry", "done"]);
    assert!(
        done["history"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("500")),
        "{done}"
    );
    let got = requests_to(&log, "flaky");
    assert_eq!(got.len(), 2);
    assert_eq!(header(&got[0], "mailroom-attempt"), "1");
    assert_eq!(header(&got[1], "mailroom-attempt"), "2");
    let gap = got[1].at - got[0].at;
    assert!(
        gap >= Duration::from_secs(1),
        "Retry-After respected: {gap:?}"
    );
    assert!(
        gap < Duration::from_secs(4),
        "Retry-After, not the 30 s schedule: {gap:?}"
    );

    // 410 → dead at once, no retry.
    let gone = server
        .accept("gone", "g-1", &serde_json::json!({"n": 1}))
        .await;
    let dead = server.event_with_status(&gone, "dead").await;
    assert_eq!(dead["attempts"], 1);
    assert_eq!(outcomes(&dead), ["dead"]);
    assert!(
        dead["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("410")),
        "{dead}"
    );
    // Proving an absence takes a wait: six times the 50 ms schedule.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(requests_to(&log, "gone").len(), 1, "a 410 is never retried");

    server.stop().await;
    receiver_stop.cancel();
}
