//! The `http` handler, configured from TOML, against a real receiver.

use crate::support::{Db, outcomes, start_with};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use mailroom_config::{Config, Specs};
use mailroom_server::ServerOptions;
use mailroom_signatures::{DEFAULT_TOLERANCE, Scheme, Verifier};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    at: Instant,
    headers: HeaderMap,
    body: Bytes,
}

type Log = Arc<Mutex<Vec<Received>>>;

/// `/ok` answers 200; `/flaky` 500 with `Retry-After: 1` the first time,
/// then 200; `/gone` 410.
async fn receive(
    State(log): State<Log>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let earlier = {
        let mut log = log.lock().expect("lock");
        let earlier = log.iter().filter(|r| r.path == path).count();
        log.push(Received {
            path: path.clone(),
            at: Instant::now(),
            headers,
            body,
        });
        earlier
    };
    match (path.as_str(), earlier) {
        ("flaky", 0) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("retry-after", "1")],
            "overloaded, come back in a second",
        )
            .into_response(),
        ("gone", _) => (StatusCode::GONE, "this endpoint was removed").into_response(),
        _ => StatusCode::OK.into_response(),
    }
}

async fn start_receiver(shutdown: CancellationToken) -> (String, Log) {
    let log: Log = Arc::default();
    let app = Router::new()
        .route("/{path}", post(receive))
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .expect("receiver");
    });
    (base, log)
}

fn requests_to(log: &Log, path: &str) -> Vec<Received> {
    log.lock()
        .expect("lock")
        .iter()
        .filter(|r| r.path == path)
        .cloned()
        .collect()
}

fn header<'a>(r: &'a Received, name: &str) -> &'a str {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("header {name} missing from {:?}", r.headers))
}

/// A topic with `handler = { http = { url, secret } }` from `mailroom.toml`
/// POSTs the original bytes and content type with Standard Webhooks
/// signature and the `mailroom-*` headers; a 500 with `Retry-After: 1` is
/// retried about a second later; a 410 sends the event straight to `dead`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_handler_delivers_signed_original_bytes_and_honours_status() {
    let receiver_stop = CancellationToken::new();
    let (receiver, log) = start_receiver(receiver_stop.clone()).await;
    let toml = format!(
        r#"
[[source]]
name = "shop"
topic = "orders"

[[source]]
name = "flaky"
topic = "flaky"

[[source]]
name = "gone"
topic = "gone"

[[topic]]
name = "orders"
handler = {{ http = {{ url = "{receiver}/ok", secret = "{SECRET}" }} }}

[[topic]]
name = "flaky"
# Only Retry-After can explain a retry within seconds.
retry = {{ max_attempts = 5, schedule = ["30s"] }}
handler = {{ http = {{ url = "{receiver}/flaky" }} }}

[[topic]]
name = "gone"
retry = {{ max_attempts = 5, schedule = ["50ms"] }}
handler = {{ http = {{ url = "{receiver}/gone" }} }}
"#
    );
    let config = Config::from_toml("mailroom.toml", &toml, &|_| None).expect("config");
    let server = start_with(
        Db::fresh().await,
        "127.0.0.1:0",
        ServerOptions::default(),
        |store| {
            Specs::from_config(&config)
                .expect("specs from config")
                .into_builder(store)
                .poll_interval(Duration::from_millis(200))
        },
    )
    .await;

    // Odd spacing and key order: only the original bytes verify.
    let original: &[u8] = b"{\"total\": 12.50,  \"id\" : \"ord_1\"}\n";
    let content_type = "application/vnd.shop+json; charset=utf-8";
    let resp = server
        .webhook(
            "shop",
            &[("webhook-id", "msg_shop_1"), ("content-type", content_type)],
            original,
        )
        .await;
    assert_eq!(resp.status(), 200);
    let id = resp.json::<serde_json::Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    let done = server.event_with_status(&id, "done").await;
    assert_eq!(done["attempts"], 1);

    let got = requests_to(&log, "ok");
    assert_eq!(got.len(), 1, "delivered once");
    let r = &got[0];
    assert_eq!(&r.body[..], original, "the original bytes");
    assert_eq!(header(r, "content-type"), content_type);
    assert_eq!(header(r, "webhook-id"), id, "webhook-id is the event id");
    assert_eq!(header(r, "mailroom-topic"), "orders");
    assert_eq!(header(r, "mailroom-attempt"), "1");
    assert_eq!(header(r, "mailroom-source"), "shop");
    assert_eq!(header(r, "mailroom-dedup-key"), "msg_shop_1");
    let ts: i64 = header(r, "webhook-timestamp")
        .parse()
        .expect("unix seconds");
    assert!((ts - jiff::Timestamp::now().as_second()).abs() < 60);
    assert!(header(r, "webhook-signature").starts_with("v1,"));
    let verifier =
        Verifier::new(Scheme::StandardWebhooks, [SECRET], DEFAULT_TOLERANCE).expect("verifier");
    verifier
        .verify(&r.headers, &r.body, jiff::Timestamp::now().as_second())
        .expect("the signature verifies with the topic's secret");
    let other = Verifier::new(
        Scheme::StandardWebhooks,
        ["whsec_dGhpcyBpcyBub3QgdGhlIHNlY3JldA=="],
        DEFAULT_TOLERANCE,
    )
    .expect("verifier");
    assert!(
        other
            .verify(&r.headers, &r.body, jiff::Timestamp::now().as_second())
            .is_err(),
        "another secret does not verify"
    );

    // 500 + Retry-After: 1 → the next attempt about a second later.
    let flaky = server
        .accept("flaky", "f-1", &serde_json::json!({"n": 1}))
        .await;
    let done = server.event_with_status(&flaky, "done").await;
    assert_eq!(outcomes(&done), ["retry", "done"]);
    assert!(
        done["history"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("500")),
        "{done}"
    );
    let got = requests_to(&log, "flaky");
    assert_eq!(got.len(), 2);
    assert_eq!(header(&got[0], "mailroom-attempt"), "1");
    assert_eq!(header(&got[1], "mailroom-attempt"), "2");
    let gap = got[1].at - got[0].at;
    assert!(
        gap >= Duration::from_secs(1),
        "Retry-After respected: {gap:?}"
    );
    assert!(
        gap < Duration::from_secs(4),
        "Retry-After, not the 30 s schedule: {gap:?}"
    );

    // 410 → dead at once, no retry.
    let gone = server
        .accept("gone", "g-1", &serde_json::json!({"n": 1}))
        .await;
    let dead = server.event_with_status(&gone, "dead").await;
    assert_eq!(dead["attempts"], 1);
    assert_eq!(outcomes(&dead), ["dead"]);
    assert!(
        dead["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("410")),
        "{dead}"
    );
    // Proving an absence takes a wait: six times the 50 ms schedule.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(requests_to(&log, "gone").len(), 1, "a 410 is never retried");

    server.stop().await;
    receiver_stop.cancel();
}

