//! `mailroom status`: per-topic counts, oldest pending age, blocked keys, and
//! the alerts firing; `--json` prints the very answer of `GET /v1/stats`.

use super::{load_config, offline_engine};
use crate::Cli;
use crate::table::render;
use anyhow::Result;
use mailroom::Status;
use mailroom::answer::TopicAnswer;

pub(super) async fn run(cli: &Cli, json: bool) -> Result<()> {
    let config = load_config(cli)?;
    // Through the engine, so blocked keys count only where a dead head blocks.
    let engine = offline_engine(&config).await?;
    let answer = engine
        .operator()
        .stats_answer(jiff::Timestamp::now())
        .await?;
    if json {
        outln!("{}", serde_json::to_string(&answer)?);
        return Ok(());
    }
    let empty = |t: &TopicAnswer| t.counts.values().all(|n| *n == 0);
    if answer.topics.iter().all(empty) {
        outln!(
            "no events yet in {}",
            mailroom::redact::url(&config.store.url)
        );
        return Ok(());
    }
    print_table(&answer.topics);
    if engine.operator().alert_rules().any() {
        if answer.alerts.is_empty() {
            outln!("\nalerts: none firing");
        } else {
            outln!("\nalerts firing:");
            for a in &answer.alerts {
                outln!("  {:<18} {}", a.kind.as_str(), a.message);
            }
        }
    }
    Ok(())
}

fn print_table(topics: &[TopicAnswer]) {
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            let mut row = vec![t.topic.clone()];
            row.extend(Status::ALL.iter().map(|st| t.count(*st).to_string()));
            row.push(
                t.oldest_pending_age_seconds
                    .map(|a| format!("{a:.1}s"))
                    .unwrap_or_else(|| "-".into()),
            );
            row.push(t.blocked_keys.to_string());
            row.push(
                t.limits
                    .as_ref()
                    .map_or_else(|| "-".into(), |l| l.summary()),
            );
            row
        })
        .collect();
    // One column per status, named from the same list the rows are read
    // with, so a status added later cannot shift the columns.
    let statuses: Vec<String> = Status::ALL
        .iter()
        .map(|st| st.as_str().to_uppercase())
        .collect();
    let mut headers = vec!["TOPIC"];
    headers.extend(statuses.iter().map(String::as_str));
    headers.extend(["OLDEST PENDING", "BLOCKED KEYS", "LIMITS"]);
    out!("{}", render(&headers, &rows));
}
