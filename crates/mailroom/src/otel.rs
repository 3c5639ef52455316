//! Spans as OpenTelemetry sees them. mailroom's spans
//! are `tracing` spans (`intake`, `attempt`, `handler call`); when the
//! binary installs an OTLP exporter (`[telemetry] otlp_endpoint`), each is
//! exported, and these helpers tie them to the event's W3C trace:
//! [`adopt`] makes a span a child of the `traceparent` an event carries,
//! and [`traceparent_of`] is the span's own `traceparent`, the one sent on
//! to a handler so that its spans nest under mailroom's. Without an
//! exporter both do nothing, and `traceparent` handling stays as in
//! [`crate::handler::outgoing_traceparent`].

use mailroom_core::TraceParent;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Makes `span` a child of `traceparent` (stored with an event, or received
/// with it). A missing or malformed value leaves the span a root.
pub fn adopt(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(parent) = traceparent.and_then(TraceParent::parse) else {
        return;
    };
    let (Ok(trace), Ok(id)) = (
        TraceId::from_hex(parent.trace_id()),
        SpanId::from_hex(parent.parent_id()),
    ) else {
        return;
    };
    let remote = SpanContext::new(
        trace,
        id,
        TraceFlags::new(parent.flags()),
        true,
        TraceState::default(),
    );
    // Fails only when no exporter layer is installed: nothing to tie.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

/// `span`'s own `traceparent` when it is exported (`None` without an
/// exporter, where spans have no OpenTelemetry identity).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let own = context.span().span_context().clone();
    own.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            own.trace_id(),
            own.span_id(),
            own.trace_flags().to_u8()
        )
    })
}
