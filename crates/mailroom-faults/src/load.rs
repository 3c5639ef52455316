//! Load generators that record every acknowledgement.
//!
//! A client owns its ordering keys and sends a key's events one after the
//! other, each retried (same dedup key, same body) until it is answered
//! 200: so a key's counter is its arrival order, and an event the server
//! lost in flight is sent again rather than forgotten.

use super::record::{Ack, Recorder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::task::JoinSet;

/// Where the load goes: the instances' base URLs (replaced on restart).
pub type Targets = Arc<RwLock<Vec<String>>>;

pub fn targets(bases: Vec<String>) -> Targets {
    Arc::new(RwLock::new(bases))
}

/// Which events misbehave in the handler: `(client, i) -> "500" | "reset" | "hang"`.
pub type Poison = fn(usize, u64) -> Option<&'static str>;

/// One load: `clients` senders posting to `/webhooks/{source}`.
#[derive(Clone)]
pub struct Load {
    pub source: &'static str,
    pub clients: usize,
    pub keys_per_client: usize,
    /// Events per client; unbounded (until stopped) when `None`.
    pub per_client: Option<u64>,
    pub poison: Option<Poison>,
    /// Bytes of padding in each body.
    pub pad: usize,
    /// A client's pause after each acked event (bounds the intake rate).
    pub pause: Duration,
}

/// A running load; `stop` ends it after the requests in flight.
pub struct Running {
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl Running {
    pub async fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        while self.tasks.join_next().await.is_some() {}
    }

    /// Waits for bounded clients to send all their events, or fails after
    /// `limit` (a client retries each event until it is acked: a server
    /// that never acks again would hold it forever).
    pub async fn finish(mut self, limit: Duration) -> anyhow::Result<()> {
        let all = async { while self.tasks.join_next().await.is_some() {} };
        tokio::time::timeout(limit, all).await.map_err(|_| {
            anyhow::anyhow!(
                "the load did not get all its events acked within {} s",
                limit.as_secs()
            )
        })
    }
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .build()
        .unwrap_or_default()
}

impl Load {
    pub fn start(&self, targets: &Targets, rec: &Recorder) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        let http = http();
        for c in 0..self.clients {
            let (load, targets, rec, stop, http) = (
                self.clone(),
                targets.clone(),
                rec.clone(),
                stop.clone(),
                http.clone(),
            );
            tasks.spawn(async move { load.client(c, &targets, &rec, &stop, &http).await });
        }
        Running { stop, tasks }
    }

    async fn client(
        &self,
        c: usize,
        targets: &Targets,
        rec: &Recorder,
        stop: &AtomicBool,
        http: &reqwest::Client,
    ) {
        let mut counters = vec![0u64; self.keys_per_client.max(1)];
        let pad = "x".repeat(self.pad);
        for i in 0..self.per_client.unwrap_or(u64::MAX) {
            let j = (i as usize) % counters.len();
            let seq = counters[j];
            counters[j] += 1;
            let key = format!("c{c}-k{j}");
            let dedup_key = format!("{}-c{c}-{i}", self.source);
            let fail = self.poison.and_then(|p| p(c, i));
            let body =
                serde_json::json!({"id": dedup_key, "k": key, "n": seq, "fail": fail, "pad": pad});
            let body = bytes::Bytes::from(body.to_string());
            let target = Target {
                source: self.source,
                targets,
                rec,
                stop,
                http,
            };
            let Some(ack) = target.deliver(&dedup_key, &body).await else {
                return;
            };
            rec.lock().acks.push(Ack {
                key: Some(key),
                seq,
                ..ack
            });
            if !self.pause.is_zero() {
                tokio::time::sleep(self.pause).await;
            }
        }
    }
}

/// One delivery's context.
pub struct Target<'a> {
    pub source: &'a str,
    pub targets: &'a Targets,
    pub rec: &'a Recorder,
    pub stop: &'a AtomicBool,
    pub http: &'a reqwest::Client,
}

impl Target<'_> {
    /// Posts `body` until it is answered 200 (round-robin over the
    /// targets); `None` once stopped first. Non-200 answers are recorded.
    pub async fn deliver(&self, dedup_key: &str, body: &bytes::Bytes) -> Option<Ack> {
        for round in 0usize.. {
            if self.stop.load(Ordering::SeqCst) {
                return None;
            }
            let base = {
                let t = self.targets.read().unwrap_or_else(|e| e.into_inner());
                t[(round + dedup_key.len()) % t.len().max(1)].clone()
            };
            self.rec.lock().sent += 1;
            let sent_at = self.rec.now();
            let answer = self
                .http
                .post(format!("{base}/webhooks/{}", self.source))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            let Ok(answer) = answer else {
                let at = self.rec.now();
                self.rec.lock().answers.push((sent_at, at, 0));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let status = answer.status().as_u16();
            let bytes = answer.bytes().await.unwrap_or_default();
            let at = self.rec.now();
            self.rec.lock().answers.push((sent_at, at, status));
            if status == 200 {
                if let Some(ack) = parse_ack(dedup_key, &bytes, sent_at, self.rec) {
                    return Some(ack);
                }
            }
            let at = self.rec.now();
            self.rec.lock().refusals.push((status, at));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

/// POSTs a JSON body (or GETs when `body` is `None`); the answer's status
/// and JSON (`null` when not JSON).
pub async fn json_call(
    client: &reqwest::Client,
    url: &str,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<(u16, serde_json::Value)> {
    let req = match body {
        Some(b) => client
            .post(url)
            .header("content-type", "application/json")
            .body(b.to_string()),
        None => client.get(url),
    };
    let answer = req.send().await?;
    let status = answer.status().as_u16();
    let bytes = answer.bytes().await?;
    Ok((status, serde_json::from_slice(&bytes).unwrap_or_default()))
}

/// `{"id": "...", "duplicate": bool}`.
fn parse_ack(dedup_key: &str, bytes: &[u8], sent_at: Duration, rec: &Recorder) -> Option<Ack> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Some(Ack {
        dedup_key: dedup_key.to_owned(),
        event_id: v.get("id")?.as_str()?.to_owned(),
        duplicate: v.get("duplicate")?.as_bool()?,
        key: None,
        seq: 0,
        sent_at,
        at: rec.now(),
    })
}
