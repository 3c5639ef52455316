//! `mailroom-bench`: throughput and latency of mailroom on this machine.
//!
//! - `ingest`: webhook intake over real HTTP against a child mailroom
//!   process, with group commit on and then off (one commit per request),
//!   printing acks/s, latency percentiles, mailroom's RSS and the ratio.
//! - `drain`: N preloaded pending events through a no-op handler.
//!
//! Run with `cargo run --release -p mailroom-bench -- ingest` (or `drain`).

mod drain;
mod ingest;
mod procfs;
mod serve;
mod stats;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
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
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct DrainArgs {
    /// Events to preload and drain.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// The topic's concurrency (attempts in flight).
    #[arg(long, default_value_t = 256)]
    concurrency: u32,
    /// Concurrent enqueues while preloading.
    #[arg(long, default_value_t = 512)]
    preload_concurrency: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 256)]
    body_size: usize,
    /// Give up after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[arg(long)]
    db: PathBuf,
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
            serve::run(&a.db, &a.listen, a.group_commit, !a.no_metrics).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Ingest(a) => {
            let settings = ingest::Settings {
                concurrency: a.concurrency.max(1),
                duration: a.duration,
                warmup: a.warmup,
                body_size: a.body_size,
                direct: a.direct,
                no_metrics: a.no_metrics,
            };
            let results = ingest::run(&settings, a.only).await?;
            if a.json {
                let out = serde_json::json!({
                    "bench": "ingest",
                    "concurrency": settings.concurrency,
                    "duration_secs": settings.duration.as_secs_f64(),
                    "body_size": settings.body_size,
                    "direct": settings.direct,
                    "metrics": !settings.no_metrics,
                    "modes": results,
                    "ratio": ingest::ratio(&results),
                });
                println!("{}", serde_json::to_string(&out).context("encoding JSON")?);
            } else {
                ingest::print_table(&settings, &results);
            }
            if results.iter().all(ingest::ModeResult::durable) {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("mailroom-bench: stored events do not match the acknowledged ones");
                Ok(ExitCode::from(2))
            }
        }
        Command::Drain(a) => {
            let settings = drain::Settings {
                events: a.events,
                concurrency: a.concurrency.max(1),
                preload_concurrency: a.preload_concurrency.max(1),
                body_size: a.body_size,
                timeout: a.timeout,
            };
            let r = drain::run(&settings).await?;
            if a.json {
                let mut out = serde_json::to_value(&r).context("encoding JSON")?;
                if let Some(o) = out.as_object_mut() {
                    o.insert("bench".into(), "drain".into());
                    o.insert("concurrency".into(), settings.concurrency.into());
                }
                println!("{out}");
            } else {
                drain::print_table(&settings, &r);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
