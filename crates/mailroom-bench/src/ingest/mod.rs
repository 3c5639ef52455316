//! `ingest`: `POST /webhooks/bench` over real HTTP/1.1 keep-alive
//! connections, once with group commit on and once with one commit per
//! request, against child mailroom processes (one per instance, sharing one
//! fresh store) each time.

mod child;
mod load;
mod probe;
mod report;

pub use report::print_table;

use crate::backend::{Backend, Fresh, ServerStats};
use crate::cli::{durability_code, parse_duration, parse_on_off, print_json};
use crate::procfs;
use anyhow::bail;
use bytes::Bytes;
use child::spawn_child;
use load::{TaskStats, Window, direct_task, http_task};
use mailroom::Engine;
use probe::{CpuProbe, CpuShares, RssSampler};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The webhook source (and so the topic) every request goes to.
const SOURCE: &str = "bench";

/// How the load is run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub concurrency: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub body_size: usize,
    /// Skip HTTP: call the engine's webhook intake in this process
    /// (experiment: separates HTTP from store costs).
    pub direct: bool,
    /// Run the child without the Prometheus recorder (experiment).
    pub no_metrics: bool,
    /// Where the events go (a fresh store per mode).
    pub backend: Backend,
    /// Child mailroom processes sharing the store; connections are spread
    /// over them round-robin.
    pub instances: usize,
}

/// One mode's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModeResult {
    pub mode: &'static str,
    pub group_commit: bool,
    pub store: &'static str,
    pub instances: usize,
    /// Acks (200, `"duplicate": false`) over the whole run, warm-up included.
    pub acked_total: u64,
    /// Acks completed inside the measured window.
    pub acked: u64,
    pub window_secs: f64,
    pub acks_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub duplicates: u64,
    pub errors: BTreeMap<String, u64>,
    /// Events found in the store after mailroom stopped.
    pub stored: u64,
    /// Insert transactions of the store writers over the whole run (all
    /// instances).
    pub commits: u64,
    /// PostgreSQL: committed transactions of the database over the whole
    /// run, as the server counts them (reads and migrations included).
    pub server_commits: Option<u64>,
    /// Bytes mailroom handed to `write` calls over the whole run (WAL,
    /// checkpoints, sockets).
    pub wchar: u64,
    /// Bytes mailroom sent to the disk over the whole run.
    pub write_bytes: u64,
    /// Highest VmRSS sampled every 100 ms (of the largest instance), MiB.
    pub peak_rss_mib: f64,
    /// VmHWM at the end, MiB.
    pub hwm_mib: f64,
    /// Share of one core per mailroom thread name over the window.
    pub mailroom_cpu: BTreeMap<String, f64>,
    /// Share of one core used by the load generator over the window.
    pub loadgen_cpu: f64,
    /// Share of one core per PostgreSQL process kind over the window.
    pub pg_cpu: BTreeMap<String, f64>,
}

impl ModeResult {
    pub fn durable(&self) -> bool {
        self.stored == self.acked_total
    }
}

pub async fn measure(s: &Settings, only: Option<bool>) -> anyhow::Result<Vec<ModeResult>> {
    if s.instances > 1 && s.backend == Backend::Sqlite {
        bail!("several instances need a shared database: give --store postgres://...");
    }
    if s.instances > 1 && s.direct {
        bail!("--direct runs one in-process instance");
    }
    let mut out = Vec::new();
    for group_commit in [true, false] {
        if only.is_some_and(|o| o != group_commit) {
            continue;
        }
        let fresh = s.backend.fresh().await?;
        let r = if s.direct {
            run_direct(s, group_commit, &fresh).await
        } else {
            run_http(s, group_commit, &fresh).await
        };
        let cleanup = fresh.cleanup().await;
        out.push(r?);
        cleanup?;
    }
    Ok(out)
}

fn mode_name(group_commit: bool) -> &'static str {
    if group_commit {
        "group-commit"
    } else {
        "commit-per-request"
    }
}

/// A JSON body of exactly `size` bytes (or the smallest valid one).
pub fn body(size: usize) -> Bytes {
    let head = r#"{"type":"bench.event","data":""#;
    let tail = r#""}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut s = String::with_capacity(size.max(head.len() + tail.len()));
    s.push_str(head);
    s.extend(std::iter::repeat_n('x', pad));
    s.push_str(tail);
    Bytes::from(s)
}

