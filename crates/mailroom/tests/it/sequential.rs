//! Sequential topics: strict order per key, keys in parallel, `on_dead`.

use mailroom::handler::handler_fn;
use mailroom::{
    Backoff, Draft, Engine, Event, Mode, OnDead, Outcome, RetryPolicy, Status, TopicSpec,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    open(&url).await
}

/// A fresh PostgreSQL database: there a fast topic claims heads ahead of
/// its free slots (`dispatch/ahead.rs`).
async fn postgres_store() -> Arc<dyn mailroom::Store> {
    open(&mailroom_testkit::fresh_postgres_db().await).await
}

async fn open(url: &str) -> Arc<dyn mailroom::Store> {
    let store = mailroom::open_store(url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

fn topic(on_dead: OnDead, max_attempts: u32, retry: Duration) -> TopicSpec {
    TopicSpec::new("orders")
        .mode(Mode::Sequential { on_dead })
        .concurrency(32)
        .retry(RetryPolicy {
            max_attempts,
            backoff: Backoff::Schedule(vec![retry]),
        })
        .timeout(Duration::from_secs(10))
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, Clone)]
struct Run {
    key: String,
    n: u64,
    start: Instant,
    end: Instant,
    ok: bool,
}

/// 20 keys × 200 events with a handler that fails 20% of the time and sleeps
/// at random: per key, successes happen in arrival order and no two events of
/// one key ever overlap, while different keys do run in parallel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_per_key_holds_under_random_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    order_per_key_under_random_failures(store(&dir).await, 32).await;
}

/// The same on PostgreSQL, where the topic also claims heads ahead: with
/// fewer slots (4) than keys (20), claimed heads wait for a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_per_key_holds_under_random_failures_on_postgres() {
    order_per_key_under_random_failures(postgres_store().await, 4).await;
}

/// `concurrency`: the topic's.
async fn order_per_key_under_random_failures(store: Arc<dyn mailroom::Store>, concurrency: u32) {
    const KEYS: usize = 20;
    const PER_KEY: u64 = 200;
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (runs, in_flight, peak) = (runs.clone(), in_flight.clone(), peak.clone());
        handler_fn(move |e: Event| {
            let (runs, in_flight, peak) = (runs.clone(), in_flight.clone(), peak.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                let start = Instant::now();
                let v: serde_json::Value =
                    serde_json::from_slice(e.payload.as_deref().unwrap_or_default())
                        .unwrap_or_default();
                let fail = rand::random::<f64>() < 0.2;
                tokio::time::sleep(Duration::from_micros(rand::random::<u64>() % 2000)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                runs.lock().expect("lock").push(Run {
                    key: e.key.clone().unwrap_or_default(),
                    n: v["n"].as_u64().unwrap_or(u64::MAX),
                    start,
                    end: Instant::now(),
                    ok: !fail,
                });
                if fail {
                    Outcome::retry("random failure")
                } else {
                    Outcome::Success
                }
            }
        })
    };
    let engine = Engine::builder(store.clone())
        .topic(topic(OnDead::Block, 1000, Duration::from_millis(2)).concurrency(concurrency))
        .handler("orders", handler)
        .build()
        .expect("engine");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    // Each key's events arrive in order (one producer per key); keys interleave.
    let mut producers = Vec::new();
    for k in 0..KEYS {
        let engine = engine.clone();
        producers.push(tokio::spawn(async move {
            for n in 0..PER_KEY {
                let d = Draft::json("orders", &serde_json::json!({ "n": n })).key(format!("k{k}"));
                engine.enqueue(d).await.expect("enqueue");
            }
        }));
    }
    for p in producers {
        p.await.expect("producer");
    }
    let total = KEYS as u64 * PER_KEY;
    wait_until("all events done", Duration::from_secs(120), async || {
        store
            .stats()
            .await
            .expect("stats")
            .iter()
            .map(|s| s.count(Status::Done))
            .sum::<u64>()
            == total
    })
    .await;
    shutdown.cancel();
    running.await.expect("engine");

    let runs = runs.lock().expect("lock").clone();
    let mut by_key: HashMap<String, Vec<Run>> = HashMap::new();
    for r in runs {
        by_key.entry(r.key.clone()).or_default().push(r);
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, mut rs) in by_key {
        rs.sort_by_key(|r| r.start);
        for w in rs.windows(2) {
            assert!(
                w[1].start >= w[0].end,
                "key {key}: event {} started before event {} ended",
                w[1].n,
                w[0].n
            );
        }
        let successes: Vec<u64> = rs.iter().filter(|r| r.ok).map(|r| r.n).collect();
        assert_eq!(
            successes,
            (0..PER_KEY).collect::<Vec<_>>(),
            "key {key}: completions out of arrival order"
        );
    }
    let peak = peak.load(Ordering::SeqCst);
    eprintln!("peak concurrent attempts across keys: {peak}");
    assert!(peak >= 4, "keys did not run in parallel (peak {peak})");
    assert!(
        peak <= concurrency as usize,
        "{peak} attempts at once, concurrency {concurrency}"
    );
}

async fn blocked_setup(
    on_dead: OnDead,
) -> (
    tempfile::TempDir,
    Arc<dyn mailroom::Store>,
    Engine,
    CancellationToken,
    mailroom::EventId,
    mailroom::EventId,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store(&dir).await;
    let engine = Engine::builder(store.clone())
        .topic(topic(on_dead, 2, Duration::from_millis(10)))
        .handler(
            "orders",
            handler_fn(|e: Event| async move {
                if e.event_type.as_deref() == Some("bad") {
                    Outcome::retry("cannot")
                } else {
                    Outcome::Success
                }
            }),
        )
        .build()
        .expect("engine");
    let bad = engine
        .enqueue(
            Draft::json("orders", &serde_json::json!({}))
                .key("A")
                .event_type("bad"),
        )
        .await
        .expect("enqueue")
        .id;
    let good = engine
        .enqueue(
            Draft::json("orders", &serde_json::json!({}))
                .key("A")
                .event_type("good"),
        )
        .await
        .expect("enqueue")
        .id;
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    (dir, store, engine, shutdown, bad, good)
}

async fn status_of(store: &Arc<dyn mailroom::Store>, id: mailroom::EventId) -> Status {
    store.get(id).await.expect("get").expect("exists").status
}

/// With `on_dead = "block"`, a dead head keeps its key blocked (and counted
/// in stats) until an operator skips it; then the next event runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_blocks_its_key_until_skipped() {
    let (_dir, store, engine, shutdown, bad, good) = blocked_setup(OnDead::Block).await;
    wait_until("head dead", Duration::from_secs(10), async || {
        status_of(&store, bad).await == Status::Dead
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        status_of(&store, good).await,
        Status::Pending,
        "the key must stay blocked"
    );
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats[0].blocked_keys, 1);
    engine.operator().skip(bad).await.expect("skip");
    wait_until("next event done", Duration::from_secs(10), async || {
        status_of(&store, good).await == Status::Done
    })
    .await;
    assert_eq!(status_of(&store, bad).await, Status::Skipped);
    shutdown.cancel();
}

/// With `on_dead = "skip"`, the next event of the key runs once the head is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_dead_skip_lets_the_next_event_go() {
    let (_dir, store, _engine, shutdown, bad, good) = blocked_setup(OnDead::Skip).await;
    wait_until("next event done", Duration::from_secs(10), async || {
        status_of(&store, good).await == Status::Done
    })
    .await;
    assert_eq!(status_of(&store, bad).await, Status::Dead);
    shutdown.cancel();
}
