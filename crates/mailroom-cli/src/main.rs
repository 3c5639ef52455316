//! The `mailroom` binary (SPEC §8). `serve` runs intake, dispatcher and API;
//! the other verbs work on the same store through the same configuration.

/// `println!` that ends the process quietly when stdout is closed (e.g.
/// `mailroom events list | head`), instead of panicking on a broken pipe.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::stdout_failed(e);
        }
    }};
}

/// `print!` counterpart of [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($arg)*) {
            $crate::stdout_failed(e);
        }
    }};
}

mod commands;
mod logging;
mod progress;
mod table;
mod telemetry;

/// A closed pipe is a normal way for a reader to stop; anything else is reported.
fn stdout_failed(e: std::io::Error) {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
    std::process::exit(0);
}

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

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
    config: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Log format: text or json.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
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
        /// `check`.
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
    Declare,
}

/// `config` verbs.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the configuration and print what it declares.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let export = telemetry::planned(&cli);
    let spans = match export
        .as_ref()
        .map(|e| telemetry::provider(e, runtime.handle().clone()))
    {
        Some(Ok(provider)) => Some(provider),
        Some(Err(e)) => {
            eprintln!("error: [telemetry] otlp_endpoint: {e}");
            return ExitCode::FAILURE;
        }
        None => None,
    };
    logging::init(
        &cli.log_format,
        spans.as_ref().map(|(_, tracer)| tracer.clone()),
    );
    let code = match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // The last batch of spans leaves before the runtime that sends it ends.
    if let Some((provider, _)) = spans {
        if let Err(e) = provider.shutdown() {
            eprintln!("warning: the last spans were not exported: {e}");
        }
    }
    code
}
