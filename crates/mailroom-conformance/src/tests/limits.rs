//! Scheduling limits: the rate budget, `max_running` claims and
//! topic pauses.

use super::{S, claim, insert, insert_many, req};
use mailroom_core::{ClaimLimits, ClaimRequest, Claimed, Completion, LimitedClaim, Rate};
use std::time::{Duration, Instant};

fn rate(s: &str) -> Rate {
    Rate::parse(s).unwrap()
}

/// A claim of `r` within `rate` and `max_running`.
async fn limited(
    s: &S,
    r: &ClaimRequest,
    rate: Option<Rate>,
    max_running: Option<u32>,
) -> LimitedClaim {
    let limits = ClaimLimits { rate, max_running };
    s.claim_limited(r, limits).await.unwrap()
}

/// (claimed, asked, capped) of a claim that was not told to wait.
fn took(l: LimitedClaim) -> (Vec<Claimed>, u32, bool) {
    match l {
        LimitedClaim::Claimed {
            claimed,
            asked,
            capped,
        } => (claimed, asked, capped),
        LimitedClaim::Wait(d) => panic!("told to wait {d:?}"),
    }
}

/// When the store stamped a claim: its lease's end less the lease, µs.
fn stamp(c: &Claimed, r: &ClaimRequest) -> i64 {
    c.lease_until.as_microsecond() - i64::try_from(r.lease.as_micros()).unwrap()
}

/// A budget starts with one grant, never holds more than one, refills at
/// the rate and says how long to wait when empty; tokens a short claim did
/// not use stay in it; topics have budgets of their own.
pub async fn rate_budget_holds_one_grant_and_refills_at_the_rate(s: S) {
    let r = rate("100/s");
    assert_eq!(r.grant(), 10);
    insert_many(&s, "mail", "m", 40, 0).await;
    insert_many(&s, "other", "o", 5, 0).await;
    let since = Instant::now();
    let (first, asked, _) = took(limited(&s, &req("mail", 50), Some(r), None).await);
    assert_eq!((first.len(), asked), (10, 10), "one grant");
    match limited(&s, &req("mail", 50), Some(r), None).await {
        LimitedClaim::Wait(d) => {
            assert!(
                d > Duration::ZERO && d <= Duration::from_millis(100),
                "{d:?}"
            );
        }
        LimitedClaim::Claimed { claimed, .. } => {
            // Only what refilled since the first claim, never more than
            // one grant (a full one once 100 ms have passed: a loaded
            // machine can take that long between the two claims).
            let refill = (since.elapsed().as_secs_f64() * 100.0).ceil() as usize;
            assert!(
                claimed.len() <= refill.min(usize::try_from(r.grant()).unwrap()),
                "{} claimed, refill {refill}",
                claimed.len()
            );
        }
    }
    let (other, ..) = took(limited(&s, &req("other", 3), Some(r), None).await);
    assert_eq!(other.len(), 3, "a budget of its own");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (refilled, ..) = took(limited(&s, &req("mail", 50), Some(r), None).await);
    assert_eq!(refilled.len(), 10, "capped at one grant");
    // Unused tokens are not spent: 3 of a fresh grant of 10 claimed, then
    // 10 more events; the next claim gets the 7 left plus the refill.
    insert_many(&s, "short", "s", 3, 0).await;
    let (short, asked, _) = took(limited(&s, &req("short", 10), Some(r), None).await);
    assert_eq!((short.len(), asked), (3, 10));
    let since = Instant::now();
    insert_many(&s, "short", "t", 10, 0).await;
    let (rest, ..) = took(limited(&s, &req("short", 10), Some(r), None).await);
    let refill = (since.elapsed().as_secs_f64() * 100.0).ceil() as usize;
    assert!(
        rest.len() >= 7 && rest.len() <= (7 + refill).min(10),
        "{} claimed, refill {refill}",
        rest.len()
    );
}

