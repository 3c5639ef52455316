//! `ingest`: `POST /webhooks/bench` over real HTTP/1.1 keep-alive
//! connections, once with group commit on and once with one commit per
//! request, against child mailroom processes (one per instance, sharing one
//! fresh store) each time.

use crate::backend::{Backend, Fresh, ServerStats, postgres_cpu};
use crate::procfs;
use crate::stats::{Latencies, fmt_cpu, fmt_ms};
use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use mailroom::Engine;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

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

pub async fn run(s: &Settings, only: Option<bool>) -> anyhow::Result<Vec<ModeResult>> {
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

/// What one load task saw.
#[derive(Debug, Default)]
struct TaskStats {
    lat: Latencies,
    acked_total: u64,
    acked: u64,
    duplicates: u64,
    errors: BTreeMap<String, u64>,
}

impl TaskStats {
    fn merge(&mut self, o: TaskStats) {
        self.lat.extend(o.lat);
        self.acked_total += o.acked_total;
        self.acked += o.acked;
        self.duplicates += o.duplicates;
        for (k, v) in o.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }

    fn error(&mut self, what: impl Into<String>) {
        *self.errors.entry(what.into()).or_default() += 1;
    }

    /// An answer to a request sent at `started` and answered at `ended`: an
    /// ack counts in the window (with its latency) only if the request lay
    /// wholly inside it.
    fn answer(&mut self, duplicate: bool, (started, ended): (Instant, Instant), window: Window) {
        if duplicate {
            self.duplicates += 1;
            return;
        }
        self.acked_total += 1;
        if window.contains(started, ended) {
            self.acked += 1;
            self.lat.record(ended - started);
        }
    }
}

/// The clock of a run.
#[derive(Debug, Clone, Copy)]
struct Window {
    from: Instant,
    to: Instant,
}

impl Window {
    fn new(warmup: Duration, duration: Duration) -> Self {
        let from = Instant::now() + warmup;
        Self {
            from,
            to: from + duration,
        }
    }

    fn contains(&self, start: Instant, end: Instant) -> bool {
        start >= self.from && end <= self.to
    }
}

#[derive(Deserialize)]
struct Ack {
    duplicate: bool,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        // Ends when the sender is dropped or the server closes.
        let _ = conn.await;
    });
    Ok(sender)
}

