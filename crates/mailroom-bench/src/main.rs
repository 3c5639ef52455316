//! `mailroom-bench`: throughput and latency of mailroom on this machine.
//!
//! - `ingest`: webhook intake over real HTTP against a child mailroom
//!   process, with group commit on and then off (one commit per request),
//!   printing acks/s, latency percentiles, mailroom's RSS and the ratio.
//! - `drain`: N preloaded pending events through no-op handlers of a
//!   `single`, a `sequential` and a `batch` topic, with ratios to `single`.
//! - `floor`: the engine's `single` and `batch` drains beside a raw SQL
//!   loop (SQLite, or PostgreSQL with `--store postgres://...`) doing only
//!   the writes a drain needs: the most any implementation on this store
//!   could reach, as a ratio to `single`.
//! - `pg`: both of the above on SQLite and on a fresh PostgreSQL database
//!   with one and with two mailroom instances, side by side.
//! - `dashboard`: the dashboard's overview, a topic page and the dead
//!   letters on a store of 1,000,000 events (p50/p99), and intake with and
//!   without a poller of the overview.
//! - `amqp`: the AMQP source and the outbox relay beside lapin alone (the
//!   broker's floor) and a hand-written relay, on one broker, in one run.
//! - `http-floor`: HTTP delivery (a `single` topic with an http handler)
//!   beside the same client doing only what a delivery must, and a
//!   hand-written Python deliverer, against one local receiver.
//! - `pickup`: ack → handler start under a steady load (50/s, 500/s).
//!
//! `ingest` and `drain` take `--store sqlite|postgres://...` and
//! `--instances N`. Run with `cargo run --release -p mailroom-bench --
//! ingest` (or `drain`, or `pg --store postgres://...`).

mod amqp;
mod counting;
mod dashboard;
mod delayed;
mod drain;
mod floor;
mod httpfloor;
mod ingest;
mod pg;
mod pgwork;
mod pickup;
mod serve;
mod stats;

use anyhow::Context;
use backend::Backend;
use clap::{Args, Parser, Subcommand};
use drain::DrainMode;
use mailroom_bench::{backend, procfs};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "mailroom-bench",
    about = "Benchmarks of mailroom's intake and drain"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// POST /webhooks/bench over HTTP with unique ids; group commit on vs off.
    Ingest(IngestArgs),
    /// Preload N pending events, then time them through a no-op handler.
    Drain(DrainArgs),
    /// Intake and drain on SQLite, PostgreSQL x1 and PostgreSQL x2, side by side.
    Pg(PgArgs),
    /// PostgreSQL: a large backlog drained; the rate over its first and last
    /// windows, and claim statements timed at its start, middle and end.
    Backlog(BacklogArgs),
    /// Claims of due events with the store empty and beside a backlog of
    /// events delivered later (a million by default): claim times and ratio.
    Delayed(DelayedArgs),
    /// SQLite drains of `single` and `batch` beside a raw SQLite loop doing
    /// only the writes a batch drain needs (the bound for `batch`).
    Floor(FloorArgs),
    /// PostgreSQL drains of `single` and `sequential` beside raw SQL
    /// floors of both (keyless events; heads of keys): what the per-key
    /// rule costs on mailroom's schema, and what the engine pays for it.
    HeadsFloor(FloorArgs),
    /// RabbitMQ: inbound (AMQP source into SQLite) and the relay, beside
    /// lapin alone and a hand-written relay, with ratios.
    Amqp(AmqpArgs),
    /// The dashboard's pages on a big store (p50/p99), and intake with and
    /// without a poller of the overview once a second.
    Dashboard(DashboardArgs),
    /// HTTP delivery beside its floor (the same client doing only what a
    /// delivery must) and a hand-written Python deliverer: events/s, CPU
    /// per delivery, ratios.
    HttpFloor(HttpFloorArgs),
    /// Ack → handler start under a steady load, per store and rate.
    Pickup(PickupArgs),
    /// (internal) mailroom as `mailroom serve` runs it, for `ingest`.
    #[command(name = "__serve", hide = true)]
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
struct IngestArgs {
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

#[derive(Debug, Args)]
struct DrainArgs {
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
    drain: DrainSettingsArgs,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct DrainSettingsArgs {
    /// Events to preload and drain.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Attempts in flight of the single and sequential topics.
    #[arg(long, default_value_t = 256)]
    concurrency: u32,
    /// Ordering keys of the sequential topic (events spread round-robin).
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// The batch topic's max_size.
    #[arg(long, default_value_t = 500)]
    batch_size: u32,
    /// The batch topic's max_wait.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    batch_wait: Duration,
    /// Batch deliveries in flight (the batch topic's concurrency).
    #[arg(long, default_value_t = 16)]
    batch_concurrency: u32,
    /// Concurrent enqueues while preloading.
    #[arg(long, default_value_t = 512)]
    preload_concurrency: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 256)]
    body_size: usize,
    /// Give up after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// The single and sequential topics' `rate` ("500/s"): the drain's
    /// events/s against it is the rate's accuracy.
    #[arg(long, value_parser = parse_rate)]
    rate: Option<mailroom::Rate>,
    /// The single and sequential topics' `max_running`.
    #[arg(long)]
    max_running: Option<u32>,
}

