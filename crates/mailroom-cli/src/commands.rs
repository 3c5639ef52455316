//! What each verb does. Errors carry context (`anyhow`); the library crates
//! stay typed.

use crate::table::{clip, render};
use crate::{Cli, Command, ConfigCommand, EventsCommand};
use anyhow::{Context, Result, bail};
use mailroom::{Engine, EventId, KeyCursor, ListFilter, Status, Store};
use mailroom_config::{Config, Topology};
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Installs the tracing subscriber: text (default) or JSON lines; level from
/// `RUST_LOG`, default `info`.
pub fn init_logging(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init();
    } else {
        builder.init();
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn load_config(cli: &Cli) -> Result<Config> {
    let path = mailroom_config::locate(cli.config.clone(), &env);
    Ok(Config::load(path.as_deref(), &env)?)
}

async fn open(config: &Config) -> Result<Arc<dyn Store>> {
    let store = mailroom::open_store(&config.store.url, config.store.group_commit)
        .await
        .with_context(|| format!("cannot open the store {}", config.store.url))?;
    store
        .migrate()
        .await
        .with_context(|| format!("cannot migrate the store {}", config.store.url))?;
    Ok(store)
}

fn parse_id(id: &str) -> Result<EventId> {
    id.parse()
        .with_context(|| format!("{id:?} is not an event id"))
}

fn parse_status(s: Option<String>) -> Result<Option<Status>> {
    s.map(|s| s.parse::<Status>().map_err(anyhow::Error::msg))
        .transpose()
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<ExitCode> {
    let json = cli.json;
    match &cli.command {
        Command::Serve { listen } => {
            let mut config = load_config(&cli)?;
            if let Some(l) = listen {
                config.listen = l.clone();
            }
            serve(config).await?;
        }
        Command::Migrate => {
            let config = load_config(&cli)?;
            open(&config).await?;
            outln!("{}: schema is up to date", config.store.url);
        }
        Command::Status => {
            let config = load_config(&cli)?;
            status(&config, json).await?;
        }
        Command::Events { command } => {
            let config = load_config(&cli)?;
            let engine = offline_engine(&config).await?;
            match command {
                EventsCommand::List {
                    topic,
                    status,
                    key,
                    limit,
                    cursor,
                } => {
                    let filter = ListFilter {
                        topic: topic.clone(),
                        status: parse_status(status.clone())?,
                        key: key.clone(),
                        limit: (*limit).clamp(1, 1000),
                        cursor: cursor.as_deref().map(parse_id).transpose()?.map(KeyCursor),
                    };
                    let page = engine.list(&filter).await?;
                    let next = page.next_cursor.map(|c| c.0.to_string());
                    if json {
                        let events: Vec<_> = page.events.iter().map(|e| e.to_json(false)).collect();
                        outln!(
                            "{}",
                            serde_json::json!({ "events": events, "next_cursor": next })
                        );
                    } else {
                        let rows: Vec<Vec<String>> = page
                            .events
                            .iter()
                            .map(|e| {
                                vec![
                                    e.id.to_string(),
                                    e.topic.clone(),
                                    e.status.to_string(),
                                    format!("{}/{}", e.attempts, e.max_attempts),
                                    e.key.clone().unwrap_or_default(),
                                    e.event_type.clone().unwrap_or_default(),
                                    e.received_at.strftime("%Y-%m-%d %H:%M:%S").to_string(),
                                    clip(e.last_error.as_deref().unwrap_or(""), 60),
                                ]
                            })
                            .collect();
                        out!(
                            "{}",
                            render(
                                &[
                                    "ID",
                                    "TOPIC",
                                    "STATUS",
                                    "ATTEMPTS",
                                    "KEY",
                                    "TYPE",
                                    "RECEIVED (UTC)",
                                    "LAST ERROR"
                                ],
                                &rows
                            )
                        );
                        if let Some(n) = next {
                            outln!("(more: --cursor {n})");
                        }
                    }
                }
                EventsCommand::Show { id } => {
                    let event = engine
                        .get(parse_id(id)?)
                        .await?
                        .with_context(|| format!("no event {id}"))?;
                    if json {
                        outln!("{}", event.to_json(true));
                    } else {
                        show(&event);
                    }
                }
            }
        }
        Command::Replay {
            id,
            topic,
            status,
            key,
        } => {
            let config = load_config(&cli)?;
            let engine = offline_engine(&config).await?;
            match id {
                Some(id) => {
                    if topic.is_some() || status.is_some() || key.is_some() {
                        bail!("give an event id or filters (--topic/--status/--key), not both");
                    }
                    let e = engine.replay(parse_id(id)?).await?;
                    if json {
                        outln!("{}", e.to_json(false));
                    } else {
                        outln!(
                            "{} is pending again (attempt {} of {} next)",
                            e.id,
                            e.attempts + 1,
                            e.max_attempts
                        );
                    }
                }
                None => {
                    let status = parse_status(status.clone())?.unwrap_or(Status::Dead);
                    if status == Status::Running {
                        bail!("running events cannot be replayed");
                    }
                    eprintln!("replaying {status} events…");
                    let filter = ListFilter {
                        topic: topic.clone(),
                        status: Some(status),
                        key: key.clone(),
                        ..ListFilter::default()
                    };
                    let n = engine.replay_matching(&filter).await?;
                    if json {
                        outln!("{}", serde_json::json!({ "replayed": n }));
                    } else {
                        outln!("{n} events are pending again");
                    }
                }
            }
        }
        Command::Skip { id } => {
            let config = load_config(&cli)?;
            let engine = offline_engine(&config).await?;
            let e = engine.skip(parse_id(id)?).await?;
            if json {
                outln!("{}", e.to_json(false));
            } else {
                outln!("{} skipped; its key is unblocked", e.id);
            }
        }
        Command::Purge { older_than } => {
            let config = load_config(&cli)?;
            let d = mailroom::duration::parse(older_than)?;
            let engine = offline_engine(&config).await?;
            eprintln!("purging finished events older than {older_than}…");
            let report = engine.purge(d).await?;
            if json {
                outln!(
                    "{}",
                    serde_json::json!({ "payloads_dropped": report.payloads_dropped, "rows_deleted": report.rows_deleted })
                );
            } else {
                outln!(
                    "payloads dropped: {}, rows deleted (past the dedup window of {}): {}",
                    report.payloads_dropped,
                    mailroom::duration::format(engine.retention().dedup.max(d)),
                    report.rows_deleted
                );
            }
        }
        Command::Config {
            command: ConfigCommand::Check,
        } => return config_check(&cli, json),
    }
    Ok(ExitCode::SUCCESS)
}

/// An engine that is never run: it gives replays their topic's budget.
async fn offline_engine(config: &Config) -> Result<Engine> {
    let store = open(config).await?;
    Ok(Topology::from_config(config)?.into_builder(store).build()?)
}

async fn serve(config: Config) -> Result<()> {
    let addr = config.listen_addr()?;
    let loopback = addr.ip().is_loopback();
    let tokens = config.api_tokens();
    if !loopback && tokens.is_empty() {
        bail!(
            "{}: refusing to listen on {addr} without api_token: anyone could read and replay events. \
             Set api_token (or MAILROOM_API_TOKEN), or listen on 127.0.0.1",
            config.origin
        );
    }
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let store = open(&config).await?;
    let engine = Topology::from_config(&config)?
        .into_builder(store)
        .accept_undeclared_sources(loopback)
        .build()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!(listen = %local, store = %config.store.url, config = %config.origin, "mailroom is serving");
    if engine.alert_rules().any() {
        tracing::info!(
            window = %mailroom::duration::format(mailroom::alert::ALERT_WINDOW),
            "[alerts] evaluated every 10s by the instance that holds maintenance: see the logs, /v1/stats and mailroom status"
        );
    }
    if loopback && config.sources.is_empty() {
        tracing::info!(
            "no sources declared: any POST /webhooks/<name> is accepted on loopback (topic = <name>)"
        );
    }

    let shutdown = CancellationToken::new();
    tokio::spawn(wait_for_signals(shutdown.clone()));
    let upkeep = {
        let handle = prometheus.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_secs(5)) => handle.run_upkeep(),
                    () = shutdown.cancelled() => break,
                }
            }
        })
    };
    let render: mailroom_server::MetricsRenderer = Arc::new(move || prometheus.render());
    let limits = server_limits(&config.limits);
    let router = mailroom_server::router(
        engine.clone(),
        mailroom_server::ServerOptions {
            api_tokens: tokens,
            metrics: Some(render),
            limits: limits.clone(),
        },
    );
    let server = mailroom_server::serve_with(listener, router, shutdown.clone(), &limits);
    let (served, ()) = tokio::join!(server, engine.run(shutdown.clone()));
    let _ = upkeep.await;
    served.context("HTTP server failed")?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// `[limits]` over the server's defaults.
