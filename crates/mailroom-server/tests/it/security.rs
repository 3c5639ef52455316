//! The HTTP surface against a hostile browser or network: cross-site
//! writes and DNS rebinding on a token-less instance, bulk writes without a
//! filter, token guessing, session eviction, the login redirect, the
//! session cookie over TLS, and the read routes `protect_metrics` guards.

use crate::support::{Db, Server, expect_problem, start_with};
use mailroom::{Engine, SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use serde_json::{Value, json};
use std::sync::Arc;

const TOKEN: &str = "security-test-token-0123456789abcdef";

/// A server with a pull topic `parked` (events stay pending) fed by the
/// source `parked`.
async fn server(options: ServerOptions) -> Server {
    start_with(Db::fresh().await, "127.0.0.1:0", options, |store| {
        Engine::builder(store)
            .topic(TopicSpec::new("parked"))
            .source(SourceSpec::new("parked", "parked"))
    })
    .await
}

fn with_token() -> ServerOptions {
    ServerOptions {
        api_tokens: vec![TOKEN.to_owned()],
        ..ServerOptions::default()
    }
}

/// A client that never follows redirects (the tests read them).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

async fn pending(s: &Server) -> usize {
    s.events_of("parked")
        .await
        .iter()
        .filter(|e| e["status"] == "pending")
        .count()
}

/// Without a token, a page on another site cannot change anything (a
/// foreign `Origin` on a write is 403, whatever the route) and a rebound
/// DNS name cannot read or write (a foreign `Host` is 421 on every route,
/// and the dashboard sets no cookie for it); tools that send no `Origin`,
/// and the instance's own origin, still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_less_server_refuses_cross_site_writes_and_foreign_hosts() {
    let s = server(ServerOptions::default()).await;
    let mut ids = vec![];
    for i in 0..3 {
        ids.push(
            s.accept("parked", &format!("p-{i}"), &json!({"i": i}))
                .await,
        );
    }
    let http = client();
    let evil = "https://evil.example";

    // What a browser's `fetch(..., {method: "POST", mode: "no-cors"})` sends.
    for path in [
        "/v1/cancel".to_owned(),
        "/v1/replay".to_owned(),
        format!("/v1/events/{}/cancel", ids[0]),
        "/webhooks/parked".to_owned(),
    ] {
        let resp = http
            .post(s.url(&path))
            .header("origin", evil)
            .body(r#"{"all": true}"#)
            .send()
            .await
            .expect("POST");
        expect_problem(resp, 403).await;
    }
    let null_origin = http
        .post(s.url("/v1/cancel"))
        .header("origin", "null")
        .json(&json!({"all": true}))
        .send()
        .await
        .expect("POST");
    expect_problem(null_origin, 403).await;
    assert_eq!(pending(&s).await, 3, "nothing was cancelled");

    for (method, path) in [
        (reqwest::Method::GET, "/v1/events"),
        (reqwest::Method::GET, "/"),
        (reqwest::Method::GET, "/metrics"),
        (reqwest::Method::POST, "/v1/cancel"),
    ] {
        let resp = http
            .request(method.clone(), s.url(path))
            .header("host", "rebind.evil.example:8080")
            .json(&json!({"all": true}))
            .send()
            .await
            .expect("request");
        assert!(
            resp.headers().get("set-cookie").is_none(),
            "{method} {path} sets no cookie for a foreign host"
        );
        expect_problem(resp, 421).await;
    }
    assert_eq!(pending(&s).await, 3, "nothing was cancelled");

    // Loopback names pass, with or without a same-origin Origin.
    let port = s.base.rsplit(':').next().expect("port");
    let page = http
        .get(s.url("/"))
        .header("host", format!("localhost:{port}"))
        .send()
        .await
        .expect("GET /");
    assert_eq!(page.status(), 200);
    let one = http
        .post(s.url(&format!("/v1/events/{}/cancel", ids[0])))
        .header("origin", &s.base)
        .send()
        .await
        .expect("POST");
    assert_eq!(one.status(), 200);
    let rest: Value = http
        .post(s.url("/v1/cancel"))
        .json(&json!({"all": true}))
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("json");
    assert_eq!(rest, json!({"matching": 2, "cancelled": 2}));
}

/// `POST /v1/cancel` and `POST /v1/replay` without a body, or with one
/// that names no filter, change nothing and answer 400 naming the missing
/// filter; `"all": true` says "every one" explicitly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_writes_without_a_filter_are_refused_unless_all() {
    let s = server(ServerOptions::default()).await;
    for i in 0..2 {
        s.accept("parked", &format!("p-{i}"), &json!({"i": i}))
            .await;
    }
    let http = client();
    for (path, filterless) in [
        ("/v1/cancel", json!({"dry_run": true})),
        ("/v1/replay", json!({"status": "pending"})),
    ] {
        let bare = http.post(s.url(path)).send().await.expect("POST");
        let p = expect_problem(bare, 400).await;
        assert!(
            p["detail"]
                .as_str()
                .is_some_and(|d| d.contains("missing filter") && d.contains("\"all\": true")),
            "{p}"
        );
        for body in [json!({}), filterless] {
            let resp = http
                .post(s.url(path))
                .json(&body)
                .send()
                .await
                .expect("POST");
            expect_problem(resp, 400).await;
        }
    }
    assert_eq!(pending(&s).await, 2, "nothing was cancelled");
    let all: Value = http
        .post(s.url("/v1/cancel"))
        .json(&json!({"all": true, "dry_run": true}))
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("json");
    assert_eq!(all, json!({"matching": 2, "cancelled": 0}));
    let replayed: Value = http
        .post(s.url("/v1/replay"))
        .json(&json!({"all": true}))
        .send()
        .await
        .expect("POST")
        .json()
        .await
        .expect("json");
    assert_eq!(replayed["replayed"], 0, "no dead event: {replayed}");
}

