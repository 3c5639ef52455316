//! `amqp`: mailroom's RabbitMQ side beside what the broker alone allows, in
//! one run on one broker. The targets: the relay at least 10× the
//! hand-written relay and 60 % of the publish floor, inbound at least 60 %
//! of the consume floor.
//!
//! - **publish floor**: lapin alone publishes N persistent, `mandatory`
//!   messages with confirms, pipelined (every publish sent, then every
//!   confirm awaited): the most any relay can publish here. It also fills
//!   the queue the consume phases read.
//! - **consume floor** (per prefetch): lapin alone consumes those N with
//!   `basic.qos(prefetch)` and acks each one; no store.
//! - **mailroom inbound** (per prefetch): an [`AmqpSource`](mailroom_amqp::AmqpSource) with that
//!   prefetch stores the same N messages into a fresh SQLite store (default
//!   settings: group commit) and acks each after its commit.
//! - **ack-after-commit floor** (per prefetch): lapin consumes as above,
//!   and one writer thread group-commits the deliveries into SQLite (WAL,
//!   `synchronous = FULL`, `message_id` as primary key) before each is
//!   acked: the store's part of any ack-after-commit consumer, no engine.
//! - **mailroom relay**: N outbox events, already committed in a fresh
//!   SQLite store, published through a topic whose handler is an
//!   [`AmqpHandler`](mailroom_amqp::AmqpHandler) (confirms, `mandatory`),
//!   on a supervised [`AmqpConnection`](mailroom_amqp::AmqpConnection) as `serve` runs it: a `single` topic, then a
//!   `batch` topic (a batch is published whole, then its confirms awaited).
//! - **durable relay floor**: the N rows in an outbox table in SQLite (WAL,
//!   `synchronous = FULL`), relayed with no engine: one writer thread claims
//!   groups of rows and marks published ones done, everything that has
//!   arrived in one commit, while the groups are published pipelined with
//!   confirms. The least any relay that records claim and outcome in this
//!   store does; again with the claim only read (no claim commit).
//! - **hand-written relay**: the usual outbox relay: an outbox table in
//!   SQLite (WAL, `synchronous = FULL`, as mailroom's), polled for unsent
//!   rows; each row is published, its confirm awaited, and the row marked
//!   sent. The idle poll interval is not counted, only the loop over the
//!   backlog.
//!
//! Each phase reports messages/s, the broker's CPU (its process, found by
//! the port it listens on) and this process's CPU (mailroom and the lapin
//! clients live here), so a missed target says which side ran out.

mod durable;
mod engine;
mod handwritten;
mod lapin_only;
mod relay_floor;

use crate::cli::parse_duration;
use crate::procfs;
use crate::stats::fmt_times;
use anyhow::Context;
use lapin::{Channel, Connection, ConnectionProperties};
use mailroom_amqp::{ExchangeSpec, ExchangeType, QueueSpec, Topology};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Where the benchmark's messages go: a topic exchange and a queue bound
/// to it, named uniquely for the run.
#[derive(Debug, Clone)]
pub struct Route {
    pub exchange: String,
    pub routing_key: String,
    pub queue: String,
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// `amqp://...` of the broker.
    pub url: String,
    /// Messages per phase.
    pub messages: u64,
    /// Messages of the hand-written relay (it is slow; its rate is steady).
    pub handwritten_messages: u64,
    pub body_size: usize,
    /// Prefetch values of the consume phases.
    pub prefetch: Vec<u16>,
    /// Attempts in flight of the `single` relay topic.
    pub relay_concurrency: u32,
    /// `max_size` of the `batch` relay topic (0: no batch relay phase).
    pub relay_batch_size: u32,
    /// Deliveries in flight of the `batch` relay topic.
    pub relay_batch_concurrency: u32,
    /// Give up on a phase after this long.
    pub timeout: Duration,
    /// Skip the inbound phases; measure the publish floor once, then the
    /// relay phases.
    pub relay_only: bool,
}

/// One measured phase.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    pub name: String,
    pub messages: u64,
    pub secs: f64,
    pub per_sec: f64,
    /// Share of one core used by the broker's process during the phase.
    pub broker_cpu: Option<f64>,
    /// Share of one core used by this process (mailroom, lapin clients).
    pub bench_cpu: f64,
    /// SQLite write transactions during the phase (mailroom, hand-written).
    pub commits: Option<u64>,
    /// Share of one core per thread name of this process (mailroom's SQLite
    /// writer is `sqlite-writer`, the runtime's workers `tokio-runtime-w`).
    pub threads: BTreeMap<String, f64>,
    /// Bytes sent to the disk by the broker and by this process, MiB.
    pub broker_disk_mib: Option<f64>,
    pub bench_disk_mib: f64,
}

