//! The dispatcher: one loop per topic that claims due events and runs their
//! attempts.
//!
//! A topic loop never polls on a fixed tick. It claims as many events as it
//! has free slots (a slot is a handler call); when fewer come back, it
//! sleeps until the earliest of: a wake-up (an intake commit or a finished
//! attempt calls [`Notify::notify_one`], which is remembered if nobody is
//! waiting yet), the next due time the store reports, or the polling
//! fallback (`poll`, 1 s by default — it catches writes made by other
//! processes, such as a CLI replay).
//!
//! An attempt's outcome is recorded in one of two ways (`attempt::Record`).
//! With a store that shares commits ([`Store::shares_commits`], SQLite),
//! the attempt hands it to its loop with its slot, and the loop records
//! every outcome handed over with its next claim, in one commit
//! ([`Store::complete_and_claim`]), as a hand-made relay marks a group
//! done and takes the next in one transaction. Otherwise the attempt
//! records it on its own and gives its slot back as soon as the verdict is
//! in (`attempt::Slot`), so the loop's next claim overlaps that commit.
//!
//! Single and sequential topics run here, batch topics in [`batch`]; both
//! share the attempt runner (`attempt`), the sleep until the next due time
//! (`idle`) and the outcome telemetry (`telemetry`).

mod ahead;
pub(crate) mod attempt;
pub(crate) mod batch;
pub(crate) mod idle;
mod notifications;
pub(crate) mod telemetry;
pub(crate) mod throttle;

pub(crate) use notifications::run_notifications;

