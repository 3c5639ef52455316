//! Undeclared webhook sources, as `mailroom serve` takes them: only the
//! quick start (no config file) on loopback; a configured mailroom answers
//! 404 on every address, loopback and behind a same-host proxy included.

use crate::support;

use crate::support::Serve;

const TOKEN: &str = "an-operator-token-of-some-length-0123456789";

/// A configured mailroom on loopback: a token, a signed source and a topic
/// `reports` with a handler.
fn configured(dir: &std::path::Path) -> Serve {
    let config = support::write_config(
        dir,
        &format!(
            r#"api_token = "{TOKEN}"

[[source]]
name = "billing"
topic = "payments"
verify = {{ scheme = "token", header = "x-token", secret = "a-shared-secret" }}

[[topic]]
name = "reports"
handler = {{ command = ["true"] }}
"#
        ),
    );
    let url = format!("sqlite://{}", dir.join("m.db").display());
    support::serve(&config, &url)
}

/// Events stored in `topic`, read through the API with the token.
async fn stored_in(http: &reqwest::Client, serve: &Serve, topic: &str) -> usize {
    let answer: serde_json::Value = http
        .get(format!("{}/v1/events?topic={topic}", serve.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    answer["events"].as_array().map_or(0, Vec::len)
}

/// With a config file on a loopback listener, an unsigned POST to a source
/// the file does not declare answers 404, whether it names a configured
/// topic (`reports`, a declared source's `payments`) or any other name, sent
/// directly or with the headers a same-host reverse proxy adds; nothing is
/// stored. The declared source still takes its signed events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_mailroom_answers_404_to_undeclared_sources_on_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let serve = configured(dir.path());
    let http = reqwest::Client::new();
    let proxied = [
        ("x-forwarded-for", "203.0.113.7"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "hooks.example.com"),
        ("forwarded", "for=203.0.113.7;proto=https"),
    ];
    for source in ["reports", "payments", "anything-else"] {
        for via_proxy in [false, true] {
            let mut req = http
                .post(format!("{}/webhooks/{source}", serve.base))
                .header("webhook-id", format!("forged-{source}-{via_proxy}"))
                .header("content-type", "application/json")
                .body(r#"{"forged": true}"#);
            if via_proxy {
                for (k, v) in proxied {
                    req = req.header(k, v);
                }
            }
            let resp = req.send().await.expect("post");
            assert_eq!(
                resp.status(),
                404,
                "{source} (proxy headers: {via_proxy}) must be refused"
            );
        }
    }
    for topic in ["reports", "payments", "anything-else"] {
        assert_eq!(stored_in(&http, &serve, topic).await, 0, "{topic}");
    }
    let signed = http
        .post(format!("{}/webhooks/billing", serve.base))
        .header("x-token", "a-shared-secret")
        .header("webhook-id", "real-1")
        .body("{}")
        .send()
        .await
        .expect("post");
    assert_eq!(signed.status(), 200);
    assert_eq!(stored_in(&http, &serve, "payments").await, 1);
}

/// The quick start (no config file, loopback) keeps its open door: any
/// `POST /webhooks/<name>` is stored into topic `<name>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_start_accepts_undeclared_sources() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let serve = support::serve_quick(dir.path(), &url);
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/webhooks/github-test", serve.base))
        .header("webhook-id", "gh-1")
        .body(r#"{"action": "opened"}"#)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status(), 200);
    let answer: serde_json::Value = http
        .get(format!("{}/v1/events?topic=github-test", serve.base))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(
        answer["events"].as_array().map_or(0, Vec::len),
        1,
        "{answer}"
    );
}