/// Times a phase and the CPU of this process and of the broker.
pub struct Meter {
    started: Instant,
    broker: Option<(String, Duration, u64)>,
    me: Duration,
    threads: BTreeMap<String, Duration>,
    written: u64,
}

fn written(pid: &str) -> Option<u64> {
    procfs::io_counter(pid, "write_bytes")
}

impl Meter {
    pub fn start(broker_pid: Option<&str>) -> Self {
        let broker = broker_pid.and_then(|p| {
            Some((
                p.to_string(),
                procfs::process_cpu(p)?,
                written(p).unwrap_or(0),
            ))
        });
        Self {
            started: Instant::now(),
            broker,
            me: procfs::process_cpu("self").unwrap_or_default(),
            threads: procfs::threads_cpu("self"),
            written: written("self").unwrap_or(0),
        }
    }

    pub fn finish(self, name: String, messages: u64, commits: Option<u64>) -> Phase {
        let secs = self.started.elapsed().as_secs_f64();
        let share = |before: Duration, after: Option<Duration>| {
            after.map(|a| a.saturating_sub(before).as_secs_f64() / secs)
        };
        let elapsed = self.started.elapsed();
        let mib = |before: u64, after: Option<u64>| {
            procfs::mib(after.unwrap_or(0).saturating_sub(before))
        };
        let (broker_cpu, broker_disk_mib) = match &self.broker {
            Some((pid, cpu, disk)) => (
                share(*cpu, procfs::process_cpu(pid)),
                Some(mib(*disk, written(pid))),
            ),
            None => (None, None),
        };
        Phase {
            name,
            messages,
            secs,
            per_sec: messages as f64 / secs,
            broker_cpu,
            bench_cpu: share(self.me, procfs::process_cpu("self")).unwrap_or(0.0),
            commits,
            threads: procfs::cpu_share(&self.threads, &procfs::threads_cpu("self"), elapsed),
            broker_disk_mib,
            bench_disk_mib: mib(self.written, written("self")),
        }
    }
}

/// What every phase needs: the broker, its process, the settings.
pub struct Ctx {
    pub settings: Settings,
    pub conn: Connection,
    pub broker_pid: Option<String>,
    run_id: u32,
}

impl Ctx {
    async fn channel(&self) -> anyhow::Result<Channel> {
        self.conn
            .create_channel()
            .await
            .context("opening a channel")
    }

    /// A consumer of `queue` on a channel of its own with
    /// `basic.qos(prefetch)`, and the meter of the phase it starts, started
    /// just before consuming begins.
    async fn consumer(
        &self,
        queue: &str,
        prefetch: u16,
    ) -> anyhow::Result<(Channel, Meter, lapin::Consumer)> {
        use lapin::options::{BasicConsumeOptions, BasicQosOptions};
        let ch = self.channel().await?;
        ch.basic_qos(prefetch, BasicQosOptions::default())
            .await
            .context("basic.qos")?;
        let meter = Meter::start(self.broker_pid.as_deref());
        let consumer = ch
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                Default::default(),
            )
            .await
            .context("basic.consume")?;
        Ok((ch, meter, consumer))
    }

    /// Declares a fresh exchange and queue for `what`.
    async fn route(&self, what: &str) -> anyhow::Result<Route> {
        let base = format!("bench-{:08x}.{what}", self.run_id);
        let route = Route {
            exchange: format!("{base}.x"),
            routing_key: format!("bench.{what}"),
            queue: format!("{base}.q"),
        };
        let topology = Topology {
            exchanges: vec![ExchangeSpec::new(&route.exchange, ExchangeType::Topic)],
            queues: vec![QueueSpec::new(&route.queue).bind(&route.exchange, "bench.#")],
        };
        mailroom_amqp::declare(&self.channel().await?, &topology).await?;
        Ok(route)
    }

    async fn drop_route(&self, route: &Route) -> anyhow::Result<()> {
        let ch = self.channel().await?;
        ch.queue_delete(route.queue.as_str().into(), Default::default())
            .await?;
        ch.exchange_delete(route.exchange.as_str().into(), Default::default())
            .await?;
        let _ = ch.close(200, "OK".into()).await;
        Ok(())
    }

    /// Fails unless `queue` holds exactly `n` ready messages (`what` names
    /// them in the error): every phase that publishes checks its queue so.
    async fn expect_queued(&self, queue: &str, n: u64, what: &str) -> anyhow::Result<()> {
        let queued = self.ready(queue).await?;
        anyhow::ensure!(
            u64::from(queued) == n,
            "{queued} of {n} {what} are in the queue"
        );
        Ok(())
    }

    /// Ready messages in `queue` (a passive declare).
    async fn ready(&self, queue: &str) -> anyhow::Result<u32> {
        let ch = self.channel().await?;
        let passive = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = ch
            .queue_declare(queue.into(), passive, Default::default())
            .await?;
        let _ = ch.close(200, "OK".into()).await;
        Ok(q.message_count())
    }
}

