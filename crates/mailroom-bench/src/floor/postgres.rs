//! `floor --store postgres://…`: what PostgreSQL alone costs a drain on
//! mailroom's schema (`mailroom.events`, the narrow `mailroom.queue`,
//! `mailroom.attempts`), as a bound for the engine's drains.
//!
//! On a fresh database migrated by the store, N pending events are
//! inserted (not measured), then drained by one connection with only the
//! durable writes every drained event needs, set-based, each statement its
//! own transaction and commit (`synchronous_commit = on`, as the store),
//! claims on one connection and completions on another, overlapping:
//!
//! 1. claim `max_size` events: lock their queue rows `FOR UPDATE SKIP
//!    LOCKED` (what makes a claim safe beside other claimers), mark them
//!    running and their events running under a lease, returning the full
//!    rows, read into owned values as a dispatcher must. The walk starts
//!    past the last claimed position, which one lone claimer knows exactly;
//! 2. record them done: their events' status, their queue rows deleted and
//!    their attempt-history rows, by `seq`.
//!
//! No engine, no async work between statements, no handler, no JSON, no
//! lookups by id, no fencing check beyond `status = 'running'`: no
//! dispatcher on this schema can do less per event. The database work (CPU,
//! WAL) is measured over the drain as for the engine's (`pgwork.rs`).
//!
//! [`run_heads`] is the same bound for a sequential topic: the events
//! spread round-robin over keys, and each claim takes only heads of keys
//! ([`HEADS`]): the pending events in claim order, up to the engine's walk
//! bound, of which no earlier event of the key is still in the queue
//! (pending, or running: claimed and not yet completed). Two index probes
//! per candidate (`queue_keys` holds no running row, `queue_running` finds
//! those), one statement, no row lock, no key lock and no second
//! look after the locks: what a lone claimer needs, less than a correct
//! claim beside other claimers can do.

use super::FloorResult;
use crate::backend::Backend;
use crate::pgwork::{CpuSampler, DbWork, read_wal};
use anyhow::Context;
use sqlx::{Connection, PgConnection, Row};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Events inserted per preload statement.
const PRELOAD_CHUNK: u64 = 5_000;

/// The events of the queue rows a claim `picked`, marked running under a
/// lease and returned whole (both claims' second half).
macro_rules! claimed_events {
    () => {
        "
    UPDATE mailroom.events e
    SET status = 'running', attempts = e.attempts + 1,
        lease_until = now() + interval '30 seconds', started_at = now(),
        worker = 'floor', next_attempt_at = NULL
    WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
    RETURNING e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type, e.status,
        e.correlation_id, e.causation_id, e.content_type, e.last_error,
        e.attempts, e.max_attempts, (extract(epoch FROM e.received_at) * 1000000)::int8,
        (extract(epoch FROM e.lease_until) * 1000000)::int8, e.payload"
    };
}

/// Step 1, the claim; `$1` how many, `$2` the last `seq` claimed.
const CLAIM: &str = concat!(
    "WITH picked AS (
        UPDATE mailroom.queue q SET state = 'running'
        WHERE q.seq = ANY(ARRAY(
            SELECT c.seq FROM mailroom.queue c
            WHERE c.topic = ANY(ARRAY['floor']) AND c.state = 'pending' AND c.run_at <= now()
              AND (c.topic, -c.priority, c.seq) > ('floor', 0, $2)
            ORDER BY c.topic, -c.priority, c.seq LIMIT $1 FOR UPDATE SKIP LOCKED))
        RETURNING q.seq
    )",
    claimed_events!()
);

/// Step 1 for a sequential topic: up to `$1` heads of keys, walking at
/// most as many pending events as the engine's claims do
/// (`SEQUENTIAL_WINDOW`, 1,024). A head: no earlier open event of its key
/// that is not running (`queue_keys`, which holds no running row) and
/// nothing of its key running (`queue_running`).
const HEADS: &str = concat!(
    "WITH picked AS (
        UPDATE mailroom.queue q SET state = 'running'
        WHERE q.seq = ANY(ARRAY(
            SELECT c.seq FROM (
                SELECT w.seq, w.topic, w.key FROM mailroom.queue w
                WHERE w.topic = ANY(ARRAY['floor']) AND w.state = 'pending' AND w.run_at <= now()
                ORDER BY w.topic, -w.priority, w.seq LIMIT 1024) c
            WHERE NOT EXISTS (SELECT 1 FROM mailroom.queue p
                              WHERE p.topic = c.topic AND p.key = c.key AND p.key IS NOT NULL
                                AND p.state <> 'running' AND p.seq < c.seq)
              AND NOT EXISTS (SELECT 1 FROM mailroom.queue r
                              WHERE r.topic = c.topic AND r.key = c.key AND r.state = 'running')
            LIMIT $1))
        RETURNING q.seq
    )",
    claimed_events!()
);

