//! The conformance tests, one async function of a fresh store each.
//!
//! Every `pub async fn` here and in the files under `tests/` (re-exported
//! here) is a test: the build script finds them and `suite!` runs each on
//! every backend. Helpers stay private.
//!
//! Tests panic on failure (they are tests); every store call's error is
//! shown in the panic message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::event;
use bytes::Bytes;
use mailroom_core::Delivery;
use mailroom_core::{
    AttemptOutcome, ClaimLimits, ClaimRequest, Claimed, Completion, EventId, EventSearch,
    FencingToken, LimitedClaim, ListFilter, OnDead, Retention, Status, Store, StoreError,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

mod limits;
pub use limits::*;

type S = Arc<dyn Store>;

const HOUR: Duration = Duration::from_secs(3600);

fn req(topic: &str, max: u32) -> ClaimRequest {
    ClaimRequest {
        topic: topic.into(),
        worker: "w1".into(),
        max,
        lease: Duration::from_secs(30),
        per_key: None,
        max_wait_for_priority: None,
        expire_after: None,
    }
}

fn seq_req(topic: &str, max: u32, on_dead: OnDead) -> ClaimRequest {
    ClaimRequest {
        per_key: Some(on_dead),
        ..req(topic, max)
    }
}

async fn insert(s: &S, topic: &str, dedup: &str, key: Option<&str>) -> EventId {
    s.insert(event(topic, dedup, key)).await.unwrap().id
}

async fn claim(s: &S, r: &ClaimRequest) -> Vec<Claimed> {
    s.claim(r).await.unwrap()
}

fn ids(claimed: &[Claimed]) -> Vec<EventId> {
    claimed.iter().map(|c| c.event.id).collect()
}

fn dead(error: &str) -> Completion {
    Completion::Dead {
        error: error.into(),
    }
}

fn retry(error: &str, delay: Duration) -> Completion {
    Completion::Retry {
        delay,
        error: error.into(),
    }
}

/// Lets the store clock move past leases of a millisecond.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(15)).await;
}

/// Insert then get returns every envelope field unchanged, as a due pending event.
pub async fn insert_then_get_round_trips_every_field(s: S) {
    let before = s.now().await.unwrap();
    let mut new = event("orders", "evt-1", Some("customer-7"));
    new.correlation_id = Some("corr-1".into());
    new.causation_id = Some("cause-1".into());
    new.version = Some("2.1".into());
    new.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    new.content_type = Some("application/octet-stream".into());
    new.payload = Bytes::from_static(b"\x00\xffbinary");
    new.max_attempts = 9;
    new.priority = -7;
    let answer = s.insert(new.clone()).await.unwrap();
    assert_eq!(answer.id, new.id);
    assert!(!answer.duplicate);
    let got = s.get(new.id).await.unwrap().expect("stored");
    assert_eq!(got.id, new.id);
    assert_eq!(got.source, new.source);
    assert_eq!(got.topic, new.topic);
    assert_eq!(got.dedup_key, new.dedup_key);
    assert_eq!(got.key, new.key);
    assert_eq!(got.event_type, new.event_type);
    assert_eq!(got.correlation_id, new.correlation_id);
    assert_eq!(got.causation_id, new.causation_id);
    assert_eq!(got.version, new.version);
    assert_eq!(got.traceparent, new.traceparent);
    assert_eq!(got.content_type, new.content_type);
    assert_eq!(got.payload, Some(new.payload.clone()));
    assert_eq!(got.max_attempts, 9);
    assert_eq!(got.priority, -7);
    assert_eq!(got.status, Status::Pending);
    assert_eq!(got.attempts, 0);
    assert!(got.history.is_empty());
    assert!(got.last_error.is_none());
    assert!(got.lease_until.is_none());
    let after = s.now().await.unwrap();
    let slack = jiff::SignedDuration::from_millis(1);
    assert!(got.received_at >= before - slack && got.received_at <= after + slack);
    let due = got.next_attempt_at.expect("pending events have a due time");
    assert!(due <= after + slack, "a new event is due now");

    let mut bare = event("orders", "evt-2", None);
    bare.event_type = None;
    bare.content_type = None;
    bare.payload = Bytes::new();
    s.insert(bare.clone()).await.unwrap();
    let got = s.get(bare.id).await.unwrap().unwrap();
    assert_eq!(got.key, None);
    assert_eq!(got.traceparent, None);
    assert_eq!(got.event_type, None);
    assert_eq!(got.content_type, None);
    assert_eq!(
        got.payload,
        Some(Bytes::new()),
        "an empty payload is not a purged one"
    );
}

/// A repeated (source, dedup key) is answered with the stored id, `duplicate: true`, and changes nothing.
pub async fn duplicate_is_answered_with_the_same_id(s: S) {
    let first = event("orders", "evt-1", None);
    let a = s.insert(first.clone()).await.unwrap();
    let mut again = event("other-topic", "evt-1", Some("k"));
    again.payload = Bytes::from_static(b"different");
    let b = s.insert(again.clone()).await.unwrap();
    assert_eq!(b.id, a.id);
    assert!(b.duplicate);
    assert!(
        s.get(again.id).await.unwrap().is_none(),
        "the duplicate's own id is not stored"
    );
    let stored = s.get(a.id).await.unwrap().unwrap();
    assert_eq!(stored.payload, Some(first.payload));
    assert_eq!(stored.topic, "orders");
    // The dedup key is unique per source, not globally.
    let mut elsewhere = event("orders", "evt-1", None);
    elsewhere.source = "another-source".into();
    let c = s.insert(elsewhere).await.unwrap();
    assert!(!c.duplicate);
    assert_ne!(c.id, a.id);
}

/// Of 50 concurrent inserts of one dedup key, exactly one is not a duplicate, all get its id, one event is stored.
pub async fn concurrent_duplicates_store_exactly_one_event(s: S) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let s = Arc::clone(&s);
        tasks.spawn(async move { s.insert(event("orders", "same", None)).await.unwrap() });
    }
    let answers = tasks.join_all().await;
    assert_eq!(answers.iter().filter(|a| !a.duplicate).count(), 1);
    let ids: HashSet<EventId> = answers.iter().map(|a| a.id).collect();
    assert_eq!(ids.len(), 1);
    let page = s.list(&ListFilter::default()).await.unwrap();
    assert_eq!(page.events.len(), 1);
}

/// Running the migrations again is harmless and keeps the data.
pub async fn migrate_is_idempotent(s: S) {
    let id = insert(&s, "orders", "evt-1", None).await;
    s.migrate().await.unwrap();
    s.migrate().await.unwrap();
    assert!(s.get(id).await.unwrap().is_some());
}

/// A migrated store reads its schema as this build's version without
/// changing it, and migrating it again applies nothing and reports the
/// same version (what `mailroom migrate` prints as "up to date").
pub async fn a_migrated_schema_reads_current_and_migrates_to_nothing(s: S) {
    let schema = s.schema().await.unwrap();
    assert!(schema.build > 0, "{schema:?}");
    assert_eq!(schema.database, schema.build, "{schema:?}");
    assert_eq!(schema.fit(), mailroom_core::SchemaFit::Current);
    assert!(schema.require_runnable().is_ok());
    let again = s.migrate().await.unwrap();
    assert!(!again.applied(), "{again:?}");
    assert_eq!(again.from, schema.database);
    assert_eq!(again.schema, schema);
    assert_eq!(s.schema().await.unwrap(), schema);
}

/// Operations on an id that was never stored answer NotFound (get answers None).
pub async fn unknown_ids_are_not_found(s: S) {
    let id = EventId::new();
    assert!(s.get(id).await.unwrap().is_none());
    let nf = |r: Result<(), StoreError>| assert!(matches!(r, Err(StoreError::NotFound)), "{r:?}");
    nf(s.complete(id, FencingToken(1), Completion::Done).await);
    nf(s.extend(id, FencingToken(1), HOUR).await.map(drop));
    nf(s.replay(id, 3).await.map(drop));
    nf(s.skip(id).await.map(drop));
}

/// A claim takes only due pending events of its topic, at most `max`, and marks them running under a lease.
pub async fn claim_respects_due_time_and_max(s: S) {
    let later = insert(&s, "orders", "later", None).await;
    let c = claim(&s, &req("orders", 1)).await;
    s.complete(c[0].event.id, c[0].token, retry("boom", HOUR))
        .await
        .unwrap();
    assert_eq!(c[0].event.id, later);
    for i in 0..5 {
        insert(&s, "orders", &format!("now-{i}"), None).await;
    }
    insert(&s, "elsewhere", "x", None).await;
    let now = s.now().await.unwrap();
    let first = claim(&s, &req("orders", 3)).await;
    assert_eq!(first.len(), 3);
    let second = claim(&s, &req("orders", 10)).await;
    assert_eq!(second.len(), 2, "the retrying event is not due for an hour");
    assert!(claim(&s, &req("orders", 10)).await.is_empty());
    assert!(claim(&s, &req("orders", 0)).await.is_empty());
    for c in first.iter().chain(&second) {
        assert_ne!(c.event.id, later);
        assert_eq!(c.event.status, Status::Running);
        assert_eq!(c.event.attempts, 1);
        assert_eq!(c.token, FencingToken(1));
        assert!(c.lease_until >= now + jiff::SignedDuration::from_secs(29));
        let stored = s.get(c.event.id).await.unwrap().unwrap();
        assert_eq!(stored.status, Status::Running);
        assert_eq!(stored.lease_until, Some(c.lease_until));
    }
}

