//! A fast single topic claims more events than it has free slots
//! (`dispatch/ahead.rs`, on PostgreSQL): its handlers still never run more
//! than its concurrency at once, every event runs once, and the events
//! claimed ahead that have not started when the engine stops are given
//! back, not left running under their leases. The same on SQLite, where
//! topics do not claim ahead.

use mailroom::handler::handler_fn;
use mailroom::{Draft, Engine, Event, Outcome, Status, TopicSpec};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const CONCURRENCY: u32 = 4;

/// A fresh store: PostgreSQL (claims ahead) or SQLite in `dir`.
async fn store(postgres: bool, dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    let url = if postgres {
        mailroom_testkit::fresh_postgres_db().await
    } else {
        format!("sqlite://{}", dir.path().join("m.db").display())
    };
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

/// Handler calls in flight now and at most, and the calls per event.
#[derive(Default)]
struct Seen {
    now: AtomicU32,
    most: AtomicU32,
    calls: Mutex<HashMap<String, u32>>,
}

/// An engine over `store` whose `jobs` topic (single, `CONCURRENCY`) runs
/// a handler that holds its call for `hold`, recording into `seen`.
fn engine(store: Arc<dyn mailroom::Store>, seen: &Arc<Seen>, hold: Duration) -> Engine {
    let seen = seen.clone();
    Engine::builder(store)
        .topic(TopicSpec::new("jobs").concurrency(CONCURRENCY))
        .handler(
            "jobs",
            handler_fn(move |e: Event| {
                let seen = seen.clone();
                async move {
                    let now = seen.now.fetch_add(1, Ordering::SeqCst) + 1;
                    seen.most.fetch_max(now, Ordering::SeqCst);
                    *seen
                        .calls
                        .lock()
                        .expect("calls")
                        .entry(e.id.to_string())
                        .or_default() += 1;
                    tokio::time::sleep(hold).await;
                    seen.now.fetch_sub(1, Ordering::SeqCst);
                    Outcome::Success
                }
            }),
        )
        .build()
        .expect("engine")
}

async fn enqueue(engine: &Engine, n: u32) {
    for i in 0..n {
        engine
            .enqueue(Draft::json("jobs", &serde_json::json!({ "i": i })))
            .await
            .expect("enqueue");
    }
}

async fn count(store: &dyn mailroom::Store, status: Status) -> u64 {
    let stats = store.stats().await.expect("stats");
    stats.iter().map(|t| t.count(status)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_ahead_never_runs_more_than_the_concurrency_and_runs_each_event_once() {
    bounded_and_once(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_too_the_concurrency_holds_and_each_event_runs_once() {
    bounded_and_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_claimed_ahead_are_given_back_when_the_engine_stops() {
    given_back_at_stop(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_too_nothing_is_left_running_when_the_engine_stops() {
    given_back_at_stop(false).await;
}

/// `events` queued on a fresh store whose handler holds each call for
/// `hold`, and the engine running until the returned token is cancelled.
async fn running(
    postgres: bool,
    dir: &tempfile::TempDir,
    events: u32,
    hold: Duration,
) -> (
    Arc<dyn mailroom::Store>,
    Arc<Seen>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let store = store(postgres, dir).await;
    let seen = Arc::new(Seen::default());
    let engine = engine(store.clone(), &seen, hold);
    enqueue(&engine, events).await;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { engine.run(shutdown).await }
    });
    (store, seen, shutdown, running)
}

/// Waits until `n` events are done, failing past `within`.
async fn wait_done(store: &dyn mailroom::Store, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    while count(store, Status::Done).await < n {
        assert!(
            Instant::now() < deadline,
            "{n} events not done in {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn bounded_and_once(postgres: bool) {
    const EVENTS: u32 = 1_500;
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, seen, shutdown, running) =
        running(postgres, &dir, EVENTS, Duration::from_micros(200)).await;
    wait_done(&*store, u64::from(EVENTS), Duration::from_secs(60)).await;
    shutdown.cancel();
    running.await.expect("engine task");
    assert!(
        seen.most.load(Ordering::SeqCst) <= CONCURRENCY,
        "{} handler calls at once, concurrency {CONCURRENCY}",
        seen.most.load(Ordering::SeqCst)
    );
    let calls = seen.calls.lock().expect("calls");
    assert_eq!(calls.len(), EVENTS as usize, "every event ran");
    assert!(calls.values().all(|&n| n == 1), "an event ran twice");
}

async fn given_back_at_stop(postgres: bool) {
    const EVENTS: u32 = 2_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, seen, shutdown, running) =
        running(postgres, &dir, EVENTS, Duration::from_millis(2)).await;
    // Stop mid-drain, while the loop holds events claimed ahead.
    wait_done(&*store, 300, Duration::from_secs(30)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the engine stops within 10 s")
        .expect("engine task");
    let (done, pending) = (
        count(&*store, Status::Done).await,
        count(&*store, Status::Pending).await,
    );
    assert_eq!(
        count(&*store, Status::Running).await,
        0,
        "events left running"
    );
    assert_eq!(
        done + pending,
        u64::from(EVENTS),
        "done {done}, pending {pending}"
    );
    let ran = seen.calls.lock().expect("calls").len() as u64;
    assert_eq!(ran, done, "only the events that ran are done");
}
