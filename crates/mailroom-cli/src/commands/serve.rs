//! `mailroom serve`: intake, dispatcher and HTTP API in one process, until
//! SIGINT/SIGTERM. With `[tls]` the listener speaks HTTPS, and SIGHUP
//! re-reads its certificate and key.

use super::{amqp, load_config, open};
use crate::Cli;
use anyhow::{Context, Result, anyhow};
use mailroom_config::{Config, Specs};
use mailroom_server::tls::ServerTls;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub(super) async fn run(cli: &Cli, listen: Option<&str>) -> Result<()> {
    let mut config = load_config(cli)?;
    if let Some(l) = listen {
        config.listen = l.to_string();
    }
    serve(config).await
}

async fn serve(config: Config) -> Result<()> {
    let shutdown = CancellationToken::new();
    let render = mailroom_server::prometheus::install(shutdown.clone())
        .context("cannot install the metrics recorder")?;
    // A public listener needs a strong api_token; config errors name the key.
    let addr = config.checked_listen_addr()?;
    let tokens = config.api_tokens();
    let undeclared = config.accept_undeclared_sources()?;
    let tls = load_tls(&config)?.map(Arc::new);
    let mut specs = Specs::from_config(&config)?;
    let plan = std::mem::take(&mut specs.amqp);
    amqp::declare_before_serve(&plan, &config.origin).await?;
    let store = open(&config).await?;
    let engine = specs
        .into_builder(store)
        .accept_undeclared_sources(undeclared)
        .build()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    // Before the start-up line: a SIGHUP sent once it is out reloads
    // rather than ends the process.
    let reload = tls
        .as_ref()
        .map(|tls| reload_on_sighup(tls.clone(), shutdown.clone()))
        .transpose()?;
    announce(
        &config,
        &engine,
        listener.local_addr()?,
        undeclared,
        tls.as_deref(),
    );
    let (brokers, dependencies) = amqp::start(&plan, &engine, &shutdown)?;

    tokio::spawn(wait_for_signals(shutdown.clone()));
    if let Some(reload) = reload {
        tokio::spawn(reload);
    }
    let limits = server_limits(&config.limits);
    let router = mailroom_server::router(
        engine.clone(),
        mailroom_server::ServerOptions {
            api_tokens: tokens,
            metrics: Some(render),
            limits: limits.clone(),
            dependencies,
            tls: tls.is_some(),
            protect_metrics: config.protect_metrics,
        },
    );
    let server = async {
        match &tls {
            Some(tls) => {
                mailroom_server::serve_https(listener, router, shutdown.clone(), &limits, tls).await
            }
            None => mailroom_server::serve_with(listener, router, shutdown.clone(), &limits).await,
        }
    };
    // Dispatch starts once the AMQP connections are up (or after a few
    // seconds without them), so due events are not first attempted on a
    // handler whose channel is still opening; intake starts at once.
    let dispatch = async {
        brokers.wait_up(amqp::CONNECT_GRACE).await;
        engine.run(shutdown.clone()).await;
    };
    let (served, ()) = tokio::join!(server, dispatch);
    // After the engine: AMQP handlers publish until its last attempt ends.
    brokers.stop().await;
    served.context("HTTP server failed")?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// The start-up log lines: where it listens, and what an operator should know.
fn announce(
    config: &Config,
    engine: &mailroom::Engine,
    local: std::net::SocketAddr,
    undeclared: bool,
    tls: Option<&ServerTls>,
) {
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(listen = %local, url = %format_args!("{scheme}://{local}"), store = %mailroom::redact::url(&config.store.url), config = %config.origin, "mailroom is serving");
    if let Some(tls) = tls {
        tracing::info!(cert_file = %tls.cert_file().display(), sha256 = %tls.fingerprint(), "serving HTTPS; SIGHUP re-reads the certificate and key");
    }
    if engine.operator().alert_rules().any() {
        tracing::info!(
            window = %mailroom::duration::format(mailroom::alert::ALERT_WINDOW),
            "[alerts] evaluated every 10s by the instance that holds maintenance: see the logs, /v1/stats and mailroom status"
        );
    }
    if undeclared {
        tracing::info!(
            "undeclared sources accepted: POST /webhooks/<name> stores into topic <name> unsigned \
             (quick start; with a config file only declared [[source]]s are)"
        );
    }
}

/// `[limits]` over the server's defaults.
fn server_limits(c: &mailroom_config::file::LimitsConfig) -> mailroom_server::shedding::Limits {
    let d = mailroom_server::shedding::Limits::default();
    mailroom_server::shedding::Limits {
        max_concurrent_requests: c
            .max_concurrent_requests
            .unwrap_or(d.max_concurrent_requests)
            .max(1),
        max_connections: c.max_connections.unwrap_or(d.max_connections).max(1),
        header_read_timeout: c.header_read_timeout.unwrap_or(d.header_read_timeout),
        tls_handshake_timeout: c.tls_handshake_timeout.unwrap_or(d.tls_handshake_timeout),
        body_read_timeout: c.body_read_timeout.unwrap_or(d.body_read_timeout),
        max_headers: c.max_headers.unwrap_or(d.max_headers).max(1),
        max_header_bytes: c.max_header_bytes.map_or(d.max_header_bytes, |b| {
            usize::try_from(b.0).unwrap_or(usize::MAX)
        }),
        api_max_body: c.api_max_body.map_or(d.api_max_body, |b| b.0),
        shutdown_grace: d.shutdown_grace,
        rejection_log_every: d.rejection_log_every,
    }
}

/// `[tls]`'s certificate and key, read and checked; errors name the key
/// and the file.
pub(super) fn load_tls(config: &Config) -> Result<Option<ServerTls>> {
    config
        .tls
        .as_ref()
        .map(|t| {
            ServerTls::load(&t.cert_file, &t.key_file)
                .map_err(|e| anyhow!("{}: {e}", config.origin))
        })
        .transpose()
}

/// Each SIGHUP re-reads `[tls]`'s files: new handshakes get the new
/// certificate, open connections keep theirs; a pair that does not load
/// is refused (ERROR) and the current one kept. The signal is taken here,
/// at once, so a SIGHUP no longer ends the process from this call on.
#[cfg(unix)]
fn reload_on_sighup(
    tls: Arc<ServerTls>,
    shutdown: CancellationToken,
) -> Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
    Ok(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            match tls.reload() {
                Ok(()) => {
                    tracing::info!(cert_file = %tls.cert_file().display(), sha256 = %tls.fingerprint(), "SIGHUP: TLS certificate reloaded; new connections get it")
                }
                Err(e) => {
                    tracing::error!(error = %e, sha256 = %tls.fingerprint(), "SIGHUP: the TLS certificate and key were not reloaded; still serving the previous certificate")
                }
            }
        }
    })
}

/// Without SIGHUP, the certificate is read at start only.
#[cfg(not(unix))]
fn reload_on_sighup(
    _tls: Arc<ServerTls>,
    _shutdown: CancellationToken,
) -> Result<impl Future<Output = ()>> {
    Ok(std::future::ready(()))
}

/// First SIGINT/SIGTERM: graceful shutdown (stop intake, finish attempts in
/// flight). A second one exits at once; leases of unfinished attempts then
/// expire and their events are retried.
async fn wait_for_signals(shutdown: CancellationToken) {
    one_signal().await;
    tracing::info!(
        "shutting down: intake stopped, finishing attempts in flight (signal again to force)"
    );
    shutdown.cancel();
    one_signal().await;
    tracing::warn!("forced exit; unfinished attempts will be retried after their leases expire");
    std::process::exit(130);
}

async fn one_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
