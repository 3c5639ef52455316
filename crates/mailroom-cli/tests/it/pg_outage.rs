//! `mailroom serve` on PostgreSQL while the database crash-restarts under
//! load (`pg_ctl restart -m immediate`) and then stays down for a while.
//! The database is a private cluster this test owns, never the shared one.
//!
//! If the store fails, the answer is 503, never 200 — and the
//! process must ride the outage out and serve again afterwards. What was
//! acknowledged is judged by the fault matrix's checker
//! (`mailroom_testkit::harness::check`), as `cluster` is.

use crate::support;

use crate::support::write_config;
use mailroom_testkit::PrivatePostgres;
use mailroom_testkit::harness::check::{self, Expect};
use mailroom_testkit::harness::{Ack, Recorder, store};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
/// No request may take longer than this (it would count as a hang).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
/// The topic's lease, in seconds.
const LEASE_SECS: u64 = 3;

/// Load phases, in order.
const NORMAL: u8 = 0;
const RESTARTING: u8 = 1;
const AFTER_RESTART: u8 = 2;
const DOWN: u8 = 3;
const STARTING: u8 = 4;
const SETTLED: u8 = 5;
const PHASES: [&str; 6] = [
    "normal",
    "restarting",
    "after restart",
    "down",
    "starting",
    "settled",
];

#[derive(Debug, Clone)]
enum Answer {
    Stored,
    Unavailable,
    Unexpected(String),
}

#[derive(Debug, Clone)]
struct Outcome {
    /// Phase when the request was sent.
    sent: u8,
    answer: Answer,
    took: Duration,
    /// When the answer came, since the test started.
    at: Duration,
}

