//! The hostile clients, each a loop until `until` that tallies how every
//! request it sent was answered: a status code, `closed` (the server ended
//! the connection without an answer), or a client-side error.

use hmac::{Hmac, Mac};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The source's shared secret (GitHub scheme: `x-hub-signature-256`).
pub const SECRET: &str = "hostile-secret";

/// `sha256=<hex HMAC-SHA256 of body>`.
pub fn github_signature(secret: &str, body: &[u8]) -> anyhow::Result<String> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())?;
    mac.update(body);
    Ok(format!(
        "sha256={}",
        hex::encode(mac.finalize().into_bytes())
    ))
}

/// (class, outcome) -> count.
#[derive(Debug, Clone, Default)]
pub struct Tally(Arc<Mutex<BTreeMap<(&'static str, String), u64>>>);

impl Tally {
    pub fn add(&self, class: &'static str, outcome: impl Into<String>) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *t.entry((class, outcome.into())).or_default() += 1;
    }

    pub fn snapshot(&self) -> BTreeMap<(&'static str, String), u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What one raw exchange ended with.
fn outcome_of(answer: &[u8]) -> String {
    // "HTTP/1.1 408 ..." -> "408"
    match answer.get(9..12).and_then(|s| std::str::from_utf8(s).ok()) {
        Some(code) if answer.starts_with(b"HTTP/1.") => code.to_owned(),
        _ => "closed".to_owned(),
    }
}

/// Reads until the server closes or `limit` passes; `None` if still open.
async fn read_to_close(rd: &mut (impl AsyncReadExt + Unpin), limit: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| got)
}

/// One slow client: writes `head`, then one byte of `trickle` per second,
/// until the server answers or closes; again until `until`. A connection
/// still open `grace` after it started is tallied `open too long`.
pub async fn slowloris(
    addr: SocketAddr,
    class: &'static str,
    head: Vec<u8>,
    tally: Tally,
    grace: Duration,
    until: Instant,
) {
    let trickle =
        b"x-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".repeat(8);
    while Instant::now() < until {
        let Ok(stream) = TcpStream::connect(addr).await else {
            tally.add(class, "client: connect failed");
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let started = Instant::now();
        let (mut rd, mut wr) = stream.into_split();
        let writer = {
            let (head, trickle) = (head.clone(), trickle.clone());
            tokio::spawn(async move {
                if wr.write_all(&head).await.is_err() {
                    return;
                }
                for b in trickle {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    if wr.write_all(&[b]).await.is_err() {
                        return;
                    }
                }
            })
        };
        let ended = read_to_close(&mut rd, grace).await;
        writer.abort();
        match ended {
            Some(answer) => tally.add(class, outcome_of(&answer)),
            // Cut short by the end of the run: no verdict either way.
            None if Instant::now() >= until => {}
            None => tally.add(class, format!("open over {:?}", started.elapsed())),
        }
    }
}

/// Sends `request` on a fresh connection (`connection: close`), reads the
/// answer; write errors are ignored (the server may answer and close early).
pub async fn raw_once(addr: SocketAddr, request: &[u8]) -> String {
    let Ok(stream) = TcpStream::connect(addr).await else {
        return "client: connect failed".into();
    };
    let (mut rd, mut wr) = stream.into_split();
    let request = request.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        // Keep the write half open: the server ends the exchange.
        tokio::time::sleep(Duration::from_secs(10)).await;
    });
    let answer = read_to_close(&mut rd, Duration::from_secs(10)).await;
    writer.abort();
    match answer {
        Some(a) => outcome_of(&a),
        None => "client: no answer in 10 s".into(),
    }
}

/// Raw requests, one after the other, until `until`: each of `requests`
/// in turn, tallied under its class.
pub async fn raw_loop(
    addr: SocketAddr,
    requests: Vec<(&'static str, Vec<u8>)>,
    tally: Tally,
    pause: Duration,
    until: Instant,
) {
    for (class, request) in requests.iter().cycle() {
        if Instant::now() >= until {
            return;
        }
        tally.add(class, raw_once(addr, request).await);
        tokio::time::sleep(pause).await;
    }
}

/// HTTP requests through a pooled client, paced to `per_sec` overall across
/// `workers` loops (each one behind schedule sends at once, never more
/// than its share in a burst).
pub struct Flood {
    pub class: &'static str,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub bodies: Vec<bytes::Bytes>,
    pub per_sec: f64,
    pub workers: usize,
}

impl Flood {
    pub async fn run(self, http: reqwest::Client, tally: Tally, until: Instant) {
        let this = Arc::new(self);
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..this.workers {
            let (this, http, tally) = (this.clone(), http.clone(), tally.clone());
            tasks.spawn(async move { this.worker(w, &http, &tally, until).await });
        }
        while tasks.join_next().await.is_some() {}
    }

    async fn worker(&self, w: usize, http: &reqwest::Client, tally: &Tally, until: Instant) {
        let every = Duration::from_secs_f64(self.workers as f64 / self.per_sec.max(0.001));
        let start = Instant::now();
        for i in 0u32.. {
            let due = start + every * i;
            // A generator behind schedule (starved of CPU) drops its
            // backlog at the end instead of sending it after `until`.
            if due >= until || Instant::now() >= until {
                return;
            }
            tokio::time::sleep_until(due.into()).await;
            let body = self.bodies[(w + i as usize) % self.bodies.len()].clone();
            let mut req = http.post(&self.url).body(body);
            for (k, v) in &self.headers {
                req = req.header(k, v);
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let _ = resp.bytes().await;
                    tally.add(self.class, status.to_string());
                }
                Err(e) if e.is_connect() => tally.add(self.class, "client: connect failed"),
                Err(_) => tally.add(self.class, "closed"),
            }
        }
    }
}

/// A JSON request whose right answer is a 400 problem naming `field`.
pub struct Probe {
    pub class: &'static str,
    pub url: String,
    pub body: serde_json::Value,
    pub field: &'static str,
}

/// Sends each of `probes` in turn until `until`, tallying `400` only when
/// the problem's `detail` names its field (else `400 without <field>`, the
/// status, or `closed` when the server ended the exchange without an
/// answer, as a panicking request does).
pub async fn probe_loop(
    http: reqwest::Client,
    probes: Vec<Probe>,
    tally: Tally,
    pause: Duration,
    until: Instant,
) {
    for p in probes.iter().cycle() {
        if Instant::now() >= until {
            return;
        }
        // `POST /v1/events` needs one; the pull routes ignore it.
        let req = http
            .post(&p.url)
            .header("idempotency-key", "hostile-probe")
            .header("content-type", "application/json")
            .body(p.body.to_string());
        let outcome = match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let body = resp.bytes().await.unwrap_or_default();
                let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let detail = body["detail"].as_str().unwrap_or_default();
                match status {
                    400 if detail.starts_with(p.field) => "400".to_owned(),
                    400 => format!("400 without {}", p.field),
                    other => other.to_string(),
                }
            }
            Err(e) if e.is_connect() => "client: connect failed".to_owned(),
            Err(_) => "closed".to_owned(),
        };
        tally.add(p.class, outcome);
        tokio::time::sleep(pause).await;
    }
}
