//! Scheduling limits (SPEC §13): the rate budget, `max_running` claims and
//! topic pauses.

use super::{S, claim, insert, req};
use mailroom_core::{Completion, Rate};
use std::time::{Duration, Instant};

fn rate(s: &str) -> Rate {
    Rate::parse(s).unwrap()
}

/// A budget starts with one grant, never holds more than one, refills at
/// the rate, says how long to wait when empty, and takes back what a short
/// claim did not use; topics have budgets of their own.
pub async fn rate_budget_holds_one_grant_and_refills_at_the_rate(s: S) {
    let r = rate("100/s");
    assert_eq!(r.grant(), 10);
    let first = s.take_tokens("mail", r, 50).await.unwrap();
    assert_eq!(first.granted, 10, "{first:?}");
    let empty = s.take_tokens("mail", r, 50).await.unwrap();
    assert!(empty.granted <= 1, "{empty:?}");
    if empty.granted == 0 {
        assert!(
            empty.wait > Duration::ZERO && empty.wait <= Duration::from_millis(100),
            "{empty:?}"
        );
    }
    assert_eq!(s.take_tokens("other", r, 3).await.unwrap().granted, 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refilled = s.take_tokens("mail", r, 50).await.unwrap();
    assert_eq!(refilled.granted, 10, "capped at one grant: {refilled:?}");
    s.give_back_tokens("mail", r, 4).await.unwrap();
    let back = s.take_tokens("mail", r, 50).await.unwrap();
    assert!((4..=6).contains(&back.granted), "{back:?}");
    s.give_back_tokens("mail", r, 50).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let capped = s.take_tokens("mail", r, 50).await.unwrap();
    assert_eq!(capped.granted, 10, "give back stays within one grant");
}

/// Takers racing for one budget get, together, no more than the first
/// grant plus the rate over the time they took.
pub async fn concurrent_takers_share_one_rate_budget(s: S) {
    let r = rate("200/s");
    let started = Instant::now();
    let takers: Vec<_> = (0..6)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut got = 0u64;
                while started.elapsed() < Duration::from_millis(800) {
                    let g = s.take_tokens("mail", r, 7).await.unwrap();
                    got += u64::from(g.granted);
                    if g.granted == 0 {
                        tokio::time::sleep(g.wait.min(Duration::from_millis(20))).await;
                    }
                }
                got
            })
        })
        .collect();
    let mut total = 0;
    for t in takers {
        total += t.await.unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let most = 20.0 + 200.0 * secs + 1.0;
    assert!(total as f64 <= most, "{total} tokens in {secs:.3} s");
    assert!(total >= 100, "only {total} tokens in {secs:.3} s");
}

/// A capped claim takes only the room `max_running` leaves (running events
/// of the topic, however claimed), says when the cap cut it short, and
/// concurrent capped claims never fill the same room twice.
pub async fn capped_claims_keep_running_events_within_max_running(s: S) {
    for i in 0..20 {
        insert(&s, "exports", &format!("e{i}"), None).await;
    }
    let first = claim(&s, &req("exports", 1)).await.remove(0);
    let (got, capped) = s.claim_capped(&req("exports", 8), 3).await.unwrap();
    assert_eq!((got.len(), capped), (2, true));
    let (got, capped) = s.claim_capped(&req("exports", 8), 3).await.unwrap();
    assert_eq!((got.len(), capped), (0, true));
    s.complete(first.event.id, first.token, Completion::Done)
        .await
        .unwrap();
    let (got, capped) = s.claim_capped(&req("exports", 1), 3).await.unwrap();
    assert_eq!((got.len(), capped), (1, false), "room 1 for an ask of 1");
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(
                async move { s.claim_capped(&req("exports", 2), 7).await.unwrap().0.len() },
            )
        })
        .collect();
    let mut total = 0;
    for r in racers {
        total += r.await.unwrap();
    }
    assert_eq!(total, 4, "7 minus the 3 running");
    insert(&s, "quiet", "q", None).await;
    let (got, capped) = s.claim_capped(&req("quiet", 5), 10).await.unwrap();
    assert_eq!(
        (got.len(), capped),
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
