//! `mailroom serve` over HTTPS (`[tls] cert_file, key_file`): clients that
//! trust the CA send webhooks and `/v1/events`; the certificate is renewed
//! under load with SIGHUP; a broken renewal and plain HTTP on the port are
//! refused without harm; a bad pair stops the start naming the key.
//!
//! Certificates come from `$MAILROOM_TEST_TLS_DIR` (`scripts/services.sh`);
//! renewed ones are issued here by the same test CA with openssl.

use crate::support;
use crate::support::{run_mailroom, write_config};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOKEN: &str = "https-test-token";

fn tls_dir() -> PathBuf {
    PathBuf::from(std::env::var("MAILROOM_TEST_TLS_DIR").expect(
        "MAILROOM_TEST_TLS_DIR names the test certificates: run scripts/services.sh up and eval its env",
    ))
}

/// The DER of the first certificate in a PEM file.
fn der(pem: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(pem)
        .unwrap_or_else(|e| panic!("{}: {e}", pem.display()))
        .to_vec()
}

/// Issues a new certificate for localhost and 127.0.0.1 from the test CA
/// (a fresh key, a random serial) as `<name>.pem` and `<name>.key` in `dir`.
fn issue(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let ca = tls_dir();
    let (cert, key, csr) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.csr")),
    );
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let s = |p: &Path| p.display().to_string();
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &s(&key),
        "-out",
        &s(&csr),
    ]);
    let serial = format!(
        "0x{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos()
    );
    openssl(&[
        "x509",
        "-req",
        "-in",
        &s(&csr),
        "-CA",
        &s(&ca.join("ca.pem")),
        "-CAkey",
        &s(&ca.join("ca.key")),
        "-set_serial",
        &serial,
        "-days",
        "1",
        "-extfile",
        &s(&ca.join("server.ext")),
        "-out",
        &s(&cert),
    ]);
    (cert, key)
}

/// Copies `from` over `to` the way a deploy hook does: a whole new file
/// renamed into place, never a half-written one.
fn replace(from: &Path, to: &Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).expect("copy");
    std::fs::rename(&tmp, to).expect("rename into place");
}

/// A client trusting only the test CA, reporting the server's certificate;
/// `keep_alive = false` opens a new connection for every request. (A new
/// connection of the same client may resume its TLS session, and then
/// reports the certificate of the session: see [`send_new`].)
fn client(keep_alive: bool) -> reqwest::Client {
    let ca = std::fs::read(tls_dir().join("ca.pem")).expect("ca.pem");
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).expect("ca")])
        .tls_info(true)
        .timeout(Duration::from_secs(10));
    if !keep_alive {
        b = b.pool_max_idle_per_host(0);
    }
    b.build().expect("client")
}

/// The certificate the server presented on the answer's connection.
fn served(resp: &reqwest::Response) -> Vec<u8> {
    resp.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("the answer came over TLS")
        .to_vec()
}

/// A config serving `cert`/`key` (copied into `dir` as `server.pem` and
/// `server.key`, the files a renewal replaces).
fn config(dir: &Path, cert: &Path, key: &Path) -> PathBuf {
    std::fs::copy(cert, dir.join("server.pem")).expect("copy cert");
    std::fs::copy(key, dir.join("server.key")).expect("copy key");
    write_config(
        dir,
        &format!(
            "api_token = \"{TOKEN}\"\n\n[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n[limits]\ntls_handshake_timeout = \"3s\"\n\n[[source]]\nname = \"orders\"\n\n[[topic]]\nname = \"orders\"\nhandler = {{ pull = true }}\n",
            dir.join("server.pem").display(),
            dir.join("server.key").display()
        ),
    )
}

fn store(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("mailroom.db").display())
}

/// [`send`] from a new client: a new connection and a full handshake
/// (no session to resume), so the answer shows the certificate served now.
async fn send_new(base: &str, n: u64) -> Result<Vec<u8>, String> {
    send(&client(false), base, n).await
}

/// One request of the load: a webhook or a `POST /v1/events`, by turn.
async fn send(http: &reqwest::Client, base: &str, n: u64) -> Result<Vec<u8>, String> {
    let req = if n % 2 == 0 {
        http.post(format!("{base}/webhooks/orders"))
            .header("webhook-id", format!("w-{n}"))
            .json(&serde_json::json!({"n": n}))
    } else {
        http.post(format!("{base}/v1/events"))
            .bearer_auth(TOKEN)
            .header("idempotency-key", format!("e-{n}"))
            .json(&serde_json::json!({"topic": "orders", "payload": {"n": n}}))
    };
    let resp = req.send().await.map_err(|e| format!("{e:?}"))?;
    let cert = served(&resp);
    match resp.status().as_u16() {
        200 | 201 => Ok(cert),
        s => Err(format!(
            "HTTP {s}: {}",
            resp.text().await.unwrap_or_default()
        )),
    }
}

