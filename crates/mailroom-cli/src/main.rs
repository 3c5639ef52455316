//! The `mailroom` binary. `serve` runs intake, dispatcher and API;
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

use clap::Parser;
use mailroom_cli::{AmqpCommand, Cli, Command, ConfigCommand, EventsCommand, Filter};
use std::process::ExitCode;

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
