//! Behaviour only the SQLite backend has: a file that outlives the process,
//! group commit, a second process on the same file, and load shedding.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use mailroom_conformance::event;
use mailroom_core::{ClaimRequest, Completion, Status, Store, StoreError};
use mailroom_sqlite::{SqliteOptions, SqliteStore};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn open(path: &Path, tune: impl FnOnce(&mut SqliteOptions)) -> SqliteStore {
    let mut opts = SqliteOptions::new(path);
    tune(&mut opts);
    let store = SqliteStore::open(opts).unwrap();
    store.migrate().await.unwrap();
    store
}

fn claim_req(max: u32) -> ClaimRequest {
    ClaimRequest {
        topic: "orders".into(),
        worker: "w".into(),
        max,
        lease: Duration::from_secs(30),
        per_key: None,
        max_wait_for_priority: None,
        expire_after: None,
    }
}

async fn insert_concurrently(store: &SqliteStore, tasks: usize, each: usize) {
    let mut set = tokio::task::JoinSet::new();
    for t in 0..tasks {
        let store = store.clone();
        set.spawn(async move {
            for i in 0..each {
                let answer = store
                    .insert(event("orders", &format!("{t}-{i}"), None))
                    .await
                    .unwrap();
                assert!(!answer.duplicate);
            }
        });
    }
    set.join_all().await;
}

/// Acknowledged events survive closing and reopening the file, history included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let store = open(&path, |_| {}).await;
    let id = store.insert(event("orders", "a", None)).await.unwrap().id;
    let c = store.claim(&claim_req(1)).await.unwrap().remove(0);
    store.complete(id, c.token, Completion::Done).await.unwrap();
    drop(store);

    let store = open(&path, |_| {}).await;
    let e = store.get(id).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Done);
    assert_eq!(e.history.len(), 1);
    assert!(
        store
            .insert(event("orders", "a", None))
            .await
            .unwrap()
            .duplicate
    );
}

/// 64 concurrent callers share commits: far fewer transactions than inserts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_shares_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("m.db"), |_| {}).await;
    let before = store.commits();
    insert_concurrently(&store, 64, 10).await;
    let used = store.commits() - before;
    assert!(used < 640 / 4, "640 inserts took {used} commits");
    assert_eq!(
        store.list(&Default::default()).await.unwrap().events.len(),
        100
    );
}

/// Without group commit every write is its own transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_group_commit_each_write_commits_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("m.db"), |o| o.group_commit = false).await;
    let before = store.commits();
    insert_concurrently(&store, 16, 5).await;
    assert_eq!(store.commits() - before, 80);
}

/// A second store on the same file (the CLI) can replay while the first keeps writing, and the first sees it.
/// A topic loop's outcomes and its next claim share one commit: 50
/// outcomes recorded and 50 events claimed by one `complete_and_claim`
/// are one transaction, not one for the outcomes and one for the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_and_the_next_claim_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("t.db"), |_| {}).await;
    insert_concurrently(&store, 4, 25).await;
    let first = store.claim(&claim_req(50)).await.unwrap();
    let done = first
        .iter()
        .map(|c| (c.event.id, c.token, Completion::Done))
        .collect();
    let before = store.commits();
    let (recorded, next) = store.complete_and_claim(done, &claim_req(50), None).await;
    assert_eq!(store.commits() - before, 1);
    assert!(recorded.iter().all(Result::is_ok), "{recorded:?}");
    assert!(
        matches!(&next, Ok(mailroom_core::LimitedClaim::Claimed { claimed, .. }) if claimed.len() == 50),
        "{next:?}"
    );
    let done = store.stats().await.unwrap()[0].count(Status::Done);
    assert_eq!(done, 50);
}

/// The rows of `sql` (text, text, integer), sorted.
fn rows(db: &rusqlite::Connection, sql: &str) -> Vec<(String, String, i64)> {
    let mut stmt = db.prepare(sql).unwrap();
    let mut rows: Vec<_> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    rows.sort();
    rows
}