/// Served over HTTPS, webhooks and `/v1/events` are accepted and the
/// dashboard's session cookie is `Secure` (named `__Host-`); renewing the
/// certificate under load (new and kept-alive connections) with SIGHUP
/// fails no request: new connections get the new certificate, a kept-alive
/// one goes on with the old; a mismatched renewal is refused with an
/// ERROR and the current certificate kept; plain HTTP to the port fails
/// cleanly, a silent socket is closed at the handshake deadline, and the
/// server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_and_renews_its_certificate_under_load_with_sighup() {
    let tls = tls_dir();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &tls.join("server.pem"), &tls.join("server.key"));
    let serve = {
        let (cfg, store) = (cfg.clone(), store(dir.path()));
        tokio::task::spawn_blocking(move || support::serve(&cfg, &store))
            .await
            .expect("start")
    };
    assert!(
        serve.base.starts_with("https://"),
        "the start-up log says https: {}",
        serve.base
    );
    let old = der(&tls.join("server.pem"));
    let fresh = client(false);
    assert_eq!(
        send(&fresh, &serve.base, 0).await.expect("a webhook"),
        old,
        "the configured certificate is served"
    );
    send(&fresh, &serve.base, 1).await.expect("POST /v1/events");
    let login = fresh
        .get(format!("{}/ui/login", serve.base))
        .send()
        .await
        .expect("the login page");
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|c| c.to_str().ok())
        .unwrap_or_default();
    assert!(
        cookie.starts_with("__Host-mailroom_session=") && cookie.contains("; Secure"),
        "over HTTPS the session cookie is Secure and __Host- prefixed: {cookie:?}"
    );

    // The load: two loops opening a connection per request, two keeping
    // one alive; every answer's certificate is recorded.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(2));
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut loops = Vec::new();
    for keep_alive in [false, false, true, true] {
        let (stop, sent, failures, base) = (
            stop.clone(),
            sent.clone(),
            failures.clone(),
            serve.base.clone(),
        );
        loops.push(tokio::spawn(async move {
            let http = client(true);
            let mut seen = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let n = sent.fetch_add(1, Ordering::Relaxed);
                let answer = match keep_alive {
                    true => send(&http, &base, n).await,
                    false => send_new(&base, n).await,
                };
                match answer {
                    Ok(cert) => seen.push(cert),
                    Err(e) => failures.lock().expect("lock").push(e),
                }
            }
            (keep_alive, seen)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (new_cert, new_key) = issue(dir.path(), "renewed");
    let new = der(&new_cert);
    assert_ne!(new, old);
    replace(&new_key, &dir.path().join("server.key"));
    replace(&new_cert, &dir.path().join("server.pem"));
    serve.signal("HUP").expect("kill -HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = send_new(&serve.base, sent.fetch_add(1, Ordering::Relaxed))
            .await
            .expect("a request during the renewal");
        if got == new {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new connections never got the renewed certificate; warnings: {:?}",
            serve.problem_summary()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut before_and_after = false;
    for l in loops {
        let (keep_alive, seen) = l.await.expect("load loop");
        assert!(!seen.is_empty());
        if keep_alive {
            // Its one connection was opened before the renewal and kept.
            assert!(
                seen.iter().all(|c| *c == old),
                "a kept-alive connection was dropped"
            );
        } else {
            before_and_after |= seen.first() == Some(&old) && seen.last() == Some(&new);
        }
    }
    assert!(
        before_and_after,
        "new connections saw the old certificate, then the new one"
    );
    let failures = failures.lock().expect("lock").clone();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed during the renewal, e.g. {:?}",
        failures.len(),
        sent.load(Ordering::Relaxed),
        failures.first()
    );

    // A renewal whose key is not the certificate's is refused; the
    // renewed certificate stays.
    replace(&tls.join("client.key"), &dir.path().join("server.key"));
    serve.signal("HUP").expect("kill -HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !serve
        .problems()
        .iter()
        .any(|l| l.contains("\"ERROR\"") && l.contains("not reloaded") && l.contains("key_file"))
    {
        assert!(
            Instant::now() < deadline,
            "no ERROR for the bad pair: {:?}",
            serve.problem_summary()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        send_new(&serve.base, 1_000_000)
            .await
            .expect("served after a refused renewal"),
        new
    );

    // Plain HTTP to the HTTPS port: a clean failure, not a hang.
    let plain = serve.base.replacen("https://", "http://", 1);
    let started = Instant::now();
    let answer = reqwest::Client::new()
        .post(format!("{plain}/webhooks/orders"))
        .timeout(Duration::from_secs(5))
        .body("{}")
        .send()
        .await;
    assert!(
        answer.is_err() && started.elapsed() < Duration::from_secs(4),
        "plain HTTP is refused at once: {answer:?}"
    );

    // A socket that never says anything is closed at the 3 s deadline (long
    // enough for a full handshake on a busy test machine).
    let addr = serve.base.trim_start_matches("https://").to_owned();
    let mut silent = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut silent, &mut buf),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the silent socket was closed: {read:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(2900));

    assert_eq!(
        send_new(&serve.base, 1_000_001)
            .await
            .expect("still serving"),
        new
    );
}

/// `serve` refuses to start on a missing key or a key that is not the
/// certificate's, naming the key and the file.
#[test]
fn a_missing_or_mismatched_key_stops_the_start_naming_the_key_and_file() {
    let tls = tls_dir();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), &tls.join("server.pem"), &tls.join("client.key"));
    let (ok, _, err) = run_mailroom(
        &cfg,
        &store(dir.path()),
        &["serve", "--listen", "127.0.0.1:0"],
        Duration::from_secs(30),
    );
    assert!(!ok, "a mismatched key is refused");
    let key = dir.path().join("server.key").display().to_string();
    assert!(
        err.contains("tls.key_file") && err.contains(&key) && err.contains("does not match"),
        "{err}"
    );

    std::fs::remove_file(dir.path().join("server.key")).expect("rm key");
    let (ok, _, err) = run_mailroom(
        &cfg,
        &store(dir.path()),
        &["serve", "--listen", "127.0.0.1:0"],
        Duration::from_secs(30),
    );
    assert!(!ok, "a missing key is refused");
    assert!(
        err.contains("tls.key_file") && err.contains(&key) && err.contains("cannot read"),
        "{err}"
    );
    // `config check` finds it too.
    let (ok, _, err) = run_mailroom(
        &cfg,
        &store(dir.path()),
        &["config", "check"],
        Duration::from_secs(30),
    );
    assert!(!ok && err.contains("tls.key_file"), "{err}");
}
