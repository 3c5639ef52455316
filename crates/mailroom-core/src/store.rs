//! The storage contract every backend implements, and the small types it
//! speaks. How a backend keeps it (its SQL, indexes, durability settings)
//! is told in its own crate; the shared conformance suite
//! (`mailroom-conformance`) holds every backend to this page.

use crate::alert::AttemptWindow;
use crate::error::Result;
use crate::event::{Event, EventId, NewEvent, Status};
use crate::lease::{Claimed, FencingToken};
use crate::limit::Rate;
use crate::mode::OnDead;
use crate::outcome::Completion;
use crate::schema::{Migrated, SchemaVersion};
use jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

/// The answer to an insert: the stored id, and whether it was already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inserted {
    /// The id of the one stored event for this (source, dedup key).
    pub id: EventId,
    /// `true` when the (source, dedup key) was already stored; nothing changed.
    pub duplicate: bool,
}

/// A topic's scheduling limits as a claim meets them
/// ([`Store::claim_limited`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClaimLimits {
    /// Attempts started per period, from the topic's shared budget.
    pub rate: Option<Rate>,
    /// The most events of the topic running at once.
    pub max_running: Option<u32>,
}

/// What a claim within a topic's limits gave.
#[derive(Debug)]
pub enum LimitedClaim {
    /// The claim was made.
    Claimed {
        /// The events claimed, at most `asked`.
        claimed: Vec<Claimed>,
        /// What was asked of the backlog: the request's `max`, lowered to
        /// the rate's grant, then to the tokens granted and to the
        /// `max_running` room when that room is not zero.
        asked: u32,
        /// The `max_running` room was less than the request lowered to the
        /// grant: the cap, rather than the backlog, may have cut the claim
        /// short.
        capped: bool,
    },
    /// The rate budget is empty: nothing may start for this long.
    Wait(Duration),
}

/// Which events a claim may take.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest {
    /// The topic to claim from.
    pub topic: String,
    /// Recorded in the attempt history.
    pub worker: String,
    /// At most this many events.
    pub max: u32,
    /// Lease length, added to the database clock.
    pub lease: Duration,
    /// `Some` for sequential topics: only the head of each key may be taken,
    /// and only when no earlier event of its key is `pending`, `running`, or
    /// (with [`OnDead::Block`]) `dead`. Events without a key are independent.
    /// Per-key order wins over priority.
    pub per_key: Option<OnDead>,
    /// The starvation bound of priorities (a topic's `max_wait_for_priority`):
    /// a due event that has waited this long is taken before higher-priority
    /// ones. `None`: strict priority order.
    pub max_wait_for_priority: Option<Duration>,
    /// A topic's `expire_after`: a pending event whose expiry clock (see
    /// [`Store::expire`]) started longer ago than this is not claimed.
    pub expire_after: Option<Duration>,
}

impl ClaimRequest {
    /// A request for up to `max` events of `topic` under leases of `lease`:
    /// independent events, strict priority order, no expiry.
    pub fn new(
        topic: impl Into<String>,
        worker: impl Into<String>,
        max: u32,
        lease: Duration,
    ) -> Self {
        Self {
            topic: topic.into(),
            worker: worker.into(),
            max,
            lease,
            per_key: None,
            max_wait_for_priority: None,
            expire_after: None,
        }
    }
}

/// Filters for listing and bulk replay. Empty fields match everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// Only this topic.
    pub topic: Option<String>,
    /// Only this status.
    pub status: Option<Status>,
    /// Only this key.
    pub key: Option<String>,
    /// Page size (lists only); the backend caps it at 1000.
    pub limit: u32,
    /// Continue after this cursor (from [`Page::next_cursor`]).
    pub cursor: Option<KeyCursor>,
}

