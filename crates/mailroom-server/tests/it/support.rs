//! The harness: a fresh SQLite file per test, the real router served on an
//! ephemeral port, the engine running beside it, and small HTTP helpers.

use mailroom::{Engine, EngineBuilder, Store};
use mailroom_server::ServerOptions;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use mailroom_testkit::harness::eventually;

/// How long a test waits with [`eventually`] before failing.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A fresh database: its own directory, its own SQLite file, migrated.
#[derive(Debug)]
pub struct Db {
    /// Holds the directory (and the file) until the test ends.
    pub dir: TempDir,
    /// The store over the file.
    pub store: Arc<dyn Store>,
}

impl Db {
    /// Creates and migrates a new database in a new temporary directory.
    pub async fn fresh() -> Db {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("mailroom.db").display());
        let store = mailroom::open_store(&url, true).await.expect("open store");
        store.migrate().await.expect("migrate");
        Db { dir, store }
    }
}

/// A running server and engine. Dropping it cancels both.
#[derive(Debug)]
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The engine behind the server.
    pub engine: Engine,
    /// The engine's store.
    pub store: Arc<dyn Store>,
    /// Cancels the server and the engine.
    pub shutdown: CancellationToken,
    /// A client for the tests.
    pub http: reqwest::Client,
    tasks: Vec<JoinHandle<()>>,
    /// Keeps the database directory alive.
    _db_dir: TempDir,
}

/// Starts a loopback server with default options over a fresh database.
pub async fn start(build: impl FnOnce(Arc<dyn Store>) -> EngineBuilder) -> Server {
    start_with(
        Db::fresh().await,
        "127.0.0.1:0",
        ServerOptions::default(),
        build,
    )
    .await
}

/// Starts the real router on `listen` (port 0) over `db`, with the engine
/// `build` makes, both running until the returned [`Server`] is dropped.
pub async fn start_with(
    db: Db,
    listen: &str,
    options: ServerOptions,
    build: impl FnOnce(Arc<dyn Store>) -> EngineBuilder,
) -> Server {
    let engine = build(db.store.clone()).build().expect("engine builds");
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .expect("bind listener");
    let port = listener.local_addr().expect("local addr").port();
    let shutdown = CancellationToken::new();
    let router = mailroom_server::router(engine.clone(), options);
    let serve = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            mailroom_server::serve(listener, router, shutdown)
                .await
                .expect("serve");
        }
    });
    let run = tokio::spawn({
        let engine = engine.clone();
        let shutdown = shutdown.clone();
        async move { engine.run(shutdown).await }
    });
    Server {
        base: format!("http://127.0.0.1:{port}"),
        engine,
        store: db.store,
        shutdown,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("client"),
        tasks: vec![serve, run],
        _db_dir: db.dir,
    }
}

impl Server {
    /// Cancels the server and the engine and waits for both to stop.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        for t in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("server and engine stop within 10 s")
                .expect("server and engine tasks do not panic");
        }
    }

    /// `base` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `POST /webhooks/{source}` with `headers` and `body`.
    pub async fn webhook(
        &self,
        source: &str,
        headers: &[(&str, &str)],
        body: impl Into<reqwest::Body>,
    ) -> reqwest::Response {
        let mut req = self.http.post(self.url(&format!("/webhooks/{source}")));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(body).send().await.expect("webhook request")
    }

    /// Sends a JSON webhook that must be accepted as new; returns the event id.
    pub async fn accept(&self, source: &str, webhook_id: &str, body: &Value) -> String {
        let resp = self
            .webhook(
                source,
                &[
                    ("webhook-id", webhook_id),
                    ("content-type", "application/json"),
                ],
                body.to_string(),
            )
            .await;
        assert_eq!(resp.status(), 200, "webhook {webhook_id} accepted");
        let answer: Value = resp.json().await.expect("json answer");
        assert_eq!(answer["duplicate"], false, "{answer}");
        answer["id"].as_str().expect("id").to_string()
    }

    /// `GET path`, expecting 200 and JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let resp = self
            .http
            .get(self.url(path))
            .send()
            .await
            .expect("GET request");
        assert_eq!(resp.status(), 200, "GET {path}");
        resp.json().await.expect("json body")
    }

    /// `POST path` without a body, expecting 200 and JSON.
    pub async fn post_json(&self, path: &str) -> Value {
        let resp = self
            .http
            .post(self.url(path))
            .send()
            .await
            .expect("POST request");
        assert_eq!(resp.status(), 200, "POST {path}");
        resp.json().await.expect("json body")
    }

    /// `GET /v1/events/{id}` (with history).
    pub async fn event(&self, id: &str) -> Value {
        self.get_json(&format!("/v1/events/{id}")).await
    }

    /// Polls the event until `pred` holds; returns it.
    pub async fn event_until(&self, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        eventually(DEADLINE, what, || async {
            let e = self.event(id).await;
            pred(&e).then_some(e)
        })
        .await
    }

    /// Polls the event until its status is `status`; returns it.
    pub async fn event_with_status(&self, id: &str, status: &str) -> Value {
        self.event_until(id, &format!("event {id} is {status}"), |e| {
            e["status"] == status
        })
        .await
    }

    /// Every event of `topic` (following the cursor), newest first.
    pub async fn events_of(&self, topic: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/events?topic={topic}&limit=1000");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let page = self.get_json(&path).await;
            all.extend(page["events"].as_array().expect("events").iter().cloned());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => return all,
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The outcomes of an event's history, in order.
pub fn outcomes(event: &Value) -> Vec<String> {
    event["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|a| a["outcome"].as_str().expect("outcome").to_string())
        .collect()
}

/// Asserts a `application/problem+json` answer with `status`; returns its body.
pub async fn expect_problem(resp: reqwest::Response, status: u16) -> Value {
    assert_eq!(resp.status(), status, "status");
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert_eq!(ct, "application/problem+json", "problem content type");
    let body: Value = resp.json().await.expect("problem body is JSON");
    assert_eq!(body["status"], status, "{body}");
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "problem has a detail: {body}"
    );
    body
}
