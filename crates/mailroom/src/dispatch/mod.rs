//! The dispatcher: one loop per topic that claims due events and runs their
//! attempts.
//!
//! A topic loop never polls on a fixed tick. It claims as many events as it
//! has free slots — a slot is a handler call, given back as soon as the
//! verdict is in, so the next claim overlaps the commit of the last
//! outcomes (`attempt::Slot`) —; when fewer come back, it sleeps until the earliest of: a
//! wake-up (an intake commit or a finished attempt calls
//! [`Notify::notify_one`], which is remembered if nobody is waiting yet), the
//! next due time the store reports, or the polling fallback (`poll`, 1 s by
//! default — it catches writes made by other processes, such as a CLI replay).
//!
//! Single and sequential topics run here, batch topics in [`batch`]; both
//! share the attempt runner (`attempt`), the sleep until the next due time
//! (`idle`) and the outcome telemetry (`telemetry`).

pub(crate) mod attempt;
pub(crate) mod batch;
pub(crate) mod idle;
pub(crate) mod limits;
mod notifications;
pub(crate) mod telemetry;

pub(crate) use notifications::run_notifications;

use crate::handler::SharedHandler;
use crate::topology::TopicSpec;
use attempt::{Slot, release, run_attempt};
use mailroom_core::{ClaimRequest, Claimed, LimitedClaim, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

/// Most events claimed in one store round trip.
const MAX_CLAIM: u32 = 256;
/// The first and the longest pause after a failed claim (doubling between).
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Everything a topic loop needs.
#[derive(Debug)]
pub(crate) struct TopicRuntime {
    pub spec: TopicSpec,
    pub handler: Option<SharedHandler>,
    pub wake: Notify,
    /// The pause a 429 + `Retry-After` asked for (`limits`).
    pub pause: limits::Pause,
}

impl TopicRuntime {
    /// A topic's runtime state, before its first claim.
    pub(crate) fn new(spec: TopicSpec, handler: Option<SharedHandler>) -> Self {
        Self {
            spec,
            handler,
            wake: Notify::new(),
            pause: limits::Pause::default(),
        }
    }
}

impl TopicRuntime {
    fn claim_request(&self, worker: &str, max: u32) -> ClaimRequest {
        self.spec.claim_request(worker, max, self.spec.lease)
    }
}

/// Runs one topic until `shutdown`, then waits for attempts in flight (each
/// is bounded by the topic's timeout, so this ends).
pub(crate) async fn run_topic(
    store: Arc<dyn Store>,
    topic: Arc<TopicRuntime>,
    handler: SharedHandler,
    worker: String,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let attempts = Attempts {
        slots: Arc::new(Semaphore::new(topic.spec.concurrency as usize)),
        recording: Arc::new(Semaphore::new(topic.spec.concurrency as usize)),
        tracker: TaskTracker::new(),
        store: store.clone(),
        topic: topic.clone(),
        handler,
    };
    let mut backoff = BACKOFF_FIRST;
    while !shutdown.is_cancelled() {
        let free = attempts.slots.available_permits() as u32;
        if free == 0 {
            // Full: wait for one attempt to end.
            tokio::select! {
                permit = attempts.slots.clone().acquire_owned() => drop(permit),
                () = shutdown.cancelled() => break,
            }
            // Let the other attempts whose verdicts are in free their slots
            // too (the first one woke this loop), so the claim takes them
            // all at once rather than one event now and the rest next.
            tokio::task::yield_now().await;
            continue;
        }
        let want = free.min(MAX_CLAIM);
        let req = topic.claim_request(&worker, want);
        let (claimed, asked, capped) = match limits::claim(&*store, &topic, &req).await {
            Ok(LimitedClaim::Claimed {
                claimed,
                asked,
                capped,
            }) => (claimed, asked, capped),
            Ok(LimitedClaim::Wait(d)) => {
                backoff = BACKOFF_FIRST;
                if !idle::nap(&topic.wake, d, &shutdown).await {
                    break;
                }
                continue;
            }
            Err(e) => {
                warn!(topic = %topic.spec.name, error = %e, "claim failed; retrying");
                if !idle::sleep(backoff, &shutdown).await {
                    break;
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_FIRST;
        let got = claimed.len() as u32;
        for c in claimed {
            attempts.start(c).await;
        }
        if got == asked {
            continue;
        }
        // Fewer than asked: nothing more is due right now, or max_running
        // is full (ask again soon: other instances' attempts end unseen).
        let until = if capped {
            limits::RUNNING_RECHECK
        } else {
            idle::until_due(&*store, &req, poll, backoff).await
        };
        if !idle::nap(&topic.wake, until, &shutdown).await {
            break;
        }
    }
    attempts.tracker.close();
    attempts.tracker.wait().await;
}

/// The attempts of one topic loop: at most its concurrency of handlers at
/// a time, and as many outcomes being recorded (`attempt::Slot`).
struct Attempts {
    slots: Arc<Semaphore>,
    recording: Arc<Semaphore>,
    tracker: TaskTracker,
    store: Arc<dyn Store>,
    topic: Arc<TopicRuntime>,
    handler: SharedHandler,
}

impl Attempts {
    /// Starts an attempt of `c` in a free slot.
    async fn start(&self, c: Claimed) {
        let Ok(handler_slot) = self.slots.clone().try_acquire_owned() else {
            // Cannot happen (the loop claims at most the free slots); release
            // the lease rather than run over the concurrency bound.
            release(&*self.store, &c, "released: no free slot").await;
            return;
        };
        let slot = Slot {
            handler: handler_slot,
            recording: self.recording.clone(),
        };
        let (store, topic, handler) =
            (self.store.clone(), self.topic.clone(), self.handler.clone());
        self.tracker.spawn(async move {
            run_attempt(&*store, &topic, &*handler, c, slot).await;
        });
    }
}
