//! A `sequential` topic: events of one key (a customer) are handled strictly
//! in arrival order, one at a time, while different customers run in
//! parallel. A failing head blocks its key while it retries.
//!
//! Run: `cargo run -p mailroom --example sequential`

mod common;

use mailroom::handler::handler_fn;
use mailroom::{Backoff, Draft, Engine, Event, Mode, OnDead, Outcome, RetryPolicy, TopicSpec};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = common::temp_store(&dir, "seq.db").await?;
    let engine = Engine::builder(store)
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
        .handler("payments", handler_fn(pay))
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
    common::run_until_done(&engine, 6).await
}

/// The handler: the first attempt at alice's refund fails, and her later
/// events wait for it.
async fn pay(e: Event) -> Outcome {
    let body = String::from_utf8_lossy(e.payload.as_deref().unwrap_or_default()).into_owned();
    let customer = e.key.as_deref().unwrap_or("-");
    if body.contains("refund") && e.attempts == 1 {
        println!(
            "  {customer} attempt {}: {body} -> gateway timeout, retrying",
            e.attempts
        );
        return Outcome::retry("gateway timeout");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!("  {customer} attempt {}: {body} -> ok", e.attempts);
    Outcome::Success
}
