//! The floor of an HTTP delivery: the same client mailroom's http handler
//! uses (reqwest, keep-alive pool, the same timeout, user agent and
//! redirect policy), `concurrency` loops each POSTing the next event's
//! body with what a delivery must send (the Standard Webhooks id,
//! timestamp and signature, the content type, the `mailroom-*` envelope
//! headers), reading the answer and judging its status. No store, no
//! engine: what any deliverer on this client and machine pays at least.

use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// One event to deliver: its id and body.
pub struct Item {
    pub id: String,
    pub body: Bytes,
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{ts}.{body}">`.
fn sign(key: &[u8], id: &str, ts: i64, body: &[u8]) -> anyhow::Result<String> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key)?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// Delivers every item once with `concurrency` loops; returns the number
/// answered 2xx (the others are counted as failures by the caller).
pub async fn deliver(
    url: &str,
    key: &[u8],
    topic: &str,
    items: Arc<Vec<Item>>,
    concurrency: usize,
) -> anyhow::Result<u64> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .connect_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(1024)
        .user_agent(concat!("mailroom/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let url = reqwest::Url::parse(url)?;
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let key: Arc<[u8]> = key.into();
    let topic: Arc<str> = topic.into();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, url, next, ok) = (client.clone(), url.clone(), next.clone(), ok.clone());
        let (items, key, topic) = (items.clone(), key.clone(), topic.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else {
                    return anyhow::Ok(());
                };
                let ts = jiff::Timestamp::now().as_second();
                let resp = client
                    .post(url.clone())
                    .header("webhook-id", item.id.as_str())
                    .header("webhook-timestamp", ts.to_string())
                    .header("webhook-signature", sign(&key, &item.id, ts, &item.body)?)
                    .header("content-type", "application/json")
                    .header("mailroom-topic", &*topic)
                    .header("mailroom-attempt", "1")
                    .header("mailroom-source", "api")
                    .header("mailroom-dedup-key", item.id.as_str())
                    .body(item.body.clone())
                    .send()
                    .await;
                if let Ok(resp) = resp {
                    let success = resp.status().is_success();
                    let _ = resp.bytes().await;
                    if success {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(ok.load(Ordering::Relaxed))
}
