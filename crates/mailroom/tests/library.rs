//! The engine as a library: no global state.

use mailroom::handler::handler_fn;
use mailroom::{Draft, Engine, Event, Outcome, Status, TopicSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Two engines in one process, each with its own store, topics and handlers,
/// process their own events and never each other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_in_one_process_stay_independent() {
    let mut engines = Vec::new();
    let mut dirs = Vec::new();
    for name in ["a", "b"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = mailroom::open_store(
            &format!("sqlite://{}", dir.path().join("m.db").display()),
            true,
        )
        .await
        .expect("open");
        store.migrate().await.expect("migrate");
        let seen = Arc::new(AtomicU64::new(0));
        let engine = Engine::builder(store.clone())
            .topic(TopicSpec::new("jobs"))
            .handler("jobs", {
                let seen = seen.clone();
                handler_fn(move |e: Event| {
                    let seen = seen.clone();
                    async move {
                        assert_eq!(
                            e.source,
                            format!("from-{name}"),
                            "an engine got another's event"
                        );
                        seen.fetch_add(1, Ordering::SeqCst);
                        Outcome::Success
                    }
                })
            })
            .build()
            .expect("engine");
        engines.push((engine, store, seen, name));
        dirs.push(dir);
    }
    let shutdown = CancellationToken::new();
    for (engine, _, _, name) in &engines {
        for i in 0..20 {
            engine
                .enqueue(
                    Draft::json("jobs", &serde_json::json!({ "i": i }))
                        .source(format!("from-{name}")),
                )
                .await
                .expect("enqueue");
        }
        tokio::spawn({
            let (engine, shutdown) = (engine.clone(), shutdown.clone());
            async move { engine.run(shutdown).await }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (_, store, seen, _) in &engines {
        while store
            .stats()
            .await
            .expect("stats")
            .iter()
            .map(|s| s.count(Status::Done))
            .sum::<u64>()
            < 20
        {
            assert!(Instant::now() < deadline, "engine did not finish");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen.load(Ordering::SeqCst), 20);
    }
    shutdown.cancel();
}