/// Claims hand out events in arrival order.
pub async fn claim_takes_oldest_arrival_first(s: S) {
    let mut inserted = Vec::new();
    for i in 0..10 {
        inserted.push(insert(&s, "orders", &format!("e{i}"), None).await);
    }
    let mut claimed = ids(&claim(&s, &req("orders", 4)).await);
    claimed.extend(ids(&claim(&s, &req("orders", 100)).await));
    assert_eq!(claimed, inserted);
}

/// Two claimers racing over the same topic never receive the same event.
pub async fn concurrent_claimers_never_share_an_event(s: S) {
    for i in 0..200 {
        insert(&s, "orders", &format!("e{i}"), None).await;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..4 {
        let s = Arc::clone(&s);
        tasks.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let mut r = req("orders", 7);
                r.worker = format!("w{w}");
                let got = s.claim(&r).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(ids(&got));
            }
        });
    }
    let all: Vec<EventId> = tasks.join_all().await.into_iter().flatten().collect();
    let unique: HashSet<EventId> = all.iter().copied().collect();
    assert_eq!(all.len(), 200);
    assert_eq!(unique.len(), 200);
}

/// After lease expiry, rescue and a new claim, the old token is StaleToken and the new one completes.
pub async fn stale_token_is_rejected_after_rescue_and_reclaim(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    let mut short = req("orders", 1);
    short.lease = Duration::from_millis(1);
    let old = claim(&s, &short).await.remove(0);
    tick().await;
    assert_eq!(s.rescue_expired().await.unwrap(), 1);
    let new = claim(&s, &req("orders", 1)).await.remove(0);
    assert_eq!(new.event.id, id);
    assert!(new.token > old.token);
    let stale = s.complete(id, old.token, Completion::Done).await;
    assert!(matches!(stale, Err(StoreError::StaleToken)), "{stale:?}");
    s.complete(id, new.token, Completion::Done).await.unwrap();
    let again = s.complete(id, new.token, Completion::Done).await;
    assert!(
        matches!(again, Err(StoreError::StaleToken)),
        "a token completes once: {again:?}"
    );
    assert_eq!(s.get(id).await.unwrap().unwrap().status, Status::Done);
}

/// A batch of completions applies each item on its own token: current ones
/// are recorded (with history), a stale, repeated or unknown one fails alone.
pub async fn complete_many_applies_each_item_on_its_own_token(s: S) {
    let a = insert(&s, "orders", "a", None).await;
    let b = insert(&s, "orders", "b", None).await;
    let c = insert(&s, "orders", "c", None).await;
    let claimed = claim(&s, &req("orders", 3)).await;
    assert_eq!(claimed.len(), 3);
    let token = |id| {
        claimed
            .iter()
            .find(|x| x.event.id == id)
            .map(|x| x.token)
            .unwrap()
    };
    let results = s
        .complete_many(vec![
            (a, token(a), Completion::Done),
            (b, FencingToken(token(b).0 + 7), Completion::Done),
            (
                c,
                token(c),
                Completion::Retry {
                    delay: HOUR,
                    error: "later".into(),
                },
            ),
            // The same completion again: the first one used the token.
            (a, token(a), Completion::Done),
            (EventId::new(), FencingToken(1), Completion::Done),
        ])
        .await;
    assert_eq!(results.len(), 5);
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(
        matches!(results[1], Err(StoreError::StaleToken)),
        "{:?}",
        results[1]
    );
    assert!(results[2].is_ok(), "{:?}", results[2]);
    assert!(
        matches!(results[3], Err(StoreError::StaleToken)),
        "{:?}",
        results[3]
    );
    assert!(
        matches!(results[4], Err(StoreError::NotFound)),
        "{:?}",
        results[4]
    );
    let ga = s.get(a).await.unwrap().unwrap();
    assert_eq!(ga.status, Status::Done);
    assert_eq!(ga.history.len(), 1);
    assert_eq!(ga.history[0].outcome, AttemptOutcome::Done);
    assert_eq!(ga.history[0].attempt, token(a).0);
    assert_eq!(s.get(b).await.unwrap().unwrap().status, Status::Running);
    let gc = s.get(c).await.unwrap().unwrap();
    assert_eq!(gc.status, Status::Pending);
    assert_eq!(gc.last_error.as_deref(), Some("later"));
}

/// Outcomes recorded and a claim made in one call: each outcome exactly as
/// `complete_many` records it (a stale or unknown one fails alone), and the
/// claim sees them recorded: the key an outcome ends is claimable in the
/// same call, and `max_running` counts the events it ended as not running.
pub async fn complete_and_claim_records_before_it_claims(s: S) {
    let a = insert(&s, "orders", "a", Some("k1")).await;
    let b = insert(&s, "orders", "b", Some("k1")).await;
    let c = insert(&s, "orders", "c", Some("k2")).await;
    let r = seq_req("orders", 10, OnDead::Block);
    let first = claim(&s, &seq_req("orders", 1, OnDead::Block)).await;
    assert_eq!(ids(&first), vec![a]);
    let done = vec![
        (a, first[0].token, Completion::Done),
        (EventId::new(), FencingToken(1), Completion::Done),
    ];
    let (results, claimed) = s.complete_and_claim(done, &r, None).await;
    assert!(results[0].is_ok(), "{:?}", results[0]);
    assert!(
        matches!(results[1], Err(StoreError::NotFound)),
        "{:?}",
        results[1]
    );
    let Ok(LimitedClaim::Claimed {
        claimed,
        asked: 10,
        capped: false,
    }) = claimed
    else {
        panic!("a plain claim: {claimed:?}");
    };
    let mut got = ids(&claimed);
    got.sort_by_key(|id| id.to_string());
    let mut want = vec![b, c];
    want.sort_by_key(|id| id.to_string());
    assert_eq!(got, want, "a's key is free once a is done");
    assert_eq!(s.get(a).await.unwrap().unwrap().status, Status::Done);
    let tb = claimed.iter().find(|x| x.event.id == b).unwrap().token;
    let tc = claimed.iter().find(|x| x.event.id == c).unwrap().token;
    let d = insert(&s, "orders", "d", Some("k3")).await;
    let one = Some(ClaimLimits {
        rate: None,
        max_running: Some(1),
    });
    let stale = vec![(b, FencingToken(tb.0 + 7), Completion::Done)];
    let (results, claimed) = s.complete_and_claim(stale, &r, one).await;
    assert!(
        matches!(results[0], Err(StoreError::StaleToken)),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(&claimed, Ok(LimitedClaim::Claimed { claimed, capped: true, .. }) if claimed.is_empty()),
        "b and c still run: {claimed:?}"
    );
    let ended = vec![(b, tb, Completion::Done), (c, tc, Completion::Done)];
    let (results, claimed) = s.complete_and_claim(ended, &r, one).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert!(
        matches!(&claimed, Ok(LimitedClaim::Claimed { claimed, .. }) if ids(claimed) == vec![d]),
        "b and c ended in the same call: {claimed:?}"
    );
}

/// `attempt_window` reports, per topic, the attempts finished in the window
/// (failed ones apart, with a p95 duration) and the oldest running attempt.
pub async fn attempt_window_counts_recent_attempts_and_the_longest_running(s: S) {
    let a = insert(&s, "orders", "a", None).await;
    let b = insert(&s, "orders", "b", None).await;
    let c = insert(&s, "orders", "c", None).await;
    insert(&s, "idle", "d", None).await;
    let claimed = claim(&s, &req("orders", 3)).await;
    let token = |id| claimed.iter().find(|x| x.event.id == id).unwrap().token;
    tokio::time::sleep(Duration::from_millis(30)).await;
    s.complete(a, token(a), Completion::Done).await.unwrap();
    s.complete(
        b,
        token(b),
        Completion::Retry {
            delay: HOUR,
            error: "later".into(),
        },
    )
    .await
    .unwrap();
    // c is still running.
    let _ = c;
    let windows = s.attempt_window(HOUR).await.unwrap();
    assert_eq!(windows.len(), 1, "only topics with attempts: {windows:?}");
    let w = &windows[0];
    assert_eq!(w.topic, "orders");
    assert_eq!((w.finished, w.failed), (2, 1));
    let p95 = w.p95.expect("a p95 of two attempts");
    assert!(
        p95 >= Duration::from_millis(25) && p95 < Duration::from_secs(60),
        "{p95:?}"
    );
    let running = w.longest_running.expect("c is running");
    assert!(
        running >= Duration::from_millis(25) && running < Duration::from_secs(60),
        "{running:?}"
    );
    // Once c finishes nothing runs; attempts older than the window drop out.
    s.complete(c, token(c), Completion::Done).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let recent = s.attempt_window(Duration::from_millis(10)).await.unwrap();
    assert!(recent.is_empty(), "{recent:?}");
}