/// Claims and completions count their own status changes (schema
/// migration 8, not the trigger): after claims, outcomes one by one and in
/// batches (done, retry, dead, stale), in two topics, the counters equal
/// the rows, and the traffic counters the attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_completions_keep_the_counters_exact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let store = open(&path, |_| {}).await;
    for i in 0..20 {
        store
            .insert(event("orders", &format!("o{i}"), None))
            .await
            .unwrap();
        store
            .insert(event("billing", &format!("b{i}"), None))
            .await
            .unwrap();
    }
    let mut orders = store.claim(&claim_req(12)).await.unwrap();
    let billing = ClaimRequest {
        topic: "billing".into(),
        ..claim_req(5)
    };
    let bills = store.claim(&billing).await.unwrap();
    let one = orders.remove(0);
    store
        .complete(one.event.id, one.token, Completion::Done)
        .await
        .unwrap();
    let retry = Completion::Retry {
        delay: Duration::ZERO,
        error: "x".into(),
    };
    let dead = Completion::Dead { error: "y".into() };
    let mut items: Vec<_> = orders
        .iter()
        .take(6)
        .map(|c| (c.event.id, c.token, Completion::Done))
        .collect();
    items.push((orders[6].event.id, orders[6].token, retry));
    items.push((orders[7].event.id, orders[7].token, dead));
    // Stale: recorded above already.
    items.push((one.event.id, one.token, Completion::Done));
    items.extend(
        bills
            .iter()
            .take(3)
            .map(|c| (c.event.id, c.token, Completion::Done)),
    );
    let results = store.complete_many(items).await;
    assert_eq!(
        results.iter().filter(|r| r.is_err()).count(),
        1,
        "{results:?}"
    );
    let done = orders[8..]
        .iter()
        .map(|c| (c.event.id, c.token, Completion::Done));
    let (recorded, next) = store
        .complete_and_claim(done.collect(), &claim_req(4), None)
        .await;
    assert!(
        recorded.iter().all(Result::is_ok) && next.is_ok(),
        "{recorded:?} {next:?}"
    );
    drop(store);

    let db = rusqlite::Connection::open(&path).unwrap();
    let counted = rows(
        &db,
        "SELECT topic, status, n FROM topic_counts WHERE n <> 0",
    );
    let actual = rows(
        &db,
        "SELECT topic, status, COUNT(*) FROM events GROUP BY 1, 2",
    );
    assert_eq!(counted, actual);
    assert!(actual.iter().any(|(_, s, n)| s == "done" && *n > 1));
    assert!(actual.iter().any(|(_, s, n)| s == "running" && *n > 1));
    let outcomes = "SELECT topic, 'done', SUM(done) FROM traffic GROUP BY 1
                    UNION ALL SELECT topic, 'failed', SUM(failed) FROM traffic GROUP BY 1";
    let attempts = "SELECT e.topic, 'done', SUM(a.outcome = 'done') FROM attempts a
                        JOIN events e ON e.seq = a.event_seq GROUP BY 1
                    UNION ALL SELECT e.topic, 'failed', SUM(a.outcome <> 'done') FROM attempts a
                        JOIN events e ON e.seq = a.event_seq GROUP BY 1";
    assert_eq!(rows(&db, outcomes), rows(&db, attempts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_can_replay_while_the_first_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let server = open(&path, |_| {}).await;
    let id = server
        .insert(event("orders", "poison", None))
        .await
        .unwrap()
        .id;
    let c = server.claim(&claim_req(1)).await.unwrap().remove(0);
    server
        .complete(id, c.token, Completion::Dead { error: "x".into() })
        .await
        .unwrap();

    let writing = {
        let server = server.clone();
        tokio::spawn(async move { insert_concurrently(&server, 8, 50).await })
    };
    let cli = open(&path, |_| {}).await;
    let replayed = cli.replay(id, 3).await.unwrap();
    assert_eq!(replayed.status, Status::Pending);
    drop(cli);
    writing.await.unwrap();

    let e = server.get(id).await.unwrap().unwrap();
    assert_eq!(e.status, Status::Pending);
    assert_eq!(e.max_attempts, 4);
    let claimed = server.claim(&claim_req(1000)).await.unwrap();
    assert_eq!(claimed.len(), 401);
    assert_eq!(
        claimed[0].event.id, id,
        "the replayed event keeps its place"
    );
}

/// Two stores migrating one fresh file at once both succeed and apply the schema once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_are_safe() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let a = SqliteStore::open(SqliteOptions::new(&path)).unwrap();
    let b = SqliteStore::open(SqliteOptions::new(&path)).unwrap();
    let (ra, rb) = tokio::join!(a.migrate(), b.migrate());
    ra.unwrap();
    rb.unwrap();
    drop((a, b));
    let conn = rusqlite::Connection::open(&path).unwrap();
    // Every migration recorded once: versions 1..=n, no repeats.
    let (rows, distinct, newest): (i64, i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), COUNT(DISTINCT version), MAX(version) FROM schema_migrations",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert!(newest >= 2, "migrations applied: {newest}");
    assert_eq!((rows, distinct), (newest, newest));
}

