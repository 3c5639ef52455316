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

use super::FloorResult;
use crate::backend::Backend;
use crate::pgwork::{CpuSampler, DbWork, read_wal};
use anyhow::Context;
use sqlx::{Connection, PgConnection, Row};
use std::time::Instant;

/// Events inserted per preload statement.
const PRELOAD_CHUNK: u64 = 5_000;

/// Step 1, the claim; `$1` how many, `$2` the last `seq` claimed.
const CLAIM: &str = "
    WITH picked AS (
        UPDATE mailroom.queue q SET state = 'running'
        WHERE q.seq = ANY(ARRAY(
            SELECT c.seq FROM mailroom.queue c
            WHERE c.topic = ANY(ARRAY['floor']) AND c.state = 'pending' AND c.run_at <= now()
              AND (c.topic, -c.priority, c.seq) > ('floor', 0, $2)
            ORDER BY c.topic, -c.priority, c.seq LIMIT $1 FOR UPDATE SKIP LOCKED))
        RETURNING q.seq
    )
    UPDATE mailroom.events e
    SET status = 'running', attempts = e.attempts + 1,
        lease_until = now() + interval '30 seconds', started_at = now(),
        worker = 'floor', next_attempt_at = NULL
    WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
    RETURNING e.seq, e.id::text, e.source, e.topic, e.dedup_key, e.key, e.type, e.status,
        e.correlation_id, e.causation_id, e.content_type, e.last_error,
        e.attempts, e.max_attempts, (extract(epoch FROM e.received_at) * 1000000)::int8,
        (extract(epoch FROM e.lease_until) * 1000000)::int8, e.payload";

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
    preload(&mut conn, events, &crate::ingest::body(body_size)).await?;

    let wal_before = read_wal(&fresh).await;
    let cpu = CpuSampler::start();
    let started = Instant::now();
    let (drained, commits) = drain(&mut conn, &fresh.url, max_size).await?;
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
/// store inserts them.
async fn preload(conn: &mut PgConnection, events: u64, body: &[u8]) -> anyhow::Result<()> {
    let mut inserted = 0u64;
    while inserted < events {
        let n = PRELOAD_CHUNK.min(events - inserted);
        sqlx::query(
            "WITH inserted AS (
                 INSERT INTO mailroom.events (id, source, topic, dedup_key, status, max_attempts,
                     next_attempt_at, received_at, content_type, payload)
                 SELECT mailroom.uuid_v7(), 'floor', 'floor', g::text, 'pending', 10,
                     now(), now(), 'application/json', $3
                 FROM generate_series($1::int8, $1::int8 + $2::int8 - 1) g
                 RETURNING seq, topic, key, next_attempt_at
             )
             INSERT INTO mailroom.queue (seq, topic, key, run_at, state)
             SELECT seq, topic, key, next_attempt_at, 'pending' FROM inserted",
        )
        .bind(i64::try_from(inserted)?)
        .bind(i64::try_from(n)?)
        .bind(body)
        .execute(&mut *conn)
        .await
        .context("preloading")?;
        inserted += n;
    }
    Ok(())
}

/// Claims on `conn` and completes on a second connection, the two
/// overlapping as the engine's claim loop and completion group do (one
/// claim ahead at most); events drained and commits.
async fn drain(conn: &mut PgConnection, url: &str, max_size: u32) -> anyhow::Result<(u64, u64)> {
    let mut completer = PgConnection::connect(url).await.context("connecting")?;
    sqlx::query("SET synchronous_commit = on")
        .execute(&mut completer)
        .await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<i64>>(1);
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
        }
        let _ = completer.close().await;
        anyhow::Ok((done, commits))
    });
    let (mut claims, mut last) = (0u64, 0i64);
    loop {
        let claimed = claim(conn, max_size, last).await?;
        claims += 1;
        if claimed.is_empty() {
            break;
        }
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

/// Step 1: up to `max_size` events past `last`, claimed and read.
async fn claim(conn: &mut PgConnection, max_size: u32, last: i64) -> anyhow::Result<Vec<Claimed>> {
    let rows = sqlx::query(CLAIM)
        .bind(i64::from(max_size))
        .bind(last)
        .fetch_all(&mut *conn)
        .await
        .context("claiming")?;
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
