//! Scheduling limits held by running engines: `rate` and
//! `max_running` across three instances on one PostgreSQL database (three
//! engines, each with its own store handle, pool and LISTEN connection),
//! per process on SQLite, for pull claims too; a `429` + `Retry-After`
//! pausing the whole topic on every instance.

use mailroom::handler::http::{HttpHandler, HttpHandlerSettings};
use mailroom::handler::{SharedHandler, handler_fn};
use mailroom::{Draft, Engine, Event, Outcome, Rate, Store, TopicSpec};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

type Starts = Arc<Mutex<Vec<Instant>>>;

async fn postgres_url() -> String {
    mailroom_testkit::fresh_postgres_db().await
}

async fn store(url: &str) -> Arc<dyn Store> {
    let store = mailroom::open_store(url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

/// Engines over `stores`, each running `spec` with `handler(i)`.
fn engines(
    stores: Vec<Arc<dyn Store>>,
    spec: &TopicSpec,
    handler: impl Fn(usize) -> SharedHandler,
) -> Vec<Engine> {
    stores
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            Engine::builder(s)
                .topic(spec.clone())
                .handler(spec.name.clone(), handler(i))
                .worker_id(format!("instance-{i}"))
                .build()
                .expect("engine")
        })
        .collect()
}

struct Running {
    shutdown: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn run(engines: &[Engine]) -> Running {
    let shutdown = CancellationToken::new();
    let tasks = engines
        .iter()
        .map(|e| {
            let (e, s) = (e.clone(), shutdown.clone());
            tokio::spawn(async move { e.run(s).await })
        })
        .collect();
    Running { shutdown, tasks }
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            t.await.expect("engine stops");
        }
    }
}

async fn enqueue(engine: &Engine, topic: &str, n: usize) {
    for i in 0..n {
        let draft = Draft::json(topic, &serde_json::json!({ "i": i }));
        engine.enqueue(draft).await.expect("enqueue");
    }
}

async fn wait_for(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The most starts in any window of `width` beginning at a start.
fn busiest_window(starts: &mut [Instant], width: Duration) -> usize {
    starts.sort_unstable();
    let mut most = 0;
    let mut end = 0;
    for (i, &from) in starts.iter().enumerate() {
        while end < starts.len() && starts[end] < from + width {
            end += 1;
        }
        most = most.max(end - i);
    }
    most
}

fn recording(starts: &Starts) -> SharedHandler {
    recording_claims(starts, &Arc::default())
}

/// Records when each attempt started: in the handler (this process's
/// clock), and when the store claimed it (the store's clock: the lease's
/// end less its length).
fn recording_claims(starts: &Starts, claims: &Arc<Mutex<Vec<i64>>>) -> SharedHandler {
    let (starts, claims) = (starts.clone(), claims.clone());
    handler_fn(move |e: Event| {
        starts.lock().expect("lock").push(Instant::now());
        if let Some(until) = e.lease_until {
            let lease = i64::try_from(TopicSpec::new("x").lease.as_micros()).unwrap_or(0);
            claims
                .lock()
                .expect("lock")
                .push(until.as_microsecond() - lease);
        }
        async { Outcome::Success }
    })
}

/// `rate` across instances: three on one database, `rate = "100/s"`, 3,000
/// events queued before they start: no one-second window holds more than
/// 100 starts plus one grant (10) by the store's clock (the handlers' clock
/// allows for the lag from claim to handler), and the whole takes 30 s
/// within 10 %.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_holds_across_three_instances_on_postgres() {
    let url = postgres_url().await;
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(store(&url).await);
    }
    let rate = Rate::parse("100/s").expect("rate");
    let spec = TopicSpec::new("partner").concurrency(32).rate(rate);
    let starts: Starts = Arc::default();
    let claims: Arc<Mutex<Vec<i64>>> = Arc::default();
    let engines = engines(stores, &spec, |_| recording_claims(&starts, &claims));
    enqueue(&engines[0], "partner", 3000).await;
    let began = Instant::now();
    let running = run(&engines);
    wait_for("3,000 starts", Duration::from_secs(60), || {
        starts.lock().expect("lock").len() >= 3000
    })
    .await;
    let took = began.elapsed();
    running.stop().await;
    let mut starts = starts.lock().expect("lock").clone();
    let most = busiest_window(&mut starts, Duration::from_secs(1));
    let mut claims = claims.lock().expect("lock").clone();
    claims.sort_unstable();
    let mut claimed_most = 0;
    let mut end = 0;
    for (i, &from) in claims.iter().enumerate() {
        while end < claims.len() && claims[end] < from + 1_000_000 {
            end += 1;
        }
        claimed_most = claimed_most.max(end - i);
    }
    eprintln!(
        "3,000 starts in {took:?}; busiest second {most} by the handlers' clock, {claimed_most} by the store's claims"
    );
    // The budget never grants more than 100 + 10 in a second, and the
    // tokens are taken in the claim's own transaction, settled at the
    // claim's stamp: grants and claims alternate across instances, so no
    // grant taken before a window claims inside it. The claims' stamps
    // (the attempts' start on the store's clock) hold the documented bound:
    // at most the rate plus one grant in any window of its period.
    let bound = 100 + rate.grant() as usize;
    assert!(claimed_most <= bound, "{claimed_most} claims in one second");
    // A handler starts a few round trips and a task switch after its
    // claim's stamp, and that lag varies with the machine's load (at load
    // 11-12, 110-111 starts in the busiest second while the claims held
    // 109; in CI, beside the whole suite on 2 cores, 117 while the claims
    // held 109): the handlers' clock allows the rate over 100 ms of it.
    let lag = (rate.per_second() * 0.1) as usize;
    assert!(most <= bound + lag, "{most} starts in one second");
    let secs = took.as_secs_f64();
    assert!(
        (27.0..=33.0).contains(&secs),
        "took {secs:.1} s, not 30 s ± 10 %"
    );
}