async fn run_http(s: &Settings, group_commit: bool, fresh: &Fresh) -> anyhow::Result<ModeResult> {
    let server_before = fresh.server_stats().await;
    let mut children = Vec::new();
    for _ in 0..s.instances.max(1) {
        children.push(spawn_child(s, group_commit, &fresh.url).await?);
    }
    let pids: Vec<String> = children.iter().map(|c| c.pid.clone()).collect();
    let addrs: Vec<SocketAddr> = children.iter().map(|c| c.addr).collect();
    let rss = RssSampler::start(&pids);
    let window = Window::new(s.warmup, s.duration);
    let payload = body(s.body_size);
    let tag = mode_name(group_commit);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..s.concurrency {
        tasks.spawn(http_task(
            addrs[i % addrs.len()],
            format!("{tag}-{i}"),
            payload.clone(),
            window,
        ));
    }
    let probe = CpuProbe::at_window_start(pids.clone(), window).await;
    let cpu = probe.at_window_end(window).await;
    let mut total = TaskStats::default();
    while let Some(t) = tasks.join_next().await {
        total.merge(t?);
    }
    let peak = rss.stop().await?;
    let hwm = pids
        .iter()
        .filter_map(|pid| procfs::status_bytes(pid, "VmHWM"))
        .max()
        .unwrap_or(0);
    let io = pids
        .iter()
        .map(|pid| Io::read(pid))
        .fold(Io::default(), Io::add);
    // Stop mailroom gracefully and collect the commit counts.
    let mut commits = 0;
    for c in children {
        commits += c.stop().await?;
    }
    let counts = Counts::read(fresh, server_before, commits, io).await?;
    Ok(finish(s, group_commit, total, counts, peak, hwm, cpu))
}

/// In-process intake without HTTP: the same engine path
/// (`ingest_webhook`: source resolution, envelope, insert), no sockets.
async fn run_direct(s: &Settings, group_commit: bool, fresh: &Fresh) -> anyhow::Result<ModeResult> {
    let server_before = fresh.server_stats().await;
    let opened = fresh.open(group_commit).await?;
    let store: Arc<dyn mailroom::Store> = opened.store();
    store.migrate().await?;
    let engine = Engine::builder(store)
        .accept_undeclared_sources(true)
        .build()?;
    let rss = RssSampler::start(&["self".into()]);
    let window = Window::new(s.warmup, s.duration);
    let payload = body(s.body_size);
    let tag = mode_name(group_commit);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..s.concurrency {
        let tag = format!("direct-{tag}-{i}");
        tasks.spawn(direct_task(engine.clone(), tag, payload.clone(), window));
    }
    let probe = CpuProbe::at_window_start(vec!["self".into()], window).await;
    let mut cpu = probe.at_window_end(window).await;
    cpu.loadgen = f64::NAN;
    let mut total = TaskStats::default();
    while let Some(t) = tasks.join_next().await {
        total.merge(t?);
    }
    let peak = rss.stop().await?;
    let hwm = procfs::status_bytes("self", "VmHWM").unwrap_or(0);
    let io = Io::read("self");
    let commits = opened.commits();
    drop(engine);
    opened.close().await;
    drop(opened);
    let counts = Counts::read(fresh, server_before, commits, io).await?;
    Ok(finish(s, group_commit, total, counts, peak, hwm, cpu))
}

/// I/O counters of a process so far.
#[derive(Debug, Clone, Copy, Default)]
struct Io {
    wchar: u64,
    write_bytes: u64,
}

impl Io {
    fn read(pid: &str) -> Self {
        Self {
            wchar: procfs::io_counter(pid, "wchar").unwrap_or(0),
            write_bytes: procfs::io_counter(pid, "write_bytes").unwrap_or(0),
        }
    }

    fn add(self, o: Self) -> Self {
        Self {
            wchar: self.wchar + o.wchar,
            write_bytes: self.write_bytes + o.write_bytes,
        }
    }
}

/// What the store says after the run.
struct Counts {
    stored: u64,
    commits: u64,
    server_commits: Option<u64>,
    io: Io,
}