/// One keep-alive connection sending requests back to back.
async fn http_task(addr: SocketAddr, tag: String, payload: Bytes, window: Window) -> TaskStats {
    let mut st = TaskStats::default();
    let host = addr.to_string();
    let uri = format!("/webhooks/{SOURCE}");
    let mut sender: Option<Sender> = None;
    let mut n: u64 = 0;
    while Instant::now() < window.to {
        let s = match &mut sender {
            Some(s) => s,
            None => match connect(addr).await {
                Ok(s) => sender.insert(s),
                Err(e) => {
                    st.error(format!("connect: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        n += 1;
        let req = http::Request::post(&uri)
            .header(http::header::HOST, &host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", format!("{tag}-{n}"))
            .body(Full::new(payload.clone()));
        let req = match req {
            Ok(r) => r,
            Err(e) => {
                st.error(format!("request: {e}"));
                break;
            }
        };
        let started = Instant::now();
        let answer = send(s, req).await;
        let span = (started, Instant::now());
        match answer {
            Ok((http::StatusCode::OK, body)) => match serde_json::from_slice::<Ack>(&body) {
                Ok(Ack { duplicate }) => st.answer(duplicate, span, window),
                Err(_) => st.error("200 with an unexpected body"),
            },
            Ok((status, _)) => st.error(format!("HTTP {}", status.as_u16())),
            Err(e) => {
                st.error(format!("transport: {e}"));
                sender = None;
            }
        }
    }
    st
}

/// One request on a ready connection: the answer's status and whole body.
async fn send(
    s: &mut Sender,
    req: http::Request<Full<Bytes>>,
) -> anyhow::Result<(http::StatusCode, Bytes)> {
    s.ready().await?;
    let resp = s.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// CPU readings at the window's edges.
struct CpuProbe {
    pids: Vec<String>,
    before: BTreeMap<String, Duration>,
    pg_before: BTreeMap<String, Duration>,
    self_before: Option<Duration>,
}

/// CPU per thread name, summed over `pids` (instances of one program).
fn threads_cpu_of(pids: &[String]) -> BTreeMap<String, Duration> {
    let mut out = BTreeMap::new();
    for pid in pids {
        for (name, t) in procfs::threads_cpu(pid) {
            *out.entry(name).or_insert(Duration::ZERO) += t;
        }
    }
    out
}

/// What [`CpuProbe`] measured: mailroom's threads, the load generator,
/// PostgreSQL's processes.
struct CpuShares {
    mailroom: BTreeMap<String, f64>,
    loadgen: f64,
    postgres: BTreeMap<String, f64>,
}

impl CpuProbe {
    async fn at_window_start(pids: Vec<String>, window: Window) -> Self {
        tokio::time::sleep_until(window.from.into()).await;
        Self {
            before: threads_cpu_of(&pids),
            pg_before: postgres_cpu(),
            self_before: procfs::process_cpu("self"),
            pids,
        }
    }

    /// `direct` means mailroom and the load generator are this process, so
    /// the load generator's share is not separable.
    async fn at_window_end(self, window: Window) -> CpuShares {
        tokio::time::sleep_until(window.to.into()).await;
        let span = window.to - window.from;
        let after = threads_cpu_of(&self.pids);
        let mailroom = procfs::cpu_share(&self.before, &after, span);
        let postgres = procfs::cpu_share(&self.pg_before, &postgres_cpu(), span);
        let loadgen = match (self.self_before, procfs::process_cpu("self")) {
            (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64() / span.as_secs_f64(),
            _ => f64::NAN,
        };
        CpuShares {
            mailroom,
            loadgen,
            postgres,
        }
    }
}

/// One child `__serve` process.
struct Child {
    child: tokio::process::Child,
    pid: String,
    addr: SocketAddr,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

async fn spawn_child(s: &Settings, group_commit: bool, url: &str) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("__serve")
        .args(["--store", url])
        .args(["--listen", "127.0.0.1:0"])
        .args([
            "--group-commit",
            if group_commit { "true" } else { "false" },
        ]);
    if s.no_metrics {
        cmd.arg("--no-metrics");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting the mailroom child process")?;
    let pid = child.id().context("child pid")?.to_string();
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .context("the child did not start listening within 60 s")??
        .context("the child exited before listening")?;
    let addr: SocketAddr = first
        .strip_prefix("LISTENING ")
        .with_context(|| format!("unexpected child output {first:?}"))?
        .parse()?;
    Ok(Child {
        child,
        pid,
        addr,
        lines,
    })
}

impl Child {
    /// Stops mailroom gracefully (closes its stdin) and returns its commit count.
    async fn stop(mut self) -> anyhow::Result<u64> {
        drop(self.child.stdin.take());
        let mut commits = 0;
        while let Some(line) = self.lines.next_line().await? {
            if let Some(n) = line.strip_prefix("COMMITS ") {
                commits = n.trim().parse()?;
            }
        }
        let status = self.child.wait().await?;
        if !status.success() {
            bail!("the mailroom child exited with {status}");
        }
        Ok(commits)
    }
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

/// The highest VmRSS of some processes, sampled until stopped.
struct RssSampler {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<procfs::RssPeak>>,
}

impl RssSampler {
    fn start(pids: &[String]) -> Self {
        let stop = CancellationToken::new();
        let tasks = pids
            .iter()
            .map(|pid| tokio::spawn(procfs::sample_rss(pid.clone(), stop.clone())))
            .collect();
        Self { stop, tasks }
    }

    /// The largest peak of any of the processes, in bytes.
    async fn stop(self) -> anyhow::Result<u64> {
        self.stop.cancel();
        let mut peak = 0;
        for t in self.tasks {
            peak = peak.max(t.await?.sampled_max);
        }
        Ok(peak)
    }
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

/// One in-process caller of `ingest_webhook`, calls back to back.
async fn direct_task(engine: Engine, tag: String, payload: Bytes, window: Window) -> TaskStats {
    let mut st = TaskStats::default();
    let mut n = 0u64;
    while Instant::now() < window.to {
        n += 1;
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        match http::HeaderValue::try_from(format!("{tag}-{n}")) {
            Ok(v) => {
                headers.insert("webhook-id", v);
            }
            Err(e) => {
                st.error(format!("header: {e}"));
                break;
            }
        }
        let started = Instant::now();
        let answer = engine
            .ingest_webhook(SOURCE, &headers, payload.clone())
            .await;
        match answer {
            Ok(i) => st.answer(i.duplicate, (started, Instant::now()), window),
            Err(e) => st.error(e.to_string()),
        }
    }
    st
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

/// The human-readable report.
pub fn print_table(s: &Settings, results: &[ModeResult]) {
    println!(
        "ingest: store {} x{}, {} over {}, concurrency {}, body {} B, window {:.0} s after {:.0} s warm-up",
        s.backend.name(),
        s.instances.max(1),
        if s.direct {
            "engine.ingest_webhook in-process (no HTTP)"
        } else {
            "POST /webhooks/bench, HTTP/1.1 keep-alive"
        },
        if s.no_metrics {
            "no metrics recorder"
        } else {
            "Prometheus recorder on"
        },
        s.concurrency,
        s.body_size,
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64(),
    );
    println!(
        "{:<19} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>6} {:>9}",
        "mode",
        "acked",
        "acks/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "peak RSS",
        "HWM MiB",
        "commits",
        "acks/c",
        "stored"
    );
    for r in results {
        println!(
            "{:<19} {:>9} {:>9.0} {:>8} {:>8} {:>8} {:>9.1} {:>8.1} {:>8} {:>6.1} {:>9}",
            r.mode,
            r.acked,
            r.acks_per_sec,
            fmt_ms(r.p50_ms),
            fmt_ms(r.p99_ms),
            fmt_ms(r.max_ms),
            r.peak_rss_mib,
            r.hwm_mib,
            r.commits,
            r.acked_total as f64 / r.commits.max(1) as f64,
            r.stored,
        );
    }
    for r in results {
        print_cpu(s, r);
        print_details(r);
    }
    if let Some(ratio) = ratio(results) {
        println!("ratio group-commit / commit-per-request: {ratio:.2}x");
    }
}

/// Where a mode's CPU went: mailroom (the whole process with `--direct`),
/// the load generator, PostgreSQL.
fn print_cpu(s: &Settings, r: &ModeResult) {
    if s.direct {
        println!(
            "  cpu {:<19} whole process {}",
            r.mode,
            fmt_cpu(&r.mailroom_cpu)
        );
    } else {
        println!(
            "  cpu {:<19} mailroom {}; load generator {:.0}%",
            r.mode,
            fmt_cpu(&r.mailroom_cpu),
            r.loadgen_cpu * 100.0
        );
    }
    if !r.pg_cpu.is_empty() {
        println!("  cpu {:<19} postgres {}", r.mode, fmt_cpu(&r.pg_cpu));
    }
}

/// A mode's commits, errors, disk writes and durability, a line each.
fn print_details(r: &ModeResult) {
    if let Some(c) = r.server_commits {
        println!(
            "  {}: postgres committed {c} transactions in the run ({:.1} acks each; insert commits of mailroom's writers {})",
            r.mode,
            r.acked_total as f64 / c.max(1) as f64,
            r.commits,
        );
    }
    if r.duplicates > 0 || !r.errors.is_empty() {
        println!(
            "  {}: duplicates {}, errors {:?}",
            r.mode, r.duplicates, r.errors
        );
    }
    println!(
        "  {}: {:.1} KiB written to disk per commit ({:.1} MiB in all; {:.1} MiB passed to write calls)",
        r.mode,
        r.write_bytes as f64 / 1024.0 / r.commits.max(1) as f64,
        procfs::mib(r.write_bytes),
        procfs::mib(r.wchar),
    );
    println!(
        "  {}: durability {} ({} acked in total, {} stored)",
        r.mode,
        if r.durable() { "OK" } else { "MISMATCH" },
        r.acked_total,
        r.stored
    );
}

/// acks/s with group commit over acks/s with one commit per request.
pub fn ratio(results: &[ModeResult]) -> Option<f64> {
    let on = results.iter().find(|r| r.group_commit)?;
    let off = results.iter().find(|r| !r.group_commit)?;
    (off.acks_per_sec > 0.0).then(|| on.acks_per_sec / off.acks_per_sec)
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
