//! The hidden `__serve` subcommand: mailroom as `mailroom serve` runs it with
//! default settings (store — `sqlite://FILE` or `postgres://...` — migrated
//! at start, undeclared sources
//! accepted on loopback, Prometheus recorder installed), in a child process
//! so its memory and CPU are measured apart from the load generator.
//!
//! Protocol with the parent: prints `LISTENING <addr>` once serving; stops
//! gracefully when its stdin closes; then prints `COMMITS <n>` (write
//! transactions of the store's insert writer) before exiting.

use crate::cli::parse_on_off;
use anyhow::Context;
use mailroom::Engine;
use mailroom_server::{ServerOptions, router, serve};
use std::io::Write;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub struct Args {
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

/// Runs `__serve` until its stdin closes.
pub async fn run(a: Args) -> anyhow::Result<std::process::ExitCode> {
    serve_store(&a.store, &a.listen, a.group_commit, !a.no_metrics).await?;
    Ok(std::process::ExitCode::SUCCESS)
}

async fn serve_store(
    url: &str,
    listen: &str,
    group_commit: bool,
    metrics: bool,
) -> anyhow::Result<()> {
    let opened = crate::backend::open_url(url, group_commit).await?;
    let store: Arc<dyn mailroom::Store> = opened.store();
    store.migrate().await.context("migrating")?;

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;

    let mut options = ServerOptions::default();
    let shutdown = CancellationToken::new();
    if metrics {
        options.metrics = Some(
            mailroom_server::prometheus::install(shutdown.clone())
                .context("installing the Prometheus recorder")?,
        );
    }

    let engine = Engine::builder(store)
        .accept_undeclared_sources(addr.ip().is_loopback())
        .build()?;
    let app = router(engine.clone(), options);

    let engine_task = {
        let engine = engine.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let server = tokio::spawn(serve(listener, app, shutdown.clone()));

    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "LISTENING {addr}")?;
        out.flush()?;
    }

    // Stop when the parent closes our stdin (or goes away).
    let mut stdin = tokio::io::stdin();
    let mut sink = [0u8; 64];
    while stdin.read(&mut sink).await.unwrap_or(0) > 0 {}
    shutdown.cancel();
    server.await?.context("serving")?;
    engine_task.await?;
    drop(engine);

    let mut out = std::io::stdout().lock();
    writeln!(out, "COMMITS {}", opened.commits())?;
    out.flush()?;
    Ok(())
}
