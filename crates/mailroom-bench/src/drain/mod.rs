//! `drain`: N pending events preloaded into a fresh store, then processed
//! through a no-op handler by a `single`, `sequential` (events spread
//! round-robin over `--keys` ordering keys) or `batch` topic, by one or more
//! mailroom instances. In-process: this process is mailroom, so its RSS is
//! mailroom's; with `--instances 2` it runs two engines, each with its own
//! store handle (own connection pool, writer, completer and `LISTEN`
//! connection, as two processes would have), sharing this process's CPU.

pub mod backlog;
mod report;

pub use report::{print_rounds, print_table};

use crate::backend::{Backend, Fresh, ServerStats};
use crate::cli::{parse_duration, parse_rate, print_json};
use crate::counting::{CallCounts, CountingStore};
use crate::pgwork::{self, CpuSampler, DbWork};
use crate::procfs;
use anyhow::{Context, bail};
use bytes::Bytes;
use mailroom::handler::{batch_handler_fn, handler_fn};
use mailroom::{BatchSettings, Draft, Engine, Mode, OnDead, Status, StoreError, TopicSpec};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "drain";

/// The topic mode under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DrainMode {
    Single,
    Sequential,
    Batch,
}

impl DrainMode {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "single" => Ok(Self::Single),
            "sequential" => Ok(Self::Sequential),
            "batch" => Ok(Self::Batch),
            _ => Err(format!("expected single, sequential or batch, got {s:?}")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Sequential => "sequential",
            Self::Batch => "batch",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub events: u64,
    /// Attempts in flight (single and sequential topics).
    pub concurrency: u32,
    pub preload_concurrency: usize,
    pub body_size: usize,
    /// Ordering keys of the sequential topic.
    pub keys: u64,
    /// Batch topic: `max_size`, `max_wait`, deliveries in flight.
    pub batch_size: u32,
    pub batch_wait: Duration,
    pub batch_concurrency: u32,
    /// Give up after this long.
    pub timeout: Duration,
    /// The single and sequential topics' `rate`, if any.
    pub rate: Option<mailroom::Rate>,
    /// The single and sequential topics' `max_running`, if any.
    pub max_running: Option<u32>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainResult {
    pub mode: DrainMode,
    pub store: &'static str,
    pub instances: usize,
    pub events: u64,
    pub preload_secs: f64,
    pub preload_inserts_per_sec: f64,
    /// Insert transactions while preloading (the store's writer).
    pub preload_commits: u64,
    pub drain_secs: f64,
    pub events_per_sec: f64,
    /// SQLite: write transactions (claims + completions) while draining.
    /// PostgreSQL: committed transactions of the database while draining
    /// (`pg_stat_database.xact_commit`, read-only ones included).
    pub drain_commits: u64,
    pub done: u64,
    pub handled: u64,
    /// Events handled by each instance.
    pub handled_per_instance: Vec<u64>,
    /// Store calls of the dispatchers while draining (all instances).
    pub calls: CallCounts,
    /// Bytes this process sent to the disk while draining (SQLite's writes;
    /// PostgreSQL writes from its own processes, not counted here).
    pub drain_write_bytes: u64,
    /// Highest VmRSS sampled while draining, MiB.
    pub drain_peak_rss_mib: f64,
    /// VmHWM of the process at the end (preload included), MiB.
    pub hwm_mib: f64,
    /// Share of one core per thread name of this process while draining.
    pub cpu: BTreeMap<String, f64>,
    /// Share of one core per PostgreSQL process kind while draining.
    pub pg_cpu: BTreeMap<String, f64>,
    /// PostgreSQL: the database's CPU time and WAL for this drain, and per
    /// event.
    pub db: Option<DbWork>,
}

/// Runs one mode on a fresh store of `backend`, which is dropped afterwards.
pub async fn measure(
    s: &Settings,
    mode: DrainMode,
    backend: &Backend,
    instances: usize,
) -> anyhow::Result<DrainResult> {
    if instances > 1 && *backend == Backend::Sqlite {
        bail!("several instances need a shared database: give --store postgres://...");
    }
    let fresh = backend.fresh().await?;
    let result = run_on(s, mode, &fresh, instances.max(1)).await;
    let cleanup = fresh.cleanup().await;
    let r = result?;
    cleanup?;
    Ok(r)
}

struct Instance {
    engine: Engine,
    opened: crate::backend::Opened,
    calls: Arc<crate::counting::Calls>,
    handled: Arc<AtomicU64>,
}

fn topic_spec(s: &Settings, mode: DrainMode) -> TopicSpec {
    let limited = |mut t: TopicSpec| {
        t.rate = s.rate;
        t.max_running = s.max_running;
        t
    };
    match mode {
        DrainMode::Single => limited(TopicSpec::new(TOPIC).concurrency(s.concurrency)),
        DrainMode::Sequential => limited(
            TopicSpec::new(TOPIC)
                .mode(Mode::Sequential {
                    on_dead: OnDead::Block,
                })
                .concurrency(s.concurrency),
        ),
        DrainMode::Batch => TopicSpec::new(TOPIC)
            .mode(Mode::Batch(BatchSettings {
                max_size: s.batch_size.max(1),
                max_wait: s.batch_wait,
                schedule: None,
                group_by: None,
            }))
            .concurrency(s.batch_concurrency),
    }
}

async fn instance(
    s: &Settings,
    mode: DrainMode,
    fresh: &Fresh,
    n: usize,
) -> anyhow::Result<Instance> {
    let opened = fresh.open(true).await?;
    let counting = CountingStore::new(opened.store());
    let calls = counting.calls.clone();
    let store: Arc<dyn mailroom::Store> = Arc::new(counting);
    store.migrate().await.context("migrating")?;
    let handled = Arc::new(AtomicU64::new(0));
    let counter = handled.clone();
    let handler = match mode {
        DrainMode::Single | DrainMode::Sequential => handler_fn(move |_event: mailroom::Event| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                Ok::<(), String>(())
            }
        }),
        DrainMode::Batch => batch_handler_fn(move |events: Vec<mailroom::Event>| {
            let counter = counter.clone();
            let n = events.len() as u64;
            async move {
                counter.fetch_add(n, Ordering::Relaxed);
                Ok::<(), String>(())
            }
        }),
    };
    let engine = Engine::builder(store)
        .worker_id(format!("bench-{n}"))
        .topic(topic_spec(s, mode))
        .handler(TOPIC, handler)
        .build()?;
    Ok(Instance {
        engine,
        opened,
        calls,
        handled,
    })
}