/// Claimers racing for one budget get, together, no more than the first
/// grant plus the rate over the time they took, and no window of their
/// claims' stamps (the store's clock) holds more than the rate over it
/// plus one grant.
pub async fn concurrent_takers_share_one_rate_budget(s: S) {
    let r = rate("200/s");
    insert_many(&s, "mail", "m", 400, 0).await;
    let started = Instant::now();
    let takers: Vec<_> = (0..6)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                let ask = req("mail", 7);
                let mut stamps = Vec::new();
                while started.elapsed() < Duration::from_millis(800) {
                    match limited(&s, &ask, Some(r), None).await {
                        LimitedClaim::Claimed { claimed, .. } => {
                            stamps.extend(claimed.iter().map(|c| stamp(c, &ask)));
                        }
                        LimitedClaim::Wait(d) => {
                            tokio::time::sleep(d.min(Duration::from_millis(20))).await;
                        }
                    }
                }
                stamps
            })
        })
        .collect();
    let mut stamps = Vec::new();
    for t in takers {
        stamps.extend(t.await.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    let total = stamps.len();
    let most = 20.0 + 200.0 * secs + 1.0;
    assert!(total as f64 <= most, "{total} claims in {secs:.3} s");
    assert!(total >= 100, "only {total} claims in {secs:.3} s");
    stamps.sort_unstable();
    let mut end = 0;
    for (i, &from) in stamps.iter().enumerate() {
        while end < stamps.len() && stamps[end] < from + 250_000 {
            end += 1;
        }
        // 200/s over 250 ms, one grant of 20, and 1 for the stores' clock
        // resolution (SQLite stamps whole milliseconds).
        assert!(
            end - i <= 50 + 20 + 1,
            "{} claims stamped within 250 ms",
            end - i
        );
    }
}

/// A claim of up to `n` exports while at most 3 run.
async fn capped(s: &S, n: u32) -> LimitedClaim {
    limited(s, &req("exports", n), None, Some(3)).await
}

/// A capped claim takes only the room `max_running` leaves (running events
/// of the topic, however claimed), says when the cap cut it short, and
/// concurrent capped claims never fill the same room twice; with a rate
/// too, the room lowers what is asked of the budget.
pub async fn capped_claims_keep_running_events_within_max_running(s: S) {
    for i in 0..20 {
        insert(&s, "exports", &format!("e{i}"), None).await;
    }
    let first = claim(&s, &req("exports", 1)).await.remove(0);
    let (got, _, cut) = took(capped(&s, 8).await);
    assert_eq!((got.len(), cut), (2, true));
    let (got, asked, cut) = took(capped(&s, 8).await);
    assert_eq!((got.len(), asked, cut), (0, 8, true));
    let r = rate("100/s");
    let (got, _, cut) = took(limited(&s, &req("exports", 8), Some(r), Some(3)).await);
    assert_eq!((got.len(), cut), (0, true), "full room");
    s.complete(first.event.id, first.token, Completion::Done)
        .await
        .unwrap();
    let (got, _, cut) = took(capped(&s, 1).await);
    assert_eq!((got.len(), cut), (1, false), "room 1 for an ask of 1");
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                took(limited(&s, &req("exports", 2), None, Some(7)).await)
                    .0
                    .len()
            })
        })
        .collect();
    let mut total = 0;
    for r in racers {
        total += r.await.unwrap();
    }
    assert_eq!(total, 4, "7 minus the 3 running");
    let (got, asked, cut) = took(limited(&s, &req("exports", 20), Some(r), Some(10)).await);
    assert_eq!(
        (got.len(), asked, cut),
        (3, 3, true),
        "the room, within the grant"
    );
    insert(&s, "quiet", "q", None).await;
    let (got, _, cut) = took(limited(&s, &req("quiet", 5), None, Some(10)).await);
    assert_eq!(
        (got.len(), cut),
        (1, false),
        "a short backlog is not the cap"
    );
}

/// A pause is read back (on the store clock) until it ends, a shorter one
/// does not cut it, and other topics are not paused.
pub async fn a_topic_pause_lasts_its_time_and_is_only_lengthened(s: S) {
    assert_eq!(s.paused_for("mail").await.unwrap(), None);
    let until = s.pause_topic("mail", Duration::from_secs(2)).await.unwrap();
    let now = s.now().await.unwrap();
    let ahead = until.as_millisecond() - now.as_millisecond();
    assert!((1500..=2000).contains(&ahead), "{ahead} ms");
    let again = s
        .pause_topic("mail", Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(again, until, "a shorter pause keeps the longer one");
    let left = s.paused_for("mail").await.unwrap().unwrap();
    assert!(
        left > Duration::from_millis(1500) && left <= Duration::from_secs(2),
        "{left:?}"
    );
    assert_eq!(s.paused_for("orders").await.unwrap(), None);
    s.pause_topic("orders", Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.paused_for("orders").await.unwrap(), None, "over");
    assert_eq!(
        mailroom_core::paused_topic(&mailroom_core::pause_notice("orders")),
        Some("orders")
    );
    assert_eq!(mailroom_core::paused_topic("orders"), None);
}