/// The broker's port, from `amqp://user:pass@host:port/vhost`.
fn port_of(url: &str) -> Option<u16> {
    let rest = url.split_once("://")?.1;
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let hostport = host.split('/').next()?;
    hostport.rsplit_once(':')?.1.parse().ok()
}

/// A run's phases and the store's commit latency.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub phases: Vec<Phase>,
    /// Mean latency of a one-row SQLite commit (WAL, `synchronous = FULL`)
    /// in a temporary directory like the stores', ms.
    pub commit_latency_ms: f64,
    /// `/proc/loadavg` before and after the run: other work on the machine.
    pub load_before: String,
    pub load_after: String,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A SQLite database with mailroom's durability (WAL, `synchronous =
/// FULL`): the baselines' stores.
fn open_durable(path: &std::path::Path) -> anyhow::Result<rusqlite::Connection> {
    let db = rusqlite::Connection::open(path)?;
    let mode: String = db.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "WAL refused: {mode}");
    db.execute_batch("PRAGMA synchronous = FULL;")?;
    Ok(db)
}

/// Mean latency of 200 one-row SQLite commits with mailroom's durability:
/// what every ack-after-commit waits for at least (measured once, at the
/// end of the run: the disk's latency moves when it is shared).
async fn commit_latency() -> anyhow::Result<Duration> {
    tokio::task::spawn_blocking(|| -> anyhow::Result<Duration> {
        let dir = tempfile::tempdir()?;
        let db = open_durable(&dir.path().join("probe.db"))?;
        db.execute_batch("CREATE TABLE t (x BLOB);")?;
        let body = vec![b'x'; 1024];
        let started = Instant::now();
        for _ in 0..200 {
            db.execute("INSERT INTO t (x) VALUES (?1)", [&body])?;
        }
        Ok(started.elapsed() / 200)
    })
    .await?
}