#[allow(clippy::too_many_arguments)]
async fn client(
    c: usize,
    http: reqwest::Client,
    base: String,
    phase: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Outcome>>>,
    epoch: Instant,
    rec: Recorder,
) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let id = format!("w{c}-{i}");
        let sent = phase.load(Ordering::Relaxed);
        let started = Instant::now();
        let sent_at = rec.now();
        let answer = match http
            .post(format!("{base}/webhooks/load"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"id":"{id}","n":{i}}}"#))
            .send()
            .await
        {
            Ok(r) if r.status() == 200 => match r.json::<serde_json::Value>().await {
                Ok(v) => {
                    let at = rec.now();
                    rec.lock().acks.push(Ack {
                        dedup_key: id,
                        event_id: v["id"].as_str().unwrap_or_default().to_owned(),
                        duplicate: v["duplicate"].as_bool().unwrap_or_default(),
                        key: None,
                        seq: i,
                        sent_at,
                        at,
                    });
                    Answer::Stored
                }
                Err(e) => Answer::Unexpected(format!("200 without its JSON: {e}")),
            },
            Ok(r) if r.status() == 503 => {
                let ct = r
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                if ct == "application/problem+json" {
                    Answer::Unavailable
                } else {
                    Answer::Unexpected(format!("503 with content-type {ct:?}"))
                }
            }
            Ok(r) => {
                let status = r.status();
                Answer::Unexpected(format!("{status}: {:?}", r.text().await))
            }
            Err(e) => Answer::Unexpected(format!("no answer: {e}")),
        };
        let backoff = matches!(answer, Answer::Unavailable);
        log.lock().expect("lock").push(Outcome {
            sent,
            answer,
            took: started.elapsed(),
            at: epoch.elapsed(),
        });
        if backoff {
            // What a well-behaved sender does with 503 + Retry-After (shortened).
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Runs a blocking `PrivatePostgres` operation off the runtime's workers.
async fn blocking(pg: &Arc<PrivatePostgres>, f: fn(&PrivatePostgres)) {
    let pg = pg.clone();
    tokio::task::spawn_blocking(move || f(&pg))
        .await
        .expect("pg_ctl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_rides_out_a_postgres_restart_under_load() {
    let t0 = Instant::now();
    let pg = Arc::new(
        tokio::task::spawn_blocking(PrivatePostgres::start)
            .await
            .expect("private postgres"),
    );
    let (receiver, rec) = support::receiver(Duration::ZERO).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(
        dir.path(),
        &format!(
            r#"
[[source]]
name = "load"
topic = "jobs"
id = {{ json = "/id" }}

[[topic]]
name = "jobs"
concurrency = 16
timeout = "2s"
lease = "{LEASE_SECS}s"
retry = {{ max_attempts = 50, base = "100ms", max_delay = "1s" }}
handler = {{ http = {{ url = "{}" }} }}
"#,
            receiver.url
        ),
    );
    let mut serve = {
        let (config, url) = (config.clone(), pg.url().to_owned());
        tokio::task::spawn_blocking(move || support::serve(&config, &url))
            .await
            .expect("start")
    };

    let http = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT)
        .build()
        .expect("client");
    let phase = Arc::new(AtomicU8::new(NORMAL));
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(client(
                c,
                http.clone(),
                serve.base.clone(),
                phase.clone(),
                stop.clone(),
                log.clone(),
                t0,
                rec.clone(),
            ))
        })
        .collect();
    let pause = |secs| tokio::time::sleep(Duration::from_secs(secs));

    pause(3).await;
    // 1. A crash-restart: every connection is cut, the server recovers.
    phase.store(RESTARTING, Ordering::Relaxed);
    let t = Instant::now();
    let from = rec.now();
    blocking(&pg, PrivatePostgres::restart_immediate).await;
    let restart_took = t.elapsed();
    // Completions the restart cut are redone after their leases.
    rec.disrupted_between(from, rec.now());
    phase.store(AFTER_RESTART, Ordering::Relaxed);
    pause(3).await;
    // 2. A longer outage, so that answers given while it lasts are observed.
    //    While PostgreSQL is down the insert task fails one group every 5 s
    //    (the pool's acquire timeout) and requests queued behind a failing
    //    group wait for the next one, so a 503 takes 5-10 s: 12 s of outage
    //    make sure some are answered inside the window.
    let from = rec.now();
    blocking(&pg, PrivatePostgres::stop_immediate).await;
    phase.store(DOWN, Ordering::Relaxed);
    // Answers from 1 s after the stop on: anything committed before it has
    // surely been answered by then, even on a busy machine.
    let down_from = t0.elapsed() + Duration::from_secs(1);
    pause(12).await;
    let down_to = t0.elapsed();
    phase.store(STARTING, Ordering::Relaxed);
    blocking(&pg, PrivatePostgres::start_again).await;
    rec.disrupted_between(from, rec.now());
    // Give the pool a moment to reconnect, then everything must be 200.
    pause(3).await;
    phase.store(SETTLED, Ordering::Relaxed);
    pause(3).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }

    assert!(serve.alive(), "mailroom serve died during the outage");
    let outcomes = log.lock().expect("lock").clone();
    let stored = |a: &Answer| matches!(a, Answer::Stored);
    let unavailable = |a: &Answer| matches!(a, Answer::Unavailable);
    // By the phase the request was sent in.
    let count = |p: u8, f: fn(&Answer) -> bool| {
        outcomes
            .iter()
            .filter(|o| o.sent == p && f(&o.answer))
            .count()
    };
    // By when the answer came: while PostgreSQL was certainly down.
    let while_down = |f: fn(&Answer) -> bool| {
        outcomes
            .iter()
            .filter(|o| o.at > down_from && o.at < down_to && f(&o.answer))
            .count()
    };
    let unexpected: Vec<&str> = outcomes
        .iter()
        .filter_map(|o| match &o.answer {
            Answer::Unexpected(what) => Some(what.as_str()),
            _ => None,
        })
        .collect();
    let slowest = outcomes.iter().map(|o| o.took).max().unwrap_or_default();
    let table: Vec<String> = (NORMAL..=SETTLED)
        .map(|p| {
            format!(
                "{}: {} x 200, {} x 503",
                PHASES[usize::from(p)],
                count(p, stored),
                count(p, unavailable)
            )
        })
        .collect();
    eprintln!(
        "pg outage: {} requests by phase sent: {}; answered while down ({:.1}s): {} x 503, \
         {} x 200; restart -m immediate took {:.1}s; slowest answer {:.1}s; \
         instance WARN/ERROR log lines: {:?}",
        outcomes.len(),
        table.join(", "),
        (down_to - down_from).as_secs_f64(),
        while_down(unavailable),
        while_down(stored),
        restart_took.as_secs_f64(),
        slowest.as_secs_f64(),
        serve.problem_summary()
    );
    assert!(
        unexpected.is_empty(),
        "{} answers were neither 200 nor 503 problem+json (or never came), e.g. {:?}",
        unexpected.len(),
        unexpected.first()
    );
    assert!(count(NORMAL, stored) > 0, "no load before the restart");
    assert!(
        count(AFTER_RESTART, stored) > 0,
        "no 200 after the crash-restart"
    );
    assert!(
        while_down(unavailable) > 0,
        "no 503 while PostgreSQL was down"
    );
    assert_eq!(while_down(stored), 0, "200 while PostgreSQL was down");
    assert!(
        count(SETTLED, stored) > 0,
        "no 200 after PostgreSQL came back"
    );
    assert_eq!(
        count(SETTLED, unavailable),
        0,
        "still 503 seconds after PostgreSQL came back"
    );

    // Every event answered 200 is stored, and the dispatcher (claims,
    // completions) recovered too: everything gets done, by a successful
    // call, never two runs of an event at once: the fault matrix's checker.
    let pool = sqlx::PgPool::connect(pg.url()).await.expect("connect");
    let drain_time = support::wait_all_done(
        &pool,
        Duration::from_secs(60),
        "not done 60 s after the outage",
    )
    .await;
    // Deliveries in flight at the last check have ended by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let rows = store::rows(pg.url()).await.expect("rows");
    // On a loaded machine a completion's commit can outlive the 3-s lease,
    // and the event runs again once it expired (at least once), never at once.
    let expect = Expect {
        lease: Some(Duration::from_secs(LEASE_SECS)),
        ..Expect::default()
    };
    let verdict = check::check(&rec.snapshot(), &rows, &expect);
    assert!(
        verdict.lost == 0 && verdict.duplicates == 0 && verdict.order == 0,
        "{verdict:#?}"
    );
    assert!(serve.alive(), "mailroom serve died");
    pool.close().await;
    drop(serve);
    eprintln!(
        "pg outage: {} acknowledged, all stored ({} more stored though answered 503: \
         cut after the commit); all delivered, {} run again; drain {:.1}s; total {:.1}s",
        verdict.acked,
        rows.len() - verdict.acked,
        verdict.excused,
        drain_time.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}