fn server_limits(c: &mailroom_config::file::LimitsConfig) -> mailroom_server::limits::Limits {
    let d = mailroom_server::limits::Limits::default();
    mailroom_server::limits::Limits {
        max_concurrent_requests: c
            .max_concurrent_requests
            .unwrap_or(d.max_concurrent_requests)
            .max(1),
        max_connections: c.max_connections.unwrap_or(d.max_connections).max(1),
        header_read_timeout: c.header_read_timeout.unwrap_or(d.header_read_timeout),
        body_read_timeout: c.body_read_timeout.unwrap_or(d.body_read_timeout),
        max_headers: c.max_headers.unwrap_or(d.max_headers).max(1),
        max_header_bytes: c.max_header_bytes.map_or(d.max_header_bytes, |b| {
            usize::try_from(b.0).unwrap_or(usize::MAX)
        }),
        api_max_body: c.api_max_body.map_or(d.api_max_body, |b| b.0),
    }
}

/// First SIGINT/SIGTERM: graceful shutdown (stop intake, finish attempts in
/// flight). A second one exits at once; leases of unfinished attempts then
/// expire and their events are retried.
async fn wait_for_signals(shutdown: CancellationToken) {
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
    one_signal().await;
    tracing::info!(
        "shutting down: intake stopped, finishing attempts in flight (signal again to force)"
    );
    shutdown.cancel();
    one_signal().await;
    tracing::warn!("forced exit; unfinished attempts will be retried after their leases expire");
    std::process::exit(130);
}

