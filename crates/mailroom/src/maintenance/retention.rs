//! Retention: dropping old payloads and deleting rows past the dedup
//! window, once an hour on the elected instance.

use mailroom_core::{Retention, Store};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// How often retention is applied.
const EVERY: Duration = Duration::from_secs(3600);

/// Applies retention at most once per [`EVERY`] (and at once on taking
/// over maintenance).
pub(super) struct RetentionRun {
    store: Arc<dyn Store>,
    retention: Retention,
    last: Option<Instant>,
}

impl RetentionRun {
    pub(super) fn new(store: Arc<dyn Store>, retention: Retention) -> Self {
        Self {
            store,
            retention,
            last: None,
        }
    }

    /// Applies retention if its time has come.
    pub(super) async fn run_if_due(&mut self) {
        if self.last.is_some_and(|t| t.elapsed() <= EVERY) {
            return;
        }
        match self.store.purge(self.retention).await {
            Ok(r) if r.payloads_dropped + r.rows_deleted > 0 => {
                info!(
                    payloads_dropped = r.payloads_dropped,
                    rows_deleted = r.rows_deleted,
                    "retention applied"
                );
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "retention failed"),
        }
        self.last = Some(Instant::now());
    }
}