/// After ten wrong bearer tokens a client gets 429 with `Retry-After`, even
/// with the right token, until its window ends; other routes' failures
/// count toward the same limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_bearer_tokens_are_rate_limited_per_client() {
    let s = server(with_token()).await;
    let http = client();
    let get = |token: &'static str| http.get(s.url("/v1/events")).bearer_auth(token).send();
    assert_eq!(get(TOKEN).await.expect("GET").status(), 200);
    for _ in 0..10 {
        let resp = get("guess").await.expect("GET");
        expect_problem(resp, 401).await;
    }
    let limited = get("guess").await.expect("GET");
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=61).contains(&wait), "{wait}");
    expect_problem(limited, 429).await;
    expect_problem(get(TOKEN).await.expect("GET"), 429).await;
    let page = http
        .get(s.url("/"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET");
    assert_eq!(page.status(), 429, "the dashboard counts the same client");
    // No token at all is no guess: still the plain 401.
    let none = http.get(s.url("/v1/events")).send().await.expect("GET");
    expect_problem(none, 401).await;
}

/// The login form's session cookie and CSRF token.
async fn login_form(s: &Server, http: &reqwest::Client) -> (String, String) {
    let form = http
        .get(s.url("/ui/login"))
        .send()
        .await
        .expect("login form");
    let pre = session_cookie(&form, "mailroom_session").expect("a pre-login session");
    let html = form.text().await.expect("html");
    let at = html.find(r#"name="csrf" value=""#).expect("a csrf field") + 19;
    let csrf = html[at..].split('"').next().unwrap_or_default().to_owned();
    (pre, csrf)
}

fn session_cookie(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix(&format!("{name}=")))
        .map(|c| c.split(';').next().unwrap_or_default().to_owned())
}

async fn post_login(
    s: &Server,
    http: &reqwest::Client,
    (pre, csrf): &(String, String),
    token: &str,
    next: &str,
) -> reqwest::Response {
    http.post(s.url("/ui/login"))
        .header("origin", &s.base)
        .header("cookie", format!("mailroom_session={pre}"))
        .form(&[("token", token), ("csrf", csrf), ("next", next)])
        .send()
        .await
        .expect("login")
}

/// Ten wrong tokens on the login form, then 429 even for the right one;
/// a `next` that a browser would read as another site sends to `/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_guesses_are_limited_and_next_stays_on_the_site() {
    let s = server(with_token()).await;
    let http = client();
    for next in ["/\t/evil.example/", "/\n/evil.example/", "//evil.example/"] {
        let form = login_form(&s, &http).await;
        let resp = post_login(&s, &http, &form, TOKEN, next).await;
        assert_eq!(resp.status(), 303);
        assert_eq!(resp.headers()["location"], "/", "next = {next:?}");
    }
    let form = login_form(&s, &http).await;
    for _ in 0..10 {
        let resp = post_login(&s, &http, &form, "guess", "/").await;
        assert_eq!(resp.status(), 401);
    }
    let limited = post_login(&s, &http, &form, TOKEN, "/").await;
    assert_eq!(limited.status(), 429);
    assert!(limited.headers().contains_key("retry-after"));
    assert!(session_cookie(&limited, "mailroom_session").is_none());
}

