//! The pull workers' door ([`Engine::pull`](crate::Engine::pull)):
//! processes outside this one claim events of a topic without a built-in
//! handler and answer each claim with a verdict. Their claims get the
//! topic's lease and ordering, their verdicts the topic's retry policy and
//! the processing metrics, exactly as the engine's own attempts do. The
//! types a claim and its verdict are made of are here too.

use crate::dispatch::attempt::resolve;
use crate::dispatch::telemetry::record_outcome;
use crate::shared::Shared;
use mailroom_core::{EventId, LimitedClaim, Outcome, StoreError, Timestamp};
use std::sync::Arc;
use std::time::Duration;

pub use mailroom_core::{Claimed, Completion, FencingToken};

/// Why a pull claim was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The topic has a built-in handler: its events are the engine's to run.
    #[error("topic {0:?} has a built-in handler; only pull topics can be claimed")]
    NotPullTopic(String),
    /// The store could not be read or written; the claim took nothing.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What pull workers do with one engine: claim, extend, finish. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Pull {
    shared: Arc<Shared>,
}

impl Pull {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// Claims up to `max` due events of the pull topic `topic` for `worker`,
    /// each under a lease of `lease` (default: the topic's) and a fresh
    /// fencing token. Sequential topics hand out only the head of each key.
    pub async fn claim(
        &self,
        topic: &str,
        max: u32,
        lease: Option<Duration>,
        worker: &str,
    ) -> Result<Vec<Claimed>, ClaimError> {
        if self.shared.has_handler(topic) {
            return Err(ClaimError::NotPullTopic(topic.to_string()));
        }
        let spec = self.shared.spec_or_default(topic);
        let req = spec.claim_request(worker, max, lease.unwrap_or(spec.lease));
        // Declared topics' claims meet their limits (rate, max_running,
        // a pause); a limit that allows nothing now answers an empty claim.
        let Some(rt) = self.shared.topics.get(topic) else {
            return Ok(self.shared.store.claim(&req).await?);
        };
        match crate::dispatch::throttle::claim(&*self.shared.store, rt, &req).await? {
            LimitedClaim::Claimed { claimed, .. } => Ok(claimed),
            LimitedClaim::Wait(_) => Ok(Vec::new()),
        }
    }

    /// Pushes the end of a claim's lease to now + `lease` (default: the
    /// event's topic's lease), if `token` is still current. Returns the new end.
    pub async fn extend(
        &self,
        id: EventId,
        token: FencingToken,
        lease: Option<Duration>,
    ) -> Result<Timestamp, StoreError> {
        let lease = match lease {
            Some(lease) => lease,
            None => {
                let event = self
                    .shared
                    .store
                    .get(id)
                    .await?
                    .ok_or(StoreError::NotFound)?;
                self.shared.spec_or_default(&event.topic).lease
            }
        };
        self.shared.store.extend(id, token, lease).await
    }

    /// Records a pull worker's verdict on its claim (`ack` / `nack`): the
    /// outcome is resolved by the topic's retry policy exactly as for built-in
    /// handlers, stored only if `token` is still the current one, and then
    /// counted in `mailroom_events_processed_total`.
    pub async fn finish(
        &self,
        id: EventId,
        token: FencingToken,
        outcome: Outcome,
    ) -> Result<Completion, StoreError> {
        let event = self
            .shared
            .store
            .get(id)
            .await?
            .ok_or(StoreError::NotFound)?;
        let spec = self.shared.spec_or_default(&event.topic);
        // The claim's attempt number is its token.
        let completion = resolve(outcome, token.0, event.max_attempts, &spec.retry);
        self.shared
            .store
            .complete(id, token, completion.clone())
            .await?;
        record_outcome(&event, &completion, None);
        if let (Completion::Dead { .. }, Some(rt)) =
            (&completion, self.shared.topics.get(&event.topic))
        {
            // The claim's attempt number is its token.
            rt.died(event.id, token.0);
        }
        self.shared.wake(&event.topic);
        Ok(completion)
    }
}