/// When the write queue is full, inserts fail fast with Overloaded instead of waiting, and queued work still commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_sheds_inserts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let store = open(&path, |o| {
        o.queue_capacity = 2;
        o.busy_timeout = Duration::from_secs(10);
    })
    .await;
    // Another process holds the write lock, so the writer thread stalls.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();

    let mut queued = Vec::new();
    let mut shed = 0;
    for i in 0..10 {
        let s = store.clone();
        let task =
            tokio::spawn(async move { s.insert(event("orders", &format!("{i}"), None)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        if task.is_finished() {
            let r = task.await.unwrap();
            assert!(matches!(r, Err(StoreError::Overloaded)), "{r:?}");
            shed += 1;
        } else {
            queued.push(task);
        }
    }
    assert!(shed >= 5, "only {shed} of 10 were shed");
    blocker.execute_batch("COMMIT").unwrap();
    for task in queued {
        assert!(!task.await.unwrap().unwrap().duplicate);
    }
}

/// Dropping the last handle finishes queued writes and closes the file; nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_store_stops_the_writer_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.db");
    let store = Arc::new(open(&path, |_| {}).await);
    insert_concurrently(&store, 4, 25).await;
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 100);
}

/// A quick throughput sanity check: grouped inserts, then claims and completions in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_sanity() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("m.db"), |_| {}).await;
    let start = Instant::now();
    insert_concurrently(&store, 64, 40).await;
    let inserted = start.elapsed();
    let commits = store.commits();

    let start = Instant::now();
    let mut done = 0;
    loop {
        let batch = store.claim(&claim_req(256)).await.unwrap();
        if batch.is_empty() {
            break;
        }
        let mut set = tokio::task::JoinSet::new();
        for c in batch {
            let s = store.clone();
            set.spawn(async move { s.complete(c.event.id, c.token, Completion::Done).await });
        }
        for r in set.join_all().await {
            r.unwrap();
            done += 1;
        }
    }
    let processed = start.elapsed();
    assert_eq!(done, 2560);
    println!(
        "2560 inserts in {inserted:?} ({:.0}/s, {commits} commits); claimed+completed in {processed:?} ({:.0}/s)",
        2560.0 / inserted.as_secs_f64(),
        2560.0 / processed.as_secs_f64()
    );
}

/// A purge walks the whole table in bounded steps, across gaps left by deleted rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_walks_every_row_in_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("m.db"), |_| {}).await;
    insert_concurrently(&store, 50, 100).await;
    loop {
        let batch = store.claim(&claim_req(1000)).await.unwrap();
        if batch.is_empty() {
            break;
        }
        let mut set = tokio::task::JoinSet::new();
        for c in batch {
            let s = store.clone();
            set.spawn(async move { s.complete(c.event.id, c.token, Completion::Done).await });
        }
        for r in set.join_all().await {
            r.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    let report = store
        .purge(mailroom_core::Retention {
            done: Duration::ZERO,
            dead: Duration::ZERO,
            dedup: Duration::from_secs(3600),
        })
        .await
        .unwrap();
    assert_eq!(report.payloads_dropped, 5000);
    let report = store
        .purge(mailroom_core::Retention {
            done: Duration::ZERO,
            dead: Duration::ZERO,
            dedup: Duration::ZERO,
        })
        .await
        .unwrap();
    assert_eq!(report.rows_deleted, 5000);
    assert!(
        store
            .list(&Default::default())
            .await
            .unwrap()
            .events
            .is_empty()
    );
}
