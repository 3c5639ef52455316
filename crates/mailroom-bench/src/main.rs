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
mod cli;
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

use clap::{Parser, Subcommand};
use mailroom_bench::{backend, procfs};
use std::process::ExitCode;

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
    Ingest(ingest::Args),
    /// Preload N pending events, then time them through a no-op handler.
    Drain(drain::Args),
    /// Intake and drain on SQLite, PostgreSQL x1 and PostgreSQL x2, side by side.
    Pg(pg::Args),
    /// PostgreSQL: a large backlog drained; the rate over its first and last
    /// windows, and claim statements timed at its start, middle and end.
    Backlog(drain::backlog::Args),
    /// Claims of due events with the store empty and beside a backlog of
    /// events delivered later (a million by default): claim times and ratio.
    Delayed(delayed::Args),
    /// SQLite drains of `single` and `batch` beside a raw SQLite loop doing
    /// only the writes a batch drain needs (the bound for `batch`).
    Floor(floor::Args),
    /// PostgreSQL drains of `single` and `sequential` beside raw SQL
    /// floors of both (keyless events; heads of keys): what the per-key
    /// rule costs on mailroom's schema, and what the engine pays for it.
    HeadsFloor(floor::Args),
    /// RabbitMQ: inbound (AMQP source into SQLite) and the relay, beside
    /// lapin alone and a hand-written relay, with ratios.
    Amqp(amqp::Args),
    /// The dashboard's pages on a big store (p50/p99), and intake with and
    /// without a poller of the overview once a second.
    Dashboard(dashboard::Args),
    /// HTTP delivery beside its floor (the same client doing only what a
    /// delivery must) and a hand-written Python deliverer: events/s, CPU
    /// per delivery, ratios.
    HttpFloor(httpfloor::Args),
    /// Ack → handler start under a steady load, per store and rate.
    Pickup(pickup::Args),
    /// (internal) mailroom as `mailroom serve` runs it, for `ingest`.
    #[command(name = "__serve", hide = true)]
    Serve(serve::Args),
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

/// Runs one verb: each module holds its verb's arguments and runner.
async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(a) => serve::run(a).await,
        Command::Ingest(a) => ingest::run(a).await,
        Command::Drain(a) => drain::run(a).await,
        Command::Pg(a) => pg::run(a).await,
        Command::Backlog(a) => drain::backlog::run(a).await,
        Command::Delayed(a) => delayed::run(a).await,
        Command::Dashboard(a) => dashboard::run(a).await,
        Command::Amqp(a) => amqp::run(a).await,
        Command::Floor(a) => floor::run(a).await,
        Command::HeadsFloor(a) => floor::heads::run(a).await,
        Command::HttpFloor(a) => httpfloor::run(a).await,
        Command::Pickup(a) => pickup::run(a).await,
    }
}
