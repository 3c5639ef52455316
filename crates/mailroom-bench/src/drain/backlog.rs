//! `backlog`: does the drain slow down as finished rows accumulate? A large
//! backlog (default 1,000,000 events) is preloaded into a fresh PostgreSQL
//! database and drained by one instance; the rate is taken over every
//! `--window` events drained (first and last compared), and a probe on a
//! store handle of its own times single claim statements — before the
//! drain, at 5 %, 50 % and 95 % of it (beside the engine's load), and after
//! it (an empty claim over the finished backlog). The probe's events are
//! completed `done` and counted as drained.

use super::{DrainMode, Instance, Settings, TOPIC, drain_all, instance, preload_store};
use crate::backend::{Backend, Fresh, Opened};
use crate::cli::{parse_duration, print_json};
use crate::counting::CallCounts;
use crate::pgwork::DbWork;
use anyhow::{Context, bail};
use mailroom::OnDead;
use mailroom::pull::Completion;
use mailroom::store::ClaimRequest;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Where the probes run, as shares of the backlog drained.
const PROBE_AT: [f64; 3] = [0.05, 0.5, 0.95];

#[derive(Debug, Clone)]
pub struct BacklogSettings {
    pub drain: Settings,
    pub mode: DrainMode,
    /// Events per rate window.
    pub window: u64,
    /// Claim statements per probe, and events each asks for.
    pub probe_claims: u32,
    pub probe_size: u32,
}

/// The drain rate over one window of events.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Window {
    /// Events drained before the window, and at its end.
    pub from: u64,
    pub to: u64,
    pub secs: f64,
    pub events_per_sec: f64,
    /// The engine's claim calls in the window and their mean time, pool
    /// queueing included.
    pub engine_claims: u64,
    pub engine_claim_ms: f64,
}

/// One probe: `probe_claims` claim statements, one after another.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Probe {
    /// "before", "5%", "50%", "95%", "after".
    pub at: String,
    /// Events drained when it started.
    pub drained: u64,
    pub claim_ms: Vec<f64>,
    pub median_ms: f64,
    /// The fastest: the statement's own cost, least disturbed by the load.
    pub min_ms: f64,
    /// Events the probe claimed (and completed).
    pub claimed: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BacklogResult {
    pub mode: DrainMode,
    pub events: u64,
    pub preload_secs: f64,
    pub drain_secs: f64,
    pub events_per_sec: f64,
    pub windows: Vec<Window>,
    /// Rate of the last window over the rate of the first (target ≥ 0.8).
    pub last_over_first: Option<f64>,
    pub probes: Vec<Probe>,
    pub db: Option<DbWork>,
}

pub async fn measure(s: &BacklogSettings, backend: &Backend) -> anyhow::Result<BacklogResult> {
    if *backend == Backend::Sqlite {
        bail!("backlog needs --store postgres://...");
    }
    let fresh = backend.fresh().await?;
    let result = run_on(s, &fresh).await;
    let cleanup = fresh.cleanup().await;
    let r = result?;
    cleanup?;
    Ok(r)
}

async fn run_on(s: &BacklogSettings, fresh: &Fresh) -> anyhow::Result<BacklogResult> {
    let (preload, _) = preload_store(&s.drain, s.mode, fresh, &mut Vec::new()).await?;
    let inst = instance(&s.drain, s.mode, fresh, 0).await?;
    let prober = fresh.open(true).await?;
    let mut probes = vec![probe(s, &prober, "before", &inst).await?];
    let all = [inst];
    let stop = CancellationToken::new();
    let watch = tokio::spawn(watch_windows(s.clone(), progress(&all), stop.clone()));
    let during = tokio::spawn(probe_during(
        s.clone(),
        prober.clone(),
        progress(&all),
        stop.clone(),
    ));
    let drained = drain_all(&s.drain, fresh, &all).await;
    stop.cancel();
    let marks = watch.await?;
    probes.extend(during.await??);
    let d = drained?;
    probes.push(probe(s, &prober, "after", &all[0]).await?);
    prober.close().await;
    if d.done < s.drain.events {
        bail!("drain timed out: {} of {} done", d.done, s.drain.events);
    }
    let windows = windows(s, d.started, &marks);
    let rate = |w: Option<&Window>| w.map(|w| w.events_per_sec);
    Ok(BacklogResult {
        mode: s.mode,
        events: s.drain.events,
        preload_secs: preload.as_secs_f64(),
        drain_secs: d.took.as_secs_f64(),
        events_per_sec: s.drain.events as f64 / d.took.as_secs_f64(),
        last_over_first: match (rate(windows.first()), rate(windows.last())) {
            (Some(f), Some(l)) if f > 0.0 && windows.len() > 1 => Some(l / f),
            _ => None,
        },
        windows,
        probes,
        db: d.db,
    })
}

