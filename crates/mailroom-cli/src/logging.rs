//! The binary's tracing subscriber (libraries only call `tracing` macros).

use tracing_subscriber::field::MakeExt;
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
///
/// Text lines print every field's control characters escaped
/// ([`text_fields`]); JSON lines are escaped by JSON itself.
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
        registry
            .with(fmt.fmt_fields(text_fields()).with_filter(filter))
            .init();
    }
}

/// The text format's fields as `tracing_subscriber`'s default writes them
/// (the message, then `name=value` separated by spaces), with control
/// characters escaped: a value holding a line break (a receiver's error
/// body, a sender's key) cannot forge a log line or drive a terminal.
pub fn text_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let text = mailroom::redact::escape_controls(&text);
        if field.name() == "message" {
            write!(w, "{text}")
        } else {
            write!(w, "{field}={text}")
        }
    })
    .delimited(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lock").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A handler's error body with a line break and a forged record stays
    /// on its own line in the text log, escaped.
    #[test]
    fn a_value_with_a_line_break_cannot_forge_a_log_line() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .fmt_fields(text_fields()),
        );
        let error = "receiver error\nINJECTED LOG LINE level=ERROR \u{1b}[2J";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(event_id = %"e-1", error = %error, "attempt failed; will retry");
        });
        let out = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        assert_eq!(out.lines().count(), 1, "{out:?}");
        assert!(
            out.contains(r"attempt failed; will retry event_id=e-1 error=receiver error\nINJECTED LOG LINE level=ERROR \u{1b}[2J"),
            "{out:?}"
        );
    }
}