/// Every phase, in order; see the module doc.
pub async fn measure(settings: Settings) -> anyhow::Result<Report> {
    let load_before = loadavg();
    let conn = Connection::connect(&settings.url, ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to {}", settings.url))?;
    let broker_pid = port_of(&settings.url).and_then(procfs::listener_pid);
    if broker_pid.is_none() {
        eprintln!(
            "mailroom-bench: the broker's process is not on this machine (or not readable): no broker CPU"
        );
    }
    let ctx = Ctx {
        settings,
        conn,
        broker_pid,
        run_id: rand_id(),
    };
    let mut phases = match ctx.settings.relay_only {
        true => vec![publish_floor(&ctx).await?],
        false => inbound_phases(&ctx).await?,
    };
    phases.extend(relay_phases(&ctx).await?);
    let _ = ctx.conn.close(200, "OK".into()).await;
    let latency = commit_latency().await?;
    Ok(Report {
        phases,
        commit_latency_ms: latency.as_secs_f64() * 1000.0,
        load_before,
        load_after: loadavg(),
    })
}

/// Per prefetch: the publish floor (which also fills the queue), the
/// consume floor, mailroom's inbound and the ack-after-commit floor.
async fn inbound_phases(ctx: &Ctx) -> anyhow::Result<Vec<Phase>> {
    let mut phases = Vec::new();
    let consumed = ctx.route("consume").await?;
    for &prefetch in &ctx.settings.prefetch {
        phases.push(
            lapin_only::publish(ctx, &consumed, "publish floor: lapin, confirms, pipelined")
                .await?,
        );
        phases.push(lapin_only::consume(ctx, &consumed.queue, prefetch).await?);
        // Refill (not a phase of its own: the publish floor was measured).
        lapin_only::publish(ctx, &consumed, "refill").await?;
        phases.push(engine::inbound(ctx, &consumed.queue, prefetch).await?);
        lapin_only::publish(ctx, &consumed, "refill").await?;
        phases.push(durable::consume(ctx, &consumed.queue, prefetch).await?);
    }
    ctx.drop_route(&consumed).await?;
    Ok(phases)
}

/// The publish floor alone, on a route of its own (`--relay-only`).
async fn publish_floor(ctx: &Ctx) -> anyhow::Result<Phase> {
    let route = ctx.route("floor").await?;
    let phase =
        lapin_only::publish(ctx, &route, "publish floor: lapin, confirms, pipelined").await?;
    ctx.drop_route(&route).await?;
    Ok(phase)
}

/// mailroom's relay (single, then batch), the durable relay floor (with and
/// without the claim's commit) and the hand-written relay, each on a route
/// of its own.
async fn relay_phases(ctx: &Ctx) -> anyhow::Result<Vec<Phase>> {
    let s = &ctx.settings;
    let mut shapes = vec![engine::RelayTopic::Single {
        concurrency: s.relay_concurrency,
    }];
    if s.relay_batch_size > 0 {
        shapes.push(engine::RelayTopic::Batch {
            max_size: s.relay_batch_size,
            concurrency: s.relay_batch_concurrency,
        });
    }
    let mut phases = Vec::new();
    for shape in shapes {
        let route = ctx.route("relay").await?;
        phases.push(engine::relay(ctx, &route, shape).await?);
        ctx.drop_route(&route).await?;
    }
    for claim in [relay_floor::Claim::Commit, relay_floor::Claim::Read] {
        let route = ctx.route("relay-floor").await?;
        phases.push(relay_floor::relay(ctx, &route, claim).await?);
        ctx.drop_route(&route).await?;
    }
    let route = ctx.route("handwritten").await?;
    phases.push(handwritten::relay(ctx, &route).await?);
    ctx.drop_route(&route).await?;
    Ok(phases)
}

fn rand_id() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    nanos ^ std::process::id().rotate_left(16)
}