/// A receiver that answers every POST `307` to `elsewhere` (another host).
async fn start_redirector(elsewhere: String, shutdown: CancellationToken) -> String {
    let app = Router::new().route(
        "/{path}",
        post(move || {
            let to = elsewhere.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [("location", to)]).into_response() }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind redirector");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .expect("redirector");
    });
    base
}

/// Redirects are never followed: a receiver answering `307` to another
/// host gets no payload, signature or configured header sent there; the
/// attempt fails and its error names the status and the `Location`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_a_failed_attempt_and_nothing_reaches_its_target() {
    let stop = CancellationToken::new();
    let (elsewhere, log) = start_receiver(stop.clone()).await;
    let target = format!("{elsewhere}/stolen");
    let redirector = start_redirector(target.clone(), stop.clone()).await;
    let toml = format!(
        r#"
[[source]]
name = "shop"
topic = "orders"

[[topic]]
name = "orders"
retry = {{ max_attempts = 2, schedule = ["50ms"] }}
handler = {{ http = {{ url = "{redirector}/hook", secret = "{SECRET}", headers = {{ x-api-key = "k-123" }} }} }}
"#
    );
    let config = Config::from_toml("mailroom.toml", &toml, &|_| None).expect("config");
    let server = start_with(
        Db::fresh().await,
        "127.0.0.1:0",
        ServerOptions::default(),
        |store| {
            Specs::from_config(&config)
                .expect("specs from config")
                .into_builder(store)
                .poll_interval(Duration::from_millis(200))
        },
    )
    .await;

    let id = server
        .accept("shop", "r-1", &serde_json::json!({"secret": "payload"}))
        .await;
    let dead = server.event_with_status(&id, "dead").await;
    assert_eq!(outcomes(&dead), ["retry", "dead"], "{dead}");
    let error = dead["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("307") && error.contains(&target),
        "the error names the status and the Location: {dead}"
    );
    assert!(
        requests_to(&log, "stolen").is_empty(),
        "the redirect target received nothing"
    );

    server.stop().await;
    stop.cancel();
}

fn tls_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(std::env::var("MAILROOM_TEST_TLS_DIR").expect(
        "MAILROOM_TEST_TLS_DIR names the test certificates: run scripts/services.sh up and eval its env",
    ))
}

/// An HTTPS receiver (the test CA's `server.pem`) that requires a client
/// certificate signed by the test CA; requests are recorded as by
/// [`start_receiver`].
async fn start_mtls_receiver(shutdown: CancellationToken) -> (String, Log) {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let tls = tls_dir();
    let certs = CertificateDer::pem_file_iter(tls.join("server.pem"))
        .expect("server.pem")
        .collect::<Result<Vec<_>, _>>()
        .expect("server.pem");
    let key = PrivateKeyDer::from_pem_file(tls.join("server.key")).expect("server.key");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(tls.join("ca.pem")).expect("ca.pem"))
        .expect("ca");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("client verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(clients)
        .with_single_cert(certs, key)
        .expect("server certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let log: Log = Arc::default();
    let app = Router::new()
        .route("/{path}", post(receive))
        .with_state(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let base = format!("https://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => continue,
                },
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                // A client without an accepted certificate ends here.
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(tls),
                        hyper_util::service::TowerToHyperService::new(app),
                    )
                    .await;
            });
        }
    });
    (base, log)
}

