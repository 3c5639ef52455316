//! Migrations from a deploy job with an owner role, and `mailroom serve`
//! under a role that may only use the schema's objects, with
//! `[store] migrate = "never"` (docs/src/guides/operations.md, "Migrations and least
//! privilege").

use crate::support;
use crate::support::{Serve, run_mailroom, write_config};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the server log may not hold: PostgreSQL's permission errors and
/// the warning of a VACUUM skipped for want of ownership.
const PERMISSION_PROBLEMS: &[&str] = &[
    "permission denied",
    "must be owner",
    "only table or database owner",
    "42501",
];

/// A handler endpoint on 127.0.0.1:0: answers 500 to payloads holding
/// `"fail":true` while `failing` is set, 200 otherwise; counts calls.
async fn receiver(failing: Arc<AtomicBool>, calls: Arc<AtomicUsize>) -> String {
    let app = axum::Router::new().route(
        "/deliver",
        axum::routing::post(move |body: axum::body::Bytes| {
            let (failing, calls) = (failing.clone(), calls.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let fail = String::from_utf8_lossy(&body).contains("\"fail\":true");
                if fail && failing.load(Ordering::SeqCst) {
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "no")
                } else {
                    (axum::http::StatusCode::OK, "ok")
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind receiver");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("receiver");
    });
    format!("http://{addr}/deliver")
}

fn config(receiver: &str) -> String {
    format!(
        r#"
[store]
migrate = "never"

[retention]
done = "1s"
dead = "1h"
dedup = "1h"

[[topic]]
name = "work"
retry = {{ max_attempts = 2, base = "100ms", max_delay = "100ms" }}
handler = {{ http = {{ url = "{receiver}" }} }}

[[topic]]
name = "ordered"
mode = "sequential"
key = "/k"
rate = "200/s"
max_running = 2
handler = {{ http = {{ url = "{receiver}" }} }}

[[topic]]
name = "pulled"
handler = {{ pull = true }}
"#
    )
}

/// `url` with `role` as its user (and no password).
fn as_role(url: &str, role: &str) -> String {
    let scheme = url.find("://").expect("scheme") + 3;
    let host = url.rfind('@').map_or(scheme, |at| at + 1);
    format!("{}{role}@{}", &url[..scheme], &url[host..])
}

/// Polls `sql` (one bigint) on `pool` until it is `want`, for up to 20 s.
async fn until(pool: &sqlx::PgPool, sql: &'static str, want: i64, what: &str) {
    let started = Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar(sql)
            .fetch_one(pool)
            .await
            .expect("poll query");
        if n == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: {n}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Posts an event through `/v1/events` (each with its own
/// Idempotency-Key); its id.
async fn post(http: &reqwest::Client, base: &str, body: serde_json::Value) -> String {
    static SENT: AtomicUsize = AtomicUsize::new(0);
    let key = format!("least-privilege-{}", SENT.fetch_add(1, Ordering::SeqCst));
    let resp = http
        .post(format!("{base}/v1/events"))
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .expect("POST /v1/events");
    let status = resp.status();
    let text = resp.text().await.expect("answer");
    assert_eq!(status, 201, "{body}: {text}");
    let event: serde_json::Value = serde_json::from_str(&text).expect("event");
    event["id"].as_str().expect("id").to_owned()
}

/// Permission errors among a server's WARN and ERROR lines.
fn permission_problems(serve: &Serve) -> Vec<String> {
    let lines = serve.problems();
    lines
        .iter()
        .filter(|l| PERMISSION_PROBLEMS.iter().any(|p| l.contains(p)))
        .cloned()
        .collect()
}

/// The deploy-job pattern end to end: `mailroom migrate` as the owner,
/// the grants `mailroom migrate --print-grants` prints, then a real
/// `mailroom serve` under the restricted role with `migrate = "never"`:
/// intake, dispatch, completion, retries, a dead letter and its replay,
/// sequential order under a rate and `max_running`, a pull claim whose
/// lease is rescued, the counters folded, the maintenance lease taken,
/// retention on a restart, and other verbs, all without a permission error
/// in the log; an older schema is then refused at start, naming
/// `mailroom migrate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn serve_runs_under_a_dml_only_role_after_an_owner_migrates() {
    let owner_url = mailroom_testkit::fresh_postgres_db().await;
    let owner = sqlx::PgPool::connect(&owner_url).await.expect("owner pool");
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&owner)
        .await
        .expect("db");
    let role = format!("app_{db}");
    let app_url = as_role(&owner_url, &role);
    let failing = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let recv = receiver(failing.clone(), calls.clone()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write_config(dir.path(), &config(&recv));
    let limit = Duration::from_secs(60);

    // The role exists, without rights yet: `never` refuses the empty
    // database, naming `mailroom migrate`.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE ROLE \"{role}\" LOGIN")))
        .execute(&owner)
        .await
        .expect("create role");
    let (ok, _, err) = run_mailroom(&cfg, &app_url, &["status"], limit);
    assert!(!ok && err.contains("mailroom migrate"), "{err}");

    // The deploy job: migrate as the owner, grant the service's role.
    let (ok, out, err) = run_mailroom(&cfg, &owner_url, &["migrate"], limit);
    assert!(ok, "{err}");
    assert!(
        out.contains("migrated the schema from version 0 to"),
        "{out}"
    );
    let (ok, out, err) = run_mailroom(&cfg, &owner_url, &["migrate"], limit);
    assert!(ok && out.contains("schema up to date"), "{out}{err}");
    let (ok, grants, err) = run_mailroom(
        &cfg,
        &owner_url,
        &["migrate", "--print-grants", &role],
        limit,
    );
    assert!(ok, "{err}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(grants))
        .execute(&owner)
        .await
        .expect("the printed grants run");
    let can_create: bool = sqlx::query_scalar(
        "SELECT has_schema_privilege($1, 'mailroom', 'CREATE')
             OR has_database_privilege($1, current_database(), 'CREATE')",
    )
    .bind(&role)
    .fetch_one(&owner)
    .await
    .expect("privileges");
    assert!(!can_create, "the service's role may not change the schema");

    let serve = support::serve(&cfg, &app_url);
    let http = reqwest::Client::new();
    let base = serve.base.clone();
    for i in 0..5 {
        post(
            &http,
            &base,
            serde_json::json!({"topic": "work", "payload": {"n": i}}),
        )
        .await;
    }
    let doomed = post(
        &http,
        &base,
        serde_json::json!({"topic": "work", "payload": {"fail": true}}),
    )
    .await;
    for i in 0..6 {
        let key = format!("k{}", i % 2);
        let body =
            serde_json::json!({"topic": "ordered", "key": key, "payload": {"k": key, "n": i}});
        post(&http, &base, body).await;
    }
    post(
        &http,
        &base,
        serde_json::json!({"topic": "pulled", "payload": {}}),
    )
    .await;

    until(
        &owner,
        "SELECT count(*) FROM mailroom.events WHERE status = 'done'",
        11,
        "done events",
    )
    .await;
    until(
        &owner,
        "SELECT count(*) FROM mailroom.events WHERE status = 'dead' AND attempts = 2",
        1,
        "the failing event, dead after its retry",
    )
    .await;

    // A dead letter replayed once the handler recovers.
    failing.store(false, Ordering::SeqCst);
    let resp = http
        .post(format!("{base}/v1/events/{doomed}/replay"))
        .send()
        .await
        .expect("replay");
    assert_eq!(resp.status(), 200);
    until(
        &owner,
        "SELECT count(*) FROM mailroom.events WHERE status = 'done'",
        12,
        "done after the replay",
    )
    .await;

    // A pull claim left to expire is rescued by maintenance and claimed
    // again with the next token.
    let claim = |lease: &'static str| {
        let http = http.clone();
        let url = format!("{base}/v1/topics/pulled/claim");
        async move {
            let resp = http
                .post(url)
                .json(&serde_json::json!({"lease": lease}))
                .send()
                .await
                .expect("claim");
            assert_eq!(resp.status(), 200);
            let answer: serde_json::Value = resp.json().await.expect("claim answer");
            answer["events"].as_array().cloned().unwrap_or_default()
        }
    };
    let first = claim("300ms").await;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0]["token"], 1);
    let started = Instant::now();
    let again = loop {
        let got = claim("30s").await;
        if !got.is_empty() {
            break got;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "not rescued");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(again[0]["token"], 2, "{again:?}");
    let id = again[0]["id"].as_str().expect("id");
    let resp = http
        .post(format!("{base}/v1/events/{id}/ack"))
        .json(&serde_json::json!({"token": 2}))
        .send()
        .await
        .expect("ack");
    assert_eq!(resp.status(), 200);

    // Maintenance ran under the restricted role: it holds the lease and
    // folded the counters, which agree with the events.
    until(
        &owner,
        "SELECT count(*) FROM mailroom.leaders WHERE role = 'maintenance'",
        1,
        "the maintenance lease",
    )
    .await;
    until(
        &owner,
        "SELECT count(*) FROM mailroom.count_changes",
        0,
        "unfolded counter changes",
    )
    .await;
    let stats: serde_json::Value = http
        .get(format!("{base}/v1/stats"))
        .send()
        .await
        .expect("stats")
        .json()
        .await
        .expect("stats body");
    let done: i64 = sqlx::query_scalar(
        "SELECT n FROM mailroom.counts WHERE status = 'done' AND topic = 'work'",
    )
    .fetch_one(&owner)
    .await
    .expect("folded counts");
    assert_eq!(done, 6, "{stats}");

    let mut serve = serve;
    assert!(serve.terminate().expect("SIGTERM"), "a clean stop");
    let mut problems = permission_problems(&serve);

    // Retention runs when an instance takes over maintenance: the done
    // payloads (kept 1 s) are dropped by a second instance, and the other
    // verbs work under `never` too.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut serve = support::serve(&cfg, &app_url);
    until(
        &owner,
        "SELECT count(*) FROM mailroom.events WHERE status = 'done' AND payload IS NOT NULL",
        0,
        "done payloads past retention",
    )
    .await;
    let (ok, out, err) = run_mailroom(&cfg, &app_url, &["status"], limit);
    assert!(ok && out.contains("work"), "{out}{err}");
    let (ok, _, err) = run_mailroom(&cfg, &app_url, &["purge", "--older-than", "1s"], limit);
    assert!(ok, "{err}");
    assert!(serve.terminate().expect("SIGTERM"), "a clean stop");
    problems.extend(permission_problems(&serve));
    assert!(problems.is_empty(), "permission problems: {problems:?}");
    assert!(calls.load(Ordering::SeqCst) >= 13);

    // An older schema (its newest migration not recorded) is refused at
    // start under `never`, naming `mailroom migrate` and both versions.
    sqlx::query(
        "DELETE FROM mailroom.schema_migrations
         WHERE version = (SELECT max(version) FROM mailroom.schema_migrations)",
    )
    .execute(&owner)
    .await
    .expect("fake an older schema");
    let (ok, _, err) = run_mailroom(&cfg, &app_url, &["serve", "--listen", "127.0.0.1:0"], limit);
    assert!(!ok, "serve started on an older schema");
    assert!(err.contains("mailroom migrate"), "{err}");
    assert!(err.contains("older than this build's version"), "{err}");
}
