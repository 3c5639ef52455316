//! Rough throughput of a [`PostgresStore`]: concurrent inserts through
//! group commit, then a drain (claim + complete) with a no-op handler.
//!
//! ```text
//! cargo run --release -p mailroom-postgres --example pg_throughput -- \
//!     postgres://postgres@127.0.0.1:5432/bench [events] [workers] [claim batch]
//! ```
//! The database must exist; the example migrates it and uses its own topic.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use mailroom_core::{ClaimRequest, Completion, EventId, NewEvent, Store};
use mailroom_postgres::{PostgresOptions, PostgresStore};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .expect("usage: pg_throughput URL [events] [workers] [batch]");
    let n: usize = args.get(2).map_or(20_000, |a| a.parse().expect("events"));
    let workers: usize = args.get(3).map_or(4, |a| a.parse().expect("workers"));
    let batch: u32 = args.get(4).map_or(100, |a| a.parse().expect("batch"));
    let mut opts = PostgresOptions::from_url(url).expect("url");
    opts.pool_size = 16;
    let store = PostgresStore::connect(opts).await.expect("connect");
    store.migrate().await.expect("migrate");
    let topic = format!("bench-{}", EventId::new());

    let started = Instant::now();
    let commits_before = store.commits();
    insert(&store, &topic, n).await;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "insert: {n} events in {secs:.2}s = {:.0}/s ({} commits)",
        n as f64 / secs,
        store.commits() - commits_before
    );

    let started = Instant::now();
    let drained = drain(&store, &topic, workers, batch).await;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "drain: {drained} events in {secs:.2}s = {:.0}/s ({workers} workers, claim batch {batch})",
        drained as f64 / secs
    );
}

/// `n` events into `topic` from 64 concurrent tasks (so group commit has
/// company to group).
async fn insert(store: &PostgresStore, topic: &str, n: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    let per_task = n.div_ceil(64);
    for t in 0..64 {
        let (s, topic) = (store.clone(), topic.to_string());
        tasks.spawn(async move {
            for i in (t * per_task)..((t + 1) * per_task).min(n) {
                let e = NewEvent {
                    id: EventId::new(),
                    source: "bench".into(),
                    topic: topic.clone(),
                    dedup_key: format!("{topic}-{i}"),
                    key: None,
                    event_type: Some("bench".into()),
                    correlation_id: None,
                    causation_id: None,
                    version: None,
                    traceparent: None,
                    content_type: Some("application/json".into()),
                    payload: Bytes::from_static(br#"{"hello":"world"}"#),
                    max_attempts: 3,
                    delivery: mailroom_core::Delivery::Now,
                    priority: 0,
                };
                s.insert(e).await.expect("insert");
            }
        });
    }
    tasks.join_all().await;
}

/// `workers` tasks claiming up to `batch` events of `topic` at a time and
/// completing each, until nothing is left; how many were drained.
async fn drain(store: &PostgresStore, topic: &str, workers: usize, batch: u32) -> usize {
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let s = store.clone();
        let req = ClaimRequest {
            topic: topic.to_string(),
            worker: format!("w{w}"),
            max: batch,
            lease: Duration::from_secs(30),
            per_key: None,
            max_wait_for_priority: None,
            expire_after: None,
        };
        tasks.spawn(async move {
            let mut done = 0usize;
            loop {
                let claimed = s.claim(&req).await.expect("claim");
                if claimed.is_empty() {
                    return done;
                }
                done += claimed.len();
                let completions = claimed.into_iter().map(|c| {
                    let s = s.clone();
                    async move { s.complete(c.event.id, c.token, Completion::Done).await }
                });
                for r in futures_join_all(completions).await {
                    r.expect("complete");
                }
            }
        });
    }
    tasks.join_all().await.into_iter().sum()
}

/// Runs the futures concurrently on this task's runtime and collects their outputs.
async fn futures_join_all<F>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for f in futures {
        set.spawn(f);
    }
    set.join_all().await
}
