//! The harness: a fresh SQLite file per test, optionally wrapped by
//! [`Wrapped`] (delays, a gate, an overloaded queue), the real router served
//! with [`mailroom_server::serve_with`] on `127.0.0.1:0`.

use async_trait::async_trait;
use mailroom::hooks::NewEvent;
use mailroom::operate::{ListFilter, Page, PurgeReport, TopicStats};
use mailroom::pull::{Claimed, Completion, FencingToken};
use mailroom::store::ClaimRequest;
use mailroom::{Engine, EngineBuilder};
use mailroom::{Event, EventId, Inserted, Retention, Store, StoreError};
use mailroom_server::ServerOptions;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tempfile::TempDir;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

type StoreResult<T> = Result<T, StoreError>;

/// A store that can make `insert` slow, hold it at a gate, or refuse it as
/// overloaded, and that counts inserts running at once. Everything else is
/// passed through.
#[derive(Debug)]
pub struct Wrapped {
    inner: Arc<dyn Store>,
    /// Added before every insert.
    pub delay: Duration,
    /// When set, every insert waits here (see [`Gate`]).
    pub gate: Option<Arc<Gate>>,
    /// Inserts answer [`StoreError::Overloaded`] while set.
    pub overloaded: AtomicBool,
    running: AtomicUsize,
    /// Most inserts ever running at once.
    pub max_running: AtomicUsize,
}

/// Holds inserts until opened; says when one has arrived.
#[derive(Debug)]
pub struct Gate {
    /// Notified (with a stored permit) when an insert reaches the gate.
    pub entered: Notify,
    open: Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            entered: Notify::new(),
            open: Semaphore::new(0),
        }
    }
}

impl Gate {
    /// Lets every held and future insert through.
    pub fn open(&self) {
        self.open.add_permits(Semaphore::MAX_PERMITS / 2);
    }
}

