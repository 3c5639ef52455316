//! Outcome telemetry, the same for every mode and for pull workers' verdicts:
//! each ended attempt is counted, timed and logged (inside the attempt's
//! span when there is one). Error text comes from receivers and programs,
//! so it is logged with its control characters escaped: a line break in a
//! receiver's answer cannot forge a log line, whatever the subscriber.

use crate::metrics as names;
use mailroom_core::redact::escape_controls;
use mailroom_core::{Completion, Event};
use std::time::Duration;
use tracing::{debug, error, warn};

/// Counts, times and logs an attempt's outcome. `elapsed` is `None` for a
/// pull worker's verdict: its handler ran outside the process, so only the
/// worker knows how long it took.
pub(crate) fn record_outcome(event: &Event, completion: &Completion, elapsed: Option<Duration>) {
    let label = match completion {
        Completion::Done => "done",
        Completion::Retry { .. } => "retry",
        Completion::Dead { .. } => "dead",
    };
    metrics::counter!(names::EVENTS_PROCESSED, "topic" => event.topic.clone(), "outcome" => label)
        .increment(1);
    if let Some(elapsed) = elapsed {
        metrics::histogram!(names::PROCESSING_DURATION, "topic" => event.topic.clone())
            .record(elapsed.as_secs_f64());
    }
    match completion {
        Completion::Done => {
            debug!(event_id = %event.id, elapsed_ms = elapsed.map(|e| e.as_millis() as u64), "done")
        }
        Completion::Retry { delay, error } => {
            warn!(event_id = %event.id, topic = %event.topic, error = %escape_controls(error), retry_in_ms = delay.as_millis() as u64, "attempt failed; will retry");
        }
        Completion::Dead { error } => {
            error!(event_id = %event.id, topic = %event.topic, error = %escape_controls(error), "event is dead: operator action needed (replay or skip)");
        }
    }
}
