//! Delayed delivery: events enqueued with a delay are stored at
//! once and started no earlier than due, and the dispatcher wakes for each
//! due time by itself (it sleeps until the next due event, not a poll).
//! How soon after due they start is a benchmark figure, not checked here
//! beyond a sanity bound.

use mailroom::handler::handler_fn;
use mailroom::{Draft, Engine, Event, EventId, Outcome, Timestamp, TopicSpec};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_delayed_events_start_when_due() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    a_thousand_delayed_events_on(&url).await;
}

/// The same on PostgreSQL, whose claims from a floor leave due delayed
/// events to the walks of the whole topic (`mailroom-postgres`'s
/// `floor.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_delayed_events_start_when_due_on_postgres() {
    a_thousand_delayed_events_on(&mailroom_testkit::fresh_postgres_db().await).await;
}

/// 1,000 events with random delays up to 5 s: every one starts at or after
/// its due time (as the store recorded it) and within 2 s of it; the
/// polling fallback is an hour, so only the due-time sleep can start them.
async fn a_thousand_delayed_events_on(url: &str) {
    let store = mailroom::open_store(url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    let started: Arc<Mutex<HashMap<EventId, Timestamp>>> = Arc::default();
    let record = started.clone();
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("later").concurrency(256))
        .handler(
            "later",
            handler_fn(move |e: Event| {
                record.lock().expect("lock").insert(e.id, Timestamp::now());
                async { Outcome::Success }
            }),
        )
        .poll_interval(Duration::from_secs(3600))
        .build()
        .expect("engine");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    let mut due = HashMap::new();
    for i in 0..1000u64 {
        let delay = Duration::from_millis(rand::random::<u64>() % 5000);
        let draft = Draft::json("later", &serde_json::json!({ "i": i })).delay(delay);
        let id = engine.enqueue(draft).await.expect("enqueue").id;
        let stored = engine
            .operator()
            .get(id)
            .await
            .expect("get")
            .expect("stored");
        if stored.attempts == 0 {
            due.insert(id, stored.next_attempt_at.expect("a due time"));
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while started.lock().expect("lock").len() < 1000 {
        assert!(tokio::time::Instant::now() < deadline, "not all started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await.expect("engine stops");
    let started = started.lock().expect("lock");
    let mut late = vec![];
    for (id, due) in &due {
        let at = started[id];
        assert!(
            at >= *due,
            "event {id} started at {at}, before it was due at {due}"
        );
        late.push(at.as_millisecond() - due.as_millisecond());
    }
    late.sort_unstable();
    let worst = late.last().copied().unwrap_or(0);
    eprintln!(
        "{} events checked; lateness p50 {} ms, p99 {} ms, max {worst} ms",
        late.len(),
        late[late.len() / 2],
        late[late.len() * 99 / 100]
    );
    assert!(
        late.len() > 900,
        "most events were still pending when read back"
    );
    assert!(
        worst <= 2000,
        "an event started {worst} ms after it was due"
    );
}
