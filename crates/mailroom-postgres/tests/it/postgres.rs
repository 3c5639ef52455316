//! PostgreSQL-specific behaviour beyond the shared conformance suite: group
//! commit, the outbox, LISTEN/NOTIFY, several stores (instances) on one
//! database, and outages. Each test gets a fresh database.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mailroom_conformance::event;
use mailroom_core::{
    ClaimRequest, Completion, Delivery, EventId, ListFilter, OnDead, Status, Store, StoreError,
};
use mailroom_postgres::{PostgresOptions, PostgresStore};
use sqlx::Connection as _;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

async fn store_at(url: &str, group_commit: bool) -> PostgresStore {
    let mut opts = PostgresOptions::from_url(url).unwrap();
    opts.group_commit = group_commit;
    opts.pool_size = 8;
    let store = PostgresStore::connect(opts).await.unwrap();
    store.migrate().await.unwrap();
    store
}

async fn fresh(group_commit: bool) -> (String, PostgresStore) {
    let url = mailroom_testkit::fresh_postgres_db().await;
    let store = store_at(&url, group_commit).await;
    (url, store)
}

fn claim_req(topic: &str, max: u32, per_key: Option<OnDead>) -> ClaimRequest {
    ClaimRequest {
        topic: topic.into(),
        worker: "w".into(),
        max,
        lease: Duration::from_secs(30),
        per_key,
        max_wait_for_priority: None,
        expire_after: None,
    }
}

async fn insert_concurrently(store: &PostgresStore, n: usize) -> Vec<mailroom_core::Inserted> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let s = store.clone();
        tasks.spawn(async move { s.insert(event("orders", &format!("e{i}"), None)).await });
    }
    tasks
        .join_all()
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

/// Concurrent inserts share commits: 300 inserts take far fewer than 300 transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_shares_transactions_among_concurrent_inserts() {
    let (_, store) = fresh(true).await;
    let answers = insert_concurrently(&store, 300).await;
    assert!(answers.iter().all(|a| !a.duplicate));
    let commits = store.commits();
    assert!(
        (1..150).contains(&commits),
        "{commits} commits for 300 inserts"
    );
    let all = ListFilter {
        limit: 1000,
        ..ListFilter::default()
    };
    assert_eq!(store.list(&all).await.unwrap().events.len(), 300);
}

/// Without group commit every insert is its own transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_group_commit_each_insert_commits_alone() {
    let (_, store) = fresh(false).await;
    insert_concurrently(&store, 40).await;
    assert_eq!(store.commits(), 40);
}

/// Two inserts of one dedup key in one group: exactly one is new, both get its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_twice_in_one_group_is_one_event() {
    let (_, store) = fresh(true).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let s = store.clone();
        let dedup = if i % 2 == 0 {
            "same".to_owned()
        } else {
            format!("other{i}")
        };
        tasks.spawn(async move { s.insert(event("orders", &dedup, None)).await.unwrap() });
    }
    let answers = tasks.join_all().await;
    assert_eq!(answers.iter().filter(|a| a.duplicate).count(), 49);
    assert!(store.commits() < 100, "the inserts were grouped");
}

/// A NUL character is refused as invalid input without failing its neighbours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_and_fails_only_itself() {
    let (_, store) = fresh(true).await;
    let mut bad = event("orders", "bad\0key", None);
    bad.key = Some("k".into());
    let (a, b) = tokio::join!(
        store.insert(bad),
        store.insert(event("orders", "good", None))
    );
    assert!(matches!(a, Err(StoreError::Invalid(_))), "{a:?}");
    assert!(!b.unwrap().duplicate);
}

/// An outbox event written in a transaction that rolls back is not stored;
/// one that commits is pending, claimable, JSON, from source `outbox`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_enqueue_follows_the_application_transaction() {
    let (url, store) = fresh(true).await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let payload = serde_json::json!({"amount": 42, "currency": "EUR"});

    let mut tx = conn.begin().await.unwrap();
    mailroom_postgres::outbox::enqueue(
        &mut tx,
        "payments",
        "payment.created",
        Some("c7"),
        &payload,
        Some("p-1"),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        store
            .list(&ListFilter::default())
            .await
            .unwrap()
            .events
            .is_empty()
    );

    let mut tx = conn.begin().await.unwrap();
    let id = mailroom_postgres::outbox::enqueue(
        &mut tx,
        "payments",
        "payment.created",
        Some("c7"),
        &payload,
        Some("p-1"),
    )
    .await
    .unwrap();
    let again = mailroom_postgres::outbox::enqueue(
        &mut tx,
        "payments",
        "payment.created",
        Some("c7"),
        &payload,
        Some("p-1"),
    )
    .await
    .unwrap();
    assert_eq!(again, id, "a repeated dedup key returns the stored id");
    tx.commit().await.unwrap();

    let claimed = store.claim(&claim_req("payments", 10, None)).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let e = &claimed[0].event;
    assert_eq!(e.id, EventId(id));
    assert_eq!(e.id.0.get_version_num(), 7, "outbox ids are UUIDv7");
    assert_eq!((e.source.as_str(), e.dedup_key.as_str()), ("outbox", "p-1"));
    assert_eq!(e.key.as_deref(), Some("c7"));
    assert_eq!(e.event_type.as_deref(), Some("payment.created"));
    assert_eq!(e.content_type.as_deref(), Some("application/json"));
    assert_eq!(e.max_attempts, 15);
    let body: serde_json::Value = serde_json::from_slice(e.payload.as_deref().unwrap()).unwrap();
    assert_eq!(body, payload);

    // Without a dedup key nothing is a duplicate.
    let a = mailroom_postgres::outbox::enqueue(&mut conn, "payments", "x", None, &payload, None)
        .await
        .unwrap();
    // UUIDv7 orders by millisecond; within one millisecond the random bits
    // decide, so let a millisecond pass before checking the order.
    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    let b = mailroom_postgres::outbox::enqueue(&mut conn, "payments", "x", None, &payload, None)
        .await
        .unwrap();
    assert_ne!(a, b);
    assert!(a < b, "UUIDv7 ids sort by time");
}