/// Waits until `done()` holds, checking every `every`, for at most `timeout`.
pub async fn wait_until(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !done().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// One relay phase's ratios.
#[derive(Debug, serde::Serialize)]
pub struct RelayRatios {
    pub relay: String,
    /// mailroom relay / hand-written relay (target ≥ 10).
    pub vs_handwritten: Option<f64>,
    /// mailroom relay / lapin publish floor (target ≥ 0.6).
    pub vs_publish_floor: Option<f64>,
    /// mailroom relay / durable relay floor with the claim's commit
    /// (mailroom's own share of the distance).
    pub vs_durable_floor: Option<f64>,
}

/// The ratios the targets are set for (see the module's first lines).
#[derive(Debug, serde::Serialize)]
pub struct Ratios {
    /// Per relay topic shape.
    pub relays: Vec<RelayRatios>,
    /// Per durable relay floor variant: floor / lapin publish floor (the
    /// most a relay that records its work in this store reaches here).
    pub durable_relay_floors_vs_publish_floor: Vec<(String, Option<f64>)>,
    /// Per prefetch: mailroom inbound / lapin consume floor (target ≥ 0.6).
    pub inbound_vs_consume_floor: Vec<(u16, Option<f64>)>,
    /// Per prefetch: ack-after-commit floor / lapin consume floor (the most
    /// any consumer that acks after a durable commit reaches here).
    pub durable_floor_vs_consume_floor: Vec<(u16, Option<f64>)>,
    /// Per prefetch: mailroom inbound / ack-after-commit floor (mailroom's
    /// own share of the distance).
    pub inbound_vs_durable_floor: Vec<(u16, Option<f64>)>,
}

/// The durable relay floor that records what mailroom records: the claim
/// and the outcome.
const DURABLE_RELAY_FLOOR: &str = "durable relay floor: claim + done";

fn rate(phases: &[Phase], prefix: &str) -> Option<f64> {
    let rates: Vec<f64> = phases
        .iter()
        .filter(|p| p.name.starts_with(prefix))
        .map(|p| p.per_sec)
        .collect();
    crate::drain::median(rates)
}

pub fn ratios(s: &Settings, phases: &[Phase]) -> Ratios {
    let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
    let relays = phases
        .iter()
        .filter(|p| p.name.starts_with("mailroom relay"))
        .map(|p| RelayRatios {
            relay: p.name.clone(),
            vs_handwritten: div(Some(p.per_sec), rate(phases, "hand-written relay")),
            vs_publish_floor: div(Some(p.per_sec), rate(phases, "publish floor")),
            vs_durable_floor: div(Some(p.per_sec), rate(phases, DURABLE_RELAY_FLOOR)),
        })
        .collect();
    let durable_relay_floors_vs_publish_floor = phases
        .iter()
        .filter(|p| p.name.starts_with("durable relay floor"))
        .map(|p| {
            let floor = div(Some(p.per_sec), rate(phases, "publish floor"));
            (p.name.clone(), floor)
        })
        .collect();
    let per_prefetch = |a: &str, b: &str| -> Vec<(u16, Option<f64>)> {
        s.prefetch
            .iter()
            .map(|p| {
                let (a, b) = (format!("{a}, prefetch {p}"), format!("{b}, prefetch {p}"));
                (*p, div(rate(phases, &a), rate(phases, &b)))
            })
            .collect()
    };
    let (inbound, consume, durable) = (
        "mailroom inbound",
        "consume floor: lapin",
        "ack-after-commit floor: lapin + SQLite",
    );
    Ratios {
        relays,
        durable_relay_floors_vs_publish_floor,
        inbound_vs_consume_floor: per_prefetch(inbound, consume),
        durable_floor_vs_consume_floor: per_prefetch(durable, consume),
        inbound_vs_durable_floor: per_prefetch(inbound, durable),
    }
}

pub fn print(s: &Settings, report: &Report) {
    println!(
        "machine: {} CPUs; load average before {}, after {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        report.load_before,
        report.load_after
    );
    println!(
        "amqp: {} messages of {} B per phase (hand-written relay: {}), prefetch {:?}",
        s.messages, s.body_size, s.handwritten_messages, s.prefetch
    );
    print_phases(&report.phases);
    print_ratios(s, &report.phases);
    println!(
        "SQLite commit latency (1 row of {} B, WAL, synchronous = FULL): {:.2} ms",
        s.body_size, report.commit_latency_ms
    );
    println!(
        "(broker, bench: CPU as a share of one core; MiB: bytes each process sent to the disk; ratios use the median of a phase measured more than once)"
    );
}

/// `42%`, or `-` where there is no figure.
fn pct(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0))
}

/// A line per phase: its rate, CPU, commits and disk writes; then each
/// phase's CPU by thread.
fn print_phases(phases: &[Phase]) {
    println!(
        "{:<50} {:>8} {:>7} {:>8} {:>7} {:>7} {:>8} {:>9} {:>9}",
        "phase", "messages", "secs", "msgs/s", "broker", "bench", "commits", "brk MiB", "bench MiB"
    );
    for p in phases {
        println!(
            "{:<50} {:>8} {:>7.2} {:>8.0} {:>7} {:>7} {:>8} {:>9} {:>9.0}",
            p.name,
            p.messages,
            p.secs,
            p.per_sec,
            pct(p.broker_cpu),
            pct(Some(p.bench_cpu)),
            p.commits.map_or("-".into(), |c| c.to_string()),
            p.broker_disk_mib.map_or("-".into(), |m| format!("{m:.0}")),
            p.bench_disk_mib,
        );
    }
    for p in phases {
        let threads: Vec<String> = p
            .threads
            .iter()
            .map(|(name, share)| format!("{name} {:.0}%", share * 100.0))
            .collect();
        println!("  {}: {}", p.name, threads.join(", "));
    }
}