async fn status(config: &Config, json: bool) -> Result<()> {
    // Through the engine, so blocked keys count only where a dead head blocks.
    let engine = offline_engine(config).await?;
    let stats = engine.stats().await?;
    let alerts = engine.alerts_from(&stats).await?;
    let now = jiff::Timestamp::now();
    let age = |t: Option<jiff::Timestamp>| {
        t.map(|t| (now.as_millisecond() - t.as_millisecond()).max(0) as f64 / 1000.0)
    };
    if json {
        let topics: Vec<_> = stats
            .iter()
            .map(|s| {
                let counts: serde_json::Map<String, serde_json::Value> = Status::ALL
                    .iter()
                    .map(|st| (st.as_str().to_string(), s.count(*st).into()))
                    .collect();
                serde_json::json!({
                    "topic": s.topic,
                    "counts": counts,
                    "oldest_pending_age_seconds": age(s.oldest_pending),
                    "blocked_keys": s.blocked_keys,
                })
            })
            .collect();
        let alerts: Vec<_> = alerts.iter().map(mailroom::Alert::to_json).collect();
        outln!(
            "{}",
            serde_json::json!({ "topics": topics, "alerts": alerts })
        );
        return Ok(());
    }
    if stats.is_empty() {
        outln!("no events yet in {}", config.store.url);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            vec![
                s.topic.clone(),
                s.count(Status::Pending).to_string(),
                s.count(Status::Running).to_string(),
                s.count(Status::Done).to_string(),
                s.count(Status::Dead).to_string(),
                s.count(Status::Skipped).to_string(),
                age(s.oldest_pending)
                    .map(|a| format!("{a:.1}s"))
                    .unwrap_or_else(|| "-".into()),
                s.blocked_keys.to_string(),
            ]
        })
        .collect();
    out!(
        "{}",
        render(
            &[
                "TOPIC",
                "PENDING",
                "RUNNING",
                "DONE",
                "DEAD",
                "SKIPPED",
                "OLDEST PENDING",
                "BLOCKED KEYS"
            ],
            &rows
        )
    );
    if engine.alert_rules().any() {
        if alerts.is_empty() {
            outln!("\nalerts: none firing");
        } else {
            outln!("\nalerts firing:");
            for a in &alerts {
                outln!("  {:<18} {}", a.kind.as_str(), a.message);
            }
        }
    }
    Ok(())
}

