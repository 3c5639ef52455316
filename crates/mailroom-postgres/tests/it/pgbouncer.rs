//! mailroom behind PgBouncer in transaction mode (the one `./scripts/test.sh`
//! starts in front of its PostgreSQL): statements through the pooler,
//! session work on `direct_url`, and the refusal of a transaction-mode
//! pooler given as the only URL.
#![allow(clippy::unwrap_used)]

use mailroom_conformance::event;
use mailroom_core::{ClaimRequest, Completion, OnDead, Store, StoreError};
use mailroom_postgres::{PostgresOptions, PostgresStore};
use std::time::Duration;

/// A store on a fresh database: statements through PgBouncer, session work
/// direct.
async fn pooled_store(pool_size: u32) -> PostgresStore {
    let direct = mailroom_testkit::fresh_postgres_db().await;
    let mut opts = PostgresOptions::from_url(&mailroom_testkit::pgbouncer_url(&direct))
        .unwrap()
        .with_direct_url(&direct)
        .unwrap();
    opts.pool_size = pool_size;
    let store = PostgresStore::connect(opts).await.unwrap();
    store.migrate().await.unwrap();
    store
}

mod conformance {
    mailroom_conformance::suite!(async { std::sync::Arc::new(super::pooled_store(8).await) });
}

/// Without `direct_url`, a URL that is PgBouncer in transaction mode is
/// refused at start, and the error names `direct_url`: wake-ups and claim
/// locks are never lost silently.
#[tokio::test]
async fn a_transaction_mode_pooler_without_direct_url_is_refused() {
    let direct = mailroom_testkit::fresh_postgres_db().await;
    let pooler = mailroom_testkit::pgbouncer_url(&direct);
    let refused = PostgresStore::connect(PostgresOptions::from_url(&pooler).unwrap()).await;
    match refused {
        Err(StoreError::Invalid(why)) => assert!(why.contains("direct_url"), "{why}"),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a transaction-mode pooler was accepted without direct_url"),
    }
    // The direct URL alone is accepted.
    PostgresStore::connect(PostgresOptions::from_url(&direct).unwrap())
        .await
        .unwrap();
}

/// An event inserted by one instance through the pooler, by intake or by
/// the outbox in the application's transaction, wakes another instance's
/// subscriber, which listens on its direct connection.
#[tokio::test]
async fn an_insert_through_the_pooler_wakes_a_subscriber_listening_directly() {
    let direct = mailroom_testkit::fresh_postgres_db().await;
    let pooler = mailroom_testkit::pgbouncer_url(&direct);
    let open = || async {
        let opts = PostgresOptions::from_url(&pooler)
            .unwrap()
            .with_direct_url(&direct)
            .unwrap();
        PostgresStore::connect(opts).await.unwrap()
    };
    let (listening, inserting) = (open().await, open().await);
    listening.migrate().await.unwrap();
    let mut woken = listening.subscribe();
    inserting.insert(event("orders", "d1", None)).await.unwrap();
    let topic = tokio::time::timeout(Duration::from_secs(10), woken.recv())
        .await
        .expect("no wake-up arrived")
        .unwrap();
    assert_eq!(topic, "orders");

    // The outbox, in the application's transactions on the store's pool
    // (through the pooler), between the store's own statements there.
    for i in 0..20 {
        let mut tx = inserting.begin().await.unwrap();
        let payload = serde_json::json!({ "n": i });
        mailroom_postgres::outbox::enqueue(&mut tx, "mail", "sent", None, &payload, None)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        inserting.get(mailroom_core::EventId::new()).await.unwrap();
        let topic = tokio::time::timeout(Duration::from_secs(10), woken.recv())
            .await
            .expect("no wake-up arrived for an outbox event")
            .unwrap();
        assert_eq!(topic, "mail");
    }
}

/// Many instances' worth of statements through a small PgBouncer pool at
/// once, interleaved with sequential claims whose locks are held on the
/// direct connections: every event is claimed once and completed.
#[tokio::test]
async fn concurrent_work_through_the_pooler_never_mixes_statements() {
    let store = pooled_store(16).await;
    let n = 400;
    let inserts = (0..n).map(|i| {
        let store = store.clone();
        async move {
            let key = format!("k{}", i % 7);
            store
                .insert(event("seq", &format!("d{i}"), Some(&key)))
                .await
                .unwrap();
        }
    });
    futures::future::join_all(inserts).await;
    let claimers = (0..4).map(|w| {
        let store = store.clone();
        async move {
            let mut done = 0;
            let mut idle = 0;
            while idle < 20 {
                let claimed = store
                    .claim(&ClaimRequest {
                        topic: "seq".into(),
                        worker: format!("w{w}"),
                        max: 8,
                        lease: Duration::from_secs(30),
                        per_key: Some(OnDead::Block),
                        max_wait_for_priority: None,
                        expire_after: None,
                    })
                    .await
                    .unwrap();
                if claimed.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                idle = 0;
                for c in claimed {
                    store
                        .complete(c.event.id, c.token, Completion::Done)
                        .await
                        .unwrap();
                    done += 1;
                }
            }
            done
        }
    });
    let done: usize = futures::future::join_all(claimers).await.into_iter().sum();
    assert_eq!(done, n);
}