/// A [`ListFilter`] and what an operator hunting dead letters filters on
/// besides ([`Store::search`], [`Store::count`]). Empty fields match
/// everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventSearch {
    /// Topic, status, key, and the page (limit, cursor).
    pub filter: ListFilter,
    /// Only events whose last error contains this text (exact case).
    pub error_contains: Option<String>,
    /// Only events received at or after this.
    pub received_from: Option<Timestamp>,
    /// Only events received before this.
    pub received_until: Option<Timestamp>,
}

impl EventSearch {
    /// Whether it filters on more than its [`ListFilter`].
    pub fn narrows_list(&self) -> bool {
        self.error_contains.is_some()
            || self.received_from.is_some()
            || self.received_until.is_some()
    }
}

/// One topic's traffic in one minute ([`Store::throughput`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throughput {
    /// The topic the traffic belongs to.
    pub topic: String,
    /// The minute's start (store clock).
    pub minute: Timestamp,
    /// Events received in it.
    pub received: u64,
    /// Attempts that ended `done` in it.
    pub done: u64,
    /// Attempts that failed in it (retried, dead, or lease expired).
    pub failed: u64,
}

/// Opaque position in a newest-first listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyCursor(pub EventId);

/// One page of events, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The events (without history).
    pub events: Vec<Event>,
    /// Where the next page starts, if there is one.
    pub next_cursor: Option<KeyCursor>,
}

impl Page {
    /// The page of `limit` events out of `events` read with `limit + 1`
    /// (newest first): the extra one, if it came, only says that a next
    /// page exists, which starts after the page's last event.
    pub fn from_overfetch(mut events: Vec<Event>, limit: u32) -> Page {
        let limit = limit as usize;
        let next_cursor = if events.len() > limit {
            events.truncate(limit);
            events.last().map(|e| KeyCursor(e.id))
        } else {
            None
        };
        Page {
            events,
            next_cursor,
        }
    }
}

/// Per-topic numbers for `status`, `/v1/stats`, metrics and alerts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopicStats {
    /// The topic the numbers are about.
    pub topic: String,
    /// Event count per status (statuses with no events may be absent).
    pub counts: BTreeMap<&'static str, u64>,
    /// `received_at` of the oldest pending event.
    pub oldest_pending: Option<Timestamp>,
    /// Keys whose head is dead and holds the rest back (sequential topics).
    pub blocked_keys: u64,
}

impl TopicStats {
    /// Number of events in `status`.
    pub fn count(&self, status: Status) -> u64 {
        self.counts.get(status.as_str()).copied().unwrap_or(0)
    }

    /// How long the oldest pending event has waited at `now` (never
    /// negative); `None` without pending events.
    pub fn oldest_pending_age(&self, now: Timestamp) -> Option<Duration> {
        let t = self.oldest_pending?;
        let ms = (now.as_millisecond() - t.as_millisecond()).max(0);
        Some(Duration::from_millis(ms.unsigned_abs()))
    }
}

/// How long stored events keep their payloads and their rows: what
/// retention removes, run by maintenance and by `mailroom purge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Drop payloads of `done`/`skipped` events received before now − this.
    pub done: Duration,
    /// Drop payloads of `dead`, `cancelled` and `expired` events received before now − this.
    pub dead: Duration,
    /// Delete finished rows entirely (ending dedup for their keys) before now − this.
    pub dedup: Duration,
}

impl Default for Retention {
    /// The `[retention]` defaults: payloads of done events 7 days, of dead
    /// events and rows (dedup keys) 30 days.
    fn default() -> Self {
        const DAY: u64 = 86_400;
        Self {
            done: Duration::from_secs(7 * DAY),
            dead: Duration::from_secs(30 * DAY),
            dedup: Duration::from_secs(30 * DAY),
        }
    }
}

/// What a purge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeReport {
    /// Events whose payload was dropped (their row stays for dedup).
    pub payloads_dropped: u64,
    /// Rows deleted with their history.
    pub rows_deleted: u64,
}

/// What a bulk replay ([`Store::replay_matching`]) did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReplayReport {
    /// Events sent back to `pending`.
    pub replayed: u64,
    /// Matching events left as they were because retention dropped their
    /// payload (a replay would hand the handler an empty body).
    pub skipped_purged: u64,
}

