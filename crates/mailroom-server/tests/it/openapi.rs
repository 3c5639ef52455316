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

/// A server with an API token.
fn guarded() -> ServerOptions {
    ServerOptions {
        api_tokens: vec!["openapi-test-token-0123456789abcdef".into()],
        ..ServerOptions::default()
    }
}

/// The document is OpenAPI 3.1 that the reference validator accepts, names
/// the bearer scheme, guards `/v1/*` with it when a token is configured
/// (and documents no authentication without one), and answers errors as
/// problem+json; the typed answers are its schemas.
#[tokio::test]
async fn the_document_is_valid_openapi_3_1() {
    let db = Db::fresh().await;
    let engine = Engine::builder(db.store.clone()).build().expect("engine");
    let open = document_of(mailroom_server::router(
        engine.clone(),
        ServerOptions::default(),
    ))
    .await;
    assert!(open["paths"]["/v1/stats"]["get"]["security"].is_null());
    assert!(open["paths"]["/v1/stats"]["get"]["responses"]["401"].is_null());
    let doc = document_of(mailroom_server::router(engine, guarded())).await;
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

    for doc in [&open, &doc] {
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
}

/// Whether Python's `re.fullmatch(pattern, c)` (the regular expressions
/// schemathesis generates from) matches each candidate.
fn python_matches(pattern: &str, candidates: &[String]) -> Vec<bool> {
    let script = "import json, re, sys\n\
                  d = json.load(sys.stdin)\n\
                  print(json.dumps([re.fullmatch(d['pattern'], c) is not None for c in d['candidates']]))";
    let mut child = std::process::Command::new(validator_python())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python");
    let input = serde_json::json!({ "pattern": pattern, "candidates": candidates });
    std::io::Write::write_all(
        child.stdin.as_mut().expect("stdin"),
        input.to_string().as_bytes(),
    )
    .expect("write");
    let out = child.wait_with_output().expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON list")
}

/// Duration texts near every bound, well formed or not.
fn duration_candidates() -> Vec<String> {
    let numbers = [
        "0",
        "1",
        "01",
        "0.0",
        "0.000",
        "0.001",
        "0.0001",
        "0.5",
        "1.5",
        "1.",
        "1.2345",
        ".5",
        "59",
        "59.999",
        "60",
        "60.0",
        "60.001",
        "61",
        "999",
        "1000",
        "3599",
        "3599.999",
        "3600",
        "3600.000",
        "3600.001",
        "3601",
        "36499",
        "36500",
        "36500.0",
        "36500.001",
        "36501",
        "876000",
        "876000.001",
        "3600000",
        "3600000.5",
        "3600000.0",
        "3600001",
        "52560000",
        "3153600000",
        "3153600000000",
        "3153600000001",
        "99999999999999999999",
        "1e3",
        "-1",
        " 1",
    ];
    let units = ["ms", "s", "m", "h", "d", "", "x", "S", " s", "s\n"];
    numbers
        .iter()
        .flat_map(|n| units.iter().map(move |u| format!("{n}{u}")))
        .collect()
}

/// The duration patterns the document states for `lease`/`retry_in` and
/// `delay` match exactly the texts the server accepts, near every bound
/// (checked with Python's regular expressions, as schemathesis reads them).
#[tokio::test]
async fn duration_patterns_match_what_the_server_accepts() {
    let db = Db::fresh().await;
    let engine = Engine::builder(db.store.clone()).build().expect("engine");
    let doc = document_of(mailroom_server::router(engine, ServerOptions::default())).await;
    let schemas = &doc["components"]["schemas"];
    let lease = schemas["LeaseArg"]["oneOf"]
        .as_array()
        .expect("LeaseArg is a oneOf")
        .iter()
        .find_map(|s| s["pattern"].as_str())
        .expect("a pattern for the text form");
    let delay = schemas["CreateEvent"]["allOf"][0]["properties"]["delay"]["oneOf"][0]["pattern"]
        .as_str()
        .expect("a pattern for delay");
    assert_eq!(lease, mailroom_server::formats::LEASE.pattern());
    assert_eq!(delay, mailroom_server::formats::DELAY.pattern());
    let candidates = duration_candidates();
    for (pattern, format) in [
        (lease, mailroom_server::formats::LEASE),
        (delay, mailroom_server::formats::DELAY),
    ] {
        let matched = python_matches(pattern, &candidates);
        let disagree: Vec<_> = candidates
            .iter()
            .zip(matched)
            .filter(|(c, m)| format.parse(c).is_ok() != *m)
            .map(|(c, m)| format!("{c:?} (pattern {m})"))
            .collect();
        assert!(disagree.is_empty(), "{pattern} disagrees on {disagree:?}");
    }
}

/// The Idempotency-Key pattern in the document is the one the server
/// checks, and means the same in Python's regular expressions.
#[tokio::test]
async fn the_idempotency_key_pattern_is_what_the_server_checks() {
    let db = Db::fresh().await;
    let engine = Engine::builder(db.store.clone()).build().expect("engine");
    let doc = document_of(mailroom_server::router(engine, ServerOptions::default())).await;
    let params = doc["paths"]["/v1/events"]["post"]["parameters"]
        .as_array()
        .expect("parameters");
    let key = params
        .iter()
        .find(|p| p["name"] == "Idempotency-Key")
        .expect("the header");
    let pattern = key["schema"]["pattern"].as_str().expect("a pattern");
    assert_eq!(pattern, mailroom_server::formats::IDEMPOTENCY_KEY_PATTERN);
    let candidates: Vec<String> = [
        "a",
        "order-1",
        "\"quoted\"",
        "\"\"",
        "in side",
        " lead",
        "trail ",
        "",
        "é",
        "tab\there",
        "~!",
        "x\n",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .chain([
        "k".repeat(512),
        "k".repeat(513),
        format!("a{}b", " ".repeat(510)),
    ])
    .collect();
    let matched = python_matches(pattern, &candidates);
    for (c, m) in candidates.iter().zip(matched) {
        assert_eq!(mailroom_server::formats::is_idempotency_key(c), m, "{c:?}");
    }
}

/// axum's own refusals (no `Content-Type: application/json`, a body that
/// is not the schema, a method the route does not serve, an unknown path)
/// are problem+json with their status, and a 405 keeps its `Allow`.
#[tokio::test]
async fn axum_refusals_are_problem_json() {
    let db = Db::fresh().await;
    let engine = Engine::builder(db.store.clone())
        .topic(TopicSpec::new("t"))
        .build()
        .expect("engine");
    let router = mailroom_server::router(engine, ServerOptions::default());
    let id = "0190c5f0-0000-7000-8000-000000000000";
    let cases = [
        (
            Method::POST,
            format!("/v1/events/{id}/ack"),
            None,
            "{\"token\": 1}",
            415,
        ),
        (
            Method::POST,
            format!("/v1/events/{id}/ack"),
            Some("application/json"),
            "{\"token\": \"x\"}",
            422,
        ),
        (
            Method::POST,
            format!("/v1/events/{id}/ack"),
            Some("application/json"),
            "{",
            400,
        ),
        (Method::DELETE, "/v1/stats".to_string(), None, "", 405),
        (Method::GET, "/no/such/route".to_string(), None, "", 404),
    ];
    for (method, uri, content_type, body, status) in cases {
        let mut req = Request::builder().method(method.clone()).uri(&uri);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let resp = router
            .clone()
            .oneshot(req.body(Body::from(body)).expect("request"))
            .await
            .expect("infallible");
        assert_eq!(resp.status(), status, "{method} {uri}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/problem+json",
            "{method} {uri}"
        );
        if status == 405 {
            assert!(resp.headers().contains_key("allow"), "{method} {uri}");
        }
        let bytes = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .expect("body")
            .to_bytes();
        let problem: Value = serde_json::from_slice(&bytes).expect("a problem");
        assert_eq!(problem["status"], status, "{method} {uri}");
        assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }
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
