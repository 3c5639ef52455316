//! A `batch` topic: events are delivered together when 50 are waiting or the
//! oldest has waited 500 ms, one delivery per `group_by` value (a shop).
//!
//! Run: `cargo run -p mailroom --example batch`

mod common;

use mailroom::handler::batch_handler_fn;
use mailroom::{BatchSettings, Draft, Engine, Event, Mode, Outcome, TopicSpec};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = common::temp_store(&dir, "batch.db").await?;
    let engine = Engine::builder(store)
        .topic(TopicSpec::new("sales").mode(Mode::Batch(BatchSettings {
            max_size: 50,
            max_wait: Duration::from_millis(500),
            schedule: None, // e.g. Some("0 0 * * *".into()) for one nightly delivery
            group_by: Some("/shop".into()),
        })))
        .handler("sales", batch_handler_fn(report_sales))
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
    common::run_until_done(&engine, 120).await
}

/// The batch handler: one shop's sales at a time, summed.
async fn report_sales(events: Vec<Event>) -> Outcome {
    let sales: Vec<serde_json::Value> = events
        .iter()
        .filter_map(|e| serde_json::from_slice(e.payload.as_deref()?).ok())
        .collect();
    let total: f64 = sales.iter().filter_map(|v| v["amount"].as_f64()).sum();
    let shop = sales
        .first()
        .map(|v| v["shop"].to_string())
        .unwrap_or_default();
    println!(
        "batch of {:3} sales for shop {shop}: total {total:.2}",
        events.len()
    );
    Outcome::Success
}