/// Correlation through the outbox: `correlation_id` and `causation_id`
/// given to `mailroom.enqueue` (or [`enqueue_correlated`]) are stored; a
/// follow-up naming only its cause keeps the cause's correlation id, an
/// explicit one wins, and a causation id that is no event id is stored as
/// given with no correlation.
///
/// [`enqueue_correlated`]: mailroom_postgres::outbox::enqueue_correlated
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_correlation_is_stored_and_follow_ups_keep_it() {
    use mailroom_postgres::outbox::{Correlation, Scheduling, enqueue_correlated};
    let (url, store) = fresh(true).await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    /// Enqueues `dedup` with `correlation` and reads back the event's id
    /// and its stored correlation and causation ids.
    async fn enqueue(
        conn: &mut sqlx::PgConnection,
        store: &PostgresStore,
        dedup: &str,
        correlation: Correlation,
    ) -> (uuid::Uuid, Option<String>, Option<String>) {
        let payload = serde_json::json!({"order": 7});
        let id = enqueue_correlated(
            conn,
            "orders",
            "order.placed",
            None,
            &payload,
            Some(dedup),
            Scheduling::default(),
            &correlation,
        )
        .await
        .unwrap();
        let e = store.get(EventId(id)).await.unwrap().unwrap();
        (id, e.correlation_id, e.causation_id)
    }
    let (root, corr, cause) = enqueue(
        &mut conn,
        &store,
        "o-1",
        Correlation {
            correlation_id: Some("flow-1".into()),
            causation_id: Some("cmd-9".into()),
        },
    )
    .await;
    assert_eq!(
        (corr.as_deref(), cause.as_deref()),
        (Some("flow-1"), Some("cmd-9"))
    );

    let (child, corr, cause) = enqueue(&mut conn, &store, "o-2", Correlation::follows(root)).await;
    assert_eq!(
        corr.as_deref(),
        Some("flow-1"),
        "a follow-up keeps the correlation"
    );
    assert_eq!(cause, Some(root.to_string()));

    // Named notation from SQL, two generations down.
    let grandchild: String = sqlx::query_scalar(
        "SELECT mailroom.enqueue('orders', 'order.shipped', NULL, '{}', 'o-3',
                                 causation_id => $1)::text",
    )
    .bind(child.to_string())
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let e = store
        .get(EventId::parse_stored(&grandchild).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.correlation_id.as_deref(), Some("flow-1"));

    let explicit = Correlation {
        correlation_id: Some("flow-2".into()),
        causation_id: Some(root.to_string()),
    };
    let (_, corr, _) = enqueue(&mut conn, &store, "o-4", explicit).await;
    assert_eq!(
        corr.as_deref(),
        Some("flow-2"),
        "an explicit correlation id wins"
    );

    let not_an_event = Correlation {
        correlation_id: None,
        causation_id: Some("order-77".into()),
    };
    let (_, corr, cause) = enqueue(&mut conn, &store, "o-5", not_an_event).await;
    assert_eq!((corr, cause.as_deref()), (None, Some("order-77")));
}

/// An insert through another store (another connection, another instance)
/// wakes a subscriber within 100 ms; so does an outbox commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_wake_on_inserts_from_other_connections() {
    let (url, store) = fresh(true).await;
    let mut rx = store.subscribe();
    let other = store_at(&url, true).await;
    other.insert(event("orders", "e1", None)).await.unwrap();
    let topic = tokio::time::timeout(Duration::from_millis(100), rx.recv())
        .await
        .expect("woken within 100 ms")
        .unwrap();
    assert_eq!(topic, "orders");

    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    mailroom_postgres::outbox::enqueue(&mut tx, "invoices", "t", None, &serde_json::json!(1), None)
        .await
        .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), rx.recv())
            .await
            .is_err(),
        "nothing before the commit"
    );
    tx.commit().await.unwrap();
    let topic = tokio::time::timeout(Duration::from_millis(100), rx.recv())
        .await
        .expect("woken within 100 ms")
        .unwrap();
    assert_eq!(topic, "invoices");
}

