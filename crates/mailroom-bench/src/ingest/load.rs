//! The load generators: keep-alive HTTP connections (or in-process callers
//! of `ingest_webhook`) sending unique webhooks back to back, and what each saw.

use super::SOURCE;
use crate::stats::Latencies;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use mailroom::Engine;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// What one load task saw.
#[derive(Debug, Default)]
pub(super) struct TaskStats {
    pub(super) lat: Latencies,
    pub(super) acked_total: u64,
    pub(super) acked: u64,
    pub(super) duplicates: u64,
    pub(super) errors: BTreeMap<String, u64>,
}

impl TaskStats {
    pub(super) fn merge(&mut self, o: TaskStats) {
        self.lat.extend(o.lat);
        self.acked_total += o.acked_total;
        self.acked += o.acked;
        self.duplicates += o.duplicates;
        for (k, v) in o.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }

    pub(super) fn error(&mut self, what: impl Into<String>) {
        *self.errors.entry(what.into()).or_default() += 1;
    }

    /// An answer to a request sent at `started` and answered at `ended`: an
    /// ack counts in the window (with its latency) only if the request lay
    /// wholly inside it.
    pub(super) fn answer(
        &mut self,
        duplicate: bool,
        (started, ended): (Instant, Instant),
        window: Window,
    ) {
        if duplicate {
            self.duplicates += 1;
            return;
        }
        self.acked_total += 1;
        if window.contains(started, ended) {
            self.acked += 1;
            self.lat.record(ended - started);
        }
    }
}

/// The clock of a run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    pub(super) from: Instant,
    pub(super) to: Instant,
}

impl Window {
    pub(super) fn new(warmup: Duration, duration: Duration) -> Self {
        let from = Instant::now() + warmup;
        Self {
            from,
            to: from + duration,
        }
    }

    pub(super) fn contains(&self, start: Instant, end: Instant) -> bool {
        start >= self.from && end <= self.to
    }
}

#[derive(Deserialize)]
pub(super) struct Ack {
    duplicate: bool,
}

pub(super) type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

pub(super) async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Ends when the sender is dropped or the server closes.
        let _ = conn.await;
    });
    Ok(sender)
}

/// One keep-alive connection sending requests back to back.
pub(super) async fn http_task(
    addr: SocketAddr,
    tag: String,
    payload: Bytes,
    window: Window,
) -> TaskStats {
    let mut st = TaskStats::default();
    let host = addr.to_string();
    let uri = format!("/webhooks/{SOURCE}");
    let mut sender: Option<Sender> = None;
    let mut n: u64 = 0;
    while Instant::now() < window.to {
        let s = match &mut sender {
            Some(s) => s,
            None => match connect(addr).await {
                Ok(s) => sender.insert(s),
                Err(e) => {
                    st.error(format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        n += 1;
        let req = http::Request::post(&uri)
            .header(http::header::HOST, &host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", format!("{tag}-{n}"))
            .body(Full::new(payload.clone()));
        let req = match req {
            Ok(r) => r,
            Err(e) => {
                st.error(format!("request: {e}"));
                break;
            }
        };
        let started = Instant::now();
        let answer = send(s, req).await;
        let span = (started, Instant::now());
        match answer {
            Ok((http::StatusCode::OK, body)) => match serde_json::from_slice::<Ack>(&body) {
                Ok(Ack { duplicate }) => st.answer(duplicate, span, window),
                Err(_) => st.error("200 with an unexpected body"),
            },
            Ok((status, _)) => st.error(format!("HTTP {}", status.as_u16())),
            Err(e) => {
                st.error(format!("transport: {e}"));
                sender = None;
            }
        }
    }
    st
}

/// One request on a ready connection: the answer's status and whole body.
pub(super) async fn send(
    s: &mut Sender,
    req: http::Request<Full<Bytes>>,
) -> anyhow::Result<(http::StatusCode, Bytes)> {
    s.ready().await?;
    let resp = s.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// One in-process caller of `ingest_webhook`, calls back to back.
pub(super) async fn direct_task(
    engine: Engine,
    tag: String,
    payload: Bytes,
    window: Window,
) -> TaskStats {
    let mut st = TaskStats::default();
    let mut n = 0u64;
    while Instant::now() < window.to {
        n += 1;
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        match http::HeaderValue::try_from(format!("{tag}-{n}")) {
            Ok(v) => {
                headers.insert("webhook-id", v);
            }
            Err(e) => {
                st.error(format!("header: {e}"));
                break;
            }
        }
        let started = Instant::now();
        let answer = engine
            .hooks()
            .ingest_webhook(SOURCE, &headers, payload.clone())
            .await;
        match answer {
            Ok(i) => st.answer(i.duplicate, (started, Instant::now()), window),
            Err(e) => st.error(e.to_string()),
        }
    }
    st
}
