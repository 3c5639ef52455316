//! [`CountingStore`], a pass-through [`Store`] that counts the data path's
//! calls (claims and their sizes, completions, due-time queries) so a slow
//! figure can be explained without touching the engine.

use mailroom::hooks::NewEvent;
use mailroom::operate::{ListFilter, Page, PurgeReport, TopicStats};
use mailroom::pull::{Claimed, Completion, FencingToken};
use mailroom::store::{ClaimLimits, ClaimRequest, LimitedClaim, TopicStream};
use mailroom::{Event, EventId, Inserted, Retention, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Data-path call counters of [`CountingStore`].
#[derive(Debug, Default)]
pub struct Calls {
    pub claims: AtomicU64,
    /// Time spent in claim calls (queueing included), µs, and the longest.
    pub claim_micros: AtomicU64,
    pub claim_max_micros: AtomicU64,
    pub empty_claims: AtomicU64,
    pub claimed: AtomicU64,
    pub asked: AtomicU64,
    pub completes: AtomicU64,
    pub complete_many: AtomicU64,
    pub next_due: AtomicU64,
    pub inserts: AtomicU64,
    pub errors: AtomicU64,
}

/// A snapshot of [`Calls`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CallCounts {
    pub claims: u64,
    pub claim_micros: u64,
    /// The longest claim since the counters started (not windowed).
    pub claim_max_micros: u64,
    pub empty_claims: u64,
    pub claimed: u64,
    pub asked: u64,
    pub completes: u64,
    /// `complete_many` calls (batch deliveries); their items are in `completes`.
    pub complete_many: u64,
    pub next_due: u64,
    pub inserts: u64,
    pub errors: u64,
}

impl Calls {
    pub fn snapshot(&self) -> CallCounts {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CallCounts {
            claims: r(&self.claims),
            claim_micros: r(&self.claim_micros),
            claim_max_micros: r(&self.claim_max_micros),
            empty_claims: r(&self.empty_claims),
            claimed: r(&self.claimed),
            asked: r(&self.asked),
            completes: r(&self.completes),
            complete_many: r(&self.complete_many),
            next_due: r(&self.next_due),
            inserts: r(&self.inserts),
            errors: r(&self.errors),
        }
    }
}

impl CallCounts {
    pub fn since(self, b: Self) -> Self {
        Self {
            claims: self.claims - b.claims,
            claim_micros: self.claim_micros - b.claim_micros,
            claim_max_micros: self.claim_max_micros,
            empty_claims: self.empty_claims - b.empty_claims,
            claimed: self.claimed - b.claimed,
            asked: self.asked - b.asked,
            completes: self.completes - b.completes,
            complete_many: self.complete_many - b.complete_many,
            next_due: self.next_due - b.next_due,
            inserts: self.inserts - b.inserts,
            errors: self.errors - b.errors,
        }
    }

    pub fn add(self, b: Self) -> Self {
        Self {
            claims: self.claims + b.claims,
            claim_micros: self.claim_micros + b.claim_micros,
            claim_max_micros: self.claim_max_micros.max(b.claim_max_micros),
            empty_claims: self.empty_claims + b.empty_claims,
            claimed: self.claimed + b.claimed,
            asked: self.asked + b.asked,
            completes: self.completes + b.completes,
            complete_many: self.complete_many + b.complete_many,
            next_due: self.next_due + b.next_due,
            inserts: self.inserts + b.inserts,
            errors: self.errors + b.errors,
        }
    }

    /// Mean duration of a claim call, ms.
    pub fn claim_ms(&self) -> f64 {
        self.claim_micros as f64 / 1000.0 / self.claims.max(1) as f64
    }

    /// Events per non-empty claim.
    pub fn claim_size(&self) -> f64 {
        self.claimed as f64 / (self.claims - self.empty_claims).max(1) as f64
    }
}

/// A [`Store`] that forwards every call and counts the data path's.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    pub calls: Arc<Calls>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            calls: Arc::default(),
        }
    }

    /// Counts a claim of `req` begun at `started` that took `claimed` events.
    fn count_claim<E>(
        &self,
        req: &ClaimRequest,
        started: std::time::Instant,
        claimed: Result<usize, E>,
    ) {
        bump(&self.calls.claims, 1);
        bump(&self.calls.asked, u64::from(req.max));
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        bump(&self.calls.claim_micros, took);
        self.calls
            .claim_max_micros
            .fetch_max(took, Ordering::Relaxed);
        match claimed {
            Ok(0) => bump(&self.calls.empty_claims, 1),
            Ok(n) => bump(&self.calls.claimed, n as u64),
            Err(_) => bump(&self.calls.errors, 1),
        }
    }
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[async_trait::async_trait]
impl Store for CountingStore {
    async fn migrate(&self) -> mailroom::Result<mailroom::Migrated> {
        self.inner.migrate().await
    }

    async fn schema(&self) -> mailroom::Result<mailroom::SchemaVersion> {
        self.inner.schema().await
    }

    async fn insert(&self, event: NewEvent) -> mailroom::Result<Inserted> {
        bump(&self.calls.inserts, 1);
        self.inner.insert(event).await
    }

    async fn claim(&self, req: &ClaimRequest) -> mailroom::Result<Vec<Claimed>> {
        let started = std::time::Instant::now();
        let r = self.inner.claim(req).await;
        self.count_claim(req, started, r.as_ref().map(Vec::len));
        r
    }

    async fn complete(
        &self,
        id: EventId,
        token: FencingToken,
        completion: Completion,
    ) -> mailroom::Result<()> {
        bump(&self.calls.completes, 1);
        let r = self.inner.complete(id, token, completion).await;
        if r.is_err() {
            bump(&self.calls.errors, 1);
        }
        r
    }