/// Two stores on one database (two instances) claiming a plain topic
/// concurrently never receive the same event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_claim_the_same_event() {
    let (url, a) = fresh(true).await;
    let b = store_at(&url, true).await;
    insert_concurrently(&a, 400).await;
    let mut tasks = tokio::task::JoinSet::new();
    for (w, s) in [a.clone(), b.clone(), a.clone(), b.clone()]
        .into_iter()
        .enumerate()
    {
        tasks.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let mut r = claim_req("orders", 9, None);
                r.worker = format!("w{w}");
                let got = s.claim(&r).await.unwrap();
                if got.is_empty() {
                    return mine;
                }
                mine.extend(got.iter().map(|c| c.event.id));
            }
        });
    }
    let all: Vec<EventId> = tasks.join_all().await.into_iter().flatten().collect();
    let unique: HashSet<EventId> = all.iter().copied().collect();
    assert_eq!((all.len(), unique.len()), (400, 400));
}

/// Two stores on one database working a sequential topic, while earlier
/// events keep being replayed behind their keys, never run two events of one
/// key at once, and every key's first pass runs in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_run_two_events_of_one_key() {
    let (url, a) = fresh(true).await;
    let b = store_at(&url, true).await;
    let mut order: HashMap<String, Vec<EventId>> = HashMap::new();
    for i in 0..12 {
        for k in 0..8 {
            let key = format!("k{k}");
            let id = a
                .insert(event("seq", &format!("{key}-{i}"), Some(&key)))
                .await
                .unwrap()
                .id;
            order.entry(key).or_default().push(id);
        }
    }
    let running: Arc<Mutex<HashSet<String>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<String, Vec<EventId>>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for (w, s) in [a.clone(), b.clone(), a.clone(), b.clone()]
        .into_iter()
        .enumerate()
    {
        let (running, seen, stop) = (running.clone(), seen.clone(), stop.clone());
        tasks.spawn(async move {
            let mut r = claim_req("seq", 3, Some(OnDead::Block));
            r.worker = format!("w{w}");
            let mut idle = 0;
            while idle < 20 {
                let got = s.claim(&r).await.unwrap();
                if got.is_empty() {
                    idle += usize::from(stop.load(std::sync::atomic::Ordering::Relaxed));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                idle = 0;
                for c in &got {
                    let key = c.event.key.clone().unwrap();
                    assert!(
                        running.lock().unwrap().insert(key.clone()),
                        "two events of {key} running"
                    );
                    seen.lock()
                        .unwrap()
                        .entry(key)
                        .or_default()
                        .push(c.event.id);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                for c in got {
                    // Leave the set before completing: the next event of the key
                    // can only be claimed after the completion commits.
                    running
                        .lock()
                        .unwrap()
                        .remove(c.event.key.as_deref().unwrap());
                    s.complete(c.event.id, c.token, Completion::Done)
                        .await
                        .unwrap();
                }
            }
        });
    }
    // Meanwhile, replay finished events so earlier events reappear behind
    // later ones: the race the per-key lock exists for.
    let replayer = {
        let s = b.clone();
        let order = order.clone();
        tokio::spawn(async move {
            for round in 0..60 {
                for (k, (_, ids)) in order.iter().enumerate() {
                    let id = ids[(round + k) % ids.len()];
                    match s.replay(id, 1).await {
                        Ok(_) | Err(StoreError::Conflict(_)) => {}
                        Err(e) => panic!("replay: {e}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    replayer.await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    tasks.join_all().await;
    let seen = seen.lock().unwrap().clone();
    for (key, ids) in &order {
        let first_pass: Vec<EventId> = {
            let mut firsts = Vec::new();
            for id in &seen[key] {
                if !firsts.contains(id) {
                    firsts.push(*id);
                }
            }
            firsts
        };
        assert_eq!(&first_pass, ids, "first runs of {key} in arrival order");
    }
    let pending = ListFilter {
        status: Some(Status::Pending),
        ..ListFilter::default()
    };
    assert!(
        a.list(&pending).await.unwrap().events.is_empty(),
        "everything drained"
    );
}

/// A database that cannot be reached is `Unavailable`, never a panic; once it
/// accepts connections again the same store works without being reopened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_are_unavailable_and_the_pool_recovers() {
    let refused = PostgresOptions::from_url("postgres://postgres@127.0.0.1:1/nowhere").unwrap();
    let err = PostgresStore::connect(refused).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");

    let url = mailroom_testkit::fresh_postgres_db().await;
    let mut opts = PostgresOptions::from_url(&url).unwrap();
    opts.acquire_timeout = Duration::from_millis(500);
    let store = PostgresStore::connect(opts).await.unwrap();
    store.migrate().await.unwrap();
    store.insert(event("orders", "before", None)).await.unwrap();

    let db_name = url.rsplit('/').next().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect(&mailroom_testkit::postgres_admin_url())
        .await
        .unwrap();
    let set_allowed = |allowed: bool| {
        sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE \"{db_name}\" ALLOW_CONNECTIONS {allowed}"
        ))
    };
    sqlx::raw_sql(set_allowed(false))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
        .bind(&db_name)
        .execute(&mut admin)
        .await
        .unwrap();
    let down = store.insert(event("orders", "during", None)).await;
    assert!(matches!(down, Err(StoreError::Unavailable(_))), "{down:?}");
    let down = store.claim(&claim_req("orders", 1, None)).await;
    assert!(matches!(down, Err(StoreError::Unavailable(_))), "{down:?}");

    sqlx::raw_sql(set_allowed(true))
        .execute(&mut admin)
        .await
        .unwrap();
    let mut recovered = false;
    for _ in 0..20 {
        if store.insert(event("orders", "after", None)).await.is_ok() {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "the pool reconnects");
    assert_eq!(
        store
            .claim(&claim_req("orders", 10, None))
            .await
            .unwrap()
            .len(),
        2
    );
}

/// Terminates the store's server sessions on the database at `url` (as a
/// restart would, unseen by its pool), and gives the backends a moment to
/// exit.
async fn end_store_sessions(url: &str) {
    let db_name = url.rsplit('/').next().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect(&mailroom_testkit::postgres_admin_url())
        .await
        .unwrap();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = $1 AND application_name = 'mailroom'",
    )
    .bind(&db_name)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!ended.is_empty(), "the store's sessions were found");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A pooled connection whose server session ended (terminated here, as a
/// database restart ends them all) is never handed to an insert or a
/// completion, however recently it was used: the pool pings each one
/// before handing it out and replaces it when that fails (a claim skips
/// the ping and tries again instead: the next test). So right after, an
/// insert, a claim and two completions all succeed on their first try.
/// (Handing out a connection used less than a second ago without the ping
/// to every caller lost a group of outcomes and failed the intake for a
/// second after a restart; this test fails with that.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_session_ended_is_replaced_unseen() {
    let (url, store) = fresh(true).await;
    store.insert(event("orders", "before", None)).await.unwrap();
    end_store_sessions(&url).await;
    store.insert(event("orders", "after", None)).await.unwrap();
    let claimed = store.claim(&claim_req("orders", 10, None)).await.unwrap();
    assert_eq!(claimed.len(), 2);
    complete_all(&store, claimed).await;
}

/// A claim takes a connection used a moment ago without the pool's ping
/// (the claim loop's critical path): if the server ended its session
/// since, the claim runs again on pinged connections instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_connection_the_server_ended_is_tried_again() {
    let (url, store) = fresh(true).await;
    store.insert(event("orders", "e1", None)).await.unwrap();
    store.insert(event("orders", "e2", None)).await.unwrap();
    end_store_sessions(&url).await;
    // The claim comes first: the pooled connections it finds are dead.
    let claimed = store.claim(&claim_req("orders", 10, None)).await.unwrap();
    assert_eq!(claimed.len(), 2);
}

/// Manual VACUUMs of `mailroom.queue` so far (autovacuum's are counted apart).
async fn queue_vacuums(url: &str) -> i64 {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'mailroom.queue'::regclass",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

/// Claims `n` events of topic `orders` (inserted first), and completes them.
async fn claim_and_complete(store: &PostgresStore, n: usize) {
    for i in 0..n {
        store
            .insert(event("orders", &format!("v{i}"), None))
            .await
            .unwrap();
    }
    let mut left = n;
    while left > 0 {
        let claimed = store.claim(&claim_req("orders", 32, None)).await.unwrap();
        assert!(!claimed.is_empty());
        left -= claimed.len();
        complete_all(store, claimed).await;
    }
}

/// Records every one of `claimed` done, each succeeding.
async fn complete_all(store: &PostgresStore, claimed: Vec<mailroom_core::Claimed>) {
    for c in claimed {
        store
            .complete(c.event.id, c.token, mailroom_core::Completion::Done)
            .await
            .unwrap();
    }
}

/// A store VACUUMs the queue after `vacuum_queue_every` claimed events,
/// and never with 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_vacuumed_after_many_claims() {
    for (every, vacuums) in [(0, false), (50, true)] {
        let url = mailroom_testkit::fresh_postgres_db().await;
        let mut opts = PostgresOptions::from_url(&url).unwrap();
        opts.vacuum_queue_every = every;
        let store = PostgresStore::connect(opts).await.unwrap();
        store.migrate().await.unwrap();
        claim_and_complete(&store, 120).await;
        // Statistics reach the view a moment after the vacuum ends.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut seen = queue_vacuums(&url).await;
        while seen == 0 && vacuums && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            seen = queue_vacuums(&url).await;
        }
        if !vacuums {
            tokio::time::sleep(Duration::from_secs(1)).await;
            seen = queue_vacuums(&url).await;
        }
        assert_eq!(
            seen > 0,
            vacuums,
            "vacuum_queue_every = {every}: {seen} vacuums"
        );
    }
}

/// `Store::notifications` streams the topics other instances insert into.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_stream_topics_from_other_instances() {
    use futures::StreamExt;
    let (url, store) = fresh(true).await;
    let mut stream = store.notifications().expect("postgres announces commits");
    let other = store_at(&url, true).await;
    other.insert(event("orders", "e1", None)).await.unwrap();
    let topic = tokio::time::timeout(Duration::from_millis(100), stream.next())
        .await
        .expect("within 100 ms");
    assert_eq!(topic.as_deref(), Some("orders"));
}

/// Of two instances, one leads at a time; the leader renews, and the other
/// takes over once the lease has expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_leads_at_a_time() {
    let (url, a) = fresh(true).await;
    let b = store_at(&url, true).await;
    let ttl = Duration::from_millis(300);
    assert!(a.try_lead("maintenance", "a", ttl).await.unwrap());
    assert!(!b.try_lead("maintenance", "b", ttl).await.unwrap());
    assert!(
        a.try_lead("maintenance", "a", ttl).await.unwrap(),
        "renewal"
    );
    assert!(b.try_lead("other-role", "b", ttl).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        b.try_lead("maintenance", "b", ttl).await.unwrap(),
        "takeover after expiry"
    );
    assert!(!a.try_lead("maintenance", "a", ttl).await.unwrap());
}

/// `store.claim(req)` in a task of its own, for a test to watch it wait.
fn claim_meanwhile(
    store: &PostgresStore,
    req: &ClaimRequest,
) -> tokio::task::JoinHandle<mailroom_core::Result<Vec<mailroom_core::Claimed>>> {
    let (store, req) = (store.clone(), req.clone());
    tokio::spawn(async move { store.claim(&req).await })
}

/// Takes sequential topic `topic`'s claim lock in `tx` (class "mrct",
/// `hashtext(topic)`), as another instance's claim in flight holds it.
async fn hold_claim_lock(tx: &mut sqlx::PgConnection, topic: &str) {
    sqlx::query("SELECT pg_advisory_xact_lock(1836213108, hashtext($1))")
        .bind(topic)
        .execute(tx)
        .await
        .unwrap();
}

/// Takes `topic`'s claim lock on a connection of its own, as another
/// instance's claim would, and lets go of it; panics with `why` unless it
/// was granted `within`.
async fn take_claim_lock_within(url: &str, topic: &str, within: Duration, why: &str) {
    let mut other = sqlx::PgConnection::connect(url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    tokio::time::timeout(within, hold_claim_lock(&mut tx, topic))
        .await
        .expect(why);
    tx.rollback().await.unwrap();
}

/// A store's claimer lets go of its topic's claim lock within
/// milliseconds of its last claim (`claimer.rs`): a topic that stopped
/// claiming keeps no other instance waiting (without the release, this
/// lock would wait for the server to end the claimer's idle session, 1 s;
/// the 500 ms allowed here is far more than the release's 5 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_lets_go_of_its_topic_soon_after_its_last_claim() {
    let (url, store) = fresh(false).await;
    store.insert(event("seq", "a1", Some("A"))).await.unwrap();
    let claimed = store
        .claim(&claim_req("seq", 10, Some(OnDead::Block)))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    take_claim_lock_within(
        &url,
        "seq",
        Duration::from_millis(500),
        "the claimer kept its topic's lock after its last claim",
    )
    .await;
}

/// A claimer whose claims follow each other without pause still lets go
/// of its topic's lock when a claim sees another session waiting for it,
/// and every `HOLD_MAX` (100 ms) in any case: another instance's claim of
/// the topic gets its turn while this one keeps claiming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimer_claiming_without_pause_still_gives_other_instances_turns() {
    let (url, store) = fresh(false).await;
    let busy = tokio::spawn(async move {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            store
                .claim(&claim_req("seq", 10, Some(OnDead::Block)))
                .await
                .unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    take_claim_lock_within(
        &url,
        "seq",
        Duration::from_secs(2),
        "a claimer claiming without pause kept its topic's lock",
    )
    .await;
    busy.await.unwrap();
}

/// The race the topic's claim lock closes, made deterministic: while
/// another connection's claim of a key's head (A2) is still uncommitted, an
/// earlier event of the key (A1) is replayed. On a snapshot taken then, A2
/// still looks pending and A1 looks like the head, so a claim would start
/// A1 while A2 runs. Holding the topic's claim lock, as every claim of a
/// sequential topic does, makes this claim wait for that one to commit and
/// then see A2 running: A1 waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_flight_on_another_connection_holds_its_topic() {
    let (url, store) = fresh(true).await;
    let a1 = store
        .insert(event("seq", "a1", Some("A")))
        .await
        .unwrap()
        .id;
    let a2 = store
        .insert(event("seq", "a2", Some("A")))
        .await
        .unwrap()
        .id;
    let r = claim_req("seq", 10, Some(OnDead::Block));
    let c = store.claim(&r).await.unwrap();
    store
        .complete(a1, c[0].token, Completion::Done)
        .await
        .unwrap();

    // Another instance's claim of A2, caught between its UPDATE and COMMIT:
    // the topic's claim lock and the row change, both uncommitted.
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    hold_claim_lock(&mut tx, "seq").await;
    for change in [
        "UPDATE mailroom.queue SET state = 'running'
         WHERE seq = (SELECT seq FROM mailroom.events WHERE id = $1::text::uuid)",
        "UPDATE mailroom.events SET status = 'running', attempts = attempts + 1,
             lease_until = now() + interval '30 seconds', next_attempt_at = NULL
         WHERE id = $1::text::uuid",
    ] {
        sqlx::query(change)
            .bind(a2.to_string())
            .execute(&mut *tx)
            .await
            .unwrap();
    }

    store.replay(a1, 1).await.unwrap();
    let claim = claim_meanwhile(&store, &r);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !claim.is_finished(),
        "the claim did not wait for the one in flight"
    );
    tx.commit().await.unwrap();
    assert!(
        claim.await.unwrap().unwrap().is_empty(),
        "A2 runs, so A1 waits"
    );
    let running = ListFilter {
        status: Some(Status::Running),
        ..ListFilter::default()
    };
    let running = store.list(&running).await.unwrap().events;
    assert_eq!(running.iter().map(|e| e.id).collect::<Vec<_>>(), vec![a2]);
}

