//! A `batch` topic: events are delivered together when 50 are waiting or the
//! oldest has waited 500 ms, one delivery per `group_by` value (a shop).
//!
//! Run: `cargo run -p mailroom --example batch`

use mailroom::handler::batch_handler_fn;
use mailroom::{BatchSettings, Draft, Engine, Event, Mode, Outcome, Status, TopicSpec};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = mailroom::open_store(
        &format!("sqlite://{}", dir.path().join("batch.db").display()),
        true,
    )
    .await?;
    store.migrate().await?;

    let engine = Engine::builder(store.clone())
        .topic(TopicSpec::new("sales").mode(Mode::Batch(BatchSettings {
            max_size: 50,
            max_wait: Duration::from_millis(500),
            schedule: None, // e.g. Some("0 0 * * *".into()) for one nightly delivery
            group_by: Some("/shop".into()),
        })))
        .handler(
            "sales",
            batch_handler_fn(|events: Vec<Event>| async move {
                let total: f64 = events
                    .iter()
                    .filter_map(|e| {
                        serde_json::from_slice::<serde_json::Value>(e.payload.as_deref()?).ok()
                    })
                    .filter_map(|v| v["amount"].as_f64())
                    .sum();
                let shop = events
                    .first()
                    .and_then(|e| {
                        serde_json::from_slice::<serde_json::Value>(e.payload.as_deref()?).ok()
                    })
                    .map(|v| v["shop"].to_string())
                    .unwrap_or_default();
                println!(
                    "batch of {:3} sales for shop {shop}: total {total:.2}",
                    events.len()
                );
                Outcome::Success
            }),
        )
        .build()?;

    for i in 0..120 {
        let shop = ["north", "south", "east"][i % 3];
        engine
            .enqueue(Draft::json(
                "sales",
                &serde_json::json!({ "shop": shop, "amount": 1.5 * i as f64 }),
            ))
            .await?;
    }
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
        < 120
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await?;
    Ok(())
}