/// Durable storage of events: the contract every backend implements, and
/// that the conformance suite (`mailroom-conformance`) checks.
///
/// - Every method is atomic, and one that returns `Ok` has committed
///   durably: a crash right after loses nothing it reported. That is what
///   lets intake acknowledge.
/// - Times that matter for correctness (leases, due times) are computed on
///   the store's clock ([`now`](Store::now)), never the caller's: callers
///   pass durations, not instants.
/// - A completion or lease extension takes effect only with the attempt's
///   current [`FencingToken`]; a stale one changes nothing.
/// - Claims never hand one event to two concurrent callers; where several
///   instances share a store, [`try_lead`](Store::try_lead) elects one to
///   run maintenance.
/// - Errors say what happened, not how: an id never stored is
///   [`NotFound`](crate::StoreError::NotFound) (and `get` answers `None`),
///   an event in the wrong state for the operation is a
///   [`Conflict`](crate::StoreError::Conflict) that changes nothing, and
///   [`Unavailable`](crate::StoreError::Unavailable) or
///   [`Overloaded`](crate::StoreError::Overloaded) mean nothing was
///   committed, so the caller may retry.
///
/// The methods by role: setup ([`migrate`](Store::migrate),
/// [`schema`](Store::schema),
/// [`now`](Store::now)); the hot path of intake and dispatch
/// ([`insert`](Store::insert), [`claim`](Store::claim),
/// [`complete`](Store::complete), [`complete_many`](Store::complete_many),
/// [`extend`](Store::extend), [`next_due`](Store::next_due),
/// [`notifications`](Store::notifications)); reading
/// ([`get`](Store::get), [`list`](Store::list), [`stats`](Store::stats),
/// [`search`](Store::search), [`count`](Store::count),
/// [`throughput`](Store::throughput));
/// admin ([`replay`](Store::replay),
/// [`replay_matching`](Store::replay_matching), [`skip`](Store::skip));
/// maintenance ([`rescue_expired`](Store::rescue_expired),
/// [`purge`](Store::purge), [`attempt_window`](Store::attempt_window),
/// [`try_lead`](Store::try_lead)).
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    // Setup.

    /// Creates or upgrades the schema. Safe to call from several processes
    /// at once: one upgrades, the others then find nothing left to do.
    /// Returns the version found and where the schema stands now. A schema
    /// newer than this build's is left as it is: `Ok` when its newer
    /// migrations are marked compatible with this build
    /// ([`SchemaFit::NewerCompatible`](crate::SchemaFit)), otherwise
    /// [`StoreError::Schema`](crate::StoreError::Schema).
    async fn migrate(&self) -> Result<Migrated>;

    /// The schema's version against this build's migrations, read without
    /// changing anything: no DDL, so a role with only the rights to use the
    /// schema's objects may call it, and a database without the schema
    /// answers version 0. What [`migrate`](Store::migrate) would find.
    async fn schema(&self) -> Result<SchemaVersion>;

    /// The store's clock, on which leases and due times are computed.
    async fn now(&self) -> Result<Timestamp>;

    // The hot path: intake and dispatch.

    /// Stores `event` as `pending` and due now, unless its (source, dedup key)
    /// is already stored: then nothing changes and the stored id comes back
    /// with `duplicate = true`. Of many concurrent inserts of one key, exactly
    /// one reports `duplicate = false`.
    async fn insert(&self, event: NewEvent) -> Result<Inserted>;

    /// Moves up to `req.max` due `pending` events of `req.topic`, highest
    /// priority first, then oldest arrival first, to `running` under a lease
    /// of `req.lease`, each with a new fencing token (its attempt count,
    /// incremented). With `req.max_wait_for_priority`, due events that have
    /// waited that long go first, oldest first, whatever their priority;
    /// with `req.expire_after`, expired events are not taken. Claims walk
    /// indexes in claim order: they never sort the whole backlog, and a
    /// backlog of events delivered later does not slow them.
    ///
    /// For topics without `per_key`, a backend may serve an event that
    /// turned pending again behind newer ones (a retry come due, a replay)
    /// or one delivered later that came due, up to a second late, while
    /// other events keep its claims full; never later than that.
    async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Claimed>>;

    /// Records the end of an attempt, only if `token` is still current
    /// ([`StoreError::StaleToken`](crate::StoreError::StaleToken) otherwise).
    /// Appends the attempt to the history.
    async fn complete(
        &self,
        id: EventId,
        token: FencingToken,
        completion: Completion,
    ) -> Result<()>;

    /// Records the ends of several attempts (a batch's verdicts): each item
    /// exactly as [`complete`](Store::complete) would, with its own result, so
    /// one stale token does not affect the others. The default runs them
    /// concurrently; backends may apply them in one write.
    async fn complete_many(
        &self,
        items: Vec<(EventId, FencingToken, Completion)>,
    ) -> Vec<Result<()>> {
        let each = items
            .into_iter()
            .map(|(id, token, completion)| self.complete(id, token, completion));
        futures_util::future::join_all(each).await
    }

    /// Whether [`complete_and_claim`](Store::complete_and_claim) records and
    /// claims in one commit. A dispatcher then records its attempts'
    /// outcomes with its next claim instead of each on its own.
    fn shares_commits(&self) -> bool {
        false
    }

    /// Records `done` exactly as [`complete_many`](Store::complete_many)
    /// does, then claims `req`: within `limits` as
    /// [`claim_limited`](Store::claim_limited) does when they are given, as
    /// [`claim`](Store::claim) otherwise (`asked` = `req.max`, never
    /// `capped`). The claim sees every outcome of `done` recorded (a key it
    /// unblocked may be claimed). The outcomes' results do not depend on
    /// the claim's: a failed claim leaves them recorded. The default makes
    /// the two calls one after the other; a backend whose
    /// [`shares_commits`](Store::shares_commits) is `true` makes one commit.
    async fn complete_and_claim(
        &self,
        done: Vec<(EventId, FencingToken, Completion)>,
        req: &ClaimRequest,
        limits: Option<ClaimLimits>,
    ) -> (Vec<Result<()>>, Result<LimitedClaim>) {
        let recorded = if done.is_empty() {
            Vec::new()
        } else {
            self.complete_many(done).await
        };
        let claimed = match limits {
            Some(limits) => self.claim_limited(req, limits).await,
            None => self.claim(req).await.map(|claimed| LimitedClaim::Claimed {
                claimed,
                asked: req.max,
                capped: false,
            }),
        };
        (recorded, claimed)
    }

    /// Pushes the lease of a running event to now + `lease`, only if `token`
    /// is current. Returns the new end.
    async fn extend(&self, id: EventId, token: FencingToken, lease: Duration) -> Result<Timestamp>;

    /// The earliest time at which `claim(req)` could find something due,
    /// if anything is pending (may be in the past).
    async fn next_due(&self, req: &ClaimRequest) -> Result<Option<Timestamp>>;

    /// Topics that received new events, announced by the store to every
    /// process sharing it, so idle dispatchers everywhere wake within
    /// milliseconds. `None` (the default) means the backend cannot tell:
    /// dispatchers rely on in-process wake-ups and polling.
    fn notifications(&self) -> Option<TopicStream> {
        None
    }

    // Reading.

    /// One event with its attempt history.
    async fn get(&self, id: EventId) -> Result<Option<Event>>;

    /// Events matching `filter`, newest first.
    async fn list(&self, filter: &ListFilter) -> Result<Page>;

    /// Per-topic counts, oldest pending, blocked keys; the numbers of one
    /// answer are of one moment.
    async fn stats(&self) -> Result<Vec<TopicStats>>;

    /// Events matching `search`, newest first, a page at a time: [`list`](Store::list)
    /// with the error-text and time-range filters too.
    async fn search(&self, search: &EventSearch) -> Result<Page>;

    /// How many events match `search` (its limit and cursor ignored).
    async fn count(&self, search: &EventSearch) -> Result<u64>;

    /// Per topic and minute over the last `window` (store clock): events
    /// received, attempts done and failed. Minutes with none are absent;
    /// ordered by topic, then minute.
    async fn throughput(&self, window: Duration) -> Result<Vec<Throughput>>;

    // Admin.

    /// Sends an event (`dead`, `done`, `skipped` or `pending`) back to
    /// `pending`, due now, with a fresh budget: `max_attempts = attempts +
    /// budget`. A `running` event is a [`Conflict`](crate::StoreError::Conflict);
    /// one whose payload retention dropped ([`purge`](Store::purge)) is
    /// [`Purged`](crate::StoreError::Purged), and neither changes.
    async fn replay(&self, id: EventId, budget: u32) -> Result<Event>;

    /// [`replay`](Store::replay) for every non-running event matching `filter`
    /// (its `limit` and `cursor` are ignored). Events whose payload was
    /// purged are left as they are and counted in
    /// [`ReplayReport::skipped_purged`].
    async fn replay_matching(&self, filter: &ListFilter, budget: u32) -> Result<ReplayReport>;

    /// Marks a `dead` event `skipped` so its key unblocks; any other status
    /// is a [`Conflict`](crate::StoreError::Conflict).
    async fn skip(&self, id: EventId) -> Result<Event>;

    /// Withdraws a `pending` event: it becomes `cancelled` (final; listed,
    /// counted and replayable like a dead one). A `running` event, or one
    /// in any other status, is a [`Conflict`](crate::StoreError::Conflict)
    /// that changes nothing.
    async fn cancel(&self, id: EventId) -> Result<Event>;

    /// [`cancel`](Store::cancel) for every `pending` event matching `filter`
    /// (its `status`, `limit` and `cursor` are ignored); how many.
    async fn cancel_matching(&self, filter: &ListFilter) -> Result<u64>;

    // Scheduling limits (`rate`, `max_running`, a handler's 429 pause),
    // called only for topics that set them.

    /// [`claim`](Store::claim) within `req.topic`'s `limits`:
    ///
    /// - `max_running`: only as many events as keep the topic's `running`
    ///   events at most that many, counted over every process the backend
    ///   lets share it; two concurrent calls never fill the same room.
    /// - `rate`: the tokens come from the topic's rate budget (see
    ///   [`crate::limit`]: one budget for every process sharing the store,
    ///   refilled on the store's clock, holding at most one
    ///   [`Rate::grant`]), at most one grant per call, in the same step as
    ///   the claim: tokens are spent only for events claimed, and claims
    ///   stamped (`lease_until` less the lease) in any window of the rate's
    ///   period number at most the rate plus one grant.
    ///
    /// An empty budget answers [`LimitedClaim::Wait`] and claims nothing.
    async fn claim_limited(&self, req: &ClaimRequest, limits: ClaimLimits) -> Result<LimitedClaim>;

    /// Pauses claims of `topic` until `pause` from now (store clock), or
    /// later if already paused longer; returns when the pause ends. Processes
    /// sharing the store learn of it through
    /// [`notifications`](Store::notifications) ([`pause_notice`]).
    async fn pause_topic(&self, topic: &str, pause: Duration) -> Result<Timestamp>;

    /// How long `topic` stays paused from now, if it is.
    async fn paused_for(&self, topic: &str) -> Result<Option<Duration>>;

    // Maintenance.

    /// Moves the `pending` events of `topic` whose expiry clock started
    /// longer than `expire_after` ago to `expired`, with `last_error` saying
    /// why; returns how many (at most `limit`, so a sweep never holds the
    /// store long). The clock starts when the event is first due (its
    /// `deliver_at`, or when it was stored) and again when it is replayed.
    async fn expire(&self, topic: &str, expire_after: Duration, limit: u32) -> Result<u64>;

    /// Returns every `running` event whose lease has ended to `pending` (due
    /// now), or to `dead` if it has no attempts left; the lost attempt is
    /// recorded as `lease_expired`. Returns how many were rescued.
    async fn rescue_expired(&self) -> Result<u64>;

    /// Keeps the counters [`stats`](Store::stats) and
    /// [`throughput`](Store::throughput) read small: folds what changes
    /// recorded since the last call into them and drops minutes older than
    /// the store keeps. Never changes what they answer; maintenance calls
    /// it every period.
    async fn fold_counters(&self) -> Result<()>;

    /// Applies `retention` ([`Retention`] says what goes) and reports what
    /// it removed; intake and claims are not held up meanwhile.
    async fn purge(&self, retention: Retention) -> Result<PurgeReport>;

    /// Per topic, the attempts finished in the last `window` (how many, how
    /// many failed, their p95 duration) and the age of the oldest attempt
    /// still running: what `failure_rate` and `processing_time` alerts need.
    /// Topics with neither are absent.
    async fn attempt_window(&self, window: Duration) -> Result<Vec<AttemptWindow>>;

    /// Tries to hold the lease named `role` (e.g. `"maintenance"`) for
    /// `ttl` as `holder`, renewing it if `holder` already has it. Exactly one
    /// holder at a time gets `true`, so periodic work (lease rescue,
    /// retention, alerts) runs on one elected instance. The default, for
    /// single-process stores, always grants it.
    async fn try_lead(&self, role: &str, holder: &str, ttl: Duration) -> Result<bool> {
        let _ = (role, holder, ttl);
        Ok(true)
    }
}

