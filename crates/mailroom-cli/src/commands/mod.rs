//! What each verb does, one file per verb (or verb group), like mini-redis's
//! `cmd/`. This module only dispatches and holds what every verb shares:
//! loading the configuration and opening the store through an engine.
//! Errors carry context (`anyhow`); the library crates stay typed.

mod amqp;
mod cancel;
mod config;
mod events;
mod migrate;
mod purge;
mod replay;
mod serve;
mod skip;
mod status;

use crate::{Cli, Command, Filter};
use anyhow::{Context, Result};
use mailroom::operate::ListFilter;
use mailroom::{Engine, SchemaFit, Status, Store};
use mailroom_config::file::MigrateMode;
use mailroom_config::{Config, Specs};
use std::process::ExitCode;
use std::sync::Arc;

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<ExitCode> {
    let json = cli.json;
    match &cli.command {
        Command::Serve { listen } => serve::run(&cli, listen.as_deref()).await?,
        Command::Migrate { print_grants } => {
            migrate::run(&cli, print_grants.as_deref(), json).await?
        }
        Command::Status => status::run(&cli, json).await?,
        Command::Events { command } => events::run(&cli, command, json).await?,
        Command::Replay { id, filter } => replay::run(&cli, id.as_deref(), filter, json).await?,
        Command::Skip { id } => skip::run(&cli, id, json).await?,
        Command::Cancel {
            id,
            topic,
            key,
            dry_run,
            yes,
        } => {
            let how = cancel::Bulk {
                topic: topic.clone(),
                key: key.clone(),
                dry_run: *dry_run,
                yes: *yes,
            };
            cancel::run(&cli, id.as_deref(), how, json).await?
        }
        Command::Purge { older_than } => purge::run(&cli, older_than, json).await?,
        Command::Config { command } => config::run(&cli, command, json)?,
        Command::Amqp { command } => amqp::run(&cli, command, json).await?,
    }
    Ok(ExitCode::SUCCESS)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The configuration from `--config`, `$MAILROOM_CONFIG`, `./mailroom.toml`
/// or the built-in defaults, with `MAILROOM_*` overrides.
pub(crate) fn load_config(cli: &Cli) -> Result<Config> {
    let path = mailroom_config::locate(cli.config.clone(), &env);
    Ok(Config::load(path.as_deref(), &env)?)
}

/// Opens the configured store as `[store] migrate` says: `auto` applies
/// pending migrations, `never` only checks that this build can run against
/// the schema (no DDL) and refuses an older one, naming `mailroom migrate`.
async fn open(config: &Config) -> Result<Arc<dyn Store>> {
    let store = connect(config).await?;
    let url = mailroom::redact::url(&config.store.url);
    let schema = match config.store.migrate {
        MigrateMode::Auto => {
            store
                .migrate()
                .await
                .with_context(|| format!("cannot migrate the store {url}"))?
                .schema
        }
        MigrateMode::Never => {
            let schema = store
                .schema()
                .await
                .with_context(|| format!("cannot read the schema version of the store {url}"))?;
            schema.require_runnable().with_context(|| {
                format!("the store {url} ([store] migrate = \"never\" applies no migrations)")
            })?;
            schema
        }
    };
    if schema.fit() == SchemaFit::NewerCompatible {
        tracing::info!(
            database = schema.database,
            build = schema.build,
            compatible_from = schema.compatible_from,
            "{}",
            schema.explain()
        );
    }
    Ok(store)
}

/// Opens the configured store without touching its schema.
async fn connect(config: &Config) -> Result<Arc<dyn Store>> {
    mailroom::open_store_with(
        &config.store.url,
        config.store.direct_url.as_deref(),
        config.store.group_commit,
    )
    .await
    .with_context(|| {
        format!(
            "cannot open the store {}",
            mailroom::redact::url(&config.store.url)
        )
    })
}

/// An engine that is never run: every verb but `serve` reaches the store
/// through it, so replays get their topic's budget and reads share its rules.
async fn offline_engine(config: &Config) -> Result<Engine> {
    let store = open(config).await?;
    Ok(Specs::from_config(config)?.into_builder(store).build()?)
}

/// What the verbs do with a parsed [`Filter`].
pub(crate) trait FilterExt {
    /// No `--topic`, `--status` or `--key`.
    fn is_empty(&self) -> bool;
    /// The store's filter, with `default_status` where `--status` is not given.
    fn to_list_filter(&self, default_status: Option<Status>) -> Result<ListFilter>;
}

impl FilterExt for Filter {
    fn is_empty(&self) -> bool {
        self.topic.is_none() && self.status.is_none() && self.key.is_none()
    }

    fn to_list_filter(&self, default_status: Option<Status>) -> Result<ListFilter> {
        let status = self.status.as_deref().map(str::parse::<Status>).transpose();
        Ok(ListFilter {
            topic: self.topic.clone(),
            status: status.map_err(anyhow::Error::msg)?.or(default_status),
            key: self.key.clone(),
            ..ListFilter::default()
        })
    }
}