/// With `ca_file` (an internal CA) and `client_cert`/`client_key`, an http
/// handler delivers to a receiver that requires mutual TLS; without the
/// client certificate, or trusting another CA, each attempt fails with the
/// TLS reason and is retried like any failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_handlers_trust_an_internal_ca_and_present_a_client_certificate() {
    let stop = CancellationToken::new();
    let (receiver, log) = start_mtls_receiver(stop.clone()).await;
    let tls = tls_dir();
    let (ca, other_ca, cert, key) = (
        tls.join("ca.pem").display().to_string(),
        tls.join("other-ca.pem").display().to_string(),
        tls.join("client.pem").display().to_string(),
        tls.join("client.key").display().to_string(),
    );
    let toml = format!(
        r#"
[[source]]
name = "mtls"

[[source]]
name = "nocert"

[[source]]
name = "wrongca"

[[topic]]
name = "mtls"
handler = {{ http = {{ url = "{receiver}/mtls", ca_file = "{ca}", client_cert = "{cert}", client_key = "{key}" }} }}

[[topic]]
name = "nocert"
retry = {{ max_attempts = 2, schedule = ["50ms"] }}
handler = {{ http = {{ url = "{receiver}/nocert", ca_file = "{ca}" }} }}

[[topic]]
name = "wrongca"
retry = {{ max_attempts = 2, schedule = ["50ms"] }}
handler = {{ http = {{ url = "{receiver}/wrongca", ca_file = "{other_ca}", client_cert = "{cert}", client_key = "{key}" }} }}
"#
    );
    let config = Config::from_toml("mailroom.toml", &toml, &|_| None).expect("config");
    let server = start_with(
        Db::fresh().await,
        "127.0.0.1:0",
        ServerOptions::default(),
        |store| {
            Specs::from_config(&config)
                .expect("specs from config")
                .into_builder(store)
                .poll_interval(Duration::from_millis(200))
        },
    )
    .await;

    let ok = server
        .accept("mtls", "m-1", &serde_json::json!({"n": 1}))
        .await;
    let nocert = server
        .accept("nocert", "n-1", &serde_json::json!({"n": 1}))
        .await;
    let wrongca = server
        .accept("wrongca", "w-1", &serde_json::json!({"n": 1}))
        .await;
    let done = server.event_with_status(&ok, "done").await;
    assert_eq!(done["attempts"], 1, "{done}");
    assert_eq!(requests_to(&log, "mtls").len(), 1);

    for (id, why) in [(nocert, "certificate"), (wrongca, "UnknownIssuer")] {
        let dead = server.event_with_status(&id, "dead").await;
        assert_eq!(outcomes(&dead), ["retry", "dead"], "{dead}");
        let error = dead["last_error"].as_str().unwrap_or_default();
        assert!(
            error.to_lowercase().contains(&why.to_lowercase()),
            "the error names the TLS reason ({why}): {dead}"
        );
    }
    assert!(requests_to(&log, "nocert").is_empty());
    assert!(requests_to(&log, "wrongca").is_empty());

    server.stop().await;
    stop.cancel();
}

/// TLS files of an http handler are read at start: a missing file, a key
/// without its certificate, and a key that is not the certificate's are
/// refused naming the handler's key path and the file.
#[test]
fn handler_tls_files_are_checked_at_start_naming_key_and_file() {
    let tls = tls_dir();
    let p = |f: &str| tls.join(f).display().to_string();
    let refused = |handler: String| {
        let toml = format!(
            "[[topic]]\nname = \"t\"\nhandler = {{ http = {{ url = \"https://127.0.0.1:1/\", {handler} }} }}\n"
        );
        let config = Config::from_toml("m.toml", &toml, &|_| None).expect("parses");
        match Specs::from_config(&config) {
            Ok(_) => panic!("accepted: {handler}"),
            Err(e) => e.to_string(),
        }
    };
    let e = refused(format!("ca_file = \"{}\"", p("nope.pem")));
    assert!(
        e.starts_with("m.toml: topic[0].handler.http.ca_file: ") && e.contains(&p("nope.pem")),
        "{e}"
    );
    let e = refused(format!("ca_file = \"{}\"", p("client.key")));
    assert!(
        e.contains("http.ca_file") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = refused(format!("client_cert = \"{}\"", p("client.pem")));
    assert!(e.contains("topic[0].handler.http.client_key"), "{e}");
    let e = refused(format!(
        "client_cert = \"{}\", client_key = \"{}\"",
        p("client.pem"),
        p("server.key")
    ));
    assert!(
        e.contains("http.client_key")
            && e.contains(&p("server.key"))
            && e.contains("does not match"),
        "{e}"
    );
}
