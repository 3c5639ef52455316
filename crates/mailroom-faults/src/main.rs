//! `mailroom-faults`: the fault matrix. Attacks a real `mailroom serve`
//! (the binary beside this one, as a child process) under recorded load,
//! then checks the record against the store and prints one row per
//! scenario; exits non-zero if any row failed. See the crate's README.
//!
//! - `matrix.rs`: the run, its rows and the table;
//! - `child.rs`: which `mailroom` binary runs (the process, the handler
//!   endpoint, the record, the store's reads and the checker are
//!   `mailroom-testkit`'s harness, shared with `mailroom-cli`'s tests);
//! - `load.rs`: senders that record every ack;
//! - `scenarios/`: one file per attack.

mod child;
mod load;
mod matrix;
mod scenarios;

use anyhow::Context;
use backend::Backend;
use clap::Parser;
use mailroom_bench::{backend, procfs};
use mailroom_testkit::harness::{check, record, store};
use matrix::Report;
use std::process::ExitCode;

/// The fault matrix against a real `mailroom serve`.
#[derive(Debug, Parser)]
#[command(name = "mailroom-faults", version)]
struct Cli {
    /// Small runs, for CI (the whole matrix in a few minutes).
    #[arg(long)]
    quick: bool,
    /// `sqlite`, `postgres` or `both`. PostgreSQL runs on fresh databases
    /// of `--postgres-url`.
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// The PostgreSQL server (a role with CREATEDB).
    #[arg(long, env = "MAILROOM_TEST_POSTGRES_URL")]
    postgres_url: Option<String>,
    /// Run only these scenarios (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// `K/N`: run every N-th row of the run, starting with the K-th (rows
    /// in their printed order, stores included), so N processes side by
    /// side run the whole matrix once. Every scenario has servers of its
    /// own, so shards share only the CPU.
    #[arg(long, value_parser = parse_shard)]
    shard: Option<matrix::Shard>,
}

fn parse_shard(s: &str) -> Result<matrix::Shard, String> {
    let bad = || format!("expected K/N with 1 <= K <= N, got {s:?}");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let k: usize = k.trim().parse().map_err(|_| bad())?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if k == 0 || k > n {
        return Err(bad());
    }
    Ok(matrix::Shard { k, n })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The attacks make lapin (a broker stopped) and the in-process engine
    // of `panic` (handlers panicking) log errors by design, dozens a run;
    // the rows say what matters. RUST_LOG overrides.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,lapin=off,mailroom=off,sqlx=error")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mailroom-faults: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mailroom-faults: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: Cli) -> anyhow::Result<ExitCode> {
    let postgres = || -> anyhow::Result<Backend> {
        let url = a
            .postgres_url
            .clone()
            .context("PostgreSQL needs --postgres-url or MAILROOM_TEST_POSTGRES_URL")?;
        Backend::parse(&url).map_err(anyhow::Error::msg)
    };
    let stores = match a.store.as_str() {
        "sqlite" => vec![Backend::Sqlite],
        "postgres" => vec![postgres()?],
        "both" => vec![Backend::Sqlite, postgres()?],
        other => anyhow::bail!("--store: expected sqlite, postgres or both, got {other:?}"),
    };
    let known: Vec<&str> = matrix::ALL.iter().map(|s| s.name).collect();
    if let Some(bad) = a.only.iter().find(|o| !known.contains(&o.as_str())) {
        anyhow::bail!("--only: no scenario {bad:?}; known: {}", known.join(", "));
    }
    matrix::run(&matrix::Settings {
        quick: a.quick,
        stores,
        only: a.only,
        shard: a.shard,
    })
    .await
}
