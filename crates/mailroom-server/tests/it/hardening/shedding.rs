//! Load shedding: beyond the concurrency cap requests get 503 at once, a
//! source over its rate limit gets 429, a full write queue gets 503; every
//! request answered 200 is stored.

use super::support::{problem, retry_after, start};
use mailroom::spec::RateLimit;
use mailroom::{SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use mailroom_server::shedding::Limits;
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// 64 concurrent webhooks against a cap of 4 requests in flight, over a store
/// that takes 200 ms per insert: some are shed with 503 + `Retry-After`
/// (problem+json), the rest are 200, every 200 is stored, and no more than 4
/// inserts ever ran at once (work in flight stays bounded).
#[tokio::test]
async fn a_flood_beyond_the_concurrency_cap_is_shed_with_503() {
    let s = Arc::new(
        start(
            |w| w.delay = Duration::from_millis(200),
            |b| {
                b.topic(TopicSpec::new("flood"))
                    .source(SourceSpec::new("flood", "flood"))
            },
            ServerOptions {
                limits: Limits {
                    max_concurrent_requests: 4,
                    ..Limits::default()
                },
                ..ServerOptions::default()
            },
        )
        .await,
    );
    let mut tasks = Vec::new();
    for i in 0..64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("flood-{i}");
            s.webhook("flood", &[("webhook-id", &id)], "{}").await
        }));
    }
    let (mut accepted, mut shed) = (Vec::new(), 0);
    for t in tasks {
        let resp = t.await.expect("task");
        match resp.status().as_u16() {
            200 => {
                let v: Value = resp.json().await.expect("json");
                accepted.push(v["id"].as_str().expect("id").parse().expect("event id"));
            }
            503 => {
                assert!(retry_after(&resp) >= 1);
                problem(resp, 503).await;
                shed += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(shed > 0, "nothing was shed");
    assert!(!accepted.is_empty(), "nothing was accepted");
    for id in &accepted {
        assert!(
            s.engine.operator().get(*id).await.expect("get").is_some(),
            "{id} answered 200 but not stored"
        );
    }
    assert_eq!(s.stored("flood").await.len(), accepted.len());
    assert!(s.store.max_running.load(Ordering::SeqCst) <= 4);
    // Once the flood has passed, requests are served again.
    let after = s.webhook("flood", &[("webhook-id", "after")], "{}").await;
    assert_eq!(after.status(), 200);
}

/// A source with `rate_limit = "5/m"` accepts a burst of 5, then answers 429
/// problem+json with `Retry-After` (about the 12 s a token takes), and other
/// sources are unaffected. The limit parses from config syntax.
#[tokio::test]
async fn a_source_over_its_rate_limit_gets_429() {
    let mut limited = SourceSpec::new("limited", "t");
    limited.rate_limit = Some("5/m".parse::<RateLimit>().expect("rate"));
    let s = start(
        |_| {},
        |b| {
            b.topic(TopicSpec::new("t"))
                .source(limited)
                .source(SourceSpec::new("free", "t"))
        },
        ServerOptions::default(),
    )
    .await;
    let mut statuses = Vec::new();
    for i in 0..8 {
        let resp = s
            .webhook("limited", &[("webhook-id", &format!("r{i}"))], "{}")
            .await;
        statuses.push(resp.status().as_u16());
        if resp.status() == 429 {
            let wait = retry_after(&resp);
            assert!((1..=12).contains(&wait), "Retry-After {wait}");
            problem(resp, 429).await;
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    for i in 0..8 {
        let resp = s
            .webhook("free", &[("webhook-id", &format!("f{i}"))], "{}")
            .await;
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(s.stored("t").await.len(), 5 + 8);
    s.stop().await;
}

/// When the store's group-commit queue is full (`StoreError::Overloaded`),
/// webhooks and `POST /v1/events` get 503 with `Retry-After`, nothing is
/// stored, and the same requests succeed once the queue drains.
#[tokio::test]
async fn a_full_write_queue_is_503_with_retry_after() {
    let s = start(
        |w| w.overloaded.store(true, Ordering::SeqCst),
        |b| {
            b.topic(TopicSpec::new("t"))
                .source(SourceSpec::new("src", "t"))
        },
        ServerOptions::default(),
    )
    .await;
    let api = || {
        s.http
            .post(s.url("/v1/events"))
            .header("idempotency-key", "k1")
            .body(r#"{"topic":"t","payload":{}}"#)
            .send()
    };
    let resp = s.webhook("src", &[("webhook-id", "w1")], "{}").await;
    assert_eq!(retry_after(&resp), 1);
    problem(resp, 503).await;
    let resp = api().await.expect("request");
    assert_eq!(retry_after(&resp), 1);
    problem(resp, 503).await;
    assert!(s.stored("t").await.is_empty());

    s.store.overloaded.store(false, Ordering::SeqCst);
    assert_eq!(
        s.webhook("src", &[("webhook-id", "w1")], "{}")
            .await
            .status(),
        200
    );
    let resp = api().await.expect("request");
    assert_eq!(resp.status(), 201, "the key is free again after a 503");
    assert_eq!(s.stored("t").await.len(), 2);
}
