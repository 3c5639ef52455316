use crate::support::{Db, start_with};
use mailroom::{Engine, TopicSpec};
use mailroom_server::{Dependency, ServerOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// `/readyz` lists each registered dependency (an AMQP connection) by name
/// with its state, and answers 503 with `Retry-After` while one is down,
/// 200 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_each_dependency_and_fails_while_one_is_down() {
    let up = Arc::new(AtomicBool::new(false));
    let probe = up.clone();
    let options = ServerOptions {
        dependencies: vec![
            Dependency {
                kind: "amqp",
                name: "amqp://rabbit:5672/%2f".into(),
                up: Arc::new(move || probe.load(Ordering::Relaxed)),
            },
            Dependency {
                kind: "amqp",
                name: "amqp://other:5672/%2f".into(),
                up: Arc::new(|| true),
            },
        ],
        ..ServerOptions::default()
    };
    let server = start_with(Db::fresh().await, "127.0.0.1:0", options, |store| {
        Engine::builder(store).topic(TopicSpec::new("t"))
    })
    .await;

    let resp = server
        .http
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(
        body,
        serde_json::json!({
            "ready": false,
            "store": {"up": true},
            "amqp": [
                {"connection": "amqp://rabbit:5672/%2f", "up": false},
                {"connection": "amqp://other:5672/%2f", "up": true},
            ],
        })
    );

    up.store(true, Ordering::Relaxed);
    let resp = server
        .http
        .get(server.url("/readyz"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(body["ready"], true);
    assert_eq!(body["amqp"][0]["up"], true);
    server.stop().await;
}
