//! The `mailroom` command line's grammar: every verb and flag, with its
//! help text, as clap parses it. The binary (`src/main.rs`) runs what this
//! parses; [`command`] hands the same definition to anything that needs it
//! without running a verb (the command-line reference, tests that check a
//! documented command line parses).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Reliable event intake and processing: the transactional inbox and outbox.
#[derive(Debug, Parser)]
#[command(
    name = "mailroom",
    version,
    about = "Reliable event intake and processing: the transactional inbox and outbox.",
    propagate_version = true
)]
pub struct Cli {
    /// Configuration file (default: $MAILROOM_CONFIG, else ./mailroom.toml if present, else built-in defaults).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// Log format: text or json.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// The verb.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run intake, dispatcher and HTTP API (applies pending migrations first, unless `[store] migrate = "never"`).
    Serve {
        /// Listen address (overrides `listen`, and $MAILROOM_LISTEN).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Per-topic counts, oldest pending age, blocked keys, and the alerts firing.
    Status,
    /// List or show events.
    Events {
        /// `list` or `show`.
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Send events back to pending with a fresh attempt budget: one by id, or all matching a filter (dead events unless --status says otherwise).
    Replay {
        /// Event id (omit to replay by filter).
        id: Option<String>,
        /// Which events.
        #[command(flatten)]
        filter: Filter,
    },
    /// Withdraw pending events (they become cancelled): one by id, or every pending one matching --topic/--key, after showing how many.
    Cancel {
        /// Event id (omit to cancel by filter).
        id: Option<String>,
        /// Only this topic's pending events.
        #[arg(long)]
        topic: Option<String>,
        /// Only this key's pending events.
        #[arg(long)]
        key: Option<String>,
        /// Only show how many pending events match.
        #[arg(long)]
        dry_run: bool,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long, short)]
        yes: bool,
    },
    /// Mark a dead event skipped so its key unblocks.
    Skip {
        /// Event id.
        id: String,
    },
    /// Drop payloads of finished events older than a duration, and rows past the dedup window.
    Purge {
        /// e.g. 7d.
        #[arg(long, value_name = "DURATION")]
        older_than: String,
    },
    /// Apply pending schema migrations (from version X to Y, or "up to date"), then exit; what `[store] migrate = "never"` leaves to a deploy job.
    Migrate {
        /// Print the PostgreSQL GRANT statements that let ROLE run every other verb (serve included) under `[store] migrate = "never"`, and exit without connecting.
        #[arg(long, value_name = "ROLE")]
        print_grants: Option<String>,
    },
    /// RabbitMQ tools.
    Amqp {
        /// `declare`.
        #[command(subcommand)]
        command: AmqpCommand,
    },
    /// Configuration tools.
    Config {
        /// `check` or `schema`.
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

/// `--topic`, `--status`, `--key`: which events `events list` shows and a
/// bulk `replay` takes.
#[derive(Debug, Clone, Args)]
pub struct Filter {
    /// Only this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only this status (pending, running, done, dead, skipped, cancelled).
    #[arg(long)]
    pub status: Option<String>,
    /// Only this key.
    #[arg(long)]
    pub key: Option<String>,
}

/// `events` verbs.
#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Newest first.
    List {
        /// Which events.
        #[command(flatten)]
        filter: Filter,
        /// Page size (max 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue from a previous page's next cursor.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One event with its attempt history.
    Show {
        /// Event id.
        id: String,
    },
}

/// `amqp` verbs.
#[derive(Debug, Subcommand)]
pub enum AmqpCommand {
    /// Declare the [amqp] exchanges, queues and bindings on the broker and print what exists.
    // `[amqp]` is the config table as `--help` shows it, not a doc link.
    #[allow(rustdoc::broken_intra_doc_links)]
    Declare,
}

/// `config` verbs.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the configuration and print what it declares.
    Check,
    /// Print the JSON Schema (draft 2020-12) of the configuration file, for editors (taplo's `#:schema`) and checks; reads no configuration.
    Schema,
}

/// The whole command line, as `mailroom --help` describes it.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}
