//! `delayed`: does a backlog of events delivered later slow the claims of
//! due ones? On a fresh store, batches of due events are claimed (and
//! completed) once untimed, to warm it, then again with each claim
//! statement timed, with the store otherwise empty; then `--events`
//! events delayed by a day are stored, and the same batches are timed
//! again beside them, twice, with `next_due` too. The ratio
//! (backlog over empty) is the figure: near 1 means the claims never walk
//! the delayed events.

use crate::backend::Backend;
use crate::cli::print_json;
use crate::stats::Latencies;
use anyhow::Context;
use mailroom::hooks::NewEvent;
use mailroom::pull::Completion;
use mailroom::store::ClaimRequest;
use mailroom::{Delivery, EventId, Store, StoreError};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOPIC: &str = "delayed-bench";

#[derive(Debug, Clone)]
pub struct Settings {
    /// Delayed events stored before the second round.
    pub events: u64,
    /// Due events per round.
    pub due: u64,
    /// Events each claim asks for.
    pub claim_size: u32,
    /// Concurrent inserts while storing the delayed backlog.
    pub concurrency: usize,
}

/// One round: the claim statements' times in milliseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Round {
    pub delayed_in_store: u64,
    pub claims: usize,
    pub claim_p50_ms: f64,
    pub claim_p95_ms: f64,
    pub next_due_ms: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DelayedResult {
    pub store: &'static str,
    pub preload_secs: f64,
    pub preload_per_sec: f64,
    pub empty: Round,
    pub backlog: Round,
    /// The backlog round once more, right after: the first runs beside
    /// whatever storing the backlog set off (autovacuum of its rows).
    pub backlog_again: Round,
    /// `backlog.claim_p50_ms / empty.claim_p50_ms`.
    pub p50_ratio: f64,
    /// `backlog_again.claim_p50_ms / empty.claim_p50_ms`.
    pub p50_ratio_again: f64,
}

fn new_event(n: u64, delivery: Delivery) -> NewEvent {
    NewEvent {
        id: EventId::new(),
        source: "bench".into(),
        topic: TOPIC.into(),
        dedup_key: format!("{n}-{}", EventId::new()),
        key: None,
        event_type: Some("bench.event".into()),
        correlation_id: None,
        causation_id: None,
        version: None,
        traceparent: None,
        content_type: Some("application/json".into()),
        payload: crate::ingest::body(256),
        max_attempts: 3,
        delivery,
        priority: 0,
    }
}

/// Stores `n` events delivered as `delivery`, `concurrency` at a time.
async fn store_many(
    store: &Arc<dyn Store>,
    n: u64,
    delivery: Delivery,
    concurrency: usize,
) -> anyhow::Result<()> {
    let workers = concurrency.max(1) as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let share = n / workers + u64::from(w < n % workers);
        let store = store.clone();
        tasks.spawn(async move {
            for j in 0..share {
                loop {
                    match store.insert(new_event(w + j * workers, delivery)).await {
                        Ok(_) => break,
                        Err(StoreError::Overloaded) => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("an insert task panicked")??;
    }
    Ok(())
}

/// Stores `s.due` due events, then claims them `s.claim_size` at a time
/// (completing each batch), timing each claim; and times `next_due` once
/// the topic holds only delayed events.
async fn round(store: &Arc<dyn Store>, s: &Settings, delayed: u64) -> anyhow::Result<Round> {
    store_many(store, s.due, Delivery::Now, s.concurrency).await?;
    let req = ClaimRequest::new(TOPIC, "bench", s.claim_size, Duration::from_secs(60));
    let mut times = Latencies::default();
    let (mut claimed, mut claims) = (0, 0);
    while claimed < s.due {
        let started = Instant::now();
        let batch = store.claim(&req).await?;
        times.record(started.elapsed());
        claims += 1;
        anyhow::ensure!(
            !batch.is_empty(),
            "due events not claimed ({claimed} of {})",
            s.due
        );
        claimed += batch.len() as u64;
        let done = batch
            .iter()
            .map(|c| (c.event.id, c.token, Completion::Done))
            .collect();
        for r in store.complete_many(done).await {
            r?;
        }
    }
    let started = Instant::now();
    store.next_due(&req).await?;
    let next_due_ms = started.elapsed().as_secs_f64() * 1000.0;
    times.sort();
    Ok(Round {
        delayed_in_store: delayed,
        claims,
        claim_p50_ms: times.quantile_ms(0.5),
        claim_p95_ms: times.quantile_ms(0.95),
        next_due_ms,
    })
}

pub async fn measure(s: &Settings, backend: &Backend) -> anyhow::Result<DelayedResult> {
    let fresh = backend.fresh().await?;
    let opened = fresh.open(true).await?;
    let store = opened.store();
    store.migrate().await?;
    // Untimed: a fresh database's first claims run cold and on no
    // statistics, which made the empty round the slower one (0.47-0.50×).
    round(&store, s, 0).await?;
    let empty = round(&store, s, 0).await?;
    let started = Instant::now();
    let day = Delivery::After(Duration::from_secs(86_400));
    store_many(&store, s.events, day, s.concurrency).await?;
    let preload_secs = started.elapsed().as_secs_f64();
    let backlog = round(&store, s, s.events).await?;
    let backlog_again = round(&store, s, s.events).await?;
    opened.close().await;
    fresh.cleanup().await?;
    Ok(DelayedResult {
        store: backend.name(),
        preload_secs,
        preload_per_sec: s.events as f64 / preload_secs.max(1e-9),
        p50_ratio: backlog.claim_p50_ms / empty.claim_p50_ms.max(1e-9),
        p50_ratio_again: backlog_again.claim_p50_ms / empty.claim_p50_ms.max(1e-9),
        empty,
        backlog,
        backlog_again,
    })
}

pub fn print(s: &Settings, r: &DelayedResult) {
    println!(
        "delayed ({}): {} due events claimed {} at a time, with the store empty and beside {} events delivered a day later (stored in {:.1} s, {:.0}/s)",
        r.store, s.due, s.claim_size, s.events, r.preload_secs, r.preload_per_sec
    );
    println!(
        "{:>16} {:>7} {:>14} {:>14} {:>12}",
        "delayed in store", "claims", "claim p50 ms", "claim p95 ms", "next_due ms"
    );
    for round in [&r.empty, &r.backlog, &r.backlog_again] {
        println!(
            "{:>16} {:>7} {:>14.3} {:>14.3} {:>12.3}",
            round.delayed_in_store,
            round.claims,
            round.claim_p50_ms,
            round.claim_p95_ms,
            round.next_due_ms
        );
    }
    println!(
        "claim p50, backlog / empty: {:.2}x, again right after {:.2}x",
        r.p50_ratio, r.p50_ratio_again
    );
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// `sqlite` (a temporary file) or `postgres://...` (a fresh database).
    #[arg(long, default_value = "sqlite", value_parser = Backend::parse)]
    store: Backend,
    /// Events delivered a day later stored before the second round.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Due events claimed in each round.
    #[arg(long, default_value_t = 6400)]
    due: u64,
    /// Events each claim asks for.
    #[arg(long, default_value_t = 64)]
    claim_size: u32,
    /// Concurrent inserts.
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `delayed`: the claims timed without and beside the backlog, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = Settings {
        events: a.events,
        due: a.due.max(1),
        claim_size: a.claim_size.max(1),
        concurrency: a.concurrency.max(1),
    };
    let r = measure(&s, &a.store).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "delayed", "result": r }))?;
    } else {
        print(&s, &r);
    }
    Ok(ExitCode::SUCCESS)
}