/// Claims of one sequential topic wait for each other, in this process
/// without a pool connection: a crowd of them (pull workers asking at
/// once) while another instance's claim holds the topic's lock keeps one
/// connection waiting, and an insert still gets one at once. (Without the
/// process's own turn, the 8 claims took all 8 connections and the insert
/// waited for the pool's acquire timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_claims_of_one_topic_waits_on_one_connection() {
    let (url, store) = fresh(false).await;
    store.insert(event("seq", "a1", Some("A"))).await.unwrap();
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut held = other.begin().await.unwrap();
    hold_claim_lock(&mut held, "seq").await;
    let crowd: Vec<_> = (0..8)
        .map(|_| claim_meanwhile(&store, &claim_req("seq", 10, Some(OnDead::Block))))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::time::timeout(
        Duration::from_secs(2),
        store.insert(event("other", "b1", None)),
    )
    .await
    .expect("the claims waiting for the topic's lock hold the pool")
    .unwrap();
    held.commit().await.unwrap();
    let mut claimed = 0;
    for claim in crowd {
        claimed += claim.await.unwrap().unwrap().len();
    }
    assert_eq!(claimed, 1, "A's event is claimed once");
}

/// A claim that waited for its topic's lock (another instance's claim
/// held it for 2 s) still gets its whole lease, counted on the database's
/// clock from its statement, not from its transaction's start before the
/// wait: the engine reckons the lease from when the claim returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_for_its_topic_gets_its_whole_lease() {
    let (url, store) = fresh(false).await;
    store.insert(event("seq", "a1", Some("A"))).await.unwrap();
    let mut other = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut held = other.begin().await.unwrap();
    hold_claim_lock(&mut held, "seq").await;
    let claim = claim_meanwhile(&store, &claim_req("seq", 10, Some(OnDead::Block)));
    tokio::time::sleep(Duration::from_secs(2)).await;
    held.commit().await.unwrap();
    let claimed = claim.await.unwrap().unwrap();
    assert_eq!(claimed.len(), 1);
    let now = store.now().await.unwrap();
    let left = claimed[0].lease_until.duration_since(now);
    assert!(
        left.as_secs_f64() > 29.0,
        "{left:?} of a 30 s lease left just after the claim"
    );
}