use crate::handler::SharedHandler;
use crate::spec::TopicSpec;
use attempt::{Finished, Record, Slot, release, run_attempt};
use mailroom_core::{
    ClaimRequest, Claimed, Completion, EventId, FencingToken, LimitedClaim, Store,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

/// Most events claimed in one store round trip (but see
/// `ahead::AHEAD_CLAIM_MAX`).
const MAX_CLAIM: u32 = 256;
/// The error recorded for an event claimed ahead and given back at shutdown.
const SHUTTING_DOWN: &str = "released: shutting down before a slot was free";
/// How many handler slots' worth of outcomes a topic may have waiting for
/// their commit (`attempt::Slot`). At 1, a fast topic's attempts waited
/// for a place about as long as the store took to commit a group, holding
/// their handler slots meanwhile, and the topic ran at the pace of its
/// outcome commits rather than its claims: measured on PostgreSQL
/// (`drain --modes single`, alternating rounds), 4 drained 1.16–1.31× as
/// many events per second, with a quarter fewer commits (larger groups).
const RECORDING_ROUNDS: usize = 4;
/// The first and the longest pause after a failed claim (doubling between).
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Everything a topic loop needs.
#[derive(Debug)]
pub(crate) struct TopicRuntime {
    pub spec: TopicSpec,
    pub handler: Option<SharedHandler>,
    pub wake: Notify,
    /// The pause a 429 + `Retry-After` asked for (`throttle`).
    pub pause: throttle::Pause,
    /// Deaths noticed, for the dead-letter relay (`crate::dead_letter`).
    pub(crate) deaths: crate::dead_letter::Deaths,
}

impl TopicRuntime {
    /// A topic's runtime state, before its first claim.
    pub(crate) fn new(spec: TopicSpec, handler: Option<SharedHandler>) -> Self {
        Self {
            spec,
            handler,
            wake: Notify::new(),
            pause: throttle::Pause::default(),
            deaths: crate::dead_letter::Deaths::default(),
        }
    }
}

impl TopicRuntime {
    fn claim_request(&self, worker: &str, max: u32) -> ClaimRequest {
        self.spec.claim_request(worker, max, self.spec.lease)
    }
}

/// Runs one topic until `shutdown`, then waits for attempts in flight (each
/// is bounded by the topic's timeout, so this ends) and records their
/// outcomes.
pub(crate) async fn run_topic(
    store: Arc<dyn Store>,
    topic: Arc<TopicRuntime>,
    handler: SharedHandler,
    worker: String,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let (to_loop, finished) = mpsc::unbounded_channel();
    // Without sharing, no sender is kept: `finished` is closed from the start.
    let record = if store.shares_commits() {
        Record::WithClaim(to_loop)
    } else {
        drop(to_loop);
        Record::Alone
    };
    let attempts = Attempts {
        slots: Arc::new(Semaphore::new(topic.spec.concurrency as usize)),
        recording: Arc::new(Semaphore::new(
            RECORDING_ROUNDS * topic.spec.concurrency as usize,
        )),
        tracker: TaskTracker::new(),
        store: store.clone(),
        topic: topic.clone(),
        handler,
        record,
    };
    let ahead = ahead::Ahead::for_topic(&topic.spec, store.shares_commits());
    let mut topic_loop = TopicLoop {
        ahead,
        store,
        topic,
        worker,
        poll,
        shutdown,
        attempts,
        finished,
        done: Vec::new(),
        backoff: BACKOFF_FIRST,
    };
    while !topic_loop.shutdown.is_cancelled() && topic_loop.round().await {}
    topic_loop.finish().await;
}

/// A topic loop's state between claims.
struct TopicLoop {
    store: Arc<dyn Store>,
    topic: Arc<TopicRuntime>,
    worker: String,
    poll: Duration,
    shutdown: CancellationToken,
    attempts: Attempts,
    /// Outcomes handed over by attempts (`Record::WithClaim`).
    finished: mpsc::UnboundedReceiver<Finished>,
    /// Outcomes taken from `finished`, to be recorded with the next claim.
    done: Vec<Finished>,
    backoff: Duration,
    /// How many events to claim beyond the free slots (`ahead`).
    ahead: ahead::Ahead,
}

impl TopicLoop {
    /// One claim into the free slots, recording the outcomes handed over
    /// since the last one, then a wait if it came back short. `false` once
    /// `shutdown` is seen.
    async fn round(&mut self) -> bool {
        self.take_finished();
        // The slots of the outcomes taken are free once they are recorded,
        // in the claim's own commit.
        let free = (self.attempts.slots.available_permits() + self.done.len()) as u32;
        if free == 0 {
            // Full: wait for one attempt to end.
            tokio::select! {
                permit = self.attempts.slots.clone().acquire_owned() => drop(permit),
                Some(f) = self.finished.recv() => self.done.push(f),
                () = self.shutdown.cancelled() => return false,
            }
            // Let the other attempts whose verdicts are in free their slots
            // too (the first one woke this loop), so the claim takes them
            // all at once rather than one event now and the rest next.
            tokio::task::yield_now().await;
            return true;
        }
        let want = (free + self.ahead.extra(Instant::now())).min(self.ahead.claim_max());
        let req = self.topic.claim_request(&self.worker, want);
        let (claimed, asked, capped) = match self.claim(&req).await {
            Ok(LimitedClaim::Claimed {
                claimed,
                asked,
                capped,
            }) => (claimed, asked, capped),
            Ok(LimitedClaim::Wait(d)) => {
                self.backoff = BACKOFF_FIRST;
                return self.nap(d).await;
            }
            Err(e) => {
                warn!(topic = %self.topic.spec.name, error = %e, "claim failed; retrying");
                let backoff = self.backoff;
                self.backoff = (backoff * 2).min(BACKOFF_MAX);
                return self.nap(backoff).await;
            }
        };
        self.backoff = BACKOFF_FIRST;
        let got = claimed.len() as u32;
        let claimed_at = Instant::now();
        self.ahead.started(got, claimed_at);
        let mut claimed = claimed.into_iter();
        for c in claimed.by_ref() {
            if !self.attempts.start(c, claimed_at, &self.shutdown).await {
                break;
            }
        }
        // Shutting down with events claimed ahead still waiting for a
        // slot: give them back (each counts as an attempt, as a lease
        // released early does) rather than leave them to their leases.
        for c in claimed {
            release(&*self.store, &c, SHUTTING_DOWN).await;
        }
        if got == asked {
            return true;
        }
        // Fewer than asked: nothing more is due right now, or max_running
        // is full (ask again soon: other instances' attempts end unseen).
        let until = if capped {
            throttle::RUNNING_RECHECK
        } else {
            // A wake-up (an event just committed) while the next due time
            // is read claims at once: the read is a store round trip, and
            // under a steady load an event arrives during it often enough
            // to be most of the pickup latency's tail.
            tokio::select! {
                until = idle::until_due(&*self.store, &req, self.poll, self.backoff) => until,
                () = self.topic.wake.notified() => return true,
            }
        };
        self.nap(until).await
    }

    /// Claims `req`, recording the outcomes taken so far in the same
    /// commit; their slots are given back once they are.
    async fn claim(&mut self, req: &ClaimRequest) -> mailroom_core::Result<LimitedClaim> {
        let done = std::mem::take(&mut self.done);
        let (results, claim) =
            throttle::claim_recording(&*self.store, &self.topic, req, items(&done)).await;
        for (f, result) in done.into_iter().zip(results) {
            attempt::recorded(f.id, result);
            drop(f.slot);
        }
        claim
    }

    /// Sleeps for `d` or until a wake-up or an outcome handed over.
    /// `false` if `shutdown` came first.
    async fn nap(&mut self, d: Duration) -> bool {
        tokio::select! {
            Some(f) = self.finished.recv() => {
                self.done.push(f);
                true
            }
            awake = idle::nap(&self.topic.wake, d, &self.shutdown) => awake,
        }
    }

    /// Moves the outcomes handed over so far into `done`.
    fn take_finished(&mut self) {
        while let Ok(f) = self.finished.try_recv() {
            self.done.push(f);
        }
    }

    /// After `shutdown`: records the outcomes of the attempts still in
    /// flight as they end (no more claims), then waits for the last.
    async fn finish(mut self) {
        let Attempts {
            tracker, record, ..
        } = self.attempts;
        tracker.close();
        // The attempts hold the other senders: `recv` ends after the last.
        drop(record);
        let mut done = self.done;
        loop {
            while let Ok(f) = self.finished.try_recv() {
                done.push(f);
            }
            if !done.is_empty() {
                let items = items(&done);
                for (f, result) in done.drain(..).zip(self.store.complete_many(items).await) {
                    attempt::recorded(f.id, result);
                    drop(f.slot);
                }
            }
            match self.finished.recv().await {
                Some(f) => done.push(f),
                None => break,
            }
        }
        tracker.wait().await;
    }
}

/// What the store records of `done`.
fn items(done: &[Finished]) -> Vec<(EventId, FencingToken, Completion)> {
    done.iter()
        .map(|f| (f.id, f.token, f.completion.clone()))
        .collect()
}

/// The attempts of one topic loop: at most its concurrency of handlers at
/// a time, and [`RECORDING_ROUNDS`] times as many outcomes being recorded
/// (`attempt::Slot`).
struct Attempts {
    slots: Arc<Semaphore>,
    recording: Arc<Semaphore>,
    tracker: TaskTracker,
    store: Arc<dyn Store>,
    topic: Arc<TopicRuntime>,
    handler: SharedHandler,
    record: Record,
}

impl Attempts {
    /// Starts an attempt of `c`, claimed at `claimed_at`, in a free slot,
    /// waiting for one if `c` was claimed ahead (`ahead`). `false` if
    /// `shutdown` came first (`c` was given back).
    async fn start(&self, c: Claimed, claimed_at: Instant, shutdown: &CancellationToken) -> bool {
        let handler_slot = match self.slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let slot = tokio::select! {
                    slot = self.slots.clone().acquire_owned() => slot,
                    () = shutdown.cancelled() => {
                        release(&*self.store, &c, SHUTTING_DOWN).await;
                        return false;
                    }
                };
                let Ok(slot) = slot else { return false };
                if !self.lease_covers_attempt(&c, claimed_at).await {
                    return true;
                }
                slot
            }
        };
        let slot = Slot {
            handler: handler_slot,
            recording: self.recording.clone(),
        };
        let (store, topic, handler, record) = (
            self.store.clone(),
            self.topic.clone(),
            self.handler.clone(),
            self.record.clone(),
        );
        self.tracker.spawn(async move {
            run_attempt(&*store, &topic, &*handler, c, slot, record).await;
        });
        true
    }

    /// Whether `c`, claimed ahead at `claimed_at` and now holding a slot,
    /// has the lease its attempt needs: extended first if it waited so long
    /// that what is left no longer covers the timeout. `false` when the
    /// lease was lost meanwhile (the event is someone else's now).
    async fn lease_covers_attempt(&self, c: &Claimed, claimed_at: Instant) -> bool {
        let spec = &self.topic.spec;
        if !ahead::lease_too_short(claimed_at, Instant::now(), spec.lease, spec.timeout) {
            return true;
        }
        match self.store.extend(c.event.id, c.token, spec.lease).await {
            Ok(_) => true,
            Err(e) => {
                warn!(topic = %spec.name, event = %c.event.id, error = %e, "an event claimed ahead lost its lease while waiting for a slot; not started");
                false
            }
        }
    }
}
