//! Leases and fencing: a worker that dies loses its event, and its late
//! completion is refused.

use crate::support::{Db, outcomes, start_with};
use mailroom::handler::handler_fn;
use mailroom::hooks::NewEvent;
use mailroom::pull::Completion;
use mailroom::store::ClaimRequest;
use mailroom::{Engine, Event, EventId, StoreError, TopicSpec};
use mailroom_server::ServerOptions;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An event claimed by a worker that then goes silent is rescued when its
/// lease ends and processed by the engine; the silent worker's completion
/// with its stale token is refused, and the history shows lease_expired, done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_is_rescued_and_the_stale_token_refused() {
    let db = Db::fresh().await;
    let id = EventId::new();
    db.store
        .insert(NewEvent {
            id,
            source: "api".into(),
            topic: "jobs".into(),
            dedup_key: "job-1".into(),
            key: None,
            event_type: None,
            correlation_id: None,
            causation_id: None,
            version: None,
            traceparent: None,
            content_type: Some("application/json".into()),
            payload: r#"{"job":1}"#.into(),
            max_attempts: 5,
            delivery: mailroom::Delivery::Now,
            priority: 0,
        })
        .await
        .expect("insert");
    // Worker A claims with a short lease and then "dies".
    let claimed = db
        .store
        .claim(&ClaimRequest {
            topic: "jobs".into(),
            worker: "worker-a".into(),
            max: 1,
            lease: Duration::from_millis(200),
            per_key: None,
            max_wait_for_priority: None,
            expire_after: None,
        })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    let stale = claimed[0].token;
    assert_eq!(claimed[0].event.id, id);

    let runs: Arc<Mutex<Vec<u32>>> = Arc::default();
    let seen = runs.clone();
    let server = start_with(db, "127.0.0.1:0", ServerOptions::default(), move |store| {
        Engine::builder(store)
            .worker_id("engine")
            .maintenance_period(Duration::from_millis(50))
            .topic(TopicSpec::new("jobs"))
            .handler(
                "jobs",
                handler_fn(move |ev: Event| {
                    let seen = seen.clone();
                    async move {
                        seen.lock().expect("lock").push(ev.attempts);
                        Ok::<(), String>(())
                    }
                }),
            )
    })
    .await;

    let id_text = id.to_string();
    let done = server.event_with_status(&id_text, "done").await;
    assert_eq!(
        *runs.lock().expect("lock"),
        [2],
        "the engine ran it once, as attempt 2: the lost attempt counts"
    );
    assert_eq!(done["attempts"], 2);
    assert_eq!(outcomes(&done), ["lease_expired", "done"]);
    assert_eq!(done["history"][0]["worker"], "worker-a");
    assert_eq!(done["history"][1]["worker"], "engine");

    // Worker A wakes up and tries to finish with its old token.
    let late = server.store.complete(id, stale, Completion::Done).await;
    assert!(
        matches!(late, Err(StoreError::StaleToken)),
        "stale completion refused: {late:?}"
    );
    let late = server
        .store
        .complete(
            id,
            stale,
            Completion::Dead {
                error: "too late".into(),
            },
        )
        .await;
    assert!(matches!(late, Err(StoreError::StaleToken)), "{late:?}");
    let after = server.event(&id_text).await;
    assert_eq!(after, done, "the refused completions changed nothing");
    server.stop().await;
}