impl Counts {
    /// Once mailroom has closed its store (exited backends report their
    /// counters after a moment): the server's commits since
    /// `server_before`, and the events stored.
    async fn read(
        fresh: &Fresh,
        server_before: Option<ServerStats>,
        commits: u64,
        io: Io,
    ) -> anyhow::Result<Self> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let server_commits = match (server_before, fresh.server_stats().await) {
            (Some(b), Some(a)) => Some(ServerStats::since(a, b).xact_commit),
            _ => None,
        };
        let stored = crate::backend::count_events(&fresh.url, SOURCE).await?;
        Ok(Counts {
            stored,
            commits,
            server_commits,
            io,
        })
    }
}

fn finish(
    s: &Settings,
    group_commit: bool,
    mut total: TaskStats,
    counts: Counts,
    peak_rss: u64,
    hwm: u64,
    cpu: CpuShares,
) -> ModeResult {
    let Counts {
        stored,
        commits,
        server_commits,
        io,
    } = counts;
    let window_secs = s.duration.as_secs_f64();
    total.lat.sort();
    ModeResult {
        mode: mode_name(group_commit),
        group_commit,
        store: s.backend.name(),
        instances: s.instances.max(1),
        acked_total: total.acked_total,
        acked: total.acked,
        window_secs,
        acks_per_sec: total.acked as f64 / window_secs,
        p50_ms: total.lat.quantile_ms(0.50),
        p99_ms: total.lat.quantile_ms(0.99),
        max_ms: total.lat.quantile_ms(1.0),
        duplicates: total.duplicates,
        errors: total.errors,
        stored,
        commits,
        server_commits,
        wchar: io.wchar,
        write_bytes: io.write_bytes,
        peak_rss_mib: procfs::mib(peak_rss),
        hwm_mib: procfs::mib(hwm),
        mailroom_cpu: cpu.mailroom,
        loadgen_cpu: cpu.loadgen,
        pg_cpu: cpu.postgres,
    }
}

/// acks/s with group commit over acks/s with one commit per request.
pub fn ratio(results: &[ModeResult]) -> Option<f64> {
    let on = results.iter().find(|r| r.group_commit)?;
    let off = results.iter().find(|r| !r.group_commit)?;
    (off.acks_per_sec > 0.0).then(|| on.acks_per_sec / off.acks_per_sec)
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Concurrent requests (one keep-alive connection each).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured window per mode.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Load before the window, not measured.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Request body size in bytes (a JSON object).
    #[arg(long, default_value_t = 256)]
    body_size: usize,
    /// Run one mode only: `on` (group commit) or `off` (commit per request).
    #[arg(long, value_parser = parse_on_off)]
    only: Option<bool>,
    /// Experiment: skip HTTP and call the engine's webhook intake in-process.
    #[arg(long)]
    direct: bool,
    /// Experiment: run mailroom without the Prometheus recorder.
    #[arg(long)]
    no_metrics: bool,
    /// `sqlite` (a temporary file) or `postgres://...`: a fresh database is
    /// created on that server for each mode and dropped afterwards.
    #[arg(long, default_value = "sqlite", value_parser = Backend::parse)]
    store: Backend,
    /// Child mailroom processes sharing the store (PostgreSQL only);
    /// connections go to them round-robin.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `ingest`: both modes (or `--only` one), then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let settings = Settings {
        concurrency: a.concurrency.max(1),
        duration: a.duration,
        warmup: a.warmup,
        body_size: a.body_size,
        direct: a.direct,
        no_metrics: a.no_metrics,
        backend: a.store,
        instances: a.instances.max(1),
    };
    let results = measure(&settings, a.only).await?;
    if a.json {
        print_json(&serde_json::json!({
            "bench": "ingest",
            "concurrency": settings.concurrency,
            "duration_secs": settings.duration.as_secs_f64(),
            "body_size": settings.body_size,
            "direct": settings.direct,
            "store": settings.backend.name(),
            "instances": settings.instances,
            "metrics": !settings.no_metrics,
            "modes": results,
            "ratio": ratio(&results),
        }))?;
    } else {
        print_table(&settings, &results);
    }
    Ok(durability_code(results.iter().all(ModeResult::durable)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_asked_size_and_are_json() {
        let b = body(256);
        assert_eq!(b.len(), 256);
        assert!(serde_json::from_slice::<serde_json::Value>(&b).is_ok());
        assert!(serde_json::from_slice::<serde_json::Value>(&body(1)).is_ok());
    }
}
