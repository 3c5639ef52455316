//! Retries with backoff, dead letters and replay, observed through `/v1`.

use crate::support::{expect_problem, outcomes, start};
use mailroom::handler::handler_fn;
use mailroom::{Backoff, Engine, Event, Outcome, RetryPolicy, SourceSpec, TopicSpec};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn schedule(max_attempts: u32, delays_ms: &[u64]) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        backoff: Backoff::Schedule(
            delays_ms
                .iter()
                .map(|ms| Duration::from_millis(*ms))
                .collect(),
        ),
    }
}

/// A handler that fails twice then succeeds is attempted three times, each
/// retry no earlier than its backoff (200 ms, then 400 ms), and the history
/// reads retry, retry, done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_handler_is_retried_after_its_backoff() {
    let starts: Arc<Mutex<Vec<(u32, Instant)>>> = Arc::default();
    let seen = starts.clone();
    let server = start(move |store| {
        Engine::builder(store)
            .topic(TopicSpec::new("flaky").retry(schedule(5, &[200, 400])))
            .source(SourceSpec::new("src", "flaky"))
            .handler(
                "flaky",
                handler_fn(move |ev: Event| {
                    let seen = seen.clone();
                    async move {
                        seen.lock()
                            .expect("lock")
                            .push((ev.attempts, Instant::now()));
                        if ev.attempts < 3 {
                            Outcome::retry(format!("boom {}", ev.attempts))
                        } else {
                            Outcome::Success
                        }
                    }
                }),
            )
    })
    .await;

    let id = server.accept("src", "r-1", &json!({"n": 1})).await;
    let event = server.event_with_status(&id, "done").await;
    assert_eq!(event["attempts"], 3);
    assert_eq!(outcomes(&event), ["retry", "retry", "done"]);
    let history = event["history"].as_array().expect("history");
    assert_eq!(history[0]["error"], "boom 1");
    assert_eq!(history[1]["error"], "boom 2");
    assert!(history.iter().all(|a| a["finished_at"].is_string()));
    for (i, a) in history.iter().enumerate() {
        assert_eq!(a["attempt"], i + 1);
    }

    let starts = starts.lock().expect("lock").clone();
    let numbers: Vec<u32> = starts.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, [1, 2, 3], "each attempt ran once");
    let gap1 = starts[1].1 - starts[0].1;
    let gap2 = starts[2].1 - starts[1].1;
    assert!(
        gap1 >= Duration::from_millis(200),
        "first retry too early: {gap1:?}"
    );
    assert!(
        gap2 >= Duration::from_millis(400),
        "second retry too early: {gap2:?}"
    );
    // Slack upward only, but a retry must not wait for some unrelated tick either.
    assert!(
        gap1 < Duration::from_millis(1500),
        "first retry late: {gap1:?}"
    );
    assert!(
        gap2 < Duration::from_millis(1700),
        "second retry late: {gap2:?}"
    );
    server.stop().await;
}

/// A handler that always fails leaves its event `dead` after `max_attempts`;
/// a replay runs it again with attempt numbers continuing (4, 5, 6) and a
/// fresh budget: `max_attempts` = attempts so far + the topic's budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_event_replays_with_a_fresh_budget_and_continued_numbering() {
    let attempts: Arc<Mutex<Vec<u32>>> = Arc::default();
    let seen = attempts.clone();
    let server = start(move |store| {
        Engine::builder(store)
            .topic(TopicSpec::new("doomed").retry(schedule(3, &[50])))
            .source(SourceSpec::new("src", "doomed"))
            .handler(
                "doomed",
                handler_fn(move |ev: Event| {
                    let seen = seen.clone();
                    async move {
                        seen.lock().expect("lock").push(ev.attempts);
                        Err::<(), _>(format!("nope #{}", ev.attempts))
                    }
                }),
            )
    })
    .await;

    let id = server.accept("src", "d-1", &json!({"n": 1})).await;
    let dead = server.event_with_status(&id, "dead").await;
    assert_eq!(dead["attempts"], 3);
    assert_eq!(dead["max_attempts"], 3);
    assert_eq!(dead["last_error"], "nope #3");
    assert_eq!(outcomes(&dead), ["retry", "retry", "dead"]);
    assert_eq!(*attempts.lock().expect("lock"), [1, 2, 3]);

    let replayed = server.post_json(&format!("/v1/events/{id}/replay")).await;
    assert_eq!(replayed["id"], id.as_str());
    assert_eq!(replayed["attempts"], 3, "the history is not rewritten");
    assert_eq!(replayed["max_attempts"], 6, "attempts + the topic's budget");

    let dead_again = server
        .event_until(&id, "the replayed event is dead again", |e| {
            e["status"] == "dead" && e["attempts"] == 6
        })
        .await;
    assert_eq!(dead_again["max_attempts"], 6);
    assert_eq!(dead_again["last_error"], "nope #6");
    assert_eq!(
        outcomes(&dead_again),
        ["retry", "retry", "dead", "retry", "retry", "dead"]
    );
    let numbers: Vec<u64> = dead_again["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|a| a["attempt"].as_u64().expect("attempt"))
        .collect();
    assert_eq!(numbers, [1, 2, 3, 4, 5, 6]);
    assert_eq!(
        *attempts.lock().expect("lock"),
        [1, 2, 3, 4, 5, 6],
        "the handler saw the 4th attempt after the replay"
    );
    server.stop().await;
}

/// An event whose payload retention purged cannot be replayed: `POST
/// /v1/events/{id}/replay` answers a 409 problem naming the purge and the
/// event stays done; `POST /v1/replay` leaves it and counts it in
/// `skipped_purged`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_event_is_not_replayed() {
    let server = start(|store| {
        Engine::builder(store)
            .topic(TopicSpec::new("work"))
            .source(SourceSpec::new("work", "work"))
            .handler("work", handler_fn(|_: Event| async { Outcome::Success }))
    })
    .await;
    let id = server.accept("work", "w-1", &json!({"n": 1})).await;
    server.event_with_status(&id, "done").await;
    let report = server
        .engine
        .operator()
        .purge(Duration::ZERO)
        .await
        .expect("purge");
    assert_eq!(report.payloads_dropped, 1);

    let resp = server
        .http
        .post(server.url(&format!("/v1/events/{id}/replay")))
        .send()
        .await
        .expect("post");
    let p = expect_problem(resp, 409).await;
    assert!(
        p["detail"].as_str().is_some_and(|d| d.contains("purged")),
        "{p}"
    );
    let bulk = server
        .http
        .post(server.url("/v1/replay"))
        .json(&json!({"topic": "work", "status": "done"}))
        .send()
        .await
        .expect("post");
    assert_eq!(bulk.status(), 200);
    let bulk: Value = bulk.json().await.expect("json");
    assert_eq!(bulk, json!({"replayed": 0, "skipped_purged": 1}));
    assert_eq!(server.event(&id).await["status"], "done");
}
