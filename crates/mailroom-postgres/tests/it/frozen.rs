//! A frozen network between the store and PostgreSQL (packets held or
//! dropped, connections left open, no RST), through a `FreezeProxy`: every
//! operation fails within its limit instead of hanging, nothing acked is
//! lost, and the store heals by itself after the freeze (pool, LISTEN
//! connection, sequential claimer). Each test gets a fresh database.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mailroom_conformance::event;
use mailroom_core::{ClaimRequest, Completion, OnDead, Store, StoreError};
use mailroom_postgres::{PostgresOptions, PostgresStore};
use mailroom_testkit::{Freeze, FreezeProxy};
use sqlx::Connection as _;
use std::time::{Duration, Instant};

/// The data path's limit (5 s) and some room for a loaded machine.
const FAILS_WITHIN: Duration = Duration::from_secs(8);
/// How soon after the heal the store must work again.
const HEALS_WITHIN: Duration = Duration::from_secs(10);

/// A store connected through a new proxy to a fresh database; returns the
/// database's direct URL too.
async fn behind_proxy() -> (String, FreezeProxy, PostgresStore) {
    let url = mailroom_testkit::fresh_postgres_db().await;
    let host = url
        .split_once('@')
        .and_then(|(_, rest)| rest.split('/').next())
        .unwrap()
        .to_owned();
    let proxy = FreezeProxy::start(&host).await.unwrap();
    let mut opts = PostgresOptions::from_url(&proxy.url_for(&url)).unwrap();
    opts.pool_size = 6;
    let store = PostgresStore::connect(opts).await.unwrap();
    store.migrate().await.unwrap();
    (url, proxy, store)
}

fn req(topic: &str, per_key: Option<OnDead>) -> ClaimRequest {
    ClaimRequest {
        topic: topic.into(),
        worker: "w".into(),
        max: 10,
        lease: Duration::from_secs(30),
        per_key,
        max_wait_for_priority: None,
        expire_after: None,
    }
}

/// `op` ends within `limit` with an `Unavailable` error.
async fn fails_in_time<T: std::fmt::Debug>(
    what: &str,
    op: impl Future<Output = mailroom_core::Result<T>>,
) -> Duration {
    let started = Instant::now();
    let answer = tokio::time::timeout(FAILS_WITHIN, op)
        .await
        .unwrap_or_else(|_| panic!("{what} still waits on a frozen database"));
    assert!(
        matches!(answer, Err(StoreError::Unavailable(_))),
        "{what}: {answer:?}"
    );
    started.elapsed()
}

/// Retries `op` until it succeeds; panics after `HEALS_WITHIN`.
async fn heals<T>(
    what: &str,
    mut op: impl AsyncFnMut() -> mailroom_core::Result<T>,
) -> (T, Duration) {
    let started = Instant::now();
    loop {
        let left = HEALS_WITHIN.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, op()).await {
            Ok(Ok(v)) => return (v, started.elapsed()),
            Ok(Err(_)) if started.elapsed() < HEALS_WITHIN => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => panic!("{what} did not work again within 10 s of the heal"),
        }
    }
}

async fn frozen_store_fails_in_time_and_heals(mode: Freeze) {
    let (_url, proxy, store) = behind_proxy().await;
    store.insert(event("t", "before", None)).await.unwrap();

    proxy.set(mode);
    // Concurrent inserts and claims, more than the pool holds: each ends.
    let mut ops = tokio::task::JoinSet::new();
    for i in 0..8 {
        let s = store.clone();
        ops.spawn(async move {
            fails_in_time("an insert", s.insert(event("t", &format!("f{i}"), None))).await
        });
        let s = store.clone();
        ops.spawn(async move { fails_in_time("a claim", s.claim(&req("t", None))).await });
    }
    ops.join_all().await;
    fails_in_time("now()", store.now()).await;
    proxy.heal();

    let (_, took) = heals("an insert", async || {
        store.insert(event("t", "after", None)).await
    })
    .await;
    eprintln!("{mode:?}: inserts work again {took:?} after the heal");
    // Every pooled connection works: six inserts at once, then claims.
    let mut ops = tokio::task::JoinSet::new();
    for i in 0..6 {
        let s = store.clone();
        ops.spawn(async move { s.insert(event("t", &format!("a{i}"), None)).await });
    }
    for r in ops.join_all().await {
        r.unwrap();
    }
    let (claimed, _) = heals("a claim", async || store.claim(&req("t", None)).await).await;
    assert!(!claimed.is_empty());
}

/// Held packets: every operation in flight or started during the freeze
/// fails within the data path's limit, and after the heal inserts, claims
/// and every pooled connection work again within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_network_fails_operations_in_time_and_heals() {
    frozen_store_fails_in_time_and_heals(Freeze::Hold).await;
}

/// Dropped packets (the open connections never answer again): the same,
/// so no frozen connection goes back to the pool or keeps a slot of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_network_fails_operations_in_time_and_heals() {
    frozen_store_fails_in_time_and_heals(Freeze::Drop).await;
}

/// The LISTEN connection, frozen for good (dropped packets), is found dead
/// and replaced: a notification sent after the heal reaches subscribers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listen_connection_notices_a_dead_network_and_listens_again() {
    let (url, proxy, store) = behind_proxy().await;
    let mut topics = store.subscribe();
    proxy.set(Freeze::Drop);
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.heal();
    let mut direct = sqlx::PgConnection::connect(&url).await.unwrap();
    let started = Instant::now();
    let heard = async {
        loop {
            sqlx::query("SELECT pg_notify('mailroom_events', 'ping')")
                .execute(&mut direct)
                .await
                .unwrap();
            let next = tokio::time::timeout(Duration::from_millis(500), topics.recv());
            if let Ok(Ok(topic)) = next.await
                && topic == "ping"
            {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), heard)
        .await
        .expect("no notification after the heal: the LISTEN connection stayed dead");
    eprintln!("listening again {:?} after the heal", started.elapsed());
}

/// A sequential topic's claimer connection, frozen for good while it holds
/// the topic's claim lock, is dropped: claims of the topic fail in time
/// during the freeze and work again after the heal (the server ended the
/// frozen session and its lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_claimer_on_a_dead_connection_is_replaced() {
    let (_url, proxy, store) = behind_proxy().await;
    for i in 0..4 {
        store
            .insert(event("seq", &format!("e{i}"), Some(&format!("k{i}"))))
            .await
            .unwrap();
    }
    let seq = || req("seq", Some(OnDead::Block));
    let first = store.claim(&seq()).await.unwrap();
    assert_eq!(first.len(), 4);
    for c in &first {
        let done = Completion::Done;
        store.complete(c.event.id, c.token, done).await.unwrap();
    }
    store
        .insert(event("seq", "later", Some("k0")))
        .await
        .unwrap();

    proxy.set(Freeze::Drop);
    fails_in_time("a sequential claim", store.claim(&seq())).await;
    fails_in_time("a sequential claim", store.claim(&seq())).await;
    proxy.heal();
    let (claimed, took) = heals("a sequential claim", async || {
        let claimed = store.claim(&seq()).await?;
        if claimed.is_empty() {
            return Err(StoreError::Unavailable("nothing claimed yet".into()));
        }
        Ok(claimed)
    })
    .await;
    assert_eq!(claimed.len(), 1);
    eprintln!("sequential claims work again {took:?} after the heal");
}
