//! Expiry (`expire_after`): the pending events of a topic that
//! waited longer than its `expire_after` become `expired`, every
//! maintenance period. Claims never take them meanwhile (the claim
//! request carries the bound), so the sweep only records what claims
//! already skip; a sequential key held by an expired head moves on.

use crate::dispatch::TopicRuntime;
use crate::metrics as names;
use mailroom_core::Store;
use std::sync::Arc;
use tracing::{info, warn};

/// Events one store call expires at most, so a sweep never holds the store
/// long; a topic with more goes on in the same round.
const CHUNK: u32 = 10_000;

/// Expires what waited too long, every maintenance period.
pub(super) struct ExpirySweep {
    store: Arc<dyn Store>,
    topics: Vec<Arc<TopicRuntime>>,
}

impl ExpirySweep {
    pub(super) fn new(store: Arc<dyn Store>, topics: Vec<Arc<TopicRuntime>>) -> Self {
        let topics = topics
            .into_iter()
            .filter(|t| t.spec.expire_after.is_some())
            .collect();
        Self { store, topics }
    }

    /// One round over the topics with `expire_after`; a topic that expired
    /// anything is woken (its keys may have moved on) and counted.
    pub(super) async fn run_once(&self) {
        for topic in &self.topics {
            let Some(after) = topic.spec.expire_after else {
                continue;
            };
            let mut total = 0;
            loop {
                match self.store.expire(&topic.spec.name, after, CHUNK).await {
                    Ok(n) => {
                        total += n;
                        if n < u64::from(CHUNK) {
                            break;
                        }
                    }
                    Err(e) => {
                        warn!(topic = %topic.spec.name, error = %e, "expiry sweep failed");
                        break;
                    }
                }
            }
            if total > 0 {
                metrics::counter!(names::EVENTS_EXPIRED, "topic" => topic.spec.name.clone())
                    .increment(total);
                info!(topic = %topic.spec.name, expired = total, "pending events expired (expire_after)");
                topic.wake.notify_one();
            }
        }
    }
}
