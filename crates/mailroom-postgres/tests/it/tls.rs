//! PostgreSQL over TLS with libpq's URL parameters, against the test server
//! that accepts only TLS (`MAILROOM_TEST_POSTGRES_TLS_URL`: hostssl lines
//! only, the role `mailroom` by client certificate) and, for what one
//! server cannot present (an expired certificate, a name it does not
//! hold), a fake PostgreSQL in the test that answers the SSLRequest and
//! then shakes hands with the certificate given to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mailroom_conformance::event;
use mailroom_core::{ClaimRequest, Completion, OnDead, Status, Store, StoreError};
use mailroom_postgres::{PostgresOptions, PostgresStore};
use mailroom_testkit::{postgres_tls_admin_url, tls_dir, with_params};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TLS failure must be reported at once, never after a retry loop.
const FAST: Duration = Duration::from_secs(3);

fn file(name: &str) -> String {
    tls_dir().join(name).display().to_string()
}

fn verify_full(ca: &str) -> String {
    format!("sslmode=verify-full&sslrootcert={}", file(ca))
}

/// Opens a store (no LISTEN, a small pool), or the error a user would see.
async fn open(url: &str) -> Result<PostgresStore, StoreError> {
    let mut opts = PostgresOptions::from_url(url)?;
    opts.listen = false;
    opts.pool_size = 2;
    PostgresStore::connect(opts).await
}

/// Opens a store that must fail, within [`FAST`]; its error text.
async fn refused(url: &str) -> String {
    let started = Instant::now();
    let e = open(url).await.expect_err("the connection is refused");
    assert!(
        started.elapsed() < FAST,
        "refused only after {:?}: {e}",
        started.elapsed()
    );
    e.to_string()
}

/// Whether the store's connection is encrypted, as the server sees it.
async fn encrypted(store: &PostgresStore) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

fn claim_req(topic: &str, per_key: Option<OnDead>) -> ClaimRequest {
    ClaimRequest {
        topic: topic.into(),
        worker: "w".into(),
        max: 10,
        lease: Duration::from_secs(30),
        per_key,
        max_wait_for_priority: None,
        expire_after: None,
    }
}

/// A store over verify-full works end to end: inserts, claims of both
/// kinds (a sequential topic's through its claimer connection), completions,
/// and LISTEN wake-ups from another instance, all on the TLS-only server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_verify_full_inserts_claims_completes_and_wakes() {
    let url = mailroom_testkit::fresh_postgres_tls_db().await;
    let connect = |url: String| async move {
        let store = PostgresStore::connect(PostgresOptions::from_url(&url).unwrap())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store
    };
    let store = connect(url.clone()).await;
    assert!(encrypted(&store).await);
    let mut wakes = store.subscribe();
    let other = connect(url).await;
    other.insert(event("orders", "e1", None)).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(2), wakes.recv()).await;
    assert_eq!(woken.expect("woken by LISTEN").unwrap(), "orders");
    store
        .insert(event("ledger", "k1", Some("acct-1")))
        .await
        .unwrap();

    for (topic, per_key) in [("orders", None), ("ledger", Some(OnDead::Block))] {
        let claimed = store.claim(&claim_req(topic, per_key)).await.unwrap();
        assert_eq!(claimed.len(), 1, "{topic}");
        let c = &claimed[0];
        store
            .complete(c.event.id, c.token, Completion::Done)
            .await
            .unwrap();
        let done = store.get(c.event.id).await.unwrap().unwrap();
        assert_eq!(done.status, Status::Done, "{topic}");
    }
}

/// `sslmode=require` encrypts without a CA (the certificate is not
/// checked), and so does the default, `prefer`, when the server offers TLS.
#[tokio::test]
async fn require_and_prefer_encrypt_without_a_ca() {
    for params in ["sslmode=require", "sslmode=prefer", ""] {
        let store = open(&with_params(&postgres_tls_admin_url(), params))
            .await
            .unwrap_or_else(|e| panic!("{params:?}: {e}"));
        assert!(encrypted(&store).await, "{params:?}");
    }
}

/// `prefer` falls back to a plain connection only where the server offers
/// no TLS; `require` then refuses, saying why.
#[tokio::test]
async fn prefer_falls_back_to_plain_only_where_tls_is_not_offered() {
    let plain = mailroom_testkit::postgres_admin_url();
    let store = open(&with_params(&plain, "sslmode=prefer")).await.unwrap();
    assert!(!encrypted(&store).await);
    let e = refused(&with_params(&plain, "sslmode=require")).await;
    assert!(e.contains("TLS") && e.contains("did not offer it"), "{e}");
}