/// The ratios against their targets, and the ack-after-commit bound of
/// each inbound phase.
fn print_ratios(s: &Settings, phases: &[Phase]) {
    let r = ratios(s, phases);
    for relay in &r.relays {
        println!(
            "{} vs hand-written relay: {} (target >= 10x); vs lapin publish floor: {} (target >= 60%); vs durable relay floor (claim + done): {}",
            relay.relay,
            fmt_times(relay.vs_handwritten),
            pct(relay.vs_publish_floor),
            pct(relay.vs_durable_floor)
        );
    }
    for (floor, v) in &r.durable_relay_floors_vs_publish_floor {
        println!(
            "{floor} vs lapin publish floor: {} (the most a relay that records its work in SQLite reaches on this disk)",
            pct(*v)
        );
    }
    let floors = r
        .durable_floor_vs_consume_floor
        .iter()
        .zip(&r.inbound_vs_durable_floor);
    for ((p, floor), (_, inbound)) in floors {
        println!(
            "prefetch {p}: ack-after-commit floor vs lapin consume floor: {} (the most an ack-after-commit consumer reaches on this disk); mailroom inbound vs ack-after-commit floor: {}",
            pct(*floor),
            pct(*inbound)
        );
    }
    for (p, v) in &r.inbound_vs_consume_floor {
        // Had every commit of the phase held `prefetch` messages: the most
        // an ack-after-commit consumer gets at the commit pace it had.
        let bound = phases
            .iter()
            .find(|ph| ph.name == format!("mailroom inbound, prefetch {p}"))
            .and_then(|ph| Some(f64::from(*p) * ph.commits? as f64 / ph.secs));
        println!(
            "inbound vs lapin consume floor, prefetch {p}: {} (target >= 60%); {} messages per commit at most: {}/s",
            pct(*v),
            p,
            bound.map_or("-".into(), |b| format!("{b:.0}"))
        );
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The broker (`amqp://user:pass@host:port/vhost`); default
    /// `$MAILROOM_TEST_AMQP_URL` (the private node of scripts/services.sh).
    #[arg(long, env = "MAILROOM_TEST_AMQP_URL")]
    amqp: String,
    /// Messages per phase (inbound, relay, lapin floors).
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Messages of the hand-written relay. It runs at one fsync and one
    /// confirm round trip per message, a steady rate, so a smaller backlog
    /// measures it as well (100,000 would take about ten minutes).
    #[arg(long, default_value_t = 5_000)]
    handwritten_messages: u64,
    /// Message body size in bytes (a JSON object).
    #[arg(long, default_value_t = 1024)]
    body_size: usize,
    /// Prefetch values of the inbound phases.
    #[arg(long, value_delimiter = ',', default_value = "10,256")]
    prefetch: Vec<u16>,
    /// Attempts in flight of the single relay topic. Default: what a
    /// configured topic with an AMQP handler gets without setting
    /// `concurrency` (1024, of the order of the durable relay floor's
    /// 500 x 4 in flight: at 256 the single relay is bound by its depth,
    /// 256 publishes awaiting confirms, not by its work; docs/src/design/amqp.md).
    #[arg(long, default_value_t = mailroom_amqp::AmqpHandlerSpec::DEFAULT_CONCURRENCY)]
    relay_concurrency: u32,
    /// `max_size` of the batch relay topic (0: skip the batch relay).
    #[arg(long, default_value_t = 500)]
    relay_batch_size: u32,
    /// Deliveries in flight of the batch relay topic.
    #[arg(long, default_value_t = 4)]
    relay_batch_concurrency: u32,
    /// Give up on a phase after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// Only the relay phases, after one publish floor (their reference):
    /// no inbound phase. For quick before/after rounds of the relay.
    #[arg(long)]
    relay_only: bool,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `amqp`: every phase on one broker, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let settings = Settings {
        url: a.amqp,
        messages: a.messages.max(1),
        handwritten_messages: a.handwritten_messages.clamp(1, a.messages.max(1)),
        body_size: a.body_size,
        prefetch: match a.relay_only {
            true => Vec::new(),
            false => a.prefetch.into_iter().map(|p| p.max(1)).collect(),
        },
        relay_concurrency: a.relay_concurrency.max(1),
        relay_batch_size: a.relay_batch_size,
        relay_batch_concurrency: a.relay_batch_concurrency.max(1),
        timeout: a.timeout,
        relay_only: a.relay_only,
    };
    let report = measure(settings.clone()).await?;
    if a.json {
        let out = serde_json::json!({
            "bench": "amqp",
            "messages": settings.messages,
            "body_size": settings.body_size,
            "phases": report.phases,
            "commit_latency_ms": report.commit_latency_ms,
            "load_before": report.load_before,
            "load_after": report.load_after,
            "ratios": ratios(&settings, &report.phases),
        });
        println!("{}", serde_json::to_string(&out).context("encoding JSON")?);
    } else {
        print(&settings, &report);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_comes_from_the_url() {
        assert_eq!(port_of("amqp://guest:guest@127.0.0.1:5673/%2f"), Some(5673));
        assert_eq!(port_of("amqp://127.0.0.1:41000"), Some(41000));
        assert_eq!(port_of("amqp://rabbit/%2f"), None);
    }
}
