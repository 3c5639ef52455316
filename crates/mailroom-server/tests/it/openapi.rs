//! `GET /openapi.json`: every route the router serves is in the
//! document, with the same methods, and the document is valid OpenAPI 3.1
//! by the reference validator (`openapi-spec-validator`, which
//! `scripts/test.sh` installs into a cached venv).

use crate::support::Db;
use axum::body::Body;
use http::{Method, Request, StatusCode};
use mailroom::{Engine, TopicSpec};
use mailroom_server::ServerOptions;
use serde_json::Value;
use std::collections::BTreeSet;
use tower::ServiceExt;

/// The methods a route may be served under (HEAD follows GET in axum).
const METHODS: [Method; 5] = [
    Method::GET,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

/// The path templates in the router's own route table. axum offers no
/// listing, but its `Debug` prints the table (`Node { paths: {RouteId(n):
/// "/path", ...} }`, the served routes first, then the fallbacks): what is
/// read here is what the router matches requests against.
fn served_paths(router: &axum::Router) -> BTreeSet<String> {
    let debug = format!("{router:?}");
    let start = debug
        .find("Node { paths: {")
        .expect("axum's route table in Debug")
        + 15;
    let mut paths = BTreeSet::new();
    let mut chars = debug[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '}' => break,
            '"' => paths.insert(chars.by_ref().take_while(|c| *c != '"').collect()),
            _ => continue,
        };
    }
    paths
}

/// The path with each `{param}` replaced by a sample value.
fn sample(path: &str) -> String {
    path.split('/')
        .map(|seg| match seg {
            "{id}" => "0190c5f0-0000-7000-8000-000000000000",
            s if s.starts_with('{') => "probe",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// (method, path) of every route served: each path of the table, asked with
/// each method; axum answers 405 for a method the path does not serve.
async fn served_routes(router: axum::Router) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for path in served_paths(&router) {
        for method in METHODS {
            let req = Request::builder()
                .method(method.clone())
                .uri(sample(&path))
                .header("content-type", "application/json")
                .body(Body::from("{}"))
                .expect("request");
            let status = router
                .clone()
                .oneshot(req)
                .await
                .expect("infallible")
                .status();
            // The dashboard's pages under /ui/ are its own links, not API
            // operations; its entry, `GET /`, is documented like the rest.
            if status != StatusCode::METHOD_NOT_ALLOWED && !path.starts_with("/ui/") {
                routes.insert((method.as_str().to_lowercase(), path.clone()));
            }
        }
    }
    routes
}

fn documented_routes(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            let methods = item.as_object().expect("path item").keys();
            methods
                .filter(|m| METHODS.iter().any(|k| k.as_str().eq_ignore_ascii_case(m)))
                .map(|m| (m.clone(), path.clone()))
        })
        .collect()
}

async fn document_of(router: axum::Router) -> Value {
    let req = Request::get("/openapi.json")
        .body(Body::empty())
        .expect("request");
    let resp = router.oneshot(req).await.expect("infallible");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    serde_json::from_slice(&body).expect("JSON")
}

/// Every (method, path) the router serves is documented, and every
/// documented one is served: a route added without `#[utoipa::path]` fails
/// here.
#[tokio::test]
async fn every_served_route_is_documented() {
    let db = Db::fresh().await;
    let engine = Engine::builder(db.store.clone())
        .topic(TopicSpec::new("t"))
        .build()
        .expect("engine");
    let router = mailroom_server::router(engine, ServerOptions::default());
    let served = served_routes(router.clone()).await;
    for known in [
        "/healthz",
        "/v1/events",
        "/v1/events/{id}/ack",
        "/webhooks/{source}",
    ] {
        assert!(
            served.iter().any(|(_, p)| p == known),
            "the route table was not read: {known} missing from {served:?}"
        );
    }
    let doc = document_of(router).await;
    let documented = documented_routes(&doc);
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in /openapi.json: {undocumented:?}"
    );
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        unserved.is_empty(),
        "in /openapi.json but not served: {unserved:?}"
    );
}

/// The document is OpenAPI 3.1 that the reference validator accepts, names
/// the bearer scheme, guards `/v1/*` with it, and answers errors as
/// problem+json; the typed answers are its schemas.
#[tokio::test]
async fn the_document_is_valid_openapi_3_1() {
    let db = Db::fresh().await;
    let engine = Engine::builder(db.store.clone()).build().expect("engine");
    let doc = document_of(mailroom_server::router(engine, ServerOptions::default())).await;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let stats = &doc["paths"]["/v1/stats"]["get"];
    assert_eq!(stats["security"][0]["bearer"], serde_json::json!([]));
    assert_eq!(
        stats["responses"]["default"]["$ref"],
        "#/components/responses/Problem"
    );
    assert!(doc["paths"]["/healthz"]["get"]["security"].is_null());
    let problem = &doc["components"]["responses"]["Problem"]["content"];
    assert!(problem["application/problem+json"]["schema"].is_object());
    for schema in [
        "EventObject",
        "EventList",
        "StatsAnswer",
        "ClaimAnswer",
        "CreateEvent",
        "Status",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "schema {schema} missing"
        );
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, doc.to_string()).expect("write");
    let out = std::process::Command::new(validator_python())
        .args(["-m", "openapi_spec_validator", "--schema", "3.1"])
        .arg(&file)
        .output()
        .expect("run openapi-spec-validator");
    assert!(
        out.status.success(),
        "openapi-spec-validator refused the document:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `MAILROOM_TEST_OPENAPI_PYTHON` (set by scripts/test.sh), else the venv
/// `scripts/openapi-validator.sh` makes. A missing validator fails the
/// test: it is never skipped.
fn validator_python() -> std::path::PathBuf {
    if let Some(py) = std::env::var_os("MAILROOM_TEST_OPENAPI_PYTHON") {
        return py.into();
    }
    let out = std::process::Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/openapi-validator.sh"
    ))
    .output()
    .expect("run scripts/openapi-validator.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().into()
}
