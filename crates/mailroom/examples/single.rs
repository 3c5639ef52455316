//! Embeds mailroom in a Rust program: a `single` topic with an async closure
//! handler that fails each event's first attempt, so the retry path shows.
//!
//! Run: `cargo run -p mailroom --example single`

mod common;

use mailroom::handler::handler_fn;
use mailroom::operate::ListFilter;
use mailroom::{Backoff, Draft, Engine, Event, Outcome, RetryPolicy, TopicSpec};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = common::temp_store(&dir, "example.db").await?;
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("emails").concurrency(4).retry(RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Schedule(vec![Duration::from_millis(200)]),
        }))
        .handler("emails", handler_fn(send_email))
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

    common::run_until_done(&engine, 3).await?;
    print_histories(&engine).await
}

/// The handler: fails each event's first attempt, so the retry path shows.
async fn send_email(event: Event) -> Outcome {
    if event.attempts == 1 {
        return Outcome::retry("SMTP server busy (first attempts always fail in this example)");
    }
    println!(
        "sent {} (attempt {}): {}",
        event.dedup_key,
        event.attempts,
        String::from_utf8_lossy(event.payload.as_deref().unwrap_or_default())
    );
    Outcome::Success
}

/// Each event's status and the outcomes of its attempts.
async fn print_histories(engine: &Engine) -> Result<(), Box<dyn std::error::Error>> {
    let filter = ListFilter {
        limit: 10,
        ..Default::default()
    };
    for e in engine.operator().list(&filter).await?.events {
        let full = engine.operator().get(e.id).await?.ok_or("event vanished")?;
        let outcomes: Vec<&str> = full.history.iter().map(|a| a.outcome.as_str()).collect();
        println!("{} {}: history {:?}", full.dedup_key, full.status, outcomes);
    }
    Ok(())
}
