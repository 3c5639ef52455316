//! Lease rescue: events whose attempt lost its lease (a crashed or stalled
//! worker) go back to pending, and their topics' loops are woken.

use crate::dispatch::TopicRuntime;
use mailroom_core::Store;
use std::sync::Arc;
use tracing::warn;

/// Rescues expired leases, every maintenance period.
pub(super) struct LeaseRescue {
    store: Arc<dyn Store>,
    topics: Vec<Arc<TopicRuntime>>,
}

impl LeaseRescue {
    pub(super) fn new(store: Arc<dyn Store>, topics: Vec<Arc<TopicRuntime>>) -> Self {
        Self { store, topics }
    }

    /// One round: rescue, and wake every topic if anything came back.
    pub(super) async fn run_once(&self) {
        match self.store.rescue_expired().await {
            Ok(0) => {}
            Ok(n) => {
                warn!(
                    rescued = n,
                    "expired leases rescued; their events will be retried"
                );
                for t in &self.topics {
                    t.wake.notify_one();
                }
            }
            Err(e) => warn!(error = %e, "lease rescue failed"),
        }
    }
}