/// A handler that counts the attempts in flight at once (start to end).
fn overlapping(
    now: &Arc<AtomicUsize>,
    most: &Arc<AtomicUsize>,
    done: &Arc<AtomicUsize>,
) -> SharedHandler {
    let (now, most, done) = (now.clone(), most.clone(), done.clone());
    handler_fn(move |_: Event| {
        let (now, most, done) = (now.clone(), most.clone(), done.clone());
        async move {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5 + rand::random::<u64>() % 25)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            done.fetch_add(1, Ordering::SeqCst);
            Outcome::Success
        }
    })
}

/// `max_running` across instances: three with 8 slots each and
/// `max_running = 4`: never more than 4 attempts overlap, and 4 do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_running_holds_across_three_instances_on_postgres() {
    let url = postgres_url().await;
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(store(&url).await);
    }
    let spec = TopicSpec::new("exports").concurrency(8).max_running(4);
    let (now, most, done) = (Arc::default(), Arc::default(), Arc::default());
    let engines = engines(stores, &spec, |_| overlapping(&now, &most, &done));
    enqueue(&engines[1], "exports", 300).await;
    let running = run(&engines);
    wait_for("300 attempts", Duration::from_secs(60), || {
        done.load(Ordering::SeqCst) >= 300
    })
    .await;
    running.stop().await;
    assert_eq!(most.load(Ordering::SeqCst), 4, "most attempts at once");
}

/// On SQLite the limits hold per process: `max_running` below the
/// concurrency, and a rate (20/s: 60 events take about 3 s, no second
/// holds more than 20 + 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let s = store(&url).await;
    let capped = TopicSpec::new("exports").concurrency(16).max_running(3);
    let (now, most, done) = (Arc::default(), Arc::default(), Arc::default());
    let rate = Rate::parse("20/s").expect("rate");
    let starts: Starts = Arc::default();
    let engine = Engine::builder(s)
        .topic(capped)
        .handler("exports", overlapping(&now, &most, &done))
        .topic(TopicSpec::new("partner").concurrency(16).rate(rate))
        .handler("partner", recording(&starts))
        .build()
        .expect("engine");
    enqueue(&engine, "exports", 100).await;
    enqueue(&engine, "partner", 60).await;
    let began = Instant::now();
    let running = run(std::slice::from_ref(&engine));
    wait_for("all attempts", Duration::from_secs(30), || {
        done.load(Ordering::SeqCst) >= 100 && starts.lock().expect("lock").len() >= 60
    })
    .await;
    let took = began.elapsed();
    running.stop().await;
    assert_eq!(most.load(Ordering::SeqCst), 3);
    let mut starts = starts.lock().expect("lock").clone();
    let busiest = busiest_window(&mut starts, Duration::from_secs(1));
    assert!(busiest <= 22, "{busiest} starts in one second");
    assert!(
        took >= Duration::from_millis(2800),
        "60 events at 20/s in {took:?}"
    );
}

