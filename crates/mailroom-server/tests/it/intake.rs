//! `POST /webhooks/{source}`: deduplication, bounded and refused input,
//! undeclared sources.

use crate::support::{Db, expect_problem, start, start_with};
use mailroom::{Engine, Field, SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use serde_json::{Value, json};
use std::collections::HashSet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Fifty concurrent deliveries of one `webhook-id` store one event, and all
/// fifty senders get 200 with its id; exactly one is told `duplicate: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_store_one_event_and_all_get_its_id() {
    let server = start(|store| {
        Engine::builder(store)
            .topic(TopicSpec::new("orders"))
            .source(SourceSpec::new("shop", "orders"))
    })
    .await;
    let body = json!({"order": 7, "total": "12.50"}).to_string();
    let mut sends = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let http = server.http.clone();
        let url = server.url("/webhooks/shop");
        let body = body.clone();
        sends.spawn(async move {
            let resp = http
                .post(url)
                .header("webhook-id", "msg_dup_1")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("send");
            let status = resp.status().as_u16();
            let answer: Value = resp.json().await.expect("json answer");
            (status, answer)
        });
    }
    let answers: Vec<(u16, Value)> = sends.join_all().await;
    assert_eq!(answers.len(), 50);
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "every sender gets 200: {answers:?}"
    );
    let ids: HashSet<&str> = answers
        .iter()
        .map(|(_, a)| a["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids.len(), 1, "one id for all: {ids:?}");
    let originals = answers
        .iter()
        .filter(|(_, a)| a["duplicate"] == false)
        .count();
    assert_eq!(originals, 1, "exactly one answer is not a duplicate");
    assert!(answers.iter().all(|(_, a)| a["duplicate"].is_boolean()));

    let stored = server.events_of("orders").await;
    assert_eq!(stored.len(), 1, "one stored event: {stored:?}");
    assert_eq!(stored[0]["id"].as_str(), ids.iter().next().copied());
    assert_eq!(stored[0]["dedup_key"], "msg_dup_1");
    assert_eq!(stored[0]["payload"], json!({"order": 7, "total": "12.50"}));
    server.stop().await;
}

/// Oversized bodies (declared or chunked, per-source limit and the 1 MiB
/// default), unparseable JSON where a pointer is needed and unknown sources
/// on a non-loopback listener are refused with problem+json; the server goes
/// on serving and nothing stored changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_without_harm() {
    let server = start_with(
        Db::fresh().await,
        // What `mailroom serve --listen 0.0.0.0:...` does: undeclared sources off.
        "0.0.0.0:0",
        ServerOptions::default(),
        |store| {
            let mut small = SourceSpec::new("small", "inbox");
            small.max_body = 64;
            let mut by_id = SourceSpec::new("by-id", "inbox");
            by_id.id = vec![Field::Json("/id".into())];
            Engine::builder(store)
                .topic(TopicSpec::new("inbox"))
                .source(small)
                .source(by_id)
                .source(SourceSpec::new("plain", "inbox"))
                .accept_undeclared_sources(false)
        },
    )
    .await;

    let good = server
        .accept("plain", "good-1", &json!({"hello": "world"}))
        .await;
    let before = server.event(&good).await;
    let count_before = server.events_of("inbox").await.len();
    assert_eq!(count_before, 1);

    // Over the source's own limit, with a Content-Length.
    let resp = server.webhook("small", &[], vec![b'x'; 65]).await;
    let p = expect_problem(resp, 413).await;
    assert!(
        p["detail"].as_str().unwrap_or_default().contains("64"),
        "{p}"
    );
    // Exactly at the limit is fine (and is stored).
    let resp = server.webhook("small", &[], vec![b'y'; 64]).await;
    assert_eq!(resp.status(), 200);
    // Over the limit without a Content-Length (chunked): cut off while read.
    let mut chunked = b"POST /webhooks/small HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n".to_vec();
    chunked.extend_from_slice(b"28\r\n");
    chunked.extend_from_slice(&[b'z'; 40]);
    chunked.extend_from_slice(b"\r\n28\r\n");
    chunked.extend_from_slice(&[b'z'; 40]);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let (status, text) = raw_exchange(&server.base, &chunked).await;
    assert_eq!(status, 413, "chunked oversize body: {text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("application/problem+json"),
        "{text}"
    );
    // Over the 1 MiB default, refused on the declared length alone. (Sent as
    // headers only: a client still writing a body the server will not read
    // may see its connection reset before it reads the answer.)
    let declared = format!(
        "POST /webhooks/plain HTTP/1.1\r\nhost: localhost\r\nwebhook-id: huge\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        1024 * 1024 + 1
    );
    let (status, text) = raw_exchange(&server.base, declared.as_bytes()).await;
    assert_eq!(status, 413, "declared oversize body: {text}");
    assert!(text.contains("1048576"), "names the default limit: {text}");

    // The dedup key is read from /id, so the body must be JSON.
    let resp = server
        .webhook(
            "by-id",
            &[("content-type", "application/json")],
            "{\"id\": oops",
        )
        .await;
    let p = expect_problem(resp, 400).await;
    assert!(
        p["detail"].as_str().unwrap_or_default().contains("JSON"),
        "{p}"
    );
    // JSON without the id.
    let resp = server
        .webhook("by-id", &[], json!({"other": 1}).to_string())
        .await;
    expect_problem(resp, 400).await;
    // Unknown source on a non-loopback listener.
    let resp = server
        .webhook("nobody", &[("webhook-id", "n1")], "{}")
        .await;
    let p = expect_problem(resp, 404).await;
    assert!(
        p["detail"].as_str().unwrap_or_default().contains("nobody"),
        "{p}"
    );

    // Still serving, on both kinds of source.
    server
        .accept("plain", "good-2", &json!({"after": "the storm"}))
        .await;
    let resp = server
        .webhook("by-id", &[], json!({"id": "pay_9"}).to_string())
        .await;
    assert_eq!(resp.status(), 200);

    // Nothing refused was stored, and what was stored is intact.
    let stored = server.events_of("inbox").await;
    assert_eq!(
        stored.len(),
        count_before + 3,
        "only the 64-byte body, good-2 and pay_9 were added: {stored:?}"
    );
    assert_eq!(
        server.event(&good).await,
        before,
        "the first event is untouched"
    );
    server.stop().await;
}

