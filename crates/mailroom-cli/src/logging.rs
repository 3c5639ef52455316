//! The binary's tracing subscriber (libraries only call `tracing` macros).

/// Installs the tracing subscriber: text (default) or JSON lines; level from
/// `RUST_LOG`, default `info`. lapin's own warning for each message the
/// broker returns (a whole message dump per unroutable publish) is left
/// out: the attempt's failure already says "unroutable: exchange .., routing key ..".
pub fn init(format: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,lapin::returned_messages=error"));
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
