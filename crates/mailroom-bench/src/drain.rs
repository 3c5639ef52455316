//! `drain`: N pending events preloaded into a fresh SQLite store, then
//! processed by one `single` topic with a no-op handler. In-process: this
//! process is mailroom, so its RSS is mailroom's.

use crate::procfs;
use anyhow::Context;
use bytes::Bytes;
use mailroom::handler::handler_fn;
use mailroom::{Draft, Engine, Status, StoreError, TopicSpec};
use mailroom_sqlite::{SqliteOptions, SqliteStore};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "drain";

#[derive(Debug, Clone)]
pub struct Settings {
    pub events: u64,
    pub concurrency: u32,
    pub preload_concurrency: usize,
    pub body_size: usize,
    /// Give up after this long.
    pub timeout: Duration,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainResult {
    pub events: u64,
    pub preload_secs: f64,
    pub preload_inserts_per_sec: f64,
    pub preload_commits: u64,
    pub drain_secs: f64,
    pub events_per_sec: f64,
    /// Write transactions (claims + completions) while draining.
    pub drain_commits: u64,
    pub done: u64,
    pub handled: u64,
    /// Bytes sent to the disk while draining.
    pub drain_write_bytes: u64,
    /// Highest VmRSS sampled while draining, MiB.
    pub drain_peak_rss_mib: f64,
    /// VmHWM of the process at the end (preload included), MiB.
    pub hwm_mib: f64,
    /// Share of one core per thread name while draining.
    pub cpu: BTreeMap<String, f64>,
}

pub async fn run(s: &Settings) -> anyhow::Result<DrainResult> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let sqlite = SqliteStore::open(SqliteOptions::new(dir.path().join("mailroom.db")))?;
    let store: Arc<dyn mailroom::Store> = Arc::new(sqlite.clone());
    store.migrate().await?;
    let handled = Arc::new(AtomicU64::new(0));
    let counter = handled.clone();
    let engine = Engine::builder(store.clone())
        .topic(TopicSpec::new(TOPIC).concurrency(s.concurrency))
        .handler(
            TOPIC,
            handler_fn(move |_event: mailroom::Event| {
                let counter = counter.clone();
                async move {
                    counter.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), String>(())
                }
            }),
        )
        .build()?;

    // Preload: many concurrent enqueues, which the writer groups into commits.
    let payload = crate::ingest::body(s.body_size);
    let commits_before = sqlite.commits();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let workers = s.preload_concurrency.max(1) as u64;
    for w in 0..workers {
        let share = s.events / workers + u64::from(w < s.events % workers);
        let engine = engine.clone();
        let payload: Bytes = payload.clone();
        tasks.spawn(async move {
            for _ in 0..share {
                loop {
                    let draft =
                        Draft::bytes(TOPIC, payload.clone()).content_type("application/json");
                    match engine.enqueue(draft).await {
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
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let preload = started.elapsed();
    let preload_commits = sqlite.commits() - commits_before;

    // Drain.
    let stop_rss = CancellationToken::new();
    let rss = tokio::spawn(procfs::sample_rss("self".into(), stop_rss.clone()));
    let cpu_before = procfs::threads_cpu("self");
    let commits_before = sqlite.commits();
    let written_before = procfs::io_counter("self", "write_bytes").unwrap_or(0);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let runner = {
        let engine = engine.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let deadline = started + s.timeout;
    // The handler's counter says when the last attempt ran; the store says
    // when its completion is committed. Time the latter.
    while handled.load(Ordering::Relaxed) < s.events && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut done = 0;
    while Instant::now() < deadline {
        done = store
            .stats()
            .await?
            .iter()
            .filter(|t| t.topic == TOPIC)
            .map(|t| t.count(Status::Done))
            .sum();
        if done >= s.events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drain = started.elapsed();
    let cpu = procfs::cpu_share(&cpu_before, &procfs::threads_cpu("self"), drain);
    let drain_commits = sqlite.commits() - commits_before;
    let drain_write_bytes = procfs::io_counter("self", "write_bytes")
        .unwrap_or(0)
        .saturating_sub(written_before);
    shutdown.cancel();
    runner.await?;
    stop_rss.cancel();
    let peak = rss.await?;
    let hwm = procfs::status_bytes("self", "VmHWM").unwrap_or(0);
    if done < s.events {
        anyhow::bail!(
            "drain timed out after {:?}: {done} of {} done",
            s.timeout,
            s.events
        );
    }
    Ok(DrainResult {
        events: s.events,
        preload_secs: preload.as_secs_f64(),
        preload_inserts_per_sec: s.events as f64 / preload.as_secs_f64(),
        preload_commits,
        drain_secs: drain.as_secs_f64(),
        events_per_sec: s.events as f64 / drain.as_secs_f64(),
        drain_commits,
        drain_write_bytes,
        done,
        handled: handled.load(Ordering::Relaxed),
        drain_peak_rss_mib: procfs::mib(peak.sampled_max),
        hwm_mib: procfs::mib(hwm),
        cpu,
    })
}

pub fn print_table(s: &Settings, r: &DrainResult) {
    println!(
        "drain: {} events, body {} B, topic mode single, concurrency {}, no-op handler",
        r.events, s.body_size, s.concurrency
    );
    println!(
        "  preload  {:>8.2} s  {:>9.0} inserts/s  ({} commits, {:.1} inserts/commit, {} tasks)",
        r.preload_secs,
        r.preload_inserts_per_sec,
        r.preload_commits,
        r.events as f64 / r.preload_commits.max(1) as f64,
        s.preload_concurrency,
    );
    println!(
        "  drain    {:>8.2} s  {:>9.0} events/s   ({} commits = claims + completions, {:.1} writes/commit est.)",
        r.drain_secs,
        r.events_per_sec,
        r.drain_commits,
        // Each event needs one completion, plus roughly one claim per batch.
        r.events as f64 / r.drain_commits.max(1) as f64,
    );
    println!(
        "  disk     {:.1} MiB written while draining, {:.1} KiB per commit",
        procfs::mib(r.drain_write_bytes),
        r.drain_write_bytes as f64 / 1024.0 / r.drain_commits.max(1) as f64,
    );
    println!(
        "  RSS      peak while draining {:.1} MiB, VmHWM (whole run, preload included) {:.1} MiB",
        r.drain_peak_rss_mib, r.hwm_mib
    );
    let cpu: Vec<String> = r
        .cpu
        .iter()
        .map(|(k, v)| format!("{k} {:.0}%", v * 100.0))
        .collect();
    println!(
        "  cpu      {:.0}% [{}]",
        r.cpu.values().sum::<f64>() * 100.0,
        cpu.join(", ")
    );
    println!("  done {} / handled {}", r.done, r.handled);
}