/// A claim that came back full makes the next one start past what it took
/// (the floor, `src/floor.rs`). An older event that turns pending again
/// (here a retry due at once) is still claimed: within the rescan interval
/// while newer events keep the claims full, and at once when a claim from
/// the floor comes back short.
#[tokio::test]
async fn events_behind_the_claim_floor_are_still_claimed() {
    let (_url, store) = fresh(true).await;
    for i in 0..40 {
        store
            .insert(event("orders", &format!("e{i}"), None))
            .await
            .unwrap();
    }
    let retry = Completion::Retry {
        delay: Duration::ZERO,
        error: "again".into(),
    };
    let first = store.claim(&claim_req("orders", 10, None)).await.unwrap();
    assert_eq!(first.len(), 10);
    let old = &first[0];
    store
        .complete(old.event.id, old.token, retry.clone())
        .await
        .unwrap();

    // Newer events keep the claims full: the next claim walks from the
    // floor, past the retried event...
    let next = store.claim(&claim_req("orders", 5, None)).await.unwrap();
    assert_eq!(next.len(), 5);
    assert!(next.iter().all(|c| c.event.id != old.event.id));
    // ...which a later claim takes while newer events are still waiting
    // (one claim per 100 ms: 25 events left, 2.5 s against a 1 s rescan).
    let mut newer_left = 25;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let got = store.claim(&claim_req("orders", 1, None)).await.unwrap();
        assert_eq!(got.len(), 1, "the newer events ran out first");
        if got[0].event.id == old.event.id {
            break;
        }
        newer_left -= 1;
        assert!(newer_left > 0, "the retried event was never claimed");
    }

    // Claim exactly what is left: a full claim, so the floor is now past
    // every event. A retried event is then claimed at once: the walk from
    // the floor comes back empty, and the whole topic is walked for the rest.
    let pending = ListFilter {
        topic: Some("orders".into()),
        status: Some(Status::Pending),
        limit: 100,
        ..ListFilter::default()
    };
    let left = store.list(&pending).await.unwrap().events.len();
    let max = u32::try_from(left).unwrap();
    let rest = store.claim(&claim_req("orders", max, None)).await.unwrap();
    assert_eq!(rest.len(), left);
    let again = &rest[0];
    store
        .complete(again.event.id, again.token, retry)
        .await
        .unwrap();
    let got = store.claim(&claim_req("orders", 100, None)).await.unwrap();
    assert_eq!(
        got.iter().map(|c| c.event.id).collect::<Vec<_>>(),
        vec![again.event.id]
    );
}

