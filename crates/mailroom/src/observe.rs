//! Gauges read from the store (queue depth, dead letters, oldest pending,
//! blocked keys), refreshed periodically. Counters and histograms are
//! recorded where things happen (intake, dispatcher). Labels are bounded:
//! topic and status only, never event ids. This crate only calls the
//! `metrics` macros, with the names of [`crate::metrics`]; the binary
//! installs the exporter.

use crate::metrics as names;
use crate::shared::Shared;
use mailroom_core::Status;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often gauges are refreshed.
const PERIOD: Duration = Duration::from_secs(5);

pub(crate) async fn run_gauges(shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        // Counting a large store can be slow: shutdown does not wait.
        let stats = tokio::select! {
            stats = shared.stats() => stats,
            () = shutdown.cancelled() => break,
        };
        if let Ok(stats) = stats {
            let now = jiff::Timestamp::now();
            for s in stats {
                for status in Status::ALL {
                    metrics::gauge!(names::QUEUE_DEPTH, "topic" => s.topic.clone(), "status" => status.as_str())
                        .set(s.count(status) as f64);
                }
                metrics::gauge!(names::DEAD_LETTER_DEPTH, "topic" => s.topic.clone())
                    .set(s.count(Status::Dead) as f64);
                let age = s.oldest_pending_age(now).map_or(0.0, |d| d.as_secs_f64());
                metrics::gauge!(names::OLDEST_PENDING_AGE, "topic" => s.topic.clone()).set(age);
                metrics::gauge!(names::BLOCKED_KEYS, "topic" => s.topic.clone())
                    .set(s.blocked_keys as f64);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(PERIOD) => {}
            () = shutdown.cancelled() => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stalled::Stalled;

    /// Shutdown while the store is still counting: the gauges stop at once.
    #[tokio::test]
    async fn shutdown_does_not_wait_for_slow_statistics() {
        let shared = Arc::new(Shared::bare(Arc::new(Stalled)));
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(run_gauges(shared, shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!running.is_finished(), "the count cannot have ended");
        shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(2), running).await;
        assert!(
            stopped.is_ok(),
            "the gauges still running 2 s after shutdown"
        );
    }
}
