//! Load shedding, so a server facing the internet keeps answering and never
//! grows without bound (bodies, buffers and concurrency are bounded, and bad
//! input gets a clear error):
//!
//! - per connection (in [`serve_with`](crate::serve_with)): a header read
//!   timeout, a cap on header count and size, a cap on open connections,
//!   and on HTTPS a TLS handshake deadline;
//! - per request: a whole-body read deadline (`read_body`, 408) and a cap on
//!   requests in flight, beyond which requests are refused at once with 503
//!   and `Retry-After` instead of queueing;
//! - per source: an optional token bucket (`rate_limit = "1000/s"`, 429);
//! - per store: the bounded group-commit queue (`StoreError::Overloaded`, 503).

use crate::problem::Problem;
use crate::rejections::{Class, RejectionLog};
use axum::body::Body;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::BodyExt as _;
use mailroom::spec::RateLimit;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Server limits. Every field has a documented default ([`Limits::default`]).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests handled at once; more are refused with 503 + `Retry-After`
    /// (never queued). Default 1024.
    pub max_concurrent_requests: usize,
    /// Open connections; beyond it new ones wait in the kernel's accept
    /// backlog. Default 4096.
    pub max_connections: usize,
    /// Time a client has to send the request line and headers; then the
    /// connection is closed. Default 10 s.
    pub header_read_timeout: Duration,
    /// On HTTPS, time a client has to finish the TLS handshake (a socket
    /// opened and left silent holds a connection slot until then); then
    /// the connection is closed. Default 10 s.
    pub tls_handshake_timeout: Duration,
    /// Time a client has to send the whole body once its headers arrived;
    /// then 408. Default 10 s.
    pub body_read_timeout: Duration,
    /// Headers per request; more get 431. Default 100.
    pub max_headers: usize,
    /// Bytes of request line plus headers; more get 431. Default 16 KiB.
    pub max_header_bytes: usize,
    /// Largest `POST /v1/events` body (webhooks use each source's `max_body`).
    /// Default 1 MiB.
    pub api_max_body: u64,
    /// Time the requests in progress at shutdown have to finish; then
    /// their connections are closed (a request cut off got no answer, so
    /// its sender retries). Without it a client that stalls mid-body, or
    /// never reads its answer, holds the shutdown forever. Default 10 s.
    pub shutdown_grace: Duration,
    /// Rejected requests (401, 400, 408, 413, slow or malformed
    /// connections) are logged at most once per class per this window,
    /// with the count since the last line. Default 10 s.
    pub rejection_log_every: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_concurrent_requests: 1024,
            max_connections: 4096,
            header_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            max_headers: 100,
            max_header_bytes: 16 * 1024,
            api_max_body: 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
            rejection_log_every: Duration::from_secs(10),
        }
    }
}

/// How much of an oversize body is read and thrown away so the sender sees
/// the 413 (a server that closes while the client is still uploading makes
/// the client see a broken pipe instead). Beyond this, the connection is
/// simply closed.
pub(crate) const DRAIN_MAX: u64 = 8 * 1024 * 1024;
/// How long draining may take.
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads `body` up to `limit` bytes within `deadline`. Over the limit, the
/// rest is drained (discarded, never buffered; see [`DRAIN_MAX`]) and
/// `too_large` is answered; a body that does not arrive in time gets 408.
pub(crate) async fn read_body(
    mut body: Body,
    limit: u64,
    deadline: Duration,
    too_large: impl FnOnce() -> Problem,
) -> Result<Bytes, Problem> {
    let read = async {
        let mut buf = bytes::BytesMut::new();
        let mut seen: u64 = 0;
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| Problem::bad_request(format!("could not read the body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            seen = seen.saturating_add(data.len() as u64);
            if seen <= limit {
                buf.extend_from_slice(&data);
            } else {
                return Ok(None);
            }
        }
        Ok(Some(buf.freeze()))
    };
    match tokio::time::timeout(deadline, read).await {
        Err(_) => Err(Problem::new(
            StatusCode::REQUEST_TIMEOUT,
            "Request Timeout",
            format!("the body did not arrive within {} ms", deadline.as_millis()),
        )),
        Ok(Err(p)) => Err(p),
        Ok(Ok(Some(bytes))) => Ok(bytes),
        Ok(Ok(None)) => {
            drain(body, DRAIN_MAX.saturating_sub(limit)).await;
            Err(too_large())
        }
    }
}

/// Reads and discards up to `max` more bytes of `body` within [`DRAIN_TIME`].
pub(crate) async fn drain(mut body: Body, max: u64) {
    let discard = async {
        let mut seen: u64 = 0;
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                seen = seen.saturating_add(data.len() as u64);
                if seen > max {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, discard).await;
}

/// Caps requests in flight at `max` across all routes; one more is refused
/// at once with 503 + `Retry-After` rather than queued, so memory stays
/// bounded under a flood and senders retry later.
pub(crate) fn shed_beyond(router: axum::Router, max: usize) -> axum::Router {
    // A global layer: `Router::layer` wraps every route separately, and a
    // plain `ConcurrencyLimitLayer` would give each its own budget.
    router.layer(
        tower::ServiceBuilder::new()
            .layer(axum::error_handling::HandleErrorLayer::new(
                shed as fn(tower::BoxError) -> ShedFuture,
            ))
            .layer(tower::load_shed::LoadShedLayer::new())
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(max)),
    )
}

type ShedFuture = std::future::Ready<Problem>;

fn shed(err: tower::BoxError) -> ShedFuture {
    if !err.is::<tower::load_shed::error::Overloaded>() {
        tracing::error!(error = %err, "unexpected middleware error");
    }
    metrics::counter!(mailroom::metrics::HTTP_SHED).increment(1);
    std::future::ready(Problem::unavailable(
        "too many requests in flight; retry shortly",
    ))
}

/// The accept loop of [`crate::serve_with`] (and, with `tls`, of
/// [`crate::serve_https`]).
pub(crate) async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
    limits: &Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    use std::sync::Arc;

    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(limits.max_headers)
        .max_header_size(limits.max_header_bytes)
        // hyper refuses a read buffer under 8 KiB; 64 KiB reads bodies in
        // few syscalls while bounding each connection's buffer.
        .max_buf_size(limits.max_header_bytes.max(64 * 1024));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    // Cancelled when the shutdown grace ends: closes what is still open.
    let cut = tokio_util::sync::CancellationToken::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let rejected = Arc::new(RejectionLog::new(limits.rejection_log_every));
    loop {
        let slot = tokio::select! {
            () = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Per-connection errors (reset before accept) are routine;
                    // others (out of file descriptors) pass with time.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // The peer's address, for per-client limits (`ConnectInfo`, as
        // axum's own `serve` provides it).
        let service = TowerToHyperService::new(tower::ServiceExt::map_request(
            router.clone(),
            move |mut req: http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                req
            },
        ));
        let Some(tls) = &tls else {
            let conn = http.serve_connection(TokioIo::new(stream), service);
            let conn = graceful.watch(conn);
            tokio::spawn(finish_connection(conn, cut.clone(), rejected.clone(), slot));
            continue;
        };
        // The handshake runs in the connection's task, holding its slot,
        // so a slow one never holds up the accept loop.
        let handshake = Handshake {
            acceptor: tls.clone(),
            deadline: limits.tls_handshake_timeout,
            shutdown: shutdown.clone(),
            rejected: rejected.clone(),
        };
        let (http, watcher, cut, rejected) = (
            http.clone(),
            graceful.watcher(),
            cut.clone(),
            rejected.clone(),
        );
        tokio::spawn(async move {
            let Some(stream) = handshake.run(stream).await else {
                return drop(slot);
            };
            let conn = http.serve_connection(TokioIo::new(stream), service);
            finish_connection(watcher.watch(conn), cut, rejected, slot).await;
        });
    }
    drop(listener);
    let grace = limits.shutdown_grace;
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(grace = ?grace, "requests still in progress at the end of the shutdown grace: their connections are closed");
        cut.cancel();
    }
    Ok(())
}