fn parse_rate(s: &str) -> Result<mailroom::Rate, String> {
    mailroom::Rate::parse(s).map_err(|e| e.to_string())
}

impl DrainSettingsArgs {
    fn settings(&self) -> drain::Settings {
        drain::Settings {
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

#[derive(Debug, Args)]
struct DashboardArgs {
    /// `sqlite`, or a PostgreSQL server (a fresh database is created and dropped).
    #[arg(long, default_value = "sqlite", value_parser = Backend::parse)]
    store: Backend,
    /// Events preloaded (pending, over the topics).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Topics the events are spread over.
    #[arg(long, default_value_t = 4)]
    topics: u32,
    /// Timed requests per page.
    #[arg(long, default_value_t = 100)]
    requests: u32,
    /// Each intake window (one without and one with the poller per round).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    intake: Duration,
    /// Intake rounds, alternating which window runs first.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Concurrent enqueues (preload and intake).
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct DelayedArgs {
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

#[derive(Debug, Args)]
struct BacklogArgs {
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

#[derive(Debug, Args)]
struct FloorArgs {
    /// Rounds (each: engine single, engine batch, raw floor); the summary
    /// gives the medians of each round's ratios to `single`.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// `sqlite` (a temporary file) or `postgres://...` (fresh databases on
    /// that server, dropped afterwards).
    #[arg(long, default_value = "sqlite", value_parser = Backend::parse)]
    store: Backend,
    #[command(flatten)]
    drain: DrainSettingsArgs,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PgArgs {
    /// The PostgreSQL server (superuser or CREATEDB): fresh databases are
    /// created there for each run and dropped afterwards.
    #[arg(long, value_parser = Backend::parse)]
    store: Backend,
    /// Concurrent intake requests (one keep-alive connection each).
    #[arg(long, default_value_t = 64)]
    ingest_concurrency: usize,
    /// Measured intake window per target.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Intake load before the window, not measured.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Topic mode of the drain.
    #[arg(long, default_value = "single", value_parser = DrainMode::parse)]
    mode: DrainMode,
    /// Skip intake (drain only).
    #[arg(long)]
    no_ingest: bool,
    /// Skip drain (intake only).
    #[arg(long)]
    no_drain: bool,
    /// Skip the SQLite target (PostgreSQL x1, x2 and the ceiling only).
    #[arg(long)]
    no_sqlite: bool,
    /// Drain rounds (each: SQLite, PostgreSQL x1, x2); the summary gives
    /// the medians, and the x2/x1 ratio as the median of each round's.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Also drain with this many instances in each round (3 or more): the
    /// most this store and machine give. xN / x1 is then the highest
    /// x2 / x1 any instance could show here.
    #[arg(long, value_parser = clap::value_parser!(u8).range(3..=16))]
    ceiling: Option<u8>,
    #[command(flatten)]
    drain: DrainSettingsArgs,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct AmqpArgs {
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

#[derive(Debug, Args)]
struct HttpFloorArgs {
    /// Events each floor and mailroom phase delivers.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Concurrencies (attempts in flight; the floor's loops); the first is
    /// the topic default.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    concurrency: Vec<u32>,
    /// Events of the Python deliverer (0: skip it).
    #[arg(long, default_value_t = 10_000)]
    python_events: u64,
    /// Worker threads (one keep-alive connection each) of the Python deliverer.
    #[arg(long, default_value_t = 16)]
    python_concurrency: u32,
    /// Payload size in bytes (a JSON object).
    #[arg(long, default_value_t = 256)]
    body_size: usize,
    /// Threads of the receiver.
    #[arg(long, default_value_t = 1)]
    receiver_threads: usize,
    /// How long the receiver-alone phase runs.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    receiver_alone: Duration,
    /// Give up on a phase after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PickupArgs {
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

#[derive(Debug, Args)]
struct ServeArgs {
    /// `sqlite://FILE` or `postgres://...`.
    #[arg(long)]
    store: String,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    #[arg(long, value_parser = parse_on_off, default_value = "true", action = clap::ArgAction::Set)]
    group_commit: bool,
    #[arg(long)]
    no_metrics: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    mailroom::duration::parse(s).map_err(|e| e.to_string())
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mailroom-bench: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mailroom-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(a) => {
            serve::run(&a.store, &a.listen, a.group_commit, !a.no_metrics).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ingest(a) => run_ingest(a).await,
        Command::Drain(a) => run_drain(a).await,
        Command::Pg(a) => pg::run(a).await,
        Command::Backlog(a) => run_backlog(a).await,
        Command::Delayed(a) => run_delayed(a).await,
        Command::Dashboard(a) => run_dashboard(a).await,
        Command::Amqp(a) => run_amqp(a).await,
        Command::Floor(a) => run_floor(a).await,
        Command::HeadsFloor(a) => run_heads_floor(a).await,
        Command::HttpFloor(a) => run_http_floor(a).await,
        Command::Pickup(a) => run_pickup(a).await,
    }
}

async fn run_http_floor(a: HttpFloorArgs) -> anyhow::Result<ExitCode> {
    let s = httpfloor::Settings {
        events: a.events.max(1),
        concurrency: match a.concurrency.is_empty() {
            true => vec![mailroom::TopicSpec::DEFAULT_CONCURRENCY],
            false => a.concurrency.into_iter().map(|c| c.max(1)).collect(),
        },
        python_events: a.python_events,
        python_concurrency: a.python_concurrency.max(1),
        body_size: a.body_size,
        receiver_threads: a.receiver_threads.max(1),
        receiver_alone: a.receiver_alone,
        timeout: a.timeout,
    };
    let r = httpfloor::run(&s).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "http-floor", "result": r }))?;
    } else {
        httpfloor::print(&s, &r);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_pickup(a: PickupArgs) -> anyhow::Result<ExitCode> {
    let s = pickup::Settings {
        rates: a.rates,
        duration: a.duration,
        warmup: a.warmup,
        body_size: a.body_size,
        concurrency: a.concurrency.max(1),
    };
    let mut runs = Vec::new();
    for store in &a.store {
        runs.extend(pickup::run(&s, store).await?);
    }
    if a.json {
        print_json(&serde_json::json!({ "bench": "pickup", "runs": runs }))?;
    } else {
        pickup::print(&s, &runs);
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints one JSON object on one line (the `--json` output of every bench).
fn print_json(out: &serde_json::Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(out).context("encoding JSON")?);
    Ok(())
}

/// Success, or 2 (after saying so) when intake acknowledged events that
/// were not stored as acknowledged.
fn durability_code(durable: bool) -> ExitCode {
    if durable {
        ExitCode::SUCCESS
    } else {
        eprintln!("mailroom-bench: stored events do not match the acknowledged ones");
        ExitCode::from(2)
    }
}

async fn run_ingest(a: IngestArgs) -> anyhow::Result<ExitCode> {
    let settings = ingest::Settings {
        concurrency: a.concurrency.max(1),
        duration: a.duration,
        warmup: a.warmup,
        body_size: a.body_size,
        direct: a.direct,
        no_metrics: a.no_metrics,
        backend: a.store,
        instances: a.instances.max(1),
    };
    let results = ingest::run(&settings, a.only).await?;
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
            "ratio": ingest::ratio(&results),
        }))?;
    } else {
        ingest::print_table(&settings, &results);
    }
    Ok(durability_code(
        results.iter().all(ingest::ModeResult::durable),
    ))
}

async fn run_drain(a: DrainArgs) -> anyhow::Result<ExitCode> {
    let settings = a.drain.settings();
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        let mut round = Vec::new();
        for mode in &a.modes {
            round.push(drain::run(&settings, *mode, &a.store, a.instances).await?);
        }
        rounds.push(round);
    }
    if rounds.len() > 1 {
        if a.json {
            print_json(&serde_json::json!({
                "bench": "drain",
                "rounds": rounds,
                "median": drain::medians(&rounds),
            }))?;
        } else {
            drain::print_rounds(&settings, &rounds);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let results = rounds.remove(0);
    if a.json {
        let ratios: Vec<Option<f64>> = results
            .iter()
            .map(|r| drain::ratio_vs_single(&results, r))
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
        drain::print_table(&settings, &results);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_dashboard(a: DashboardArgs) -> anyhow::Result<ExitCode> {
    let s = dashboard::Settings {
        events: a.events,
        topics: a.topics.max(1),
        requests: a.requests.max(1),
        intake: a.intake,
        concurrency: a.concurrency.max(1),
        rounds: a.rounds.max(1),
    };
    let r = dashboard::run(&s, &a.store).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "dashboard", "result": r }))?;
    } else {
        dashboard::print(&r);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_delayed(a: DelayedArgs) -> anyhow::Result<ExitCode> {
    let s = delayed::Settings {
        events: a.events,
        due: a.due.max(1),
        claim_size: a.claim_size.max(1),
        concurrency: a.concurrency.max(1),
    };
    let r = delayed::run(&s, &a.store).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "delayed", "result": r }))?;
    } else {
        delayed::print(&s, &r);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_backlog(a: BacklogArgs) -> anyhow::Result<ExitCode> {
    let s = drain::BacklogSettings {
        drain: drain::Settings {
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
    let r = drain::run_backlog(&s, &a.store).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "backlog", "result": r }))?;
    } else {
        drain::print_backlog(&s, &r);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_floor(a: FloorArgs) -> anyhow::Result<ExitCode> {
    let settings = a.drain.settings();
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        let single = drain::run(&settings, DrainMode::Single, &a.store, 1).await?;
        let batch = drain::run(&settings, DrainMode::Batch, &a.store, 1).await?;
        let (events, max_size, body) = (settings.events, settings.batch_size, settings.body_size);
        let raw = match &a.store {
            Backend::Sqlite => floor::run(events, max_size, body).await?,
            pg => floor::postgres::run(pg, events, max_size, body).await?,
        };
        rounds.push(floor::Round { single, batch, raw });
    }
    if a.json {
        print_json(&serde_json::json!({
            "bench": "floor",
            "rounds": rounds,
            "median": floor::medians(&rounds),
        }))?;
    } else {
        floor::print(&settings, &a.store, &rounds);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_heads_floor(a: FloorArgs) -> anyhow::Result<ExitCode> {
    let settings = a.drain.settings();
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        rounds.push(floor::heads::round(&settings, &a.store).await?);
    }
    if a.json {
        print_json(&serde_json::json!({
            "bench": "heads-floor",
            "rounds": rounds,
            "median": floor::heads::medians(&rounds),
        }))?;
    } else {
        floor::heads::print(&settings, &a.store, &rounds);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_amqp(a: AmqpArgs) -> anyhow::Result<ExitCode> {
    let settings = amqp::Settings {
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
    let report = amqp::run(settings.clone()).await?;
    if a.json {
        let out = serde_json::json!({
            "bench": "amqp",
            "messages": settings.messages,
            "body_size": settings.body_size,
            "phases": report.phases,
            "commit_latency_ms": report.commit_latency_ms,
            "load_before": report.load_before,
            "load_after": report.load_after,
            "ratios": amqp::ratios(&settings, &report.phases),
        });
        println!("{}", serde_json::to_string(&out).context("encoding JSON")?);
    } else {
        amqp::print(&settings, &report);
    }
    Ok(ExitCode::SUCCESS)
}