/// Ten thousand and fifty anonymous `GET /ui/login` (each makes a
/// pre-login session) do not log the operator out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_login_forms_does_not_evict_the_operator() {
    let s = Arc::new(server(with_token()).await);
    let http = client();
    let form = login_form(&s, &http).await;
    let resp = post_login(&s, &http, &form, TOKEN, "/").await;
    let session = session_cookie(&resp, "mailroom_session").expect("a session");
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (s, http) = (s.clone(), http.clone());
            tokio::spawn(async move {
                for _ in 0..(10_050 / 8 + 1) {
                    let resp = http.get(s.url("/ui/login")).send().await.expect("GET");
                    assert_eq!(resp.status(), 200);
                }
            })
        })
        .collect();
    for f in flood {
        f.await.expect("flood task");
    }
    let page = http
        .get(s.url("/"))
        .header("cookie", format!("mailroom_session={session}"))
        .send()
        .await
        .expect("GET /");
    assert_eq!(page.status(), 200, "the operator is still logged in");
}

/// Over TLS the session cookie is `Secure` and `__Host-` prefixed, and only
/// that cookie is read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_session_cookie_is_secure_and_host_prefixed() {
    let s = server(ServerOptions {
        tls: true,
        ..with_token()
    })
    .await;
    let http = client();
    let form = http.get(s.url("/ui/login")).send().await.expect("GET");
    let cookie = form.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        cookie.starts_with("__Host-mailroom_session=")
            && cookie.contains("; Secure")
            && cookie.contains("Path=/")
            && !cookie.contains("Domain"),
        "{cookie}"
    );
    let pre = session_cookie(&form, "__Host-mailroom_session").expect("cookie");
    let html = form.text().await.expect("html");
    let at = html.find(r#"name="csrf" value=""#).expect("a csrf field") + 19;
    let csrf = html[at..].split('"').next().unwrap_or_default().to_owned();
    let resp = http
        .post(s.url("/ui/login"))
        .header("origin", &s.base)
        .header("cookie", format!("__Host-mailroom_session={pre}"))
        .form(&[("token", TOKEN), ("csrf", &csrf), ("next", "/")])
        .send()
        .await
        .expect("login");
    assert_eq!(resp.status(), 303);
    let session = session_cookie(&resp, "__Host-mailroom_session").expect("session");
    let page = |cookie: String| http.get(s.url("/")).header("cookie", cookie).send();
    let ok = page(format!("__Host-mailroom_session={session}"))
        .await
        .expect("GET");
    assert_eq!(ok.status(), 200);
    let plain = page(format!("mailroom_session={session}"))
        .await
        .expect("GET");
    assert_eq!(plain.status(), 303, "the unprefixed name is not read");
}

/// With `protect_metrics`, `/metrics` needs the token and `/readyz` tells
/// others only whether it is ready; `/healthz` stays open. Without the
/// setting both are open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protect_metrics_guards_metrics_and_the_readiness_detail() {
    let render: mailroom_server::MetricsRenderer = Arc::new(|| "mailroom_up 1\n".to_owned());
    let s = server(ServerOptions {
        protect_metrics: true,
        metrics: Some(render.clone()),
        ..with_token()
    })
    .await;
    let http = client();
    expect_problem(http.get(s.url("/metrics")).send().await.expect("GET"), 401).await;
    let scraped = http
        .get(s.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET");
    assert_eq!(scraped.status(), 200);
    assert_eq!(scraped.text().await.expect("text"), "mailroom_up 1\n");
    let bare: Value = http
        .get(s.url("/readyz"))
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("json");
    assert_eq!(bare, json!({"ready": true}));
    let full: Value = http
        .get(s.url("/readyz"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("json");
    assert_eq!(full["store"]["up"], true, "{full}");
    assert_eq!(
        http.get(s.url("/healthz"))
            .send()
            .await
            .expect("GET")
            .status(),
        200
    );

    let open = server(ServerOptions {
        metrics: Some(render),
        ..with_token()
    })
    .await;
    let resp = http.get(open.url("/metrics")).send().await.expect("GET");
    assert_eq!(resp.status(), 200);
    let detail: Value = http
        .get(open.url("/readyz"))
        .send()
        .await
        .expect("GET")
        .json()
        .await
        .expect("json");
    assert_eq!(detail["store"]["up"], true, "{detail}");
}