/// Step 2, the completion of the claimed `seq`s (`$1`); how many ended.
const COMPLETE: &str = "
    WITH done AS (
        UPDATE mailroom.events SET status = 'done', lease_until = NULL
        WHERE seq = ANY($1) AND status = 'running'
        RETURNING seq, attempts, started_at, worker
    ), dequeued AS (
        DELETE FROM mailroom.queue WHERE seq = ANY($1)
    ), recorded AS (
        INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, worker)
        SELECT seq, attempts, started_at, now(), 'done', worker FROM done
    )
    SELECT count(*) FROM done";

/// A claimed row, owned, as a dispatcher would hold it.
#[allow(dead_code)] // read only to be paid for
struct Claimed {
    seq: i64,
    texts: [Option<String>; 11],
    numbers: [Option<i64>; 4],
    payload: Option<Vec<u8>>,
}

/// Runs one round on a fresh database of `backend`'s server.
pub async fn run(
    backend: &Backend,
    events: u64,
    max_size: u32,
    body_size: usize,
) -> anyhow::Result<FloorResult> {
    run_on(backend, events, max_size, body_size, None).await
}

/// Runs one round of the sequential floor: the events spread round-robin
/// over `keys` keys, claimed `max_size` heads at a time.
pub async fn run_heads(
    backend: &Backend,
    events: u64,
    max_size: u32,
    keys: u64,
    body_size: usize,
) -> anyhow::Result<FloorResult> {
    run_on(backend, events, max_size, body_size, Some(keys.max(1))).await
}

async fn run_on(
    backend: &Backend,
    events: u64,
    max_size: u32,
    body_size: usize,
    keys: Option<u64>,
) -> anyhow::Result<FloorResult> {
    let fresh = backend.fresh().await?;
    let opened = fresh.open(true).await?;
    opened.store().migrate().await.context("migrating")?;
    opened.close().await;
    let mut conn = PgConnection::connect(&fresh.url)
        .await
        .context("connecting")?;
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut conn)
        .await?;
    preload(&mut conn, events, keys, &crate::ingest::body(body_size)).await?;

    let wal_before = read_wal(&fresh).await;
    let cpu = CpuSampler::start();
    let started = Instant::now();
    let (drained, commits) = drain(&mut conn, &fresh.url, max_size, keys.is_some()).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu.finish().await;
    let wal_after = read_wal(&fresh).await;
    anyhow::ensure!(drained == events, "drained {drained} of {events}");
    let _ = conn.close().await;
    fresh.cleanup().await?;
    Ok(FloorResult {
        events,
        max_size,
        secs,
        events_per_sec: events as f64 / secs,
        commits,
        db: wal_before
            .zip(wal_after)
            .map(|(before, after)| DbWork::new(events, &cpu, before, after)),
    })
}

/// `events` pending events of topic `floor` with their queue rows, as the
/// store inserts them; keyless, or spread round-robin over `keys` keys.
async fn preload(
    conn: &mut PgConnection,
    events: u64,
    keys: Option<u64>,
    body: &[u8],
) -> anyhow::Result<()> {
    let mut inserted = 0u64;
    while inserted < events {
        let n = PRELOAD_CHUNK.min(events - inserted);
        sqlx::query(
            "WITH inserted AS (
                 INSERT INTO mailroom.events (id, source, topic, dedup_key, key, status,
                     max_attempts, next_attempt_at, received_at, content_type, payload)
                 SELECT mailroom.uuid_v7(), 'floor', 'floor', g::text, 'k' || (g % $4::int8), 'pending',
                     10, now(), now(), 'application/json', $3
                 FROM generate_series($1::int8, $1::int8 + $2::int8 - 1) g ORDER BY g
                 RETURNING seq, topic, key, next_attempt_at
             )
             INSERT INTO mailroom.queue (seq, topic, key, run_at, state)
             SELECT seq, topic, key, next_attempt_at, 'pending' FROM inserted",
        )
        .bind(i64::try_from(inserted)?)
        .bind(i64::try_from(n)?)
        .bind(body)
        .bind(keys.map(i64::try_from).transpose()?)
        .execute(&mut *conn)
        .await
        .context("preloading")?;
        inserted += n;
    }
    Ok(())
}

