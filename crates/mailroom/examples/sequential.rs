//! A `sequential` topic: events of one key (a customer) are handled strictly
//! in arrival order, one at a time, while different customers run in
//! parallel. A failing head blocks its key while it retries.
//!
//! Run: `cargo run -p mailroom --example sequential`

use mailroom::handler::handler_fn;
use mailroom::{
    Backoff, Draft, Engine, Event, Mode, OnDead, Outcome, RetryPolicy, Status, TopicSpec,
};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = mailroom::open_store(
        &format!("sqlite://{}", dir.path().join("seq.db").display()),
        true,
    )
    .await?;
    store.migrate().await?;

    let engine = Engine::builder(store.clone())
        .topic(
            TopicSpec::new("payments")
                .mode(Mode::Sequential {
                    on_dead: OnDead::Block,
                })
                .concurrency(8)
                .retry(RetryPolicy {
                    max_attempts: 5,
                    backoff: Backoff::Schedule(vec![Duration::from_millis(300)]),
                }),
        )
        .handler(
            "payments",
            handler_fn(|e: Event| async move {
                let body =
                    String::from_utf8_lossy(e.payload.as_deref().unwrap_or_default()).into_owned();
                // The first attempt at alice's refund fails: her later events wait for it.
                if body.contains("refund") && e.attempts == 1 {
                    println!(
                        "  {} attempt {}: {body} -> gateway timeout, retrying",
                        e.key.as_deref().unwrap_or("-"),
                        e.attempts
                    );
                    return Outcome::retry("gateway timeout");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                println!(
                    "  {} attempt {}: {body} -> ok",
                    e.key.as_deref().unwrap_or("-"),
                    e.attempts
                );
                Outcome::Success
            }),
        )
        .build()?;

    for (customer, what) in [
        ("alice", "charge 10"),
        ("bob", "charge 7"),
        ("alice", "refund 10"),
        ("bob", "charge 3"),
        ("alice", "charge 25"),
        ("bob", "refund 3"),
    ] {
        engine
            .enqueue(Draft::bytes("payments", what).key(customer))
            .await?;
    }
    println!("alice's events run in order even though her refund fails once; bob is not held up:");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    while store
        .stats()
        .await?
        .iter()
        .map(|s| s.count(Status::Done))
        .sum::<u64>()
        < 6
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await?;
    Ok(())
}