/// The `last_error` of an event [`Store::expire`] moved to `expired`.
pub fn expiry_reason(expire_after: Duration) -> String {
    format!(
        "expired: pending longer than the topic's expire_after ({})",
        crate::duration::format(expire_after)
    )
}

/// A stream of topic names (see [`Store::notifications`]).
pub type TopicStream = std::pin::Pin<Box<dyn futures_core::Stream<Item = String> + Send>>;

/// What a [`TopicStream`] carries for a topic paused by
/// [`Store::pause_topic`] (rather than a topic with new events): the name
/// behind a prefix no topic name starts with.
pub fn pause_notice(topic: &str) -> String {
    format!("{PAUSE_PREFIX}{topic}")
}

/// The topic a [`pause_notice`] names; `None` for an ordinary notification.
pub fn paused_topic(notice: &str) -> Option<&str> {
    notice.strip_prefix(PAUSE_PREFIX)
}

const PAUSE_PREFIX: &str = "\u{1}pause\u{1}";

#[cfg(test)]
mod tests {
    use super::*;

    fn events(n: usize) -> Vec<Event> {
        (0..n)
            .map(|i| Event {
                id: EventId::new(),
                source: "s".into(),
                topic: "t".into(),
                dedup_key: i.to_string(),
                key: None,
                event_type: None,
                priority: 0,
                status: Status::Pending,
                attempts: 0,
                max_attempts: 1,
                next_attempt_at: None,
                received_at: Timestamp::UNIX_EPOCH,
                correlation_id: None,
                causation_id: None,
                version: None,
                traceparent: None,
                content_type: None,
                payload: None,
                last_error: None,
                lease_until: None,
                history: Vec::new(),
            })
            .collect()
    }

    /// A listing read with one event more than the page holds has a next
    /// page starting after the page's last event; one that came short has none.
    #[test]
    fn a_page_has_a_next_cursor_only_when_more_events_came() {
        let read = events(4);
        let page = Page::from_overfetch(read.clone(), 3);
        assert_eq!(page.events, read[..3]);
        assert_eq!(page.next_cursor, Some(KeyCursor(read[2].id)));
        let page = Page::from_overfetch(read[..3].to_vec(), 3);
        assert_eq!((page.events.len(), page.next_cursor), (3, None));
        assert_eq!(Page::from_overfetch(Vec::new(), 3).next_cursor, None);
    }
}