/// Claims on `conn` and completes on a second connection, the two
/// overlapping as the engine's claim loop and completion group do (one
/// claim ahead at most); events drained and commits. With `heads`, the
/// claims take heads of keys ([`HEADS`]): one that finds none while
/// completions are outstanding (every key with events left is running)
/// waits for them and claims again.
async fn drain(
    conn: &mut PgConnection,
    url: &str,
    max_size: u32,
    heads: bool,
) -> anyhow::Result<(u64, u64)> {
    let mut completer = PgConnection::connect(url).await.context("connecting")?;
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut completer)
        .await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<i64>>(1);
    let completed = Arc::new(AtomicU64::new(0));
    let done_so_far = completed.clone();
    let completions = tokio::spawn(async move {
        let (mut done, mut commits) = (0u64, 0u64);
        while let Some(seqs) = rx.recv().await {
            let ended: i64 = sqlx::query_scalar(COMPLETE)
                .bind(&seqs)
                .fetch_one(&mut completer)
                .await
                .context("completing")?;
            anyhow::ensure!(
                usize::try_from(ended)? == seqs.len(),
                "completed {ended} of {} claimed",
                seqs.len()
            );
            (done, commits) = (done + seqs.len() as u64, commits + 1);
            done_so_far.store(done, Ordering::Release);
        }
        let _ = completer.close().await;
        anyhow::Ok((done, commits))
    });
    let (mut claims, mut claimed_so_far, mut last) = (0u64, 0u64, 0i64);
    loop {
        // Read before the claim: a completion that commits during it may
        // not be in its snapshot.
        let outstanding = completed.load(Ordering::Acquire) < claimed_so_far;
        let claimed = claim(conn, max_size, (!heads).then_some(last)).await?;
        claims += 1;
        if claimed.is_empty() {
            if heads && outstanding {
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
                continue;
            }
            break;
        }
        claimed_so_far += claimed.len() as u64;
        let seqs: Vec<i64> = claimed.iter().map(|c| c.seq).collect();
        last = seqs.iter().copied().max().unwrap_or(last);
        if tx.send(seqs).await.is_err() {
            break;
        }
    }
    drop(tx);
    let (done, commits) = completions.await.context("the completion task")??;
    Ok((done, claims + commits))
}

/// Step 1: up to `max_size` events past `last` ([`CLAIM`]), or heads of
/// keys without it ([`HEADS`]), claimed and read.
async fn claim(
    conn: &mut PgConnection,
    max_size: u32,
    last: Option<i64>,
) -> anyhow::Result<Vec<Claimed>> {
    let query = match last {
        Some(last) => sqlx::query(CLAIM).bind(i64::from(max_size)).bind(last),
        None => sqlx::query(HEADS).bind(i64::from(max_size)),
    };
    let rows = query.fetch_all(&mut *conn).await.context("claiming")?;
    rows.iter()
        .map(|r| {
            let text = |i: usize| r.try_get::<Option<String>, _>(i);
            let num = |i: usize| r.try_get::<Option<i64>, _>(i);
            Ok(Claimed {
                seq: r.try_get(0)?,
                texts: [
                    text(1)?,
                    text(2)?,
                    text(3)?,
                    text(4)?,
                    text(5)?,
                    text(6)?,
                    text(7)?,
                    text(8)?,
                    text(9)?,
                    text(10)?,
                    text(11)?,
                ],
                numbers: [num(12)?, num(13)?, num(14)?, num(15)?],
                payload: r.try_get(16)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequential floor drains every event and takes only heads: with
    /// 3 keys, a claim takes at most one event per key, so 300 events
    /// need at least 100 claims and 100 completions, where the floor of
    /// keyless events takes them 256 at a time.
    #[tokio::test]
    async fn the_heads_floor_takes_one_event_per_key_per_claim() {
        let backend = Backend::parse(&mailroom_testkit::postgres_admin_url()).unwrap();
        let heads = run_heads(&backend, 300, 256, 3, 16).await.unwrap();
        assert_eq!(heads.events, 300);
        assert!(heads.commits >= 200, "{} commits", heads.commits);
        let keyless = run(&backend, 300, 256, 16).await.unwrap();
        assert!(keyless.commits <= 6, "{} commits", keyless.commits);
    }
}