/// Extend pushes the lease with the current token and refuses any other.
pub async fn extend_needs_the_current_token(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    let until = s.extend(id, c.token, HOUR).await.unwrap();
    assert!(until > c.lease_until);
    assert_eq!(s.get(id).await.unwrap().unwrap().lease_until, Some(until));
    let wrong = s.extend(id, FencingToken(c.token.0 + 1), HOUR).await;
    assert!(matches!(wrong, Err(StoreError::StaleToken)), "{wrong:?}");
    // An extended lease is not rescued.
    assert_eq!(s.rescue_expired().await.unwrap(), 0);
}

/// Rescue returns an expired running event to pending due now, counts the attempt, and records `lease_expired`.
pub async fn rescue_counts_the_attempt_as_lease_expired(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    let mut short = req("orders", 1);
    short.lease = Duration::from_millis(1);
    short.worker = "crashed-worker".into();
    claim(&s, &short).await;
    insert(&s, "orders", "still-leased", None).await;
    claim(&s, &req("orders", 1)).await;
    tick().await;
    assert_eq!(
        s.rescue_expired().await.unwrap(),
        1,
        "only the expired lease"
    );
    let e = s.get(id).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Pending);
    assert_eq!(e.attempts, 1);
    assert!(e.next_attempt_at.unwrap() <= s.now().await.unwrap());
    assert_eq!(e.history.len(), 1);
    assert_eq!(e.history[0].attempt, 1);
    assert_eq!(e.history[0].outcome, AttemptOutcome::LeaseExpired);
    assert_eq!(e.history[0].worker.as_deref(), Some("crashed-worker"));
    let again = claim(&s, &req("orders", 1)).await.remove(0);
    assert_eq!(again.event.id, id);
    assert_eq!(again.token, FencingToken(2));
}

/// Rescue sends an event whose attempts are spent to dead instead of pending.
pub async fn rescue_sends_an_exhausted_event_dead(s: S) {
    let mut new = event("orders", "e", None);
    new.max_attempts = 1;
    let id = s.insert(new).await.unwrap().id;
    let mut short = req("orders", 1);
    short.lease = Duration::from_millis(1);
    claim(&s, &short).await;
    tick().await;
    assert_eq!(s.rescue_expired().await.unwrap(), 1);
    let e = s.get(id).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Dead);
    assert_eq!(e.history[0].outcome, AttemptOutcome::LeaseExpired);
    assert!(claim(&s, &req("orders", 1)).await.is_empty());
}

/// Retry makes the event pending again, due `delay` after completion on the store clock.
pub async fn retry_is_due_after_the_delay_on_the_store_clock(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    let before = s.now().await.unwrap();
    s.complete(
        id,
        c.token,
        retry("503 from handler", Duration::from_secs(120)),
    )
    .await
    .unwrap();
    let after = s.now().await.unwrap();
    let e = s.get(id).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Pending);
    assert_eq!(e.last_error.as_deref(), Some("503 from handler"));
    let due = e.next_attempt_at.unwrap();
    let slack = jiff::SignedDuration::from_millis(2);
    let delay = jiff::SignedDuration::from_secs(120);
    assert!(
        due >= before + delay - slack && due <= after + delay + slack,
        "{due}"
    );
    assert!(claim(&s, &req("orders", 1)).await.is_empty());
    // A zero delay is due at once.
    insert(&s, "orders", "f", None).await;
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    s.complete(c.event.id, c.token, retry("again", Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(ids(&claim(&s, &req("orders", 1)).await), vec![c.event.id]);
}

/// The history records each attempt's number, outcome, error, worker and times, oldest first.
pub async fn history_records_every_attempt(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    let mut r = req("orders", 1);
    r.worker = "alpha".into();
    let c = claim(&s, &r).await.remove(0);
    s.complete(id, c.token, retry("first failure", Duration::ZERO))
        .await
        .unwrap();
    r.worker = "beta".into();
    let c = claim(&s, &r).await.remove(0);
    s.complete(id, c.token, Completion::Done).await.unwrap();
    let e = s.get(id).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Done);
    assert_eq!(e.attempts, 2);
    assert_eq!(e.last_error.as_deref(), Some("first failure"));
    let h = &e.history;
    assert_eq!(h.len(), 2);
    assert_eq!((h[0].attempt, h[0].outcome), (1, AttemptOutcome::Retry));
    assert_eq!(h[0].error.as_deref(), Some("first failure"));
    assert_eq!(h[0].worker.as_deref(), Some("alpha"));
    assert_eq!((h[1].attempt, h[1].outcome), (2, AttemptOutcome::Done));
    assert_eq!(h[1].error, None);
    assert_eq!(h[1].worker.as_deref(), Some("beta"));
    for a in h {
        assert!(a.finished_at.unwrap() >= a.started_at);
    }
    assert!(h[1].started_at >= h[0].finished_at.unwrap());
}

/// Replay of a dead event gives `attempts + budget` and attempt numbers continue from the last.
pub async fn replay_gives_a_fresh_budget_and_attempts_keep_counting(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    s.complete(id, c.token, dead("410 gone")).await.unwrap();
    let e = s.replay(id, 5).await.unwrap();
    assert_eq!(e.status, Status::Pending);
    assert_eq!(e.attempts, 1);
    assert_eq!(e.max_attempts, 6);
    assert!(e.next_attempt_at.unwrap() <= s.now().await.unwrap());
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    assert_eq!(c.event.id, id);
    assert_eq!(c.token, FencingToken(2));
    s.complete(id, c.token, Completion::Done).await.unwrap();
    let e = s.get(id).await.unwrap().unwrap();
    let numbers: Vec<u32> = e.history.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, vec![1, 2]);
    assert_eq!(e.history[0].outcome, AttemptOutcome::Dead);
    // Done events replay too.
    assert_eq!(s.replay(id, 1).await.unwrap().max_attempts, 3);
}

/// Replaying a running event is a Conflict and leaves it running.
pub async fn replay_of_a_running_event_conflicts(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    let r = s.replay(id, 3).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "{r:?}");
    s.complete(id, c.token, Completion::Done).await.unwrap();
}

/// Bulk replay touches only non-running events matching the filter and says how many.
pub async fn replay_matching_replays_only_matching_non_running_events(s: S) {
    for i in 0..3 {
        insert(&s, "orders", &format!("d{i}"), None).await;
    }
    for c in claim(&s, &req("orders", 3)).await {
        s.complete(c.event.id, c.token, dead("x")).await.unwrap();
    }
    insert(&s, "orders", "running", None).await;
    let running = claim(&s, &req("orders", 1)).await.remove(0);
    insert(&s, "other", "o", None).await;
    let filter = ListFilter {
        topic: Some("orders".into()),
        status: Some(Status::Dead),
        limit: 1,
        ..ListFilter::default()
    };
    assert_eq!(
        s.replay_matching(&filter, 2).await.unwrap().replayed,
        3,
        "limit is ignored"
    );
    let all_orders = ListFilter {
        topic: Some("orders".into()),
        ..ListFilter::default()
    };
    for e in s.list(&all_orders).await.unwrap().events {
        if e.id == running.event.id {
            assert_eq!(e.status, Status::Running);
        } else {
            assert_eq!(e.status, Status::Pending);
            assert_eq!(e.max_attempts, 3);
        }
    }
    assert_eq!(
        s.replay_matching(&all_orders, 2).await.unwrap().replayed,
        3,
        "running one skipped"
    );
}

/// Only a dead event can be skipped; anything else is a Conflict.
pub async fn skip_only_from_dead(s: S) {
    let id = insert(&s, "orders", "e", None).await;
    assert!(matches!(s.skip(id).await, Err(StoreError::Conflict(_))));
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    assert!(matches!(s.skip(id).await, Err(StoreError::Conflict(_))));
    s.complete(id, c.token, dead("bad")).await.unwrap();
    let e = s.skip(id).await.unwrap();
    assert_eq!(e.status, Status::Skipped);
    assert!(matches!(s.skip(id).await, Err(StoreError::Conflict(_))));
}

