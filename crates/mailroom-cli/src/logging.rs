//! The binary's tracing subscriber (libraries only call `tracing` macros).

use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
use tracing_subscriber::prelude::*;

/// Installs the tracing subscriber: text (default) or JSON lines to stderr,
/// level from `RUST_LOG`, default `info`; and, with `otel` (`[telemetry]`,
/// [`crate::telemetry`]), the export of mailroom's own info spans. Two of
/// lapin's own logs are left out, since mailroom reports the same event
/// once in its words: the warning with a whole message dump for each
/// returned publish (the attempt fails with "unroutable: exchange ..,
/// routing key .."), and the error for each channel the broker closes (the
/// declare, publish or consumer that caused it fails naming the queue or
/// exchange). `RUST_LOG=info,lapin=debug` shows them.
pub fn init(format: &str, otel: Option<opentelemetry_sdk::trace::Tracer>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,sqlx=warn,lapin::returned_messages=error,lapin::channel=off")
    });
    let spans = otel.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(Targets::new().with_target("mailroom", LevelFilter::INFO))
    });
    let registry = tracing_subscriber::registry().with(spans);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    if format == "json" {
        let json = fmt.json().flatten_event(true).with_current_span(true);
        registry.with(json.with_filter(filter)).init();
    } else {
        registry.with(fmt.with_filter(filter)).init();
    }
}
