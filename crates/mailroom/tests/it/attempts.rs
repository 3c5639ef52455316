//! Attempts are bounded in time: a handler that hangs is cut off at the
//! topic's timeout, a handler that panics becomes a retry, and shutdown
//! therefore always ends.

use mailroom::handler::handler_fn;
use mailroom::{AttemptOutcome, Backoff, Draft, Engine, Event, Outcome, RetryPolicy, TopicSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

fn topic() -> TopicSpec {
    TopicSpec::new("jobs")
        .timeout(Duration::from_millis(300))
        .lease(Duration::from_secs(5))
        .retry(RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Schedule(vec![Duration::from_millis(10)]),
        })
}

/// An engine over a fresh store with `handler` on the `jobs` topic, one
/// event enqueued, and the engine running until the returned token is
/// cancelled (its task is returned to await the stop).
async fn running_with(
    dir: &tempfile::TempDir,
    handler: mailroom::handler::SharedHandler,
) -> (
    Engine,
    mailroom::EventId,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let engine = Engine::builder(store(dir).await)
        .topic(topic())
        .handler("jobs", handler)
        .build()
        .expect("engine");
    let id = engine
        .enqueue(Draft::json("jobs", &serde_json::json!({})))
        .await
        .expect("enqueue")
        .id;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    (engine, id, shutdown, running)
}

/// First attempt hangs for an hour, second panics, third succeeds: the
/// history shows a timeout, a panic and a success, all within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_attempt_times_out_and_a_panic_becomes_a_retry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = Arc::new(AtomicU32::new(0));
    let (engine, id, shutdown, running) = running_with(&dir, {
        let calls = calls.clone();
        handler_fn(move |_e: Event| {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                match n {
                    1 => tokio::time::sleep(Duration::from_secs(3600)).await,
                    2 => panic!("handler bug"),
                    _ => {}
                }
                Outcome::Success
            }
        })
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        let e = engine
            .operator()
            .get(id)
            .await
            .expect("get")
            .expect("stored");
        if e.history.len() == 3 {
            break e;
        }
        assert!(Instant::now() < deadline, "history: {:?}", e.history);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let errors: Vec<_> = event.history.iter().map(|a| a.error.clone()).collect();
    assert_eq!(
        errors,
        [
            Some("timed out after 300ms".to_string()),
            Some("handler panicked".to_string()),
            None
        ]
    );
    assert_eq!(event.history[2].outcome, AttemptOutcome::Done);
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("engine stopped")
        .expect("engine task");
}

/// Shutdown while a handler hangs ends within the topic's timeout: the
/// attempt in flight is cut off and recorded, not awaited forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_hung_attempt_ends_within_the_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = Arc::new(tokio::sync::Notify::new());
    let (engine, id, shutdown, running) = running_with(&dir, {
        let started = started.clone();
        handler_fn(move |_e: Event| {
            let started = started.clone();
            async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Outcome::Success
            }
        })
    })
    .await;
    tokio::time::timeout(Duration::from_secs(5), started.notified())
        .await
        .expect("handler started");
    let stopping = Instant::now();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("shutdown ended")
        .expect("engine task");
    assert!(
        stopping.elapsed() < Duration::from_secs(2),
        "shutdown took {:?}",
        stopping.elapsed()
    );
    let event = engine
        .operator()
        .get(id)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(
        event.history.first().and_then(|a| a.error.as_deref()),
        Some("timed out after 300ms")
    );
}