/// Pull workers' claims spend the same budget: a claim of 100 from a
/// `rate = "50/s"` topic gets one grant (5), the next one almost nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_claims_spend_the_rate_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let engine = Engine::builder(store(&url).await)
        .topic(TopicSpec::new("pulled").rate(Rate::parse("50/s").expect("rate")))
        .build()
        .expect("engine");
    enqueue(&engine, "pulled", 100).await;
    let first = engine
        .pull()
        .claim("pulled", 100, None, "w")
        .await
        .expect("claim");
    assert_eq!(first.len(), 5);
    let second = engine
        .pull()
        .claim("pulled", 100, None, "w")
        .await
        .expect("claim");
    assert!(second.len() <= 1, "{}", second.len());
    tokio::time::sleep(Duration::from_millis(250)).await;
    let later = engine
        .pull()
        .claim("pulled", 100, None, "w")
        .await
        .expect("claim");
    assert_eq!(later.len(), 5, "refilled, at most one grant");
}

/// What the receiver saw: which instance's path, and when.
type Requests = Arc<Mutex<Vec<(String, Instant)>>>;

/// A receiver that answers the first request `429` with `Retry-After: 2`
/// and every later one 200, recording each.
async fn throttling_receiver(seen: Requests) -> String {
    use axum::extract::Path;
    use axum::http::StatusCode;
    let app = axum::Router::new().route(
        "/{instance}",
        axum::routing::post(move |Path(instance): Path<String>| {
            let seen = seen.clone();
            async move {
                let mut seen = seen.lock().expect("lock");
                seen.push((instance, Instant::now()));
                if seen.len() == 1 {
                    (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "2")]).into_response()
                } else {
                    StatusCode::OK.into_response()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

use axum::response::IntoResponse;

/// An HTTP handler's 429 with `Retry-After` pauses the whole
/// topic, on both instances: events queued after it (through the instance
/// that did not get the 429) are not delivered by either before the pause
/// ends, and all are delivered after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_retry_after_pauses_the_topic_on_every_instance() {
    let url = postgres_url().await;
    let seen: Requests = Arc::default();
    let base = throttling_receiver(seen.clone()).await;
    let stores = vec![store(&url).await, store(&url).await];
    let handler = |i: usize| -> SharedHandler {
        let settings = HttpHandlerSettings {
            url: format!("{base}/{i}").parse().expect("url"),
            timeout: Duration::from_secs(5),
            secret: None,
            headers: BTreeMap::new(),
            permanent_statuses: vec![410],
            tls: Default::default(),
        };
        Arc::new(HttpHandler::new(settings).expect("handler"))
    };
    let engines = engines(stores.clone(), &TopicSpec::new("partner"), handler);
    let running = run(&engines);
    enqueue(&engines[0], "partner", 1).await;
    wait_for("the 429", Duration::from_secs(10), || {
        !seen.lock().expect("lock").is_empty()
    })
    .await;
    let (throttled, at) = seen.lock().expect("lock")[0].clone();
    let other = if throttled == "0" { 1 } else { 0 };
    // The pause reaches the other instance asynchronously (stored, then
    // announced by NOTIFY): wait until it is stored, and give the
    // announcement a moment, before testing that instance.
    let s = &stores[other];
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.paused_for("partner").await.expect("paused_for").is_none() {
        assert!(Instant::now() < deadline, "the pause was never stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    enqueue(&engines[other], "partner", 10).await;
    wait_for("every event", Duration::from_secs(15), || {
        seen.lock().expect("lock").len() >= 12
    })
    .await;
    running.stop().await;
    let seen = seen.lock().expect("lock").clone();
    for (instance, t) in &seen[1..] {
        let after = t.duration_since(at);
        assert!(
            after >= Duration::from_millis(1900),
            "instance {instance} delivered {after:?} after the 429"
        );
    }
    let instances: std::collections::HashSet<_> =
        seen[1..].iter().map(|(i, _)| i.clone()).collect();
    eprintln!("after the pause, delivered by instances {instances:?}");
}