async fn preload(s: &Settings, mode: DrainMode, engine: &Engine) -> anyhow::Result<()> {
    let payload = crate::ingest::body(s.body_size);
    let mut tasks = tokio::task::JoinSet::new();
    let workers = s.preload_concurrency.max(1) as u64;
    let keys = s.keys.max(1);
    for w in 0..workers {
        let share = s.events / workers + u64::from(w < s.events % workers);
        let engine = engine.clone();
        let payload: Bytes = payload.clone();
        tasks.spawn(async move {
            for j in 0..share {
                // Event number w + j * workers: keys go round-robin over the
                // arrival order.
                let key = (mode == DrainMode::Sequential)
                    .then(|| format!("k{}", (w + j * workers) % keys));
                loop {
                    let mut draft =
                        Draft::bytes(TOPIC, payload.clone()).content_type("application/json");
                    if let Some(k) = &key {
                        draft = draft.key(k.clone());
                    }
                    match engine.enqueue(draft).await {
                        Ok(_) => break,
                        Err(mailroom::EnqueueError::Store(StoreError::Overloaded)) => {
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
    Ok(())
}

async fn run_on(
    s: &Settings,
    mode: DrainMode,
    fresh: &Fresh,
    instances: usize,
) -> anyhow::Result<DrainResult> {
    let mut all = Vec::with_capacity(instances);
    let (preload, preload_commits) = preload_store(s, mode, fresh, &mut all).await?;
    while all.len() < instances {
        all.push(instance(s, mode, fresh, all.len()).await?);
    }
    let d = drain_all(s, fresh, &all).await?;
    let handled_per_instance: Vec<u64> = all
        .iter()
        .map(|i| i.handled.load(Ordering::Relaxed))
        .collect();
    drop(all);
    let done = d.done;
    if done < s.events {
        bail!(
            "drain timed out after {:?}: {done} of {} done",
            s.timeout,
            s.events
        );
    }
    Ok(DrainResult {
        mode,
        store: if fresh.is_postgres() {
            "postgres"
        } else {
            "sqlite"
        },
        instances,
        events: s.events,
        preload_secs: preload.as_secs_f64(),
        preload_inserts_per_sec: s.events as f64 / preload.as_secs_f64(),
        preload_commits,
        drain_secs: d.took.as_secs_f64(),
        events_per_sec: s.events as f64 / d.took.as_secs_f64(),
        drain_commits: d.commits,
        drain_write_bytes: d.after.written.saturating_sub(d.before.written),
        done,
        handled: handled_per_instance.iter().sum(),
        handled_per_instance,
        calls: d.after.calls.since(d.before.calls),
        drain_peak_rss_mib: procfs::mib(d.peak_rss),
        hwm_mib: procfs::mib(procfs::status_bytes("self", "VmHWM").unwrap_or(0)),
        cpu: procfs::cpu_share(&d.before.cpu, &d.after.cpu, d.took),
        pg_cpu: procfs::cpu_share(&BTreeMap::new(), &d.pg_cpu, d.took),
        db: d.db,
    })
}

/// What one drain measured.
struct Drained {
    /// Events `done` in the store at the end.
    done: u64,
    /// When the engines started, and how long until every event was done.
    started: Instant,
    took: Duration,
    before: Counters,
    after: Counters,
    /// The database's commits (PostgreSQL), else the store writers'.
    commits: u64,
    peak_rss: u64,
    /// CPU time of PostgreSQL's processes by kind while draining.
    pg_cpu: BTreeMap<String, Duration>,
    db: Option<DbWork>,
}

/// Runs every instance's engine until the store has all events `done` (or
/// the timeout), then stops them and closes their store handles.
async fn drain_all(s: &Settings, fresh: &Fresh, all: &[Instance]) -> anyhow::Result<Drained> {
    let stop_rss = CancellationToken::new();
    let rss = tokio::spawn(procfs::sample_rss("self".into(), stop_rss.clone()));
    if fresh.is_postgres() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let server_before = fresh.server_stats().await;
    let wal_before = pgwork::read_wal(fresh).await;
    let sampler = fresh.is_postgres().then(CpuSampler::start);
    let before = Counters::take(all);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let runners: Vec<_> = all
        .iter()
        .map(|i| {
            let (engine, shutdown) = (i.engine.clone(), shutdown.clone());
            tokio::spawn(async move { engine.run(shutdown).await })
        })
        .collect();
    let done = wait_until_done(s, all, started + s.timeout).await?;
    let took = started.elapsed();
    let after = Counters::take(all);
    let pg_cpu = match sampler {
        Some(s) => s.finish().await,
        None => BTreeMap::new(),
    };
    shutdown.cancel();
    for r in runners {
        r.await?;
    }
    for i in all {
        i.opened.close().await;
    }
    // Closed backends report their counters as they exit.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let commits = match (server_before, fresh.server_stats().await) {
        (Some(b), Some(a)) => ServerStats::since(a, b).xact_commit,
        _ => after.commits - before.commits,
    };
    let db = match (wal_before, pgwork::read_wal(fresh).await) {
        (Some(b), Some(a)) => Some(DbWork::new(s.events, &pg_cpu, b, a)),
        _ => None,
    };
    stop_rss.cancel();
    let peak_rss = rss.await?.sampled_max;
    Ok(Drained {
        done,
        started,
        took,
        before,
        after,
        commits,
        peak_rss,
        pg_cpu,
        db,
    })
}

/// Preload: many concurrent enqueues, which the writer groups into commits.
/// On PostgreSQL through a handle of its own, closed before the drain, so
/// the server's commit counters of the drain are the drain's; on SQLite
/// through the first instance, pushed onto `all`. How long it took and the
/// insert transactions it committed.
async fn preload_store(
    s: &Settings,
    mode: DrainMode,
    fresh: &Fresh,
    all: &mut Vec<Instance>,
) -> anyhow::Result<(Duration, u64)> {
    if fresh.is_postgres() {
        let loader = instance(s, mode, fresh, usize::MAX).await?;
        let started = Instant::now();
        preload(s, mode, &loader.engine).await?;
        let took = started.elapsed();
        let commits = loader.opened.commits();
        loader.opened.close().await;
        return Ok((took, commits));
    }
    let first = instance(s, mode, fresh, 0).await?;
    let started = Instant::now();
    preload(s, mode, &first.engine).await?;
    let took = (started.elapsed(), first.opened.commits());
    all.push(first);
    Ok(took)
}

/// This process's counters a drain is measured by, read at its start and
/// at its end.
struct Counters {
    cpu: BTreeMap<String, Duration>,
    calls: CallCounts,
    commits: u64,
    written: u64,
}

impl Counters {
    fn take(all: &[Instance]) -> Self {
        Counters {
            cpu: procfs::threads_cpu("self"),
            calls: all
                .iter()
                .map(|i| i.calls.snapshot())
                .fold(CallCounts::default(), CallCounts::add),
            commits: all.iter().map(|i| i.opened.commits()).sum(),
            written: procfs::io_counter("self", "write_bytes").unwrap_or(0),
        }
    }
}

/// Waits until the store has every event `done` (or `deadline`), and
/// returns how many are. The handlers' counters say when the last attempt
/// ran; the store says when its completion is committed: the drain is
/// timed to the latter.
async fn wait_until_done(s: &Settings, all: &[Instance], deadline: Instant) -> anyhow::Result<u64> {
    let handled = || -> u64 { all.iter().map(|i| i.handled.load(Ordering::Relaxed)).sum() };
    while handled() < s.events && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let store = all[0].opened.store();
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
    Ok(done)
}

/// Events/s of `r` over the `single` figure of the same run and store.
pub fn ratio_vs_single(results: &[DrainResult], r: &DrainResult) -> Option<f64> {
    let single = results.iter().find(|x| {
        x.mode == DrainMode::Single && x.store == r.store && x.instances == r.instances
    })?;
    (single.events_per_sec > 0.0).then(|| r.events_per_sec / single.events_per_sec)
}

/// The median of `xs` (the mean of the middle two for an even count).
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(xs[n / 2]),
        _ => Some((xs[n / 2 - 1] + xs[n / 2]) / 2.0),
    }
}

/// Per mode over all rounds: median events/s and median ratio vs the
/// `single` figure of the same round.
#[derive(Debug, serde::Serialize)]
pub struct MedianResult {
    pub mode: DrainMode,
    pub events_per_sec: f64,
    pub ratio_vs_single: Option<f64>,
    /// PostgreSQL: median CPU-seconds and WAL MiB per 1,000 events.
    pub cpu_secs_per_1k: Option<f64>,
    pub wal_mib_per_1k: Option<f64>,
}

pub fn medians(rounds: &[Vec<DrainResult>]) -> Vec<MedianResult> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|r| {
            let same = |round: &[DrainResult]| -> Option<DrainResult> {
                round.iter().find(|x| x.mode == r.mode).cloned()
            };
            let per_round: Vec<(DrainResult, Option<f64>)> = rounds
                .iter()
                .filter_map(|round| {
                    let x = same(round)?;
                    let ratio = ratio_vs_single(round, &x);
                    Some((x, ratio))
                })
                .collect();
            let of = |f: &dyn Fn(&DrainResult) -> Option<f64>| -> Option<f64> {
                median(per_round.iter().filter_map(|p| f(&p.0)).collect())
            };
            MedianResult {
                mode: r.mode,
                events_per_sec: of(&|x| Some(x.events_per_sec)).unwrap_or(0.0),
                ratio_vs_single: median(per_round.iter().filter_map(|p| p.1).collect()),
                cpu_secs_per_1k: of(&|x| x.db.as_ref().map(|d| d.cpu_secs_per_1k)),
                wal_mib_per_1k: of(&|x| x.db.as_ref().map(DbWork::wal_mib_per_1k)),
            }
        })
        .collect()
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Topic modes to run, each on a fresh store: single, sequential, batch.
    #[arg(long, value_delimiter = ',', default_value = "single,sequential,batch", value_parser = DrainMode::parse)]
    modes: Vec<DrainMode>,
    /// `sqlite` (a temporary file) or `postgres://...`: a fresh database is
    /// created on that server for each mode and dropped afterwards.
    #[arg(long, default_value = "sqlite", value_parser = Backend::parse)]
    store: Backend,
    /// Engines draining the store at once, each with its own store handle
    /// (PostgreSQL only).
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Run every mode this many times, in rounds (single, sequential,
    /// batch, single, ...), and report each round's ratios and their
    /// medians: on a noisy machine one round can be off by 30%.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    #[command(flatten)]
    drain: SettingsArgs,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct SettingsArgs {
    /// Events to preload and drain.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Attempts in flight of the single and sequential topics.
    #[arg(long, default_value_t = 256)]
    pub concurrency: u32,
    /// Ordering keys of the sequential topic (events spread round-robin).
    #[arg(long, default_value_t = 1000)]
    pub keys: u64,
    /// The batch topic's max_size.
    #[arg(long, default_value_t = 500)]
    pub batch_size: u32,
    /// The batch topic's max_wait.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub batch_wait: Duration,
    /// Batch deliveries in flight (the batch topic's concurrency).
    #[arg(long, default_value_t = 16)]
    pub batch_concurrency: u32,
    /// Concurrent enqueues while preloading.
    #[arg(long, default_value_t = 512)]
    pub preload_concurrency: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 256)]
    pub body_size: usize,
    /// Give up after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The single and sequential topics' `rate` ("500/s"): the drain's
    /// events/s against it is the rate's accuracy.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<mailroom::Rate>,
    /// The single and sequential topics' `max_running`.
    #[arg(long)]
    pub max_running: Option<u32>,
}

impl SettingsArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            events: self.events,
            concurrency: self.concurrency.max(1),
            preload_concurrency: self.preload_concurrency.max(1),
            body_size: self.body_size,
            keys: self.keys.max(1),
            batch_size: self.batch_size.max(1),
            batch_wait: self.batch_wait,
            batch_concurrency: self.batch_concurrency.max(1),
            timeout: self.timeout,
            rate: self.rate,
            max_running: self.max_running,
        }
    }
}

/// Runs `drain`: every mode, `--rounds` times, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let settings = a.drain.settings();
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        let mut round = Vec::new();
        for mode in &a.modes {
            round.push(measure(&settings, *mode, &a.store, a.instances).await?);
        }
        rounds.push(round);
    }
    if rounds.len() > 1 {
        if a.json {
            print_json(&serde_json::json!({
                "bench": "drain",
                "rounds": rounds,
                "median": medians(&rounds),
            }))?;
        } else {
            print_rounds(&settings, &rounds);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let results = rounds.remove(0);
    if a.json {
        let ratios: Vec<Option<f64>> = results
            .iter()
            .map(|r| ratio_vs_single(&results, r))
            .collect();
        print_json(&serde_json::json!({
            "bench": "drain",
            "concurrency": settings.concurrency,
            "keys": settings.keys,
            "batch_size": settings.batch_size,
            "batch_wait_secs": settings.batch_wait.as_secs_f64(),
            "modes": results,
            "ratio_vs_single": ratios,
        }))?;
    } else {
        print_table(&settings, &results);
    }
    Ok(ExitCode::SUCCESS)
}
