//! Embeds mailroom in a Rust program: a `single` topic with an async closure
//! handler that fails each event's first attempt, so the retry path shows.
//!
//! Run: `cargo run -p mailroom --example single`

use mailroom::handler::handler_fn;
use mailroom::{Backoff, Draft, Engine, Event, Outcome, RetryPolicy, Status, TopicSpec};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("example.db").display());
    let store = mailroom::open_store(&url, true).await?;
    store.migrate().await?;

    let engine = Engine::builder(store.clone())
        .topic(TopicSpec::new("emails").concurrency(4).retry(RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Schedule(vec![Duration::from_millis(200)]),
        }))
        .handler(
            "emails",
            handler_fn(|event: Event| async move {
                if event.attempts == 1 {
                    return Outcome::retry(
                        "SMTP server busy (first attempts always fail in this example)",
                    );
                }
                println!(
                    "sent {} (attempt {}): {}",
                    event.dedup_key,
                    event.attempts,
                    String::from_utf8_lossy(event.payload.as_deref().unwrap_or_default())
                );
                Outcome::Success
            }),
        )
        .build()?;

    for n in 1..=3 {
        let draft = Draft::json(
            "emails",
            &serde_json::json!({ "to": format!("user{n}@example.com") }),
        )
        .dedup_key(format!("welcome-{n}"));
        let stored = engine.enqueue(draft).await?; // durable when this returns
        println!("enqueued welcome-{n} as {}", stored.id);
    }
    // Enqueueing the same dedup key again changes nothing.
    let again = engine
        .enqueue(Draft::json("emails", &serde_json::json!({})).dedup_key("welcome-1"))
        .await?;
    println!("welcome-1 again: duplicate = {}", again.duplicate);

    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let engine = engine.clone();
        let shutdown = shutdown.clone();
        async move { engine.run(shutdown).await }
    });
    loop {
        let stats = store.stats().await?;
        if stats.iter().map(|s| s.count(Status::Done)).sum::<u64>() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await?;

    let page = store
        .list(&mailroom::ListFilter {
            limit: 10,
            ..Default::default()
        })
        .await?;
    for e in page.events {
        let full = store.get(e.id).await?.ok_or("event vanished")?;
        let outcomes: Vec<&str> = full.history.iter().map(|a| a.outcome.as_str()).collect();
        println!("{} {}: history {:?}", full.dedup_key, full.status, outcomes);
    }
    Ok(())
}
