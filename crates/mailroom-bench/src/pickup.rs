//! `pickup`: how long an acknowledged event waits before its handler
//! starts, under a steady load. Events are enqueued at a fixed rate (each
//! on its own task, on schedule whatever the commits take); the ack is the
//! moment `Engine::enqueue` returns (the event is durable); a recording
//! handler notes when each event's first attempt starts. Reported per
//! store and rate: ack → handler start p50 / p99 / p99.9 / max, and the
//! enqueue (ack) latency itself. The first second of each run is warm-up,
//! not counted.

use crate::backend::Backend;
use crate::cli::{parse_duration, print_json};
use crate::stats::Latencies;
use anyhow::{Context, bail};
use mailroom::handler::handler_fn;
use mailroom::{Draft, Engine, EventId, TopicSpec};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "pickup";

#[derive(Debug, Clone)]
pub struct Settings {
    pub rates: Vec<u32>,
    pub duration: Duration,
    pub warmup: Duration,
    pub body_size: usize,
    pub concurrency: u32,
}

#[derive(Debug, serde::Serialize)]
pub struct Run {
    pub store: &'static str,
    pub rate: u32,
    /// Events counted (sent after the warm-up, their handler started).
    pub events: usize,
    /// Events whose handler had not started 5 s after the last send.
    pub missing: usize,
    pub pickup_p50_ms: f64,
    pub pickup_p99_ms: f64,
    pub pickup_p999_ms: f64,
    pub pickup_max_ms: f64,
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
}

type Marks = Arc<Mutex<HashMap<EventId, Instant>>>;

pub async fn measure(s: &Settings, backend: &Backend) -> anyhow::Result<Vec<Run>> {
    let mut out = Vec::new();
    for &rate in &s.rates {
        let fresh = backend.fresh().await?;
        let r = run_one(s, &fresh, rate.max(1)).await;
        let cleanup = fresh.cleanup().await;
        out.push(r?);
        cleanup?;
    }
    Ok(out)
}

async fn run_one(s: &Settings, fresh: &crate::backend::Fresh, rate: u32) -> anyhow::Result<Run> {
    let opened = fresh.open(true).await?;
    let store = opened.store();
    store.migrate().await.context("migrating")?;
    let started: Marks = Arc::default();
    let marks = started.clone();
    let handler = handler_fn(move |event: mailroom::Event| {
        let at = Instant::now();
        let marks = marks.clone();
        async move {
            if let Ok(mut m) = marks.lock() {
                m.entry(event.id).or_insert(at);
            }
            Ok::<(), String>(())
        }
    });
    let engine = Engine::builder(store)
        .worker_id("pickup")
        .topic(TopicSpec::new(TOPIC).concurrency(s.concurrency))
        .handler(TOPIC, handler)
        .build()?;
    let shutdown = CancellationToken::new();
    let runner = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    // The engine's loops are up before the first send.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let body = crate::ingest::body(s.body_size);
    let acks: Arc<Mutex<Vec<(EventId, Instant, Duration)>>> = Arc::default();
    let total = (s.duration + s.warmup).as_secs_f64() * f64::from(rate);
    let total = total as u64;
    let warm = (s.warmup.as_secs_f64() * f64::from(rate)) as u64;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..total {
        tick.tick().await;
        let (engine, body, acks) = (engine.clone(), body.clone(), acks.clone());
        sends.spawn(async move {
            let sent = Instant::now();
            let draft = Draft::bytes(TOPIC, body).content_type("application/json");
            let inserted = engine.enqueue(draft).await?;
            let acked = Instant::now();
            if i >= warm
                && let Ok(mut a) = acks.lock()
            {
                a.push((inserted.id, acked, acked - sent));
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = sends.join_next().await {
        r??;
    }
    let expected = acks.lock().map(|a| a.len()).unwrap_or(0);
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let seen = started.lock().map(|m| m.len()).unwrap_or(0);
        if seen as u64 >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    runner.await?;
    opened.close().await;

    let acks = std::mem::take(&mut *acks.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    let started = std::mem::take(&mut *started.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    let (mut pickup, mut ack) = (Latencies::default(), Latencies::default());
    let mut missing = 0;
    for (id, acked, took) in &acks {
        ack.record(*took);
        match started.get(id) {
            // A handler may start before the enqueue's caller is woken: 0.
            Some(at) => pickup.record(at.saturating_duration_since(*acked)),
            None => missing += 1,
        }
    }
    if expected == 0 {
        bail!("no event was sent after the warm-up");
    }
    pickup.sort();
    ack.sort();
    Ok(Run {
        store: if fresh.is_postgres() {
            "postgres"
        } else {
            "sqlite"
        },
        rate,
        events: expected - missing,
        missing,
        pickup_p50_ms: pickup.quantile_ms(0.5),
        pickup_p99_ms: pickup.quantile_ms(0.99),
        pickup_p999_ms: pickup.quantile_ms(0.999),
        pickup_max_ms: pickup.quantile_ms(1.0),
        ack_p50_ms: ack.quantile_ms(0.5),
        ack_p99_ms: ack.quantile_ms(0.99),
    })
}

pub fn print(s: &Settings, runs: &[Run]) {
    println!(
        "pickup: ack -> handler start, {} s per rate after {} s of warm-up, concurrency {}",
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64(),
        s.concurrency
    );
    println!(
        "{:>8} {:>7} {:>7} | {:>8} {:>8} {:>8} {:>8} | {:>8} {:>8}",
        "store", "rate/s", "events", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "ack p50", "ack p99"
    );
    for r in runs {
        println!(
            "{:>8} {:>7} {:>7} | {:>8.3} {:>8.3} {:>8.3} {:>8.3} | {:>8.3} {:>8.3}{}",
            r.store,
            r.rate,
            r.events,
            r.pickup_p50_ms,
            r.pickup_p99_ms,
            r.pickup_p999_ms,
            r.pickup_max_ms,
            r.ack_p50_ms,
            r.ack_p99_ms,
            if r.missing > 0 {
                format!("  ({} never started)", r.missing)
            } else {
                String::new()
            }
        );
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Stores: `sqlite` and/or `postgres://...` (a fresh database per run).
    #[arg(long, value_delimiter = ',', default_value = "sqlite", value_parser = Backend::parse)]
    store: Vec<Backend>,
    /// Enqueue rates, events/s.
    #[arg(long, value_delimiter = ',', default_value = "50,500")]
    rates: Vec<u32>,
    /// Measured window per rate.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Load before the window, not counted.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    warmup: Duration,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 256)]
    body_size: usize,
    /// The topic's concurrency.
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `pickup`: every store at every rate, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = Settings {
        rates: a.rates,
        duration: a.duration,
        warmup: a.warmup,
        body_size: a.body_size,
        concurrency: a.concurrency.max(1),
    };
    let mut runs = Vec::new();
    for store in &a.store {
        runs.extend(measure(&s, store).await?);
    }
    if a.json {
        print_json(&serde_json::json!({ "bench": "pickup", "runs": runs }))?;
    } else {
        print(&s, &runs);
    }
    Ok(ExitCode::SUCCESS)
}