/// What the watchers read while the engine drains: events handled (the
/// probe's included) and the engine's store calls.
#[derive(Clone)]
struct Progress {
    handled: Arc<std::sync::atomic::AtomicU64>,
    calls: Arc<crate::counting::Calls>,
}

fn progress(all: &[Instance]) -> Progress {
    Progress {
        handled: all[0].handled.clone(),
        calls: all[0].calls.clone(),
    }
}

/// A window boundary: when `handled` first reached it, and the engine's
/// calls then.
struct Mark {
    at: Instant,
    calls: CallCounts,
}

/// Records a [`Mark`] each time another `window` events are handled (and
/// at the last event), polling every 2 ms, until `stop`.
async fn watch_windows(s: BacklogSettings, p: Progress, stop: CancellationToken) -> Vec<Mark> {
    let events = s.drain.events;
    let window = s.window.max(1);
    let bounds: Vec<u64> = (1..=events.div_ceil(window))
        .map(|k| (k * window).min(events))
        .collect();
    let mut marks = Vec::with_capacity(bounds.len());
    while marks.len() < bounds.len() && !stop.is_cancelled() {
        let handled = p.handled.load(Ordering::Relaxed);
        while marks.len() < bounds.len() && handled >= bounds[marks.len()] {
            marks.push(Mark {
                at: Instant::now(),
                calls: p.calls.snapshot(),
            });
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    marks
}

/// The rate windows from the drain's start and the marks.
fn windows(s: &BacklogSettings, started: Instant, marks: &[Mark]) -> Vec<Window> {
    let mut out = Vec::with_capacity(marks.len());
    let (mut at, mut calls, mut from) = (started, CallCounts::default(), 0);
    for (k, m) in (1..).zip(marks) {
        let to = (k * s.window.max(1)).min(s.drain.events);
        let secs = m.at.duration_since(at).as_secs_f64();
        let c = m.calls.since(calls);
        out.push(Window {
            from,
            to,
            secs,
            events_per_sec: (to - from) as f64 / secs.max(1e-9),
            engine_claims: c.claims,
            engine_claim_ms: c.claim_ms(),
        });
        (at, calls, from) = (m.at, m.calls, to);
    }
    out
}

/// Runs the probes at [`PROBE_AT`] shares of the drain, beside the engine
/// (those not reached before `stop` are skipped).
async fn probe_during(
    s: BacklogSettings,
    prober: Opened,
    p: Progress,
    stop: CancellationToken,
) -> anyhow::Result<Vec<Probe>> {
    let mut out = Vec::new();
    for share in PROBE_AT {
        let at = (s.drain.events as f64 * share) as u64;
        while p.handled.load(Ordering::Relaxed) < at {
            if stop.is_cancelled() {
                return Ok(out);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let label = format!("{:.0}%", share * 100.0);
        out.push(probe_with(&s, &prober, &label, &p).await?);
    }
    Ok(out)
}

async fn probe(
    s: &BacklogSettings,
    prober: &Opened,
    label: &str,
    inst: &Instance,
) -> anyhow::Result<Probe> {
    let p = Progress {
        handled: inst.handled.clone(),
        calls: inst.calls.clone(),
    };
    probe_with(s, prober, label, &p).await
}

/// `probe_claims` claims of `probe_size` events on the drain's topic, each
/// timed, then every claimed event completed `done` and counted handled.
async fn probe_with(
    s: &BacklogSettings,
    prober: &Opened,
    label: &str,
    p: &Progress,
) -> anyhow::Result<Probe> {
    let store = prober.store();
    let req = ClaimRequest {
        topic: TOPIC.into(),
        worker: "bench-probe".into(),
        max: s.probe_size.max(1),
        lease: Duration::from_secs(60),
        per_key: (s.mode == DrainMode::Sequential).then_some(OnDead::Block),
        max_wait_for_priority: None,
        expire_after: None,
    };
    let drained = p.handled.load(Ordering::Relaxed);
    let mut claim_ms = Vec::new();
    let mut items = Vec::new();
    for _ in 0..s.probe_claims.max(1) {
        let started = Instant::now();
        let claimed = store.claim(&req).await.context("probe claim")?;
        claim_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        items.extend(
            claimed
                .into_iter()
                .map(|c| (c.event.id, c.token, Completion::Done)),
        );
    }
    let claimed = items.len() as u64;
    for r in store.complete_many(items).await {
        r.context("probe completion")?;
    }
    p.handled.fetch_add(claimed, Ordering::Relaxed);
    Ok(Probe {
        at: label.into(),
        drained,
        median_ms: super::median(claim_ms.clone()).unwrap_or(f64::NAN),
        min_ms: claim_ms.iter().copied().fold(f64::INFINITY, f64::min),
        claim_ms,
        claimed,
    })
}

pub fn print(s: &BacklogSettings, r: &BacklogResult) {
    println!(
        "backlog: {} events preloaded in {:.1} s, drained by one {} instance in {:.1} s ({:.0} events/s); rate per {} events:",
        r.events,
        r.preload_secs,
        r.mode.name(),
        r.drain_secs,
        r.events_per_sec,
        s.window,
    );
    println!(
        "{:>9} {:>9} {:>8} {:>9} {:>8} {:>11}",
        "from", "to", "secs", "events/s", "claims", "claim ms"
    );
    for w in &r.windows {
        println!(
            "{:>9} {:>9} {:>8.2} {:>9.0} {:>8} {:>11.2}",
            w.from, w.to, w.secs, w.events_per_sec, w.engine_claims, w.engine_claim_ms
        );
    }
    println!(
        "last window / first window: {} (target >= 0.80)",
        crate::stats::fmt_times(r.last_over_first)
    );
    println!(
        "claim probes ({} claims of up to {} events each, own connection pool; 'claim ms' above is the engine's, pool queueing included):",
        s.probe_claims, s.probe_size
    );
    for p in &r.probes {
        let each: Vec<String> = p.claim_ms.iter().map(|m| format!("{m:.2}")).collect();
        println!(
            "  {:<7} at {:>8} drained: median {:>7.2} ms, min {:>6.2} ms [{}], {} events claimed",
            p.at,
            p.drained,
            p.median_ms,
            p.min_ms,
            each.join(" "),
            p.claimed
        );
    }
    if let Some(db) = &r.db {
        println!(
            "database work: per 1,000 events {:.3} PostgreSQL CPU-s, {:.2} MiB WAL, {} WAL records per event, {} full-page images per event",
            db.cpu_secs_per_1k,
            db.wal_mib_per_1k(),
            db.wal_records_per_event
                .map_or_else(|| "-".into(), |x| format!("{x:.1}")),
            db.wal_fpi_per_event
                .map_or_else(|| "-".into(), |x| format!("{x:.2}")),
        );
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The PostgreSQL server: a fresh database is created and dropped.
    #[arg(long, value_parser = Backend::parse)]
    store: Backend,
    /// Events preloaded and drained.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Topic mode of the drain.
    #[arg(long, default_value = "single", value_parser = DrainMode::parse)]
    mode: DrainMode,
    /// Events per rate window (the first and the last are compared).
    #[arg(long, default_value_t = 100_000)]
    window: u64,
    /// Claim statements per probe.
    #[arg(long, default_value_t = 10)]
    probe_claims: u32,
    /// Events each probe claim asks for.
    #[arg(long, default_value_t = 64)]
    probe_size: u32,
    /// Attempts in flight of the single and sequential topics.
    #[arg(long, default_value_t = 256)]
    concurrency: u32,
    /// Ordering keys of the sequential topic.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// The batch topic's max_size.
    #[arg(long, default_value_t = 500)]
    batch_size: u32,
    /// Batch deliveries in flight.
    #[arg(long, default_value_t = 16)]
    batch_concurrency: u32,
    /// Concurrent enqueues while preloading.
    #[arg(long, default_value_t = 512)]
    preload_concurrency: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 256)]
    body_size: usize,
    /// Give up after this long.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    timeout: Duration,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `backlog`: one drain of a large backlog, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = BacklogSettings {
        drain: Settings {
            events: a.events.max(1),
            concurrency: a.concurrency.max(1),
            preload_concurrency: a.preload_concurrency.max(1),
            body_size: a.body_size,
            keys: a.keys.max(1),
            batch_size: a.batch_size.max(1),
            batch_wait: Duration::from_millis(50),
            batch_concurrency: a.batch_concurrency.max(1),
            timeout: a.timeout,
            rate: None,
            max_running: None,
        },
        mode: a.mode,
        window: a.window.max(1),
        probe_claims: a.probe_claims.max(1),
        probe_size: a.probe_size.max(1),
    };
    let r = measure(&s, &a.store).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "backlog", "result": r }))?;
    } else {
        print(&s, &r);
    }
    Ok(ExitCode::SUCCESS)
}