/// Events stored with `Delivery::At` (an instant) or `Delivery::After` (a
/// delay on the store's clock) are pending at once but not claimed before
/// their due time, which `next_due` reports and the event shows as
/// `next_attempt_at`; then they are claimed like any other.
pub async fn delivered_later_events_are_not_claimed_before_due(s: S) {
    let now = s.now().await.unwrap();
    let at = now + Duration::from_secs(2);
    let mut later = event("orders", "at", None);
    later.delivery = Delivery::At(at);
    let at_id = s.insert(later).await.unwrap().id;
    let mut delayed = event("orders", "after", None);
    delayed.delivery = Delivery::After(Duration::from_secs(2));
    let after_id = s.insert(delayed).await.unwrap().id;
    let now_id = insert(&s, "orders", "now", None).await;
    let stored = s.get(at_id).await.unwrap().unwrap();
    assert_eq!(stored.status, Status::Pending);
    let shown = stored.next_attempt_at.unwrap();
    assert_eq!(
        shown.as_millisecond(),
        at.as_millisecond(),
        "due at the instant given"
    );
    let after_due = s
        .get(after_id)
        .await
        .unwrap()
        .unwrap()
        .next_attempt_at
        .unwrap();
    // Stores keep milliseconds (SQLite) or microseconds (PostgreSQL).
    let ms = |t: jiff::Timestamp| t.as_millisecond();
    assert!(
        ms(after_due) >= ms(now + Duration::from_secs(2)),
        "{after_due} vs {now}"
    );
    let r = req("orders", 10);
    let next = s.next_due(&r).await.unwrap().unwrap();
    assert!(
        next <= now + Duration::from_secs(1),
        "the event due now: {next}"
    );
    // Claims before the due times take only the event due now; one that
    // ends after a due time (a very slow machine) may also take that one.
    let mut taken = HashSet::new();
    while s.now().await.unwrap() < at.min(after_due) {
        let claimed = claim(&s, &r).await;
        let read_at = s.now().await.unwrap();
        for c in &claimed {
            let due = if c.event.id == at_id { at } else { after_due };
            if c.event.id != now_id {
                assert!(
                    ms(read_at) >= ms(due),
                    "{} claimed at {read_at}, before it was due at {due}",
                    c.event.id
                );
            }
            taken.insert(c.event.id);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(taken.contains(&now_id), "the event due now was claimed");
    while s.now().await.unwrap() < after_due.max(at) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    taken.extend(ids(&claim(&s, &r).await));
    for id in [at_id, after_id, now_id] {
        assert!(taken.contains(&id), "{id} claimed once due");
    }
}

/// A delayed event that claims walked past while it was not due (due
/// events arrived after it and were taken) is still claimed once it is due.
pub async fn a_delayed_event_behind_due_ones_is_claimed_once_due(s: S) {
    let mut delayed = event("orders", "d", None);
    delayed.delivery = Delivery::After(Duration::from_secs(2));
    let d = s.insert(delayed).await.unwrap().id;
    let due = s.get(d).await.unwrap().unwrap().next_attempt_at.unwrap();
    let r = req("orders", 10);
    for round in 0..3 {
        let e = insert(&s, "orders", &format!("e{round}"), None).await;
        let c = claim(&s, &r).await;
        if s.now().await.unwrap() >= due {
            // A machine this slow has made `d` due meanwhile: the rounds
            // before this one still walked past it while it was not.
            assert!(round > 0, "the first round took longer than 2 s");
            break;
        }
        assert_eq!(ids(&c), vec![e], "round {round}: only the due event");
        s.complete(e, c[0].token, Completion::Done).await.unwrap();
    }
    while s.now().await.unwrap() < due {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ids(&claim(&s, &r).await).contains(&d), "claimed once due");
}

/// `filter` as a search without the search's own filters.
fn counted(filter: &ListFilter) -> EventSearch {
    EventSearch {
        filter: filter.clone(),
        ..EventSearch::default()
    }
}

/// A cancelled event is never claimed, is listed and counted as
/// `cancelled`, and a replay makes it pending (and claimable) again.
pub async fn cancel_withdraws_a_pending_event_until_it_is_replayed(s: S) {
    let id = insert(&s, "orders", "c", None).await;
    let other = insert(&s, "orders", "o", None).await;
    let e = s.cancel(id).await.unwrap();
    assert_eq!(e.status, Status::Cancelled);
    assert_eq!(ids(&claim(&s, &req("orders", 10)).await), vec![other]);
    let stats = s.stats().await.unwrap();
    let orders = stats.iter().find(|t| t.topic == "orders").unwrap();
    assert_eq!(orders.count(Status::Cancelled), 1);
    assert_eq!(orders.count(Status::Pending), 0);
    for topic in [None, Some("orders".to_string())] {
        let listed = s
            .list(&ListFilter {
                topic: topic.clone(),
                status: Some(Status::Cancelled),
                ..ListFilter::default()
            })
            .await
            .unwrap();
        let listed: Vec<EventId> = listed.events.iter().map(|e| e.id).collect();
        assert_eq!(
            listed,
            vec![id],
            "listed as cancelled (topic filter {topic:?})"
        );
        let all = s
            .list(&ListFilter {
                topic,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert!(all.events.iter().any(|e| e.id == id), "in the full listing");
    }
    let cancelled = ListFilter {
        topic: Some("orders".into()),
        status: Some(Status::Cancelled),
        ..ListFilter::default()
    };
    assert_eq!(s.count(&counted(&cancelled)).await.unwrap(), 1);
    let e = s.replay(id, 3).await.unwrap();
    assert_eq!(e.status, Status::Pending);
    assert_eq!(ids(&claim(&s, &req("orders", 10)).await), vec![id]);
}

/// Only a pending event can be cancelled: a running one, a finished one or
/// a cancelled one is a Conflict that changes nothing; an unknown id is
/// NotFound.
pub async fn cancel_refuses_running_and_finished_events(s: S) {
    let id = insert(&s, "orders", "c", None).await;
    let c = claim(&s, &req("orders", 1)).await.remove(0);
    let r = s.cancel(id).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "running: {r:?}");
    assert_eq!(s.get(id).await.unwrap().unwrap().status, Status::Running);
    s.complete(id, c.token, Completion::Done).await.unwrap();
    let r = s.cancel(id).await;
    assert!(matches!(r, Err(StoreError::Conflict(_))), "done: {r:?}");
    assert_eq!(s.get(id).await.unwrap().unwrap().status, Status::Done);
    let again = insert(&s, "orders", "twice", None).await;
    s.cancel(again).await.unwrap();
    let r = s.cancel(again).await;
    assert!(
        matches!(r, Err(StoreError::Conflict(_))),
        "cancelled: {r:?}"
    );
    let r = s.cancel(EventId::new()).await;
    assert!(matches!(r, Err(StoreError::NotFound)), "{r:?}");
}

/// A bulk cancel takes the pending events of the filter only (not running
/// ones, not other topics or keys), and the count previews it.
pub async fn cancel_matching_takes_only_matching_pending_events(s: S) {
    let running = insert(&s, "mail", "r", Some("k1")).await;
    let c = claim(&s, &req("mail", 1)).await.remove(0);
    assert_eq!(c.event.id, running);
    let mut k1 = vec![];
    for i in 0..3 {
        k1.push(insert(&s, "mail", &format!("a{i}"), Some("k1")).await);
    }
    let k2 = insert(&s, "mail", "b", Some("k2")).await;
    let elsewhere = insert(&s, "orders", "x", Some("k1")).await;
    let filter = ListFilter {
        topic: Some("mail".into()),
        key: Some("k1".into()),
        ..ListFilter::default()
    };
    let pending = ListFilter {
        status: Some(Status::Pending),
        ..filter.clone()
    };
    assert_eq!(
        s.count(&counted(&filter)).await.unwrap(),
        4,
        "running one included"
    );
    assert_eq!(s.count(&counted(&pending)).await.unwrap(), 3);
    assert_eq!(s.cancel_matching(&filter).await.unwrap(), 3);
    for id in &k1 {
        assert_eq!(s.get(*id).await.unwrap().unwrap().status, Status::Cancelled);
    }
    for (id, status) in [
        (running, Status::Running),
        (k2, Status::Pending),
        (elsewhere, Status::Pending),
    ] {
        assert_eq!(s.get(id).await.unwrap().unwrap().status, status);
    }
    assert_eq!(s.count(&counted(&pending)).await.unwrap(), 0);
    assert_eq!(s.cancel_matching(&filter).await.unwrap(), 0, "nothing left");
    s.complete(running, c.token, Completion::Done)
        .await
        .unwrap();
}

/// A cancelled head of a sequential key is out of the key's way.
pub async fn per_key_cancelled_head_lets_the_next_go(s: S) {
    let a1 = insert(&s, "seq", "a1", Some("A")).await;
    let a2 = insert(&s, "seq", "a2", Some("A")).await;
    let r = seq_req("seq", 10, OnDead::Block);
    s.cancel(a1).await.unwrap();
    assert_eq!(ids(&claim(&s, &r).await), vec![a2]);
}

/// Sequential claims: a key's events go one at a time, in arrival order, each only after the previous is done.
pub async fn per_key_claims_one_at_a_time_in_arrival_order(s: S) {
    let a1 = insert(&s, "seq", "a1", Some("A")).await;
    let a2 = insert(&s, "seq", "a2", Some("A")).await;
    let a3 = insert(&s, "seq", "a3", Some("A")).await;
    let r = seq_req("seq", 10, OnDead::Block);
    let c = claim(&s, &r).await;
    assert_eq!(ids(&c), vec![a1]);
    assert!(claim(&s, &r).await.is_empty(), "a2 waits while a1 runs");
    // A retrying head keeps its key blocked.
    s.complete(a1, c[0].token, retry("later", HOUR))
        .await
        .unwrap();
    assert!(claim(&s, &r).await.is_empty(), "a2 waits while a1 retries");
    let a1_again = s.replay(a1, 1).await.unwrap();
    assert_eq!(a1_again.status, Status::Pending);
    let c = claim(&s, &r).await;
    assert_eq!(ids(&c), vec![a1]);
    s.complete(a1, c[0].token, Completion::Done).await.unwrap();
    let c = claim(&s, &r).await;
    assert_eq!(ids(&c), vec![a2]);
    s.complete(a2, c[0].token, Completion::Done).await.unwrap();
    assert_eq!(ids(&claim(&s, &r).await), vec![a3]);
}

/// With OnDead::Block a dead head holds its key until it is skipped (or replayed).
pub async fn per_key_dead_head_blocks_with_block(s: S) {
    let a1 = insert(&s, "seq", "a1", Some("A")).await;
    let a2 = insert(&s, "seq", "a2", Some("A")).await;
    let r = seq_req("seq", 10, OnDead::Block);
    let c = claim(&s, &r).await;
    s.complete(a1, c[0].token, dead("poison")).await.unwrap();
    assert!(claim(&s, &r).await.is_empty(), "dead head blocks");
    assert_eq!(s.next_due(&r).await.unwrap(), None, "nothing claimable");
    s.skip(a1).await.unwrap();
    assert_eq!(ids(&claim(&s, &r).await), vec![a2]);
}

/// With OnDead::Skip a dead head does not hold its key back.
pub async fn per_key_dead_head_lets_the_next_go_with_skip(s: S) {
    let a1 = insert(&s, "seq", "a1", Some("A")).await;
    let a2 = insert(&s, "seq", "a2", Some("A")).await;
    let r = seq_req("seq", 10, OnDead::Skip);
    let c = claim(&s, &r).await;
    assert_eq!(ids(&c), vec![a1]);
    assert!(claim(&s, &r).await.is_empty(), "still one at a time");
    s.complete(a1, c[0].token, dead("poison")).await.unwrap();
    assert_eq!(ids(&claim(&s, &r).await), vec![a2]);
}

/// Different keys run in parallel, and events without a key are independent of each other.
pub async fn per_key_keys_run_in_parallel_and_keyless_events_are_independent(s: S) {
    let a1 = insert(&s, "seq", "a1", Some("A")).await;
    let _a2 = insert(&s, "seq", "a2", Some("A")).await;
    let b1 = insert(&s, "seq", "b1", Some("B")).await;
    let n1 = insert(&s, "seq", "n1", None).await;
    let n2 = insert(&s, "seq", "n2", None).await;
    let _other = insert(&s, "other", "a-elsewhere", Some("A")).await;
    let r = seq_req("seq", 10, OnDead::Block);
    assert_eq!(ids(&claim(&s, &r).await), vec![a1, b1, n1, n2]);
    // The same key in another topic is another key.
    assert_eq!(
        claim(&s, &seq_req("other", 10, OnDead::Block)).await.len(),
        1
    );
}

/// Even when an earlier event is replayed while a later one of its key runs, one key never has two running events.
pub async fn per_key_never_runs_two_events_of_one_key(s: S) {
    let a1 = insert(&s, "seq", "a1", Some("A")).await;
    let a2 = insert(&s, "seq", "a2", Some("A")).await;
    let r = seq_req("seq", 10, OnDead::Block);
    let c = claim(&s, &r).await;
    s.complete(a1, c[0].token, Completion::Done).await.unwrap();
    let c2 = claim(&s, &r).await;
    assert_eq!(ids(&c2), vec![a2]);
    s.replay(a1, 1).await.unwrap();
    assert!(claim(&s, &r).await.is_empty(), "a2 is running");
    s.complete(a2, c2[0].token, Completion::Done).await.unwrap();
    assert_eq!(ids(&claim(&s, &r).await), vec![a1]);
}

/// next_due is the earliest time a claim could take something: None when empty, only heads for sequential topics.
pub async fn next_due_reports_the_earliest_claimable_time(s: S) {
    let r = req("orders", 10);
    assert_eq!(s.next_due(&r).await.unwrap(), None);
    let id = insert(&s, "orders", "e", None).await;
    let due = s.next_due(&r).await.unwrap().unwrap();
    assert!(due <= s.now().await.unwrap());
    let c = claim(&s, &r).await.remove(0);
    assert_eq!(
        s.next_due(&r).await.unwrap(),
        None,
        "running is not pending"
    );
    s.complete(id, c.token, retry("x", HOUR)).await.unwrap();
    let later = s.next_due(&r).await.unwrap().unwrap();
    assert_eq!(
        Some(later),
        s.get(id).await.unwrap().unwrap().next_attempt_at
    );
    // Sequential: an event behind a retrying head of its key is not claimable.
    let sr = seq_req("seq", 10, OnDead::Block);
    let h = insert(&s, "seq", "h", Some("K")).await;
    let hc = claim(&s, &sr).await.remove(0);
    s.complete(h, hc.token, retry("x", HOUR)).await.unwrap();
    insert(&s, "seq", "behind", Some("K")).await;
    let head_due = s.next_due(&sr).await.unwrap().unwrap();
    assert_eq!(
        Some(head_due),
        s.get(h).await.unwrap().unwrap().next_attempt_at
    );
}

/// Lists are newest first, filter by topic, status and key, and page with cursors without gaps or repeats.
pub async fn list_filters_and_pages_newest_first(s: S) {
    let mut inserted = Vec::new();
    for i in 0..25 {
        let topic = if i % 2 == 0 { "even" } else { "odd" };
        let key = if i % 5 == 0 { Some("five") } else { None };
        inserted.push(insert(&s, topic, &format!("e{i}"), key).await);
    }
    let all = s.list(&ListFilter::default()).await.unwrap();
    let newest_first: Vec<EventId> = inserted.iter().rev().copied().collect();
    assert_eq!(
        all.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        newest_first
    );
    assert_eq!(all.next_cursor, None);
    assert!(all.events.iter().all(|e| e.history.is_empty()));

    let mut paged = Vec::new();
    let mut filter = ListFilter {
        limit: 10,
        ..ListFilter::default()
    };
    loop {
        let page = s.list(&filter).await.unwrap();
        assert!(page.events.len() <= 10);
        paged.extend(page.events.iter().map(|e| e.id));
        match page.next_cursor {
            Some(cursor) => filter.cursor = Some(cursor),
            None => break,
        }
    }
    assert_eq!(paged, newest_first);

    let even = ListFilter {
        topic: Some("even".into()),
        ..ListFilter::default()
    };
    assert_eq!(s.list(&even).await.unwrap().events.len(), 13);
    let five = ListFilter {
        key: Some("five".into()),
        ..ListFilter::default()
    };
    assert_eq!(s.list(&five).await.unwrap().events.len(), 5);
    let c = claim(&s, &req("odd", 2)).await;
    let running = ListFilter {
        topic: Some("odd".into()),
        status: Some(Status::Running),
        ..ListFilter::default()
    };
    let listed: Vec<EventId> = s
        .list(&running)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(listed, vec![c[1].event.id, c[0].event.id]);
    let nothing = ListFilter {
        topic: Some("even".into()),
        status: Some(Status::Dead),
        ..ListFilter::default()
    };
    assert!(s.list(&nothing).await.unwrap().events.is_empty());
}

/// Stats count events per status and topic, report the oldest pending arrival and the keys blocked by a dead head.
pub async fn stats_count_statuses_oldest_pending_and_blocked_keys(s: S) {
    assert!(s.stats().await.unwrap().is_empty());
    let first = insert(&s, "seq", "a1", Some("A")).await;
    insert(&s, "seq", "a2", Some("A")).await;
    insert(&s, "seq", "b1", Some("B")).await;
    insert(&s, "seq", "c1", Some("C")).await;
    insert(&s, "other", "o1", None).await;
    let r = seq_req("seq", 10, OnDead::Block);
    let c = claim(&s, &r).await;
    assert_eq!(c.len(), 3);
    // A and B die; C stays running. A has a pending event behind; B has none.
    for cl in &c {
        if cl.event.key.as_deref() != Some("C") {
            s.complete(cl.event.id, cl.token, dead("x")).await.unwrap();
        }
    }
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.len(), 2);
    let seq = stats.iter().find(|t| t.topic == "seq").unwrap();
    assert_eq!(seq.count(Status::Dead), 2);
    assert_eq!(seq.count(Status::Pending), 1);
    assert_eq!(seq.count(Status::Running), 1);
    assert_eq!(seq.count(Status::Done), 0);
    assert_eq!(seq.blocked_keys, 2, "a dead head blocks its key");
    let a2 = s.get(first).await.unwrap().unwrap();
    assert!(seq.oldest_pending.unwrap() >= a2.received_at);
    let other = stats.iter().find(|t| t.topic == "other").unwrap();
    assert_eq!(other.count(Status::Pending), 1);
    assert_eq!(other.blocked_keys, 0);
    assert!(other.oldest_pending.is_some());
    // Skipping A's head unblocks A.
    s.skip(first).await.unwrap();
    let stats = s.stats().await.unwrap();
    let seq = stats.iter().find(|t| t.topic == "seq").unwrap();
    assert_eq!(seq.blocked_keys, 1);
    assert_eq!(seq.count(Status::Skipped), 1);
}

async fn finish(s: &S, topic: &str, completion: Completion) -> EventId {
    let c = claim(s, &req(topic, 1)).await.remove(0);
    s.complete(c.event.id, c.token, completion).await.unwrap();
    c.event.id
}

/// Purge drops payloads of old done and dead events but keeps their rows, so a re-delivery is still a duplicate.
pub async fn purge_drops_payloads_but_keeps_dedup(s: S) {
    insert(&s, "orders", "done", None).await;
    let done = finish(&s, "orders", Completion::Done).await;
    insert(&s, "orders", "dead", None).await;
    let dead_id = finish(&s, "orders", dead("x")).await;
    let pending = insert(&s, "orders", "pending", None).await;
    tick().await;
    let keep = Retention {
        done: HOUR,
        dead: HOUR,
        dedup: HOUR,
    };
    assert_eq!(
        s.purge(keep).await.unwrap(),
        Default::default(),
        "nothing is old enough"
    );
    let report = s
        .purge(Retention {
            done: Duration::ZERO,
            dead: Duration::ZERO,
            dedup: HOUR,
        })
        .await
        .unwrap();
    assert_eq!(report.payloads_dropped, 2);
    assert_eq!(report.rows_deleted, 0);
    for id in [done, dead_id] {
        let e = s.get(id).await.unwrap().unwrap();
        assert_eq!(e.payload, None);
        assert_eq!(e.history.len(), 1);
    }
    assert!(s.get(pending).await.unwrap().unwrap().payload.is_some());
    let again = s.insert(event("orders", "done", None)).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.id, done);
}

/// Purge deletes finished rows (and history) past the dedup window, which ends dedup for them; open events stay.
pub async fn purge_deletes_rows_past_the_dedup_window(s: S) {
    insert(&s, "orders", "done", None).await;
    let done = finish(&s, "orders", Completion::Done).await;
    insert(&s, "orders", "dead", None).await;
    let dead_id = finish(&s, "orders", dead("x")).await;
    let pending = insert(&s, "orders", "pending", None).await;
    tick().await;
    let report = s
        .purge(Retention {
            done: Duration::ZERO,
            dead: Duration::ZERO,
            dedup: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(report.rows_deleted, 1);
    assert!(s.get(done).await.unwrap().is_none());
    assert!(
        s.get(dead_id).await.unwrap().is_some(),
        "dead events wait for an operator"
    );
    assert!(s.get(pending).await.unwrap().is_some());
    let again = s.insert(event("orders", "done", None)).await.unwrap();
    assert!(!again.duplicate, "the dedup window has passed");
}

/// Drops the payloads of done events (dead ones keep theirs) received
/// before now.
async fn purge_done_payloads(s: &S) {
    tick().await;
    s.purge(Retention {
        done: Duration::ZERO,
        dead: HOUR,
        dedup: HOUR,
    })
    .await
    .unwrap();
}

/// Replaying an event whose payload retention purged is refused with
/// `Purged` and changes nothing (its handler would get an empty body); a
/// dead event whose payload is kept still replays.
pub async fn replay_of_a_purged_event_is_refused(s: S) {
    insert(&s, "orders", "done", None).await;
    let done = finish(&s, "orders", Completion::Done).await;
    insert(&s, "orders", "dead", None).await;
    let dead_id = finish(&s, "orders", dead("x")).await;
    purge_done_payloads(&s).await;
    let before = s.get(done).await.unwrap().unwrap();
    assert_eq!(before.payload, None, "purged");
    match s.replay(done, 3).await {
        Err(StoreError::Purged(id)) => assert_eq!(id, done),
        other => panic!("expected Purged, got {other:?}"),
    }
    assert_eq!(s.get(done).await.unwrap().unwrap(), before, "unchanged");
    assert!(claim(&s, &req("orders", 10)).await.is_empty());
    assert_eq!(s.replay(dead_id, 3).await.unwrap().status, Status::Pending);
}

/// A bulk replay leaves the events whose payload was purged and counts
/// them; the others matching are replayed.
pub async fn replay_matching_skips_and_counts_purged_events(s: S) {
    for i in 0..2 {
        insert(&s, "orders", &format!("done-{i}"), None).await;
        finish(&s, "orders", Completion::Done).await;
    }
    insert(&s, "orders", "dead", None).await;
    let dead_id = finish(&s, "orders", dead("x")).await;
    purge_done_payloads(&s).await;
    let all = ListFilter {
        topic: Some("orders".into()),
        ..ListFilter::default()
    };
    let report = s.replay_matching(&all, 3).await.unwrap();
    assert_eq!((report.replayed, report.skipped_purged), (1, 2));
    for e in s.list(&all).await.unwrap().events {
        let expected = if e.id == dead_id {
            Status::Pending
        } else {
            Status::Done
        };
        assert_eq!(e.status, expected, "{}", e.dedup_key);
    }
    let claimed = claim(&s, &req("orders", 10)).await;
    assert_eq!(ids(&claimed), vec![dead_id]);
}

/// A search narrows a listing by error text (exact case) and by a
/// received-at range [from, until), pages newest first like a list, and
/// `count` counts what it matches; without those filters it is the list.
pub async fn search_filters_on_error_text_and_time_and_counts_matches(s: S) {
    let mut at = Vec::new();
    for (topic, dedup) in [
        ("orders", "a"),
        ("orders", "b"),
        ("orders", "c"),
        ("other", "d"),
    ] {
        let id = insert(&s, topic, dedup, None).await;
        at.push((id, s.get(id).await.unwrap().unwrap().received_at));
        tick().await;
    }
    let a = finish(&s, "orders", dead("HTTP 500: warehouse down")).await;
    let b = finish(&s, "orders", dead("timeout after 30s")).await;
    finish(&s, "orders", Completion::Done).await;
    let d = finish(&s, "other", dead("HTTP 500: other")).await;
    let search = |topic: Option<&str>, error: Option<&str>| EventSearch {
        filter: ListFilter {
            topic: topic.map(Into::into),
            status: Some(Status::Dead),
            ..ListFilter::default()
        },
        error_contains: error.map(Into::into),
        ..EventSearch::default()
    };
    let found = |q: EventSearch| {
        let s = s.clone();
        async move {
            let page = s.search(&q).await.unwrap();
            let n = s.count(&q).await.unwrap();
            (page.events.iter().map(|e| e.id).collect::<Vec<_>>(), n)
        }
    };
    assert_eq!(found(search(None, Some("HTTP 500"))).await, (vec![d, a], 2));
    assert_eq!(
        found(search(Some("orders"), Some("HTTP 500"))).await,
        (vec![a], 1)
    );
    assert_eq!(
        found(search(None, Some("http 500"))).await,
        (vec![], 0),
        "exact case"
    );
    let plain = s.list(&search(None, None).filter).await.unwrap();
    let all_dead: Vec<EventId> = plain.events.iter().map(|e| e.id).collect();
    assert_eq!(
        found(search(None, None)).await,
        (all_dead, 3),
        "no extra filter: the list"
    );

    let mut range = search(None, None);
    range.filter.status = None;
    range.received_from = Some(at[1].1);
    range.received_until = Some(at[3].1);
    assert_eq!(
        found(range.clone()).await,
        (vec![at[2].0, b], 2),
        "[from, until)"
    );
    range.received_until = None;
    range.filter.limit = 2;
    let first = s.search(&range).await.unwrap();
    assert_eq!(
        first.events.iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![d, at[2].0]
    );
    range.filter.cursor = first.next_cursor;
    let second = s.search(&range).await.unwrap();
    assert_eq!(
        (second.events.len(), second.events[0].id, second.next_cursor),
        (1, b, None)
    );
    assert_eq!(s.count(&range).await.unwrap(), 3, "count ignores the page");
}

/// Throughput counts, per topic and minute, the events received and the
/// attempts done and failed, in minutes of the window.
pub async fn throughput_counts_received_and_finished_per_minute(s: S) {
    let started = s.now().await.unwrap();
    for i in 0..3 {
        insert(&s, "orders", &format!("o-{i}"), None).await;
    }
    insert(&s, "other", "x", None).await;
    finish(&s, "orders", Completion::Done).await;
    finish(&s, "orders", retry("busy", HOUR)).await;
    finish(&s, "other", Completion::Done).await;
    let rows = s.throughput(Duration::from_secs(600)).await.unwrap();
    let total = |topic: &str| {
        rows.iter()
            .filter(|t| t.topic == topic)
            .fold((0, 0, 0), |(r, d, f), t| {
                (r + t.received, d + t.done, f + t.failed)
            })
    };
    assert_eq!(total("orders"), (3, 1, 1));
    assert_eq!(total("other"), (1, 1, 0));
    let first_minute = started.as_second() - started.as_second().rem_euclid(60);
    for t in &rows {
        assert_eq!(t.minute.as_second() % 60, 0, "minutes start on the minute");
        assert_eq!(t.minute.subsec_nanosecond(), 0);
        assert!(
            t.minute.as_second() >= first_minute - 60,
            "{t:?} after {started}"
        );
    }
}

/// `n` events of `topic` with dedup keys `{prefix}{i}`, priority
/// `priority`, stored a few at a time concurrently (in arrival order
/// chunk by chunk); their ids in that order.
async fn insert_many(s: &S, topic: &str, prefix: &str, n: usize, priority: i32) -> Vec<EventId> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
        let inserts: Vec<_> = chunk
            .iter()
            .map(|i| {
                let mut e = event(topic, &format!("{prefix}{i}"), None);
                e.priority = priority;
                let s = s.clone();
                tokio::spawn(async move { s.insert(e).await })
            })
            .collect();
        for answer in inserts {
            ids.push(answer.await.unwrap().unwrap().id);
        }
    }
    ids
}

/// Claims take the highest priority first, then arrival order; negative
/// priorities come after the default 0; the event shows its priority.
pub async fn claims_take_higher_priority_first(s: S) {
    let mut order = Vec::new();
    for (dedup, priority) in [
        ("z1", 0),
        ("n1", -3),
        ("h1", 5),
        ("z2", 0),
        ("m1", 2),
        ("h2", 5),
    ] {
        let mut e = event("orders", dedup, None);
        e.priority = priority;
        order.push((dedup, s.insert(e).await.unwrap().id));
    }
    let id = |d: &str| order.iter().find(|(x, _)| *x == d).unwrap().1;
    let first = claim(&s, &req("orders", 3)).await;
    assert_eq!(ids(&first), vec![id("h1"), id("h2"), id("m1")]);
    assert_eq!(first[0].event.priority, 5);
    let rest = claim(&s, &req("orders", 10)).await;
    assert_eq!(ids(&rest), vec![id("z1"), id("z2"), id("n1")]);
    assert_eq!(s.get(id("n1")).await.unwrap().unwrap().priority, -3);
    // A replay keeps the event's priority.
    for c in first.iter().chain(&rest) {
        s.complete(c.event.id, c.token, Completion::Done)
            .await
            .unwrap();
    }
    s.replay(id("z1"), 1).await.unwrap();
    s.replay(id("h1"), 1).await.unwrap();
    assert_eq!(
        ids(&claim(&s, &req("orders", 10)).await),
        vec![id("h1"), id("z1")]
    );
}

/// A backlog of 10,000 events of priority 0, then 100 of priority 10:
/// claims of 50 take all 100 before any more than the next 500 of the
/// backlog.
pub async fn a_backlog_of_low_then_high_events_starts_the_high_ones_first(s: S) {
    let low = insert_many(&s, "bulk", "low-", 10_000, 0).await;
    // A claim already running through the backlog when the high ones come.
    let first = claim(&s, &req("bulk", 50)).await;
    assert_eq!(first.len(), 50);
    assert!(
        first.iter().all(|c| low[..64].contains(&c.event.id)),
        "oldest first"
    );
    let high: HashSet<EventId> = insert_many(&s, "bulk", "high-", 100, 10)
        .await
        .into_iter()
        .collect();
    let (mut high_seen, mut low_after) = (0, 0);
    while high_seen < high.len() {
        let batch = claim(&s, &req("bulk", 50)).await;
        assert!(
            !batch.is_empty(),
            "the backlog ran dry before the high ones ran"
        );
        for c in &batch {
            if high.contains(&c.event.id) {
                high_seen += 1;
            } else {
                low_after += 1;
            }
            s.complete(c.event.id, c.token, Completion::Done)
                .await
                .unwrap();
        }
    }
    assert!(
        low_after <= 500,
        "{low_after} low events ran before the last high one"
    );
}

/// The starvation bound: with `max_wait_for_priority` of 1 s, low events
/// behind a steady stream of higher ones (enough to fill every claim) all
/// run, each within the bound (plus the claim cadence) of being due;
/// without it, none would.
pub async fn a_low_priority_event_waits_at_most_max_wait_behind_higher_ones(s: S) {
    let bound = Duration::from_secs(1);
    let r = ClaimRequest {
        max_wait_for_priority: Some(bound),
        ..req("stream", 10)
    };
    // Each low event is due when its insert commits: between `inserting`
    // and `due` (the inserts run at once; under load they take a while).
    let inserting = s.now().await.unwrap();
    let low: HashSet<EventId> = insert_many(&s, "stream", "low-", 5, 0)
        .await
        .into_iter()
        .collect();
    let due = s.now().await.unwrap();
    let mut ran_low = HashMap::new();
    let mut round = 0;
    while ran_low.len() < low.len() {
        let now = s.now().await.unwrap();
        assert!(
            now < due + Duration::from_secs(6),
            "low events still waiting at {now} (due {due}); ran {ran_low:?}"
        );
        insert_many(&s, "stream", &format!("high-{round}-"), 10, 5).await;
        round += 1;
        for c in claim(&s, &r).await {
            if low.contains(&c.event.id) {
                ran_low.insert(c.event.id, s.now().await.unwrap());
            }
            s.complete(c.event.id, c.token, Completion::Done)
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for at in ran_low.values() {
        // The bound, plus the stores' raise cadence and the rounds' pace.
        assert!(
            *at <= due + bound + Duration::from_millis(2500),
            "ran at {at}, due {due}"
        );
        assert!(
            *at >= inserting + bound - Duration::from_millis(100),
            "ran at {at} before its wait (inserted from {inserting})"
        );
    }
}

/// Events delivered later are held out of claims until due; a held event
/// holds back the later events of its key (per-key order); once due it
/// runs first.
pub async fn a_delayed_head_holds_back_its_key_until_due(s: S) {
    let mut later = event("orders", "k-1", Some("k"));
    later.delivery = Delivery::After(Duration::from_millis(1500));
    let first = s.insert(later).await.unwrap().id;
    let second = insert(&s, "orders", "k-2", Some("k")).await;
    let other = insert(&s, "orders", "j-1", Some("j")).await;
    let r = seq_req("orders", 10, OnDead::Block);
    assert_eq!(ids(&claim(&s, &r).await), vec![other]);
    let due = s
        .get(first)
        .await
        .unwrap()
        .unwrap()
        .next_attempt_at
        .unwrap();
    let next = s.next_due(&r).await.unwrap().unwrap();
    assert!(next <= due, "next due {next} after the held head's {due}");
    while s.now().await.unwrap() < due {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = claim(&s, &r).await;
    assert_eq!(ids(&c), vec![first], "the held head, once due, and alone");
    s.complete(first, c[0].token, Completion::Done)
        .await
        .unwrap();
    assert_eq!(ids(&claim(&s, &r).await), vec![second]);
}

/// With `expire_after`, a pending event whose clock ran out is not
/// claimed; `expire` moves it to `expired` with the reason, counted and
/// listed; a delayed event's clock starts when it is due; a replay makes
/// an expired event pending again with a fresh clock.
pub async fn expired_events_are_not_run_and_replay_restarts_their_clock(s: S) {
    let after = Duration::from_millis(800);
    let r = ClaimRequest {
        expire_after: Some(after),
        ..req("quotes", 10)
    };
    let old = insert(&s, "quotes", "old", None).await;
    let mut delayed = event("quotes", "delayed", None);
    delayed.delivery = Delivery::After(Duration::from_millis(700));
    let delayed = s.insert(delayed).await.unwrap().id;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let fresh = insert(&s, "quotes", "fresh", None).await;
    let c = claim(&s, &r).await;
    let mut taken = ids(&c);
    taken.sort();
    let mut want = vec![fresh, delayed];
    want.sort();
    assert_eq!(
        taken, want,
        "the old one expired; the delayed one's clock started when due"
    );
    let next = s.next_due(&r).await.unwrap();
    assert!(next.is_none(), "an expired event is not due: {next:?}");
    assert_eq!(s.expire("quotes", after, 100).await.unwrap(), 1);
    assert_eq!(s.expire("quotes", after, 100).await.unwrap(), 0);
    let e = s.get(old).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Expired);
    assert!(e.last_error.unwrap().contains("expire_after"));
    let stats = s.stats().await.unwrap();
    let quotes = stats.iter().find(|t| t.topic == "quotes").unwrap();
    assert_eq!(quotes.count(Status::Expired), 1);
    let listed = s
        .list(&ListFilter {
            status: Some(Status::Expired),
            limit: 10,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.events.len(), 1);
    let replayed = s.replay(old, 3).await.unwrap();
    assert_eq!(replayed.status, Status::Pending);
    assert_eq!(
        ids(&claim(&s, &r).await),
        vec![old],
        "replayed with a fresh clock"
    );
}

/// Every stored event by topic and status, counted by listing them all
/// (what the stats counters must agree with).
async fn full_count(s: &S) -> std::collections::BTreeMap<(String, &'static str), u64> {
    let mut tally = std::collections::BTreeMap::new();
    let mut filter = ListFilter {
        limit: 1000,
        ..ListFilter::default()
    };
    loop {
        let page = s.list(&filter).await.unwrap();
        for e in &page.events {
            *tally
                .entry((e.topic.clone(), e.status.as_str()))
                .or_insert(0) += 1;
        }
        match page.next_cursor {
            Some(c) => filter.cursor = Some(c),
            None => return tally,
        }
    }
}

/// Compares the stats counters and the dead-letter counts with
/// [`full_count`]; returns the full count.
async fn assert_counters_exact(
    s: &S,
    after: &str,
) -> std::collections::BTreeMap<(String, &'static str), u64> {
    let full = full_count(s).await;
    let stats = s.stats().await.unwrap();
    let mut counted = std::collections::BTreeMap::new();
    for t in &stats {
        for status in Status::ALL {
            if t.count(status) > 0 {
                counted.insert((t.topic.clone(), status.as_str()), t.count(status));
            }
        }
    }
    assert_eq!(counted, full, "stats counters after {after}");
    let dead_search = |topic: Option<&str>| EventSearch {
        filter: ListFilter {
            topic: topic.map(str::to_owned),
            status: Some(Status::Dead),
            limit: 1000,
            ..ListFilter::default()
        },
        ..EventSearch::default()
    };
    for topic in [None, Some("orders"), Some("other")] {
        let expected: u64 = full
            .iter()
            .filter(|((t, st), _)| *st == "dead" && topic.is_none_or(|x| x == t))
            .map(|(_, n)| n)
            .sum();
        let search = dead_search(topic);
        assert_eq!(
            s.count(&search).await.unwrap(),
            expected,
            "dead in {topic:?} after {after}"
        );
        let listed = s.search(&search).await.unwrap().events;
        assert_eq!(
            listed.len() as u64,
            expected,
            "dead listed in {topic:?} after {after}"
        );
        assert!(listed.iter().all(|e| e.status == Status::Dead));
    }
    full
}

/// The stats counters (events per topic and status), the dead letters and
/// the traffic per minute stay exact through a mixed workload — claims,
/// completions done, retried and dead, lease rescue, replay of one and of
/// every match, skip, cancel of one and of every match, folding, and
/// retention deleting rows — compared with a full count of the events and
/// their attempt history.
pub async fn stats_counters_match_a_full_count_after_a_mixed_workload(s: S) {
    for i in 0..14 {
        let key = (i % 3 == 0).then(|| format!("k{i}"));
        insert(&s, "orders", &format!("o-{i}"), key.as_deref()).await;
    }
    for i in 0..6 {
        insert(&s, "other", &format!("x-{i}"), None).await;
    }
    for _ in 0..3 {
        finish(&s, "orders", Completion::Done).await;
    }
    let mut dead_ids = Vec::new();
    for _ in 0..4 {
        dead_ids.push(finish(&s, "orders", dead("boom")).await);
    }
    finish(&s, "orders", retry("busy", HOUR)).await;
    claim(&s, &req("orders", 2)).await; // stays running
    let mut short = req("other", 2);
    short.lease = Duration::from_millis(1);
    claim(&s, &short).await;
    finish(&s, "other", Completion::Done).await;
    assert_counters_exact(&s, "claims and completions").await;
    tick().await;
    assert_eq!(s.rescue_expired().await.unwrap(), 2);
    s.fold_counters().await.unwrap();
    assert_counters_exact(&s, "rescue and a fold").await;

    s.replay(dead_ids[0], 3).await.unwrap();
    s.skip(dead_ids[1]).await.unwrap();
    let pending = s
        .list(&ListFilter {
            topic: Some("orders".into()),
            status: Some(Status::Pending),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    s.cancel(pending.events[0].id).await.unwrap();
    assert_counters_exact(&s, "replay, skip and cancel").await;
    s.cancel_matching(&ListFilter {
        topic: Some("other".into()),
        ..ListFilter::default()
    })
    .await
    .unwrap();
    let dead_orders = ListFilter {
        topic: Some("orders".into()),
        status: Some(Status::Dead),
        ..ListFilter::default()
    };
    assert_eq!(
        s.replay_matching(&dead_orders, 2).await.unwrap().replayed,
        2
    );
    finish(&s, "orders", dead("again")).await;
    assert_counters_exact(&s, "bulk cancel and replay").await;

    // Traffic: every insert received, every attempt finished, in the window.
    let mut attempts = (0, 0);
    for e in s
        .list(&ListFilter {
            limit: 1000,
            ..ListFilter::default()
        })
        .await
        .unwrap()
        .events
    {
        for a in &s.get(e.id).await.unwrap().unwrap().history {
            match a.outcome {
                AttemptOutcome::Done => attempts.0 += 1,
                _ => attempts.1 += 1,
            }
        }
    }
    let traffic = s.throughput(HOUR).await.unwrap();
    let sum = traffic.iter().fold((0, 0, 0), |(r, d, f), t| {
        (r + t.received, d + t.done, f + t.failed)
    });
    assert_eq!(
        sum,
        (20, attempts.0, attempts.1),
        "traffic: received, done, failed"
    );
    s.fold_counters().await.unwrap();
    let folded = s.throughput(HOUR).await.unwrap();
    assert_eq!(folded, traffic, "folding changes no answer");

    tick().await;
    let purged = s
        .purge(Retention {
            done: Duration::ZERO,
            dead: Duration::ZERO,
            dedup: Duration::ZERO,
        })
        .await
        .unwrap();
    assert!(purged.rows_deleted >= 4, "{purged:?}");
    let full = assert_counters_exact(&s, "retention").await;
    assert!(!full.keys().any(|(_, st)| matches!(*st, "done" | "skipped")));
    s.fold_counters().await.unwrap();
    assert_counters_exact(&s, "the last fold").await;
}

/// An event's version reaches whoever claims it, by every claim path
/// (independent, sequential heads, keyless events of a sequential topic,
/// and the skip-dead variant); an event stored without one claims with none.
pub async fn claimed_events_carry_their_version(s: S) {
    let versioned = |topic: &str, dedup: &str, key: Option<&str>, v: Option<&str>| {
        let mut e = event(topic, dedup, key);
        e.version = v.map(str::to_owned);
        e
    };
    let rows = [
        versioned("any", "a1", Some("k"), Some("3")),
        versioned("any", "a2", None, None),
        versioned("seq", "s1", Some("k"), Some("4")),
        versioned("seq", "s2", None, Some("5")),
        versioned("dead", "d1", Some("k"), Some("6")),
    ];
    for e in rows {
        s.insert(e).await.unwrap();
    }
    let versions = |claimed: Vec<Claimed>| -> Vec<(String, Option<String>)> {
        let mut v: Vec<_> = claimed
            .into_iter()
            .map(|c| (c.event.dedup_key, c.event.version))
            .collect();
        v.sort();
        v
    };
    let some = |d: &str, v: Option<&str>| (d.to_string(), v.map(str::to_owned));
    assert_eq!(
        versions(claim(&s, &req("any", 10)).await),
        [some("a1", Some("3")), some("a2", None)]
    );
    assert_eq!(
        versions(claim(&s, &seq_req("seq", 10, OnDead::Block)).await),
        [some("s1", Some("4")), some("s2", Some("5"))]
    );
    assert_eq!(
        versions(claim(&s, &seq_req("dead", 10, OnDead::Skip)).await),
        [some("d1", Some("6"))]
    );
}