/// Writes `request` on a fresh connection and reads the answer to the end;
/// returns its status and its whole text.
async fn raw_exchange(base: &str, request: &[u8]) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(request).await.expect("write request");
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.expect("read answer");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
    (status, text)
}

/// On a loopback engine an undeclared source is accepted (quick start) and
/// its events land in a topic named after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_source_on_loopback_goes_to_its_own_topic() {
    let server = start(|store| Engine::builder(store).accept_undeclared_sources(true)).await;
    let id = server
        .accept("github-test", "gh-1", &json!({"action": "opened"}))
        .await;
    let event = server.event(&id).await;
    assert_eq!(event["source"], "github-test");
    assert_eq!(event["topic"], "github-test");
    assert_eq!(event["dedup_key"], "gh-1");
    assert_eq!(event["status"], "pending", "a pull topic: nothing runs it");
    assert_eq!(event["payload"], json!({"action": "opened"}));
    let listed = server.events_of("github-test").await;
    assert_eq!(listed.len(), 1);
    server.stop().await;
}

/// Even where undeclared sources are taken, one named after a known topic
/// (declared, or the topic of a declared source) answers 404 and stores
/// nothing: unsigned events never reach a configured topic's handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_sources_never_feed_a_known_topic() {
    let server = start(|store| {
        Engine::builder(store)
            .topic(TopicSpec::new("reports"))
            .source(SourceSpec::new("stripe", "payments"))
            .accept_undeclared_sources(true)
    })
    .await;
    for name in ["reports", "payments"] {
        let resp = server
            .webhook(name, &[("webhook-id", "forged-1")], b"{}".to_vec())
            .await;
        let p = expect_problem(resp, 404).await;
        assert!(
            p["detail"].as_str().unwrap_or_default().contains(name),
            "{p}"
        );
        assert!(
            server.events_of(name).await.is_empty(),
            "{name}: nothing stored"
        );
    }
    // A name no topic has is still the quick start's open door.
    server.accept("scratch", "ok-1", &json!({})).await;
    server.stop().await;
}

/// A sender uploading a body over `max_body` receives the 413 answer, not a
/// broken connection, whether the size is declared up front or only found
/// while reading (chunked); its connection can then be reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_uploads_receive_their_413() {
    let server = crate::support::start(|store| {
        mailroom::Engine::builder(store).accept_undeclared_sources(true)
    })
    .await;
    let big = vec![b'x'; 6 * 1024 * 1024];
    for i in 0..12 {
        let req = server
            .http
            .post(server.url("/webhooks/big"))
            .header("webhook-id", format!("big-{i}"));
        let req = if i % 2 == 0 {
            req.body(big.clone())
        } else {
            // No Content-Length: the limit is found while reading.
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                big.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
            req.body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        };
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("upload {i} got a connection error instead of 413: {e}"));
        assert_eq!(resp.status(), 413, "upload {i}");
    }
    let ok = server
        .http
        .post(server.url("/webhooks/big"))
        .header("webhook-id", "small")
        .body("{}")
        .send()
        .await
        .expect("small");
    assert_eq!(ok.status(), 200);
    server.stop().await;
}

/// A source with `deliver_at = { header = "x-deliver-at" }`: a webhook
/// carrying an RFC 3339 time there is stored at once and due then; one
/// without it is due now; an unusable time is a 400 and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_reads_deliver_at_from_a_header() {
    let server = start(|store| {
        let mut later = SourceSpec::new("later", "later");
        later.deliver_at = Some(Field::Header("x-deliver-at".into()));
        Engine::builder(store)
            .topic(TopicSpec::new("later"))
            .source(later)
    })
    .await;
    let at = "2099-01-02T03:04:05Z";
    let server = &server;
    let send = |id: &'static str, deliver_at: Option<&'static str>| async move {
        let mut headers = vec![("webhook-id", id), ("content-type", "application/json")];
        if let Some(at) = deliver_at {
            headers.push(("x-deliver-at", at));
        }
        server.webhook("later", &headers, "{}").await
    };
    let resp = send("w-later", Some(at)).await;
    assert_eq!(resp.status(), 200);
    let id = resp.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    let e = server.event(&id).await;
    assert_eq!(e["status"], "pending");
    assert_eq!(e["next_attempt_at"], at, "{e}");
    let now = send("w-now", None).await;
    assert_eq!(now.status(), 200);
    let bad = send("w-bad", Some("next tuesday")).await;
    assert_eq!(bad.status(), 400);
    let list = server.get_json("/v1/events?topic=later").await;
    assert_eq!(
        list["events"].as_array().expect("events").len(),
        2,
        "{list}"
    );
}