    // Every method must be forwarded: a default would replace the backend's
    // own implementation (e.g. SQLite's one-job `complete_many`).
    async fn complete_many(
        &self,
        items: Vec<(EventId, FencingToken, Completion)>,
    ) -> Vec<mailroom::Result<()>> {
        bump(&self.calls.complete_many, 1);
        bump(&self.calls.completes, items.len() as u64);
        let r = self.inner.complete_many(items).await;
        bump(
            &self.calls.errors,
            r.iter().filter(|x| x.is_err()).count() as u64,
        );
        r
    }

    fn shares_commits(&self) -> bool {
        self.inner.shares_commits()
    }

    /// Counted as a `complete_many` (when `done` is not empty) and a claim.
    async fn complete_and_claim(
        &self,
        done: Vec<(EventId, FencingToken, Completion)>,
        req: &ClaimRequest,
        limits: Option<ClaimLimits>,
    ) -> (Vec<mailroom::Result<()>>, mailroom::Result<LimitedClaim>) {
        if !done.is_empty() {
            bump(&self.calls.complete_many, 1);
            bump(&self.calls.completes, done.len() as u64);
        }
        let started = std::time::Instant::now();
        let (recorded, claim) = self.inner.complete_and_claim(done, req, limits).await;
        bump(
            &self.calls.errors,
            recorded.iter().filter(|x| x.is_err()).count() as u64,
        );
        let claimed = match &claim {
            Ok(LimitedClaim::Claimed { claimed, .. }) => Ok(claimed.len()),
            Ok(LimitedClaim::Wait(_)) => Ok(0),
            Err(_) => Err(()),
        };
        self.count_claim(req, started, claimed);
        (recorded, claim)
    }

    async fn extend(
        &self,
        id: EventId,
        token: FencingToken,
        lease: Duration,
    ) -> mailroom::Result<mailroom::Timestamp> {
        self.inner.extend(id, token, lease).await
    }

    async fn expire(&self, topic: &str, after: Duration, limit: u32) -> mailroom::Result<u64> {
        self.inner.expire(topic, after, limit).await
    }

    async fn rescue_expired(&self) -> mailroom::Result<u64> {
        self.inner.rescue_expired().await
    }

    async fn fold_counters(&self) -> mailroom::Result<()> {
        self.inner.fold_counters().await
    }

    async fn claim_limited(
        &self,
        req: &ClaimRequest,
        limits: mailroom::store::ClaimLimits,
    ) -> mailroom::Result<mailroom::store::LimitedClaim> {
        bump(&self.calls.claims, 1);
        self.inner.claim_limited(req, limits).await
    }

    async fn pause_topic(
        &self,
        topic: &str,
        pause: Duration,
    ) -> mailroom::Result<mailroom::Timestamp> {
        self.inner.pause_topic(topic, pause).await
    }

    async fn paused_for(&self, topic: &str) -> mailroom::Result<Option<Duration>> {
        self.inner.paused_for(topic).await
    }

    async fn next_due(&self, req: &ClaimRequest) -> mailroom::Result<Option<mailroom::Timestamp>> {
        bump(&self.calls.next_due, 1);
        self.inner.next_due(req).await
    }

    async fn get(&self, id: EventId) -> mailroom::Result<Option<Event>> {
        self.inner.get(id).await
    }

    async fn list(&self, filter: &ListFilter) -> mailroom::Result<Page> {
        self.inner.list(filter).await
    }

    async fn search(&self, search: &mailroom::operate::EventSearch) -> mailroom::Result<Page> {
        self.inner.search(search).await
    }

    async fn count(&self, search: &mailroom::operate::EventSearch) -> mailroom::Result<u64> {
        self.inner.count(search).await
    }

    async fn throughput(
        &self,
        window: Duration,
    ) -> mailroom::Result<Vec<mailroom::operate::Throughput>> {
        self.inner.throughput(window).await
    }

    async fn replay(&self, id: EventId, budget: u32) -> mailroom::Result<Event> {
        self.inner.replay(id, budget).await
    }

    async fn replay_matching(
        &self,
        filter: &ListFilter,
        budget: u32,
    ) -> mailroom::Result<mailroom::operate::ReplayReport> {
        self.inner.replay_matching(filter, budget).await
    }

    async fn skip(&self, id: EventId) -> mailroom::Result<Event> {
        self.inner.skip(id).await
    }

    async fn cancel(&self, id: EventId) -> mailroom::Result<Event> {
        self.inner.cancel(id).await
    }

    async fn cancel_matching(&self, filter: &ListFilter) -> mailroom::Result<u64> {
        self.inner.cancel_matching(filter).await
    }

    async fn stats(&self) -> mailroom::Result<Vec<TopicStats>> {
        self.inner.stats().await
    }
    async fn attempt_window(
        &self,
        window: std::time::Duration,
    ) -> mailroom::Result<Vec<mailroom::operate::AttemptWindow>> {
        self.inner.attempt_window(window).await
    }

    async fn purge(&self, retention: Retention) -> mailroom::Result<PurgeReport> {
        self.inner.purge(retention).await
    }

    async fn now(&self) -> mailroom::Result<mailroom::Timestamp> {
        self.inner.now().await
    }

    fn notifications(&self) -> Option<TopicStream> {
        self.inner.notifications()
    }

    async fn try_lead(&self, role: &str, holder: &str, ttl: Duration) -> mailroom::Result<bool> {
        self.inner.try_lead(role, holder, ttl).await
    }
}
