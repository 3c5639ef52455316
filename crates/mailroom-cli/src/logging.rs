//! The binary's tracing subscriber (libraries only call `tracing` macros).

/// Installs the tracing subscriber: text (default) or JSON lines; level from
/// `RUST_LOG`, default `info`. Two of lapin's own logs are left out, since
/// mailroom reports the same event once in its words: the warning with a
/// whole message dump for each returned publish (the attempt fails with
/// "unroutable: exchange .., routing key .."), and the error for each
/// channel the broker closes (the declare, publish or consumer that caused
/// it fails naming the queue or exchange). `RUST_LOG=info,lapin=debug` shows them.
pub fn init(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,sqlx=warn,lapin::returned_messages=error,lapin::channel=off")
    });
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
