//! Feeds arbitrary bodies to the `/v1` routes that take one — `POST
//! /v1/events`, `/v1/replay`, `/v1/cancel`, `/v1/topics/{topic}/claim`,
//! `/v1/events/{id}/ack|nack|extend` — through the real router
//! (`mailroom_server::router`: its extractors, body limits, deserialization
//! and validation), over a SQLite store in a temporary directory.
//!
//! Invariants checked: it never panics, and no body makes the server fail
//! on its own side (500): a bad body is a 4xx. (503 is allowed: the store
//! may refuse under load, and the fuzzer is load.)
//!
//! Input: the first byte picks the route (and whether the request says
//! `content-type: application/json`); the rest is the body.
#![no_main]

use std::sync::LazyLock;

use axum::body::Body;
use http::{Request, StatusCode};
use libfuzzer_sys::fuzz_target;
use mailroom::{Engine, Field, Mode, TopicSpec};
use mailroom_server::{ServerOptions, router};
use tower::ServiceExt;

/// The routes that take a body; `{id}` is an event that exists, claimed
/// once, so ack/nack/extend with the fuzzer's token meet the fencing check.
const ROUTES: [&str; 7] = [
    "/v1/events",
    "/v1/replay",
    "/v1/cancel",
    "/v1/topics/pull/claim",
    "/v1/events/{id}/ack",
    "/v1/events/{id}/nack",
    "/v1/events/{id}/extend",
];

struct World {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
    id: String,
    _dir: tempfile::TempDir,
}

static WORLD: LazyLock<World> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // tmpfs when there is one: every insert is a commit.
    let dir = tempfile::Builder::new()
        .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm" } else { "/tmp" })
        .expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("fuzz.db").display());
    let (app, id) = rt.block_on(async {
        let store = mailroom::open_store(&url, true).await.expect("store");
        store.migrate().await.expect("migrate");
        let engine = Engine::builder(store)
            .topic(TopicSpec::new("pull"))
            .topic(
                TopicSpec::new("seq")
                    .mode(Mode::Sequential { on_dead: Default::default() })
                    .key(Field::Json("/k".into())),
            )
            .build()
            .expect("engine");
        let app = router(engine, ServerOptions::default());
        // One event, claimed: ack/nack/extend with a wrong token meet the fence.
        let create = Request::post("/v1/events")
            .header("content-type", "application/json")
            .header("idempotency-key", "seed")
            .body(Body::from(r#"{"topic":"pull","payload":{"a":1}}"#))
            .expect("request");
        let resp = app.clone().oneshot(create).await.expect("infallible");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20).await.expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let id = v["id"].as_str().expect("id").to_owned();
        let claim = Request::post("/v1/topics/pull/claim").body(Body::empty()).expect("request");
        app.clone().oneshot(claim).await.expect("infallible");
        (app, id)
    });
    World { rt, app, id, _dir: dir }
});

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let w = &*WORLD;
    let path = ROUTES[usize::from(pick) % ROUTES.len()].replace("{id}", &w.id);
    let mut req = Request::post(path.as_str()).header("idempotency-key", "fuzz");
    if pick & 0x80 == 0 {
        req = req.header("content-type", "application/json");
    }
    let Ok(req) = req.body(Body::from(body.to_vec())) else {
        return;
    };
    let status = w.rt.block_on(w.app.clone().oneshot(req)).expect("infallible").status();
    assert!(
        status != StatusCode::INTERNAL_SERVER_ERROR,
        "{path} answered 500 to {:?}",
        String::from_utf8_lossy(body)
    );
});
