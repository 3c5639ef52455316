//! The `mailroom` binary on the test PostgreSQL that accepts only TLS
//! (`MAILROOM_TEST_POSTGRES_TLS_URL`): what an operator sees when the
//! certificate cannot be verified, and where verify-full finds its CA
//! when the URL names none.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{run_mailroom, write_config};
use mailroom_testkit::{postgres_tls_admin_url, tls_dir, with_params};
use std::process::Command;
use std::time::{Duration, Instant};

/// `mailroom serve` with a CA that did not sign the server's certificate
/// exits non-zero within seconds (as for any store it cannot open), with
/// a message that names TLS, the reason and `sslrootcert`, and never the
/// password of the URL.
#[test]
fn serve_with_the_wrong_ca_exits_at_once_naming_tls_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let admin = postgres_tls_admin_url().replacen("://postgres@", "://postgres:s3cret-pw@", 1);
    let url = with_params(
        &admin,
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            tls_dir().join("other-ca.pem").display()
        ),
    );
    let started = Instant::now();
    let (ok, _, stderr) = run_mailroom(
        &config,
        &url,
        &["serve", "--listen", "127.0.0.1:0"],
        Duration::from_secs(60),
    );
    let took = started.elapsed();
    assert!(!ok, "serve must fail: {stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
    for needle in ["TLS handshake failed", "UnknownIssuer", "set sslrootcert"] {
        assert!(stderr.contains(needle), "no {needle:?} in: {stderr}");
    }
    assert!(
        !stderr.contains("s3cret-pw"),
        "the password leaked: {stderr}"
    );
}

/// verify-full without `sslrootcert` trusts the system's roots, which
/// `SSL_CERT_FILE` points at here: with the test CA there the binary
/// connects; without it the same URL is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_without_sslrootcert_uses_the_system_roots() {
    let fresh = mailroom_testkit::fresh_postgres_tls_db().await;
    let db = fresh.split_once('?').expect("a query").0;
    let url = with_params(db, "sslmode=verify-full");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let status = |roots: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg("--config")
            .arg(&config)
            .arg("status")
            .env_remove("MAILROOM_CONFIG")
            .env("MAILROOM_STORE_URL", &url)
            .env("SSL_CERT_FILE", roots)
            .env_remove("SSL_CERT_DIR")
            .output()
            .expect("run mailroom status");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = status(&tls_dir().join("ca.pem"));
    assert!(ok, "{stderr}");
    assert!(stdout.contains("no events yet"), "{stdout}");
    let (ok, _, stderr) = status(&tls_dir().join("other-ca.pem"));
    assert!(!ok);
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
}