impl Wrapped {
    /// Wraps `inner` with no delay, no gate, not overloaded.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            delay: Duration::ZERO,
            gate: None,
            overloaded: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            max_running: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl Store for Wrapped {
    async fn migrate(&self) -> StoreResult<mailroom::Migrated> {
        self.inner.migrate().await
    }
    async fn schema(&self) -> StoreResult<mailroom::SchemaVersion> {
        self.inner.schema().await
    }
    async fn insert(&self, event: NewEvent) -> StoreResult<Inserted> {
        if self.overloaded.load(Ordering::SeqCst) {
            return Err(StoreError::Overloaded);
        }
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        if let Some(gate) = &self.gate {
            gate.entered.notify_one();
            gate.open.acquire().await.expect("gate open").forget();
        }
        tokio::time::sleep(self.delay).await;
        let r = self.inner.insert(event).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        r
    }
    async fn claim(&self, req: &ClaimRequest) -> StoreResult<Vec<Claimed>> {
        self.inner.claim(req).await
    }
    async fn complete(&self, id: EventId, t: FencingToken, c: Completion) -> StoreResult<()> {
        self.inner.complete(id, t, c).await
    }
    async fn extend(
        &self,
        id: EventId,
        t: FencingToken,
        lease: Duration,
    ) -> StoreResult<jiff::Timestamp> {
        self.inner.extend(id, t, lease).await
    }
    async fn expire(&self, topic: &str, after: Duration, limit: u32) -> StoreResult<u64> {
        self.inner.expire(topic, after, limit).await
    }
    async fn rescue_expired(&self) -> StoreResult<u64> {
        self.inner.rescue_expired().await
    }
    async fn fold_counters(&self) -> StoreResult<()> {
        self.inner.fold_counters().await
    }
    async fn next_due(&self, req: &ClaimRequest) -> StoreResult<Option<jiff::Timestamp>> {
        self.inner.next_due(req).await
    }
    async fn claim_limited(
        &self,
        req: &ClaimRequest,
        limits: mailroom::store::ClaimLimits,
    ) -> StoreResult<mailroom::store::LimitedClaim> {
        self.inner.claim_limited(req, limits).await
    }
    async fn pause_topic(&self, topic: &str, pause: Duration) -> StoreResult<jiff::Timestamp> {
        self.inner.pause_topic(topic, pause).await
    }
    async fn paused_for(&self, topic: &str) -> StoreResult<Option<Duration>> {
        self.inner.paused_for(topic).await
    }
    async fn get(&self, id: EventId) -> StoreResult<Option<Event>> {
        self.inner.get(id).await
    }
    async fn list(&self, filter: &ListFilter) -> StoreResult<Page> {
        self.inner.list(filter).await
    }
    async fn search(&self, search: &mailroom::operate::EventSearch) -> StoreResult<Page> {
        self.inner.search(search).await
    }
    async fn count(&self, search: &mailroom::operate::EventSearch) -> StoreResult<u64> {
        self.inner.count(search).await
    }
    async fn throughput(
        &self,
        window: Duration,
    ) -> StoreResult<Vec<mailroom::operate::Throughput>> {
        self.inner.throughput(window).await
    }
    async fn replay(&self, id: EventId, budget: u32) -> StoreResult<Event> {
        self.inner.replay(id, budget).await
    }
    async fn replay_matching(
        &self,
        filter: &ListFilter,
        budget: u32,
    ) -> StoreResult<mailroom::operate::ReplayReport> {
        self.inner.replay_matching(filter, budget).await
    }
    async fn skip(&self, id: EventId) -> StoreResult<Event> {
        self.inner.skip(id).await
    }
    async fn cancel(&self, id: EventId) -> StoreResult<Event> {
        self.inner.cancel(id).await
    }
    async fn cancel_matching(&self, filter: &ListFilter) -> StoreResult<u64> {
        self.inner.cancel_matching(filter).await
    }
    async fn stats(&self) -> StoreResult<Vec<TopicStats>> {
        self.inner.stats().await
    }
    async fn attempt_window(
        &self,
        window: std::time::Duration,
    ) -> StoreResult<Vec<mailroom::operate::AttemptWindow>> {
        self.inner.attempt_window(window).await
    }
    async fn purge(&self, retention: Retention) -> StoreResult<PurgeReport> {
        self.inner.purge(retention).await
    }
    async fn now(&self) -> StoreResult<jiff::Timestamp> {
        self.inner.now().await
    }
}

/// A running server over a fresh database. Dropping it cancels the server.
#[derive(Debug)]
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// `127.0.0.1:PORT`.
    pub addr: std::net::SocketAddr,
    /// The engine behind the server (its loops are not run: events stay pending).
    pub engine: Engine,
    /// The wrapped store.
    pub store: Arc<Wrapped>,
    /// A client for the tests.
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
    _dir: TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts the real router over a fresh SQLite store wrapped by `wrap`, with
/// the engine `build` makes and `options` (also used for connection limits).
pub async fn start(
    wrap: impl FnOnce(&mut Wrapped),
    build: impl FnOnce(EngineBuilder) -> EngineBuilder,
    options: ServerOptions,
) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("mailroom.db").display());
    let inner = mailroom::open_store(&url, true).await.expect("open store");
    inner.migrate().await.expect("migrate");
    let mut wrapped = Wrapped::new(inner);
    wrap(&mut wrapped);
    let store = Arc::new(wrapped);
    let engine = build(Engine::builder(store.clone()))
        .build()
        .expect("engine builds");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let limits = options.limits.clone();
    let router = mailroom_server::router(engine.clone(), options);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            mailroom_server::serve_with(listener, router, shutdown, &limits)
                .await
                .expect("serve");
        }
    });
    Server {
        base: format!("http://{addr}"),
        addr,
        engine,
        store,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client"),
        shutdown,
        task: Some(task),
        _dir: dir,
    }
}

impl Server {
    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /webhooks/{source}`.
    pub async fn webhook(
        &self,
        source: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> reqwest::Response {
        let mut req = self.http.post(self.url(&format!("/webhooks/{source}")));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(body.to_owned())
            .send()
            .await
            .expect("webhook request")
    }

    /// Events stored for `topic` (at most 1000).
    pub async fn stored(&self, topic: &str) -> Vec<Event> {
        self.store
            .list(&ListFilter {
                topic: Some(topic.into()),
                limit: 1000,
                ..ListFilter::default()
            })
            .await
            .expect("list")
            .events
    }

    /// Stops accepting, finishes requests in flight, and waits for that;
    /// returns how long it took.
    pub async fn stop(mut self) -> Duration {
        let started = std::time::Instant::now();
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .expect("server stops")
                .expect("server task does not panic");
        }
        started.elapsed()
    }
}

/// Asserts `resp` is `application/problem+json` with `status`, returning its body.
pub async fn problem(resp: reqwest::Response, status: u16) -> serde_json::Value {
    assert_eq!(resp.status().as_u16(), status, "status");
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let body: serde_json::Value = resp.json().await.expect("problem body");
    assert_eq!(body["status"], status);
    body
}

/// `Retry-After` in seconds; panics when absent.
pub fn retry_after(resp: &reqwest::Response) -> u64 {
    resp.headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After header in seconds")
}