fn show(e: &mailroom::Event) {
    let opt = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    outln!("id              {}", e.id);
    outln!("status          {}", e.status);
    outln!("topic           {}", e.topic);
    outln!("source          {}", e.source);
    outln!("dedup key       {}", e.dedup_key);
    outln!("key             {}", opt(&e.key));
    outln!("type            {}", opt(&e.event_type));
    outln!("attempts        {} of {}", e.attempts, e.max_attempts);
    outln!("received at     {}", e.received_at);
    if let Some(t) = e.next_attempt_at {
        outln!("next attempt at {t}");
    }
    outln!("correlation id  {}", opt(&e.correlation_id));
    outln!("content type    {}", opt(&e.content_type));
    outln!("last error      {}", opt(&e.last_error));
    match &e.payload {
        None => outln!("payload         (purged by retention)"),
        Some(p) => outln!("payload         {}", clip(&String::from_utf8_lossy(p), 200)),
    }
    if !e.history.is_empty() {
        outln!();
        let rows: Vec<Vec<String>> = e
            .history
            .iter()
            .map(|a| {
                vec![
                    a.attempt.to_string(),
                    a.started_at.strftime("%H:%M:%S%.3f").to_string(),
                    a.finished_at
                        .map(|t| t.strftime("%H:%M:%S%.3f").to_string())
                        .unwrap_or_default(),
                    a.outcome.as_str().to_string(),
                    a.worker.clone().unwrap_or_default(),
                    clip(a.error.as_deref().unwrap_or(""), 70),
                ]
            })
            .collect();
        out!(
            "{}",
            render(
                &[
                    "ATTEMPT", "STARTED", "FINISHED", "OUTCOME", "WORKER", "ERROR"
                ],
                &rows
            )
        );
    }
}

fn config_check(cli: &Cli, json: bool) -> Result<ExitCode> {
    let config = load_config(cli)?;
    let mut warnings = Vec::new();
    let addr = config.listen_addr()?;
    if !addr.ip().is_loopback() && config.api_tokens().is_empty() {
        bail!(
            "{}: listen: {addr} is not loopback and no api_token is set; serve would refuse to start",
            config.origin
        );
    }
    // Validates every topic, source, handler and secret, without a store.
    let topology = Topology::from_config(&config)?;
    for (i, s) in config.sources.iter().enumerate() {
        let topic = s.topic.clone().unwrap_or_else(|| s.name.clone());
        if !config.topics.iter().any(|t| t.name == topic) {
            warnings.push(format!(
                "source[{i}] ({}) sends to undeclared topic {topic:?}: it gets default settings and no handler (pull)",
                s.name
            ));
        }
    }
    if json {
        outln!(
            "{}",
            serde_json::json!({ "ok": true, "file": config.origin, "warnings": warnings })
        );
    } else {
        outln!("{}: ok", config.origin);
        outln!("  listen  {}", config.listen);
        outln!("  store   {}", config.store.url);
        let mut topics: Vec<_> = topology.topics.iter().collect();
        topics.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        for (t, handler) in topics {
            outln!(
                "  topic   {} ({}, concurrency {}, {} attempts, timeout {}, handler: {})",
                t.name,
                t.mode.name(),
                t.concurrency,
                t.retry.max_attempts,
                mailroom::duration::format(t.timeout),
                if handler.is_some() {
                    "built-in"
                } else {
                    "pull"
                }
            );
        }
        for s in &config.sources {
            outln!(
                "  source  POST /webhooks/{} -> {}{}",
                s.name,
                s.topic.as_deref().unwrap_or(&s.name),
                s.verify
                    .as_ref()
                    .map(|v| format!(
                        " (verify: {})",
                        v.scheme.as_deref().or(s.preset.as_deref()).unwrap_or("?")
                    ))
                    .unwrap_or_default()
            );
        }
        let a = &topology.alerts;
        let mut rules = Vec::new();
        if let Some(n) = a.dead_letter_depth {
            rules.push(format!("dead_letter_depth > {n}"));
        }
        if let Some(n) = a.backlog {
            rules.push(format!("backlog > {n}"));
        }
        if let Some(r) = a.failure_rate {
            rules.push(format!("failure_rate > {}%", r * 100.0));
        }
        if let Some(d) = a.processing_time {
            rules.push(format!(
                "processing_time > {}",
                mailroom::duration::format(d)
            ));
        }
        if !rules.is_empty() {
            outln!("  alerts  {} (per topic)", rules.join(", "));
        }
        for w in &warnings {
            outln!("warning: {w}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
