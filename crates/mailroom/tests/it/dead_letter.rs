//! A topic's dead letters copied into its dead-letter topic, once per
//! death, whether the death was noticed by this process or found in the
//! store at start; and the builder refuses dead-letter topics that cannot
//! work.

use mailroom::dead_letter::{DeadLetter, SOURCE};
use mailroom::handler::handler_fn;
use mailroom::operate::ListFilter;
use mailroom::{Backoff, BuildError, Draft, Engine, Outcome, RetryPolicy, Status, TopicSpec};
use mailroom_testkit::harness::eventually;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

fn failing_topic() -> TopicSpec {
    TopicSpec::new("jobs").retry(RetryPolicy {
        max_attempts: 2,
        backoff: Backoff::Schedule(vec![Duration::from_millis(10)]),
    })
}

/// An engine with `jobs` (every attempt fails) and, when `dead_letter`,
/// its dead letters copied into the pull topic `jobs.dead-letter`.
fn engine(store: Arc<dyn mailroom::Store>, dead_letter: bool) -> Engine {
    let jobs = match dead_letter {
        true => failing_topic().dead_letter("jobs.dead-letter"),
        false => failing_topic(),
    };
    Engine::builder(store)
        .poll_interval(Duration::from_millis(20))
        .topic(jobs)
        .handler(
            "jobs",
            handler_fn(|e| async move { Outcome::retry(format!("boom {}", e.attempts)) }),
        )
        .topic(TopicSpec::new("jobs.dead-letter"))
        .build()
        .expect("engine")
}

async fn copies(engine: &Engine) -> Vec<DeadLetter> {
    let filter = ListFilter {
        topic: Some("jobs.dead-letter".into()),
        limit: 1000,
        ..ListFilter::default()
    };
    let page = engine.operator().list(&filter).await.expect("list");
    page.events
        .iter()
        .map(|e| {
            assert_eq!(e.source, SOURCE);
            DeadLetter::decode(e).expect("a dead letter")
        })
        .collect()
}

async fn dead(engine: &Engine) -> usize {
    let filter = ListFilter {
        topic: Some("jobs".into()),
        status: Some(Status::Dead),
        limit: 1000,
        ..ListFilter::default()
    };
    engine
        .operator()
        .list(&filter)
        .await
        .expect("list")
        .events
        .len()
}

/// Events that died while no process handed dead letters on (here: under
/// an engine without `dead_letter`) are copied when an engine that does
/// starts, from the store, each once with its last error and payload; a
/// second start copies nothing more.
#[tokio::test]
async fn deaths_found_in_the_store_at_start_are_copied_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = store(&dir).await;
    let before = engine(s.clone(), false);
    for i in 0..3 {
        let draft = Draft::json("jobs", &serde_json::json!({ "n": i })).dedup_key(format!("k{i}"));
        before.enqueue(draft).await.expect("enqueue");
    }
    let stop = CancellationToken::new();
    let (e, st) = (before.clone(), stop.clone());
    let run = tokio::spawn(async move { e.run(st).await });
    eventually(Duration::from_secs(15), "three events die", || async {
        dead(&before).await == 3
    })
    .await;
    stop.cancel();
    run.await.expect("stopped");
    assert!(copies(&before).await.is_empty(), "no route, no copies");

    for _ in 0..2 {
        let after = engine(s.clone(), true);
        let stop = CancellationToken::new();
        let (e, st) = (after.clone(), stop.clone());
        let run = tokio::spawn(async move { e.run(st).await });
        eventually(Duration::from_secs(15), "three copies", || async {
            copies(&after).await.len() == 3
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.cancel();
        run.await.expect("stopped");
        let got = copies(&after).await;
        assert_eq!(got.len(), 3, "each death once, across starts");
        for letter in got {
            assert_eq!(letter.topic, "jobs");
            assert_eq!(letter.attempt, 2);
            assert_eq!(letter.error.as_deref(), Some("boom 2"));
            let event = letter.event().expect("the dead event");
            assert!(event.payload.is_some_and(|p| p.starts_with(b"{\"n\":")));
        }
    }
}

/// The builder refuses a dead-letter topic that is undeclared, the topic
/// itself, or a topic handing its own dead letters on.
#[tokio::test]
async fn the_builder_refuses_dead_letter_topics_that_cannot_work() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = store(&dir).await;
    let build = |topics: Vec<TopicSpec>| {
        let mut b = Engine::builder(s.clone());
        for t in topics {
            b = b.topic(t);
        }
        b.build().map(|_| ())
    };
    let cases = [
        (
            vec![TopicSpec::new("a").dead_letter("nowhere")],
            "not declared",
        ),
        (vec![TopicSpec::new("a").dead_letter("a")], "its own"),
        (
            vec![
                TopicSpec::new("a").dead_letter("b"),
                TopicSpec::new("b").dead_letter("c"),
                TopicSpec::new("c"),
            ],
            "hands its own dead letters on",
        ),
    ];
    for (topics, why) in cases {
        match build(topics) {
            Err(e @ BuildError::DeadLetter { .. }) => {
                assert!(e.to_string().contains(why), "{e}")
            }
            other => panic!("expected a dead-letter refusal ({why}), got {other:?}"),
        }
    }
    build(vec![
        TopicSpec::new("a").dead_letter("b"),
        TopicSpec::new("b"),
    ])
    .expect("a sound route");
}