/// A TLS handshake bounded by a deadline and by the shutdown.
struct Handshake {
    acceptor: tokio_rustls::TlsAcceptor,
    deadline: Duration,
    shutdown: tokio_util::sync::CancellationToken,
    rejected: std::sync::Arc<RejectionLog>,
}

impl Handshake {
    /// The encrypted stream, or `None` when the client failed the handshake
    /// (noted in the rejection log), was too slow, or the server stops.
    async fn run(
        self,
        stream: tokio::net::TcpStream,
    ) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        let accepted = tokio::select! {
            () = self.shutdown.cancelled() => return None,
            accepted = tokio::time::timeout(self.deadline, self.acceptor.accept(stream)) => accepted,
        };
        match accepted {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                self.rejected.note(Class::TlsHandshake, &e);
                None
            }
            Err(_) => {
                self.rejected.note(
                    Class::TlsHandshake,
                    &format_args!("no TLS handshake within {} ms", self.deadline.as_millis()),
                );
                None
            }
        }
    }
}

/// Runs one connection to its end (or until `cut`), notes a client-caused
/// end in the rejection log, then frees its slot.
async fn finish_connection(
    conn: impl std::future::Future<Output = hyper::Result<()>>,
    cut: tokio_util::sync::CancellationToken,
    rejected: std::sync::Arc<RejectionLog>,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    tokio::select! {
        served = conn => if let Err(e) = served {
            match Class::of_connection_error(&e) {
                Some(class) => {
                    rejected.note(class, &e);
                }
                None => tracing::debug!(error = %e, "connection closed with an error"),
            }
        },
        () = cut.cancelled() => {}
    }
    drop(slot);
}

/// One token bucket per rate-limited source, created on first use (so the
/// map holds at most one entry per declared source).
#[derive(Debug, Default)]
pub(crate) struct RateLimiter {
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl RateLimiter {
    /// Takes one token from `source`'s bucket, or says how many seconds
    /// until one is available.
    pub(crate) fn take(&self, source: &str, limit: RateLimit) -> Result<(), u32> {
        let capacity = f64::from(limit.requests);
        let per_sec = capacity / limit.per.as_secs_f64();
        let now = Instant::now();
        // A poisoned lock only means another request panicked mid-update;
        // the bucket is still a valid pair of numbers.
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let b = buckets.entry(source.to_string()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * per_sec).min(capacity);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - b.tokens) / per_sec;
            Err(wait.ceil().clamp(1.0, f64::from(u32::MAX)) as u32)
        }
    }
}

/// 429 with `Retry-After`.
pub(crate) fn too_many_requests(source: &str, retry_after: u32) -> Problem {
    Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "Too Many Requests",
        format!("source {source:?} is over its rate_limit"),
    )
    .retry_after(retry_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_one_period_of_burst_then_refuses_with_a_wait() {
        let r = RateLimiter::default();
        let limit = RateLimit {
            requests: 3,
            per: Duration::from_secs(60),
        };
        for _ in 0..3 {
            assert_eq!(r.take("s", limit), Ok(()));
        }
        assert_eq!(r.take("s", limit), Err(20));
        assert_eq!(r.take("other", limit), Ok(()));
    }
}