/// verify-full with a CA that did not sign the server's certificate fails
/// at once, naming TLS, the reason and `sslrootcert`; so do verify-ca,
/// `require` with that CA file (libpq: a CA file makes `require` verify
/// it), and verify-full without a CA file (the system's roots do not hold
/// the test CA): never a silent fallback to an unverified connection.
#[tokio::test]
async fn the_wrong_ca_is_refused_at_once_naming_the_certificate_problem() {
    let admin = postgres_tls_admin_url();
    for params in [
        verify_full("other-ca.pem"),
        format!("sslmode=verify-ca&sslrootcert={}", file("other-ca.pem")),
        format!("sslmode=require&sslrootcert={}", file("other-ca.pem")),
        "sslmode=verify-full".to_owned(),
    ] {
        let e = refused(&with_params(&admin, &params)).await;
        assert!(e.contains("TLS handshake failed"), "{params}: {e}");
        assert!(e.contains("UnknownIssuer"), "{params}: {e}");
        assert!(e.contains("set sslrootcert"), "{params}: {e}");
    }
}

/// A plain connection to the TLS-only server is refused by its pg_hba.conf,
/// and the error says the server wants TLS and which sslmode to set.
#[tokio::test]
async fn a_plain_connection_to_a_tls_only_server_is_refused_with_the_fix() {
    let e = refused(&with_params(&postgres_tls_admin_url(), "sslmode=disable")).await;
    assert!(e.contains("no encryption"), "{e}");
    assert!(e.contains("accepts only TLS connections"), "{e}");
    assert!(e.contains("sslmode=verify-full"), "{e}");
}

/// The role `mailroom` logs in by its client certificate (`cert` auth);
/// without `sslcert`/`sslkey` it is refused with that fix named.
#[tokio::test]
async fn a_client_certificate_logs_in_as_its_role_and_none_is_refused() {
    let admin = postgres_tls_admin_url();
    let as_mailroom = admin.replacen("://postgres@", "://mailroom@", 1);
    assert_ne!(as_mailroom, admin);
    let with_cert = format!(
        "{}&sslcert={}&sslkey={}",
        verify_full("ca.pem"),
        file("client.pem"),
        file("client.key")
    );
    let store = open(&with_params(&as_mailroom, &with_cert)).await.unwrap();
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(user, "mailroom");

    let e = refused(&with_params(&as_mailroom, &verify_full("ca.pem"))).await;
    assert!(e.contains("requires a valid client certificate"), "{e}");
    assert!(e.contains("set sslcert and sslkey"), "{e}");
}

/// A fake PostgreSQL on `ip`: answers the client's SSLRequest with `S`,
/// then shakes hands presenting `cert`/`key` from the test directory, and
/// closes. Returns its port and the count of completed handshakes.
async fn fake_server(ip: &str, cert: &str, key: &str) -> (u16, Arc<AtomicUsize>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(file(cert))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(file(key)).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let count = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let count = count.clone();
            tokio::spawn(async move {
                // SSLRequest: length 8, code 80877103.
                let mut request = [0u8; 8];
                socket.read_exact(&mut request).await.unwrap();
                assert_eq!(request, [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
                socket.write_all(b"S").await.unwrap();
                if let Ok(mut tls) = acceptor.accept(socket).await {
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    (port, handshakes)
}

/// An expired server certificate, though signed by the trusted CA, is
/// refused at once with the reason.
#[tokio::test]
async fn an_expired_server_certificate_is_refused() {
    let (port, handshakes) = fake_server("127.0.0.1", "expired.pem", "expired.key").await;
    let url = format!(
        "postgres://postgres@localhost:{port}/postgres?{}",
        verify_full("ca.pem")
    );
    let e = refused(&url).await;
    assert!(e.contains("TLS handshake failed"), "{e}");
    assert!(e.contains("expired"), "{e}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 0);
}

/// verify-full refuses a valid certificate that does not name the host
/// connected to (127.0.0.2 is not among server.pem's names); verify-ca,
/// which checks only the CA, completes that handshake.
#[tokio::test]
async fn verify_full_refuses_a_certificate_for_another_name_and_verify_ca_accepts_it() {
    let (port, handshakes) = fake_server("127.0.0.2", "server.pem", "server.key").await;
    let base = format!("postgres://postgres@127.0.0.2:{port}/postgres");
    let e = refused(&with_params(&base, &verify_full("ca.pem"))).await;
    assert!(e.contains("TLS handshake failed"), "{e}");
    assert!(e.contains("does not name the host"), "{e}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 0);

    let verify_ca = format!("sslmode=verify-ca&sslrootcert={}", file("ca.pem"));
    // The fake closes after the handshake, so the connection still fails,
    // but not in TLS.
    let e = refused(&with_params(&base, &verify_ca)).await;
    assert!(!e.contains("TLS"), "{e}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 1);
}
