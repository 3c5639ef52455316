//! `POST /v1/events` with `Idempotency-Key` (IETF
//! draft-ietf-httpapi-idempotency-key-header): a repeat with the same body
//! gets the stored answer, a different body 422, a repeat in flight 409.

use super::support::{Gate, Server, problem, start};
use mailroom::TopicSpec;
use mailroom_server::ServerOptions;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

async fn server(options: ServerOptions) -> Server {
    start(|_| {}, |b| b.topic(TopicSpec::new("orders")), options).await
}

async fn post(s: &Server, key: Option<&str>, token: Option<&str>, body: &str) -> reqwest::Response {
    let mut req = s
        .http
        .post(s.url("/v1/events"))
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.body(body.to_owned()).send().await.expect("request")
}

fn replayed(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// The first request is answered 201 with the event object; the same key and
/// the same JSON (re-serialized with other whitespace) get the very same
/// status and body again, marked `Idempotent-Replayed: true`; one event is stored.
#[tokio::test]
async fn a_repeat_gets_the_stored_answer_marked_replayed() {
    let s = server(ServerOptions::default()).await;
    let body = json!({
        "topic": "orders", "type": "order.created", "key": "cus_1",
        "payload": {"order": 1, "items": [1, 2]}, "correlation_id": "corr-1",
    });
    let first = post(&s, Some("key-1"), None, &body.to_string()).await;
    assert_eq!(first.status(), 201);
    assert!(!replayed(&first));
    let first: Value = first.json().await.expect("json");
    assert_eq!(first["source"], "api");
    assert_eq!(first["dedup_key"], "key-1");
    assert_eq!(first["topic"], "orders");
    assert_eq!(first["type"], "order.created");
    assert_eq!(first["key"], "cus_1");
    assert_eq!(first["correlation_id"], "corr-1");
    assert_eq!(first["status"], "pending");
    assert_eq!(first["payload"], json!({"order": 1, "items": [1, 2]}));

    let pretty = serde_json::to_string_pretty(&body).expect("json");
    for _ in 0..2 {
        let again = post(&s, Some("key-1"), None, &pretty).await;
        assert_eq!(again.status(), 201);
        assert!(replayed(&again));
        let again: Value = again.json().await.expect("json");
        assert_eq!(again, first);
    }
    // The draft's sf-string form names the same key.
    let quoted = post(&s, Some("\"key-1\""), None, &body.to_string()).await;
    assert_eq!(quoted.status(), 201);
    assert!(replayed(&quoted));
    assert_eq!(s.stored("orders").await.len(), 1);
}

/// The same key with a different payload, type or key is 422, and nothing
/// new is stored.
#[tokio::test]
async fn the_same_key_with_a_different_body_is_422() {
    let s = server(ServerOptions::default()).await;
    let body = json!({"topic": "orders", "key": "a", "payload": {"n": 1}});
    assert_eq!(
        post(&s, Some("k"), None, &body.to_string()).await.status(),
        201
    );
    for other in [
        json!({"topic": "orders", "key": "a", "payload": {"n": 2}}),
        json!({"topic": "orders", "key": "b", "payload": {"n": 1}}),
        json!({"topic": "orders", "key": "a", "type": "x", "payload": {"n": 1}}),
        json!({"topic": "orders", "key": "a", "payload": {"n": 1}, "causation_id": "c"}),
    ] {
        let resp = post(&s, Some("k"), None, &other.to_string()).await;
        assert!(!replayed(&resp));
        problem(resp, 422).await;
    }
    assert_eq!(s.stored("orders").await.len(), 1);
}

/// While the first request's insert is held at a gate (still committing), a
/// repeat gets 409 with `Retry-After`; once it commits, the first gets 201 and
/// a later repeat the replayed 201. Deterministic: the gate, not timing,
/// decides the order.
#[tokio::test]
async fn a_repeat_while_the_first_is_committing_is_409() {
    let gate = Arc::new(Gate::default());
    let s = Arc::new(
        start(
            |w| w.gate = Some(gate.clone()),
            |b| b.topic(TopicSpec::new("orders")),
            ServerOptions::default(),
        )
        .await,
    );
    let body = json!({"topic": "orders", "payload": {"n": 1}}).to_string();
    let first = tokio::spawn({
        let (s, body) = (s.clone(), body.clone());
        async move {
            let resp = post(&s, Some("slow"), None, &body).await;
            let replayed = replayed(&resp);
            (
                resp.status().as_u16(),
                replayed,
                resp.json::<Value>().await.expect("json"),
            )
        }
    });
    tokio::time::timeout(Duration::from_secs(10), gate.entered.notified())
        .await
        .expect("the first insert reaches the gate");
    let busy = post(&s, Some("slow"), None, &body).await;
    assert_eq!(super::support::retry_after(&busy), 1);
    problem(busy, 409).await;
    gate.open();
    let (status, was_replayed, original) = first.await.expect("first request");
    assert_eq!((status, was_replayed), (201, false));
    let again = post(&s, Some("slow"), None, &body).await;
    assert_eq!(again.status(), 201);
    assert!(replayed(&again));
    assert_eq!(again.json::<Value>().await.expect("json"), original);
    assert_eq!(s.stored("orders").await.len(), 1);
}

/// No key, an unknown topic, a missing or null payload, unknown fields or a
/// body that is not JSON are 400 problems, and nothing is stored.
#[tokio::test]
async fn bad_requests_are_400() {
    let s = server(ServerOptions::default()).await;
    let ok = json!({"topic": "orders", "payload": 1}).to_string();
    problem(post(&s, None, None, &ok).await, 400).await;
    problem(post(&s, Some(""), None, &ok).await, 400).await;
    let long = "k".repeat(513);
    problem(post(&s, Some(&long), None, &ok).await, 400).await;
    for bad in [
        json!({"topic": "nope", "payload": 1}).to_string(),
        json!({"topic": "orders"}).to_string(),
        json!({"topic": "orders", "payload": null}).to_string(),
        json!({"topic": "orders", "payload": 1, "extra": true}).to_string(),
        json!({"payload": 1}).to_string(),
        "{not json".to_string(),
    ] {
        let p = problem(post(&s, Some("k"), None, &bad).await, 400).await;
        assert!(
            p["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{bad}: {p}"
        );
    }
    assert!(s.stored("orders").await.is_empty());
}

/// Keys are scoped per API token: two tokens using one key get two events
/// (neither is a replay), each token's repeat replays its own, and a request
/// without a token is 401.
#[tokio::test]
async fn keys_are_scoped_per_token() {
    let s = server(ServerOptions {
        api_tokens: vec!["token-a".into(), "token-b".into()],
        ..ServerOptions::default()
    })
    .await;
    let body = json!({"topic": "orders", "payload": {"n": 1}}).to_string();
    let mut ids = Vec::new();
    let mut sources = Vec::new();
    for token in ["token-a", "token-b"] {
        let resp = post(&s, Some("shared"), Some(token), &body).await;
        assert_eq!(resp.status(), 201);
        assert!(!replayed(&resp));
        let v: Value = resp.json().await.expect("json");
        ids.push(v["id"].clone());
        sources.push(v["source"].as_str().expect("source").to_owned());
    }
    assert_ne!(ids[0], ids[1]);
    assert_ne!(sources[0], sources[1]);
    assert!(
        sources
            .iter()
            .all(|s| s.starts_with("api:") && s.len() == 20),
        "{sources:?}"
    );
    for (i, token) in ["token-a", "token-b"].into_iter().enumerate() {
        let resp = post(&s, Some("shared"), Some(token), &body).await;
        assert!(replayed(&resp));
        let v: Value = resp.json().await.expect("json");
        assert_eq!(v["id"], ids[i]);
    }
    assert_eq!(post(&s, Some("shared"), None, &body).await.status(), 401);
    assert_eq!(s.stored("orders").await.len(), 2);
}