/// An event delivered later that falls due while newer events keep the
/// claims full: claims from the floor leave it to the walks of the whole
/// topic (at least one per rescan interval), which take it before the
/// newer events run out, never before it is due; and once the claims come
/// back short, the next claim takes a due one at once.
#[tokio::test]
async fn a_delayed_event_due_behind_the_claim_floor_is_claimed() {
    let (_url, store) = fresh(true).await;
    let delayed = |name: &str| {
        let mut e = event("orders", name, None);
        e.delivery = Delivery::After(Duration::from_secs(2));
        e
    };
    let d = store.insert(delayed("d")).await.unwrap().id;
    let due = store
        .get(d)
        .await
        .unwrap()
        .unwrap()
        .next_attempt_at
        .unwrap();
    for i in 0..60 {
        store
            .insert(event("orders", &format!("e{i}"), None))
            .await
            .unwrap();
    }
    // Full claims, one per 100 ms: the floor moves past `d`'s `seq` while
    // it is not due, and stays in use after it fell due.
    let first = store.claim(&claim_req("orders", 10, None)).await.unwrap();
    assert_eq!(first.len(), 10);
    // A machine this slow made `d` due before the first claim.
    let mut taken = first.iter().any(|c| c.event.id == d);
    let mut newer_left = if taken { 51 } else { 50 };
    while !taken {
        let got = store.claim(&claim_req("orders", 1, None)).await.unwrap();
        let read_at = store.now().await.unwrap();
        assert_eq!(got.len(), 1, "the newer events ran out first");
        taken = got[0].event.id == d;
        if taken {
            assert!(read_at >= due, "claimed at {read_at}, due at {due}");
            assert!(newer_left > 0, "claimed only once the newer events ran out");
        } else {
            newer_left -= 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Claim what is left in one full claim, then a short one (nothing
    // left): a delayed event that falls due now is taken by the next claim.
    let left = u32::try_from(newer_left).unwrap();
    let rest = store.claim(&claim_req("orders", left, None)).await.unwrap();
    assert_eq!(rest.len(), newer_left);
    let d2 = store.insert(delayed("d2")).await.unwrap().id;
    let due = store
        .get(d2)
        .await
        .unwrap()
        .unwrap()
        .next_attempt_at
        .unwrap();
    assert!(
        store
            .claim(&claim_req("orders", 10, None))
            .await
            .unwrap()
            .is_empty()
    );
    while store.now().await.unwrap() < due {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let got = store.claim(&claim_req("orders", 10, None)).await.unwrap();
    assert_eq!(got.iter().map(|c| c.event.id).collect::<Vec<_>>(), vec![d2]);
}

/// A sequential topic with one deep key: its claim walks a bounded number
/// of pending events (1,024), then finds the other keys' heads one key at a
/// time, and keyless events. Heads past the bound are claimed, the head
/// rule still holds there (a dead head blocks its key unless `on_dead =
/// skip`, a head not yet due waits), and the next due time is that of a
/// head past the bound, not of an event waiting behind its key's head.
#[tokio::test]
async fn sequential_claims_reach_heads_past_a_deep_key() {
    let (url, store) = fresh(true).await;
    let deep = 1100;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..deep {
        let s = store.clone();
        tasks.spawn(async move { s.insert(event("t", &format!("a{i}"), Some("a"))).await });
    }
    for answer in tasks.join_all().await {
        answer.unwrap();
    }
    for (dedup, key) in [
        ("d1", Some("d")),
        ("d2", Some("d")),
        ("b1", Some("b")),
        ("c1", Some("c")),
        ("n1", None),
    ] {
        store.insert(event("t", dedup, key)).await.unwrap();
    }
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(
        "UPDATE mailroom.events SET status = 'dead', next_attempt_at = NULL WHERE dedup_key = 'd1';
         UPDATE mailroom.events SET next_attempt_at = now() + interval '1 hour'
         WHERE dedup_key = 'c1';
         UPDATE mailroom.events SET next_attempt_at = now() - interval '1 hour'
         WHERE key = 'a' AND seq > (SELECT min(seq) FROM mailroom.events WHERE key = 'a');
         UPDATE mailroom.queue q SET state = e.status, run_at = COALESCE(e.next_attempt_at, q.run_at)
         FROM mailroom.events e WHERE e.seq = q.seq;",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let dedup_of = |claimed: &[mailroom_core::Claimed]| {
        let mut keys: Vec<String> = claimed.iter().map(|c| c.event.dedup_key.clone()).collect();
        keys.sort();
        keys
    };
    let first_of_a: String = sqlx::query_scalar(
        "SELECT dedup_key FROM mailroom.events WHERE key = 'a' ORDER BY seq LIMIT 1",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();

    let block = store
        .claim(&claim_req("t", 50, Some(OnDead::Block)))
        .await
        .unwrap();
    assert_eq!(
        dedup_of(&block),
        vec![first_of_a, "b1".to_string(), "n1".to_string()]
    );

    // Every head now runs, is blocked or is not due: the next due time is
    // c1's, in an hour; the deep key's waiting events (due an hour ago)
    // do not count.
    let due = store
        .next_due(&claim_req("t", 50, Some(OnDead::Block)))
        .await
        .unwrap()
        .expect("c1 is due in an hour");
    let now = store.now().await.unwrap();
    let ahead = due.duration_since(now).as_secs_f64();
    assert!((3500.0..3700.0).contains(&ahead), "next due in {ahead} s");

    // With on_dead = skip, the dead d1 no longer holds d2 back.
    let skip = store
        .claim(&claim_req("t", 50, Some(OnDead::Skip)))
        .await
        .unwrap();
    assert_eq!(dedup_of(&skip), vec!["d2".to_string()]);
    let nothing = store
        .claim(&claim_req("t", 50, Some(OnDead::Block)))
        .await
        .unwrap();
    assert!(nothing.is_empty(), "claimed {:?}", dedup_of(&nothing));

    // A keyless event (the outbox can store one in any topic) behind the
    // blocked deep key is still reached: claims look past the bound for
    // keyless events at least once a second.
    store.insert(event("t", "n2", None)).await.unwrap();
    let started = std::time::Instant::now();
    loop {
        let got = store
            .claim(&claim_req("t", 50, Some(OnDead::Block)))
            .await
            .unwrap();
        if !got.is_empty() {
            assert_eq!(dedup_of(&got), vec!["n2".to_string()]);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the keyless event was never claimed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `mailroom.enqueue`'s optional trailing arguments: `priority`
/// orders claims, `deliver_at` holds the event until then; the old
/// five-argument call still works, and so do named arguments from SQL.
#[tokio::test]
async fn outbox_enqueue_takes_deliver_at_and_priority() {
    use mailroom_postgres::outbox::{Scheduling, enqueue, enqueue_scheduled};
    let (url, store) = fresh(true).await;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let payload = serde_json::json!({"n": 1});
    let plain = enqueue(&mut conn, "t", "x", None, &payload, Some("plain"))
        .await
        .unwrap();
    let urgent = Scheduling {
        priority: 5,
        ..Scheduling::default()
    };
    let high = enqueue_scheduled(&mut conn, "t", "x", None, &payload, Some("high"), urgent)
        .await
        .unwrap();
    let due = store.now().await.unwrap() + Duration::from_millis(1500);
    let later = Scheduling {
        deliver_at: Some(due),
        priority: 9,
    };
    let held = enqueue_scheduled(&mut conn, "t", "x", None, &payload, Some("later"), later)
        .await
        .unwrap();
    let named: String = sqlx::query_scalar(
        "SELECT mailroom.enqueue('t', 'x', NULL, '{}'::jsonb, 'named', priority => -1)::text",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let id = |u: uuid::Uuid| EventId(u);
    let named = EventId::parse_stored(&named).unwrap();
    let e = store.get(id(held)).await.unwrap().unwrap();
    assert_eq!(e.priority, 9);
    assert_eq!(
        e.next_attempt_at.unwrap().as_millisecond(),
        due.as_millisecond()
    );
    let taken: Vec<EventId> = store
        .claim(&claim_req("t", 10, None))
        .await
        .unwrap()
        .iter()
        .map(|c| c.event.id)
        .collect();
    assert_eq!(taken, vec![id(high), id(plain), named]);
    while store.now().await.unwrap() < due {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = store.claim(&claim_req("t", 10, None)).await.unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].event.id, id(held));
}
