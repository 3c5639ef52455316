//! The receiver every phase of `http-floor` posts to: a small hyper HTTP/1.1
//! server (keep-alive, `200` with an empty body, the request body read in
//! full) on a runtime and threads of its own, named [`THREAD`], so its CPU
//! is told apart from the deliverer's in this process. It counts requests,
//! and those that came without a Standard Webhooks signature.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

/// The receiver's thread name (its runtime's workers too).
pub const THREAD: &str = "http-recv";

#[derive(Default)]
pub struct Counts {
    /// Requests answered.
    pub requests: AtomicU64,
    /// Requests without a `webhook-signature` header.
    pub unsigned: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
}

pub struct Receiver {
    pub addr: SocketAddr,
    pub counts: Arc<Counts>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Starts the receiver on `threads` threads (1: a current-thread runtime).
    pub fn start(threads: usize) -> anyhow::Result<Self> {
        let runtime = match threads {
            0 | 1 => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            n => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(n)
                .thread_name(THREAD)
                .enable_all()
                .build()?,
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let (stop, stopped) = oneshot::channel();
        let c = counts.clone();
        let thread = std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => accept(l, c, stopped).await,
                        Err(e) => eprintln!("mailroom-bench: receiver: {e}"),
                    }
                });
                runtime.shutdown_timeout(Duration::from_millis(100));
            })?;
        Ok(Self {
            addr,
            counts,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn requests(&self) -> u64 {
        self.counts.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept(
    listener: tokio::net::TcpListener,
    counts: Arc<Counts>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
        };
        let _ = stream.set_nodelay(true);
        counts.connections.fetch_add(1, Ordering::Relaxed);
        let counts = counts.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let counts = counts.clone();
                async move {
                    if !req.headers().contains_key("webhook-signature") {
                        counts.unsigned.fetch_add(1, Ordering::Relaxed);
                    }
                    // The body is read in full, as a real receiver would.
                    let _ = req.into_body().collect().await;
                    counts.requests.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::new())))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The receiver alone: `concurrency` raw hyper HTTP/1.1 connections posting
/// `body` as fast as it answers, for `duration`: requests/s. No signing,
/// no headers beyond the body's: what the receiver takes at most here.
pub async fn alone(
    addr: SocketAddr,
    concurrency: usize,
    body: Bytes,
    duration: Duration,
) -> anyhow::Result<u64> {
    let deadline = tokio::time::Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let body = body.clone();
        tasks.spawn(async move {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let mut n = 0u64;
            while tokio::time::Instant::now() < deadline {
                let req = hyper::Request::post("/hook")
                    .header("host", "127.0.0.1")
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))?;
                let resp = send.send_request(req).await?;
                let _ = resp.into_body().collect().await;
                n += 1;
            }
            anyhow::Ok(n)
        });
    }
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        total += r??;
    }
    Ok(total)
}
