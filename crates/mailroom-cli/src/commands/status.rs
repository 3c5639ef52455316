//! `mailroom status`: per-topic counts, oldest pending age, blocked keys, and
//! the alerts firing.

use super::{load_config, offline_engine};
use crate::Cli;
use crate::table::render;
use anyhow::Result;
use mailroom::{Alert, Status, TopicStats};

pub(super) async fn run(cli: &Cli, json: bool) -> Result<()> {
    let config = load_config(cli)?;
    // Through the engine, so blocked keys count only where a dead head blocks.
    let engine = offline_engine(&config).await?;
    let stats = engine.stats().await?;
    let alerts = engine.alerts_from(&stats).await?;
    if json {
        print_json(&stats, &alerts);
        return Ok(());
    }
    if stats.is_empty() {
        outln!("no events yet in {}", config.store.url);
        return Ok(());
    }
    print_table(&stats);
    if engine.alert_rules().any() {
        if alerts.is_empty() {
            outln!("\nalerts: none firing");
        } else {
            outln!("\nalerts firing:");
            for a in &alerts {
                outln!("  {:<18} {}", a.kind.as_str(), a.message);
            }
        }
    }
    Ok(())
}

/// Seconds since `t`, never negative.
fn age(t: Option<jiff::Timestamp>) -> Option<f64> {
    let now = jiff::Timestamp::now();
    t.map(|t| (now.as_millisecond() - t.as_millisecond()).max(0) as f64 / 1000.0)
}

fn print_json(stats: &[TopicStats], alerts: &[Alert]) {
    let topics: Vec<_> = stats
        .iter()
        .map(|s| {
            let counts: serde_json::Map<String, serde_json::Value> = Status::ALL
                .iter()
                .map(|st| (st.as_str().to_string(), s.count(*st).into()))
                .collect();
            serde_json::json!({
                "topic": s.topic,
                "counts": counts,
                "oldest_pending_age_seconds": age(s.oldest_pending),
                "blocked_keys": s.blocked_keys,
            })
        })
        .collect();
    let alerts: Vec<_> = alerts.iter().map(Alert::to_json).collect();
    outln!(
        "{}",
        serde_json::json!({ "topics": topics, "alerts": alerts })
    );
}

fn print_table(stats: &[TopicStats]) {
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            vec![
                s.topic.clone(),
                s.count(Status::Pending).to_string(),
                s.count(Status::Running).to_string(),
                s.count(Status::Done).to_string(),
                s.count(Status::Dead).to_string(),
                s.count(Status::Skipped).to_string(),
                age(s.oldest_pending)
                    .map(|a| format!("{a:.1}s"))
                    .unwrap_or_else(|| "-".into()),
                s.blocked_keys.to_string(),
            ]
        })
        .collect();
    out!(
        "{}",
        render(
            &[
                "TOPIC",
                "PENDING",
                "RUNNING",
                "DONE",
                "DEAD",
                "SKIPPED",
                "OLDEST PENDING",
                "BLOCKED KEYS"
            ],
            &rows
        )
    );
}
