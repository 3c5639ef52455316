//! (8) Duplicate storm: many concurrent deliveries of a few ids (spread
//! over the instances on PostgreSQL): one event per id, exactly one answer
//! `"duplicate": false` per id, each event processed once.

use super::{LEASE_SECS, World, join_all, two_topics};
use crate::Report;
use crate::backend::Backend;
use crate::check::{Expect, Row};
use crate::child::Serve;
use crate::load::{Target, Targets, http, targets};
use crate::record::Record;
use crate::store;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

const IDS: usize = 100;
/// Requests in flight at once (the server's own cap is 1,024).
const IN_FLIGHT: usize = 512;

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let copies = if quick { 20 } else { 100 };
    let world = World::new(&backend, Duration::from_millis(5), two_topics).await?;
    let instances = if matches!(backend, Backend::Postgres { .. }) {
        2
    } else {
        1
    };
    let mut serves: Vec<Serve> = Vec::new();
    for _ in 0..instances {
        serves.push(world.serve().await?);
    }
    let targets = targets(serves.iter().map(|s| s.base.clone()).collect());
    storm(&world, &targets, copies).await?;
    let drained =
        store::settle(&world.fresh.url, store::all_final, Duration::from_secs(60)).await?;
    for s in &mut serves {
        s.signal_term()?;
        s.exit_within(Duration::from_secs(30)).await?;
    }
    let expect = Expect {
        lease: Some(Duration::from_secs(LEASE_SECS)),
        ..Expect::default()
    };
    let (record, verdict) = world.check(&expect).await?;
    let mut report = Report::new("storm", backend.name(), &record, verdict);
    let rows = store::rows(&world.fresh.url).await?;
    report.failures.extend(judge(&record, &rows, copies));
    if drained.is_none() {
        report
            .failures
            .push("events still open 60 s after the storm".into());
    }
    report.notes.push(format!(
        "{} deliveries of {IDS} ids over {instances} instance(s), {IN_FLIGHT} in flight; {} handler calls; {} refused (503) and retried",
        IDS * copies,
        record.calls.len(),
        record.refusals.len()
    ));
    world.cleanup().await?;
    Ok(report)
}

/// `copies` deliveries of each of the `IDS` ids, `IN_FLIGHT` at once, in
/// copy-major order: every id is in flight many times at once.
async fn storm(world: &World, targets: &Targets, copies: usize) -> anyhow::Result<()> {
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let stop = Arc::new(AtomicBool::new(false));
    let client = http();
    let mut tasks = JoinSet::new();
    for n in 0..IDS * copies {
        let (gate, targets, rec, stop, client) = (
            gate.clone(),
            targets.clone(),
            world.rec.clone(),
            stop.clone(),
            client.clone(),
        );
        tasks.spawn(async move {
            let Ok(_permit) = gate.acquire().await else {
                return;
            };
            let dedup_key = format!("storm-{}", n % IDS);
            let body = bytes::Bytes::from(format!(r#"{{"id":"{dedup_key}"}}"#));
            let t = Target {
                source: "single",
                targets: &targets,
                rec: &rec,
                stop: &stop,
                http: &client,
            };
            if let Some(ack) = t.deliver(&dedup_key, &body).await {
                rec.lock().acks.push(ack);
            }
        });
    }
    join_all(tasks, Duration::from_secs(300), "the storm's deliveries").await
}

/// The storm's own checks: one event per id, one `"duplicate": false`
/// per id, every delivery acked, one handler call per event (and one more
/// per attempt mailroom's timeout cut).
fn judge(record: &Record, rows: &[Row], copies: usize) -> Vec<String> {
    let mut failures = Vec::new();
    let mut fresh: HashMap<&str, usize> = HashMap::new();
    for a in record.acks.iter().filter(|a| !a.duplicate) {
        *fresh.entry(&a.dedup_key).or_default() += 1;
    }
    if rows.len() != IDS {
        failures.push(format!("{} events stored for {IDS} ids", rows.len()));
    }
    if fresh.len() != IDS || fresh.values().any(|n| *n != 1) {
        failures.push(format!(
            "\"duplicate\": false answered {} times for {} ids (want once per id)",
            fresh.values().sum::<usize>(),
            fresh.len()
        ));
    }
    if record.acks.len() != IDS * copies {
        failures.push(format!(
            "{} of {} deliveries acked",
            record.acks.len(),
            IDS * copies
        ));
    }
    let cut: usize = rows.iter().map(|r| r.timed_out.len()).sum();
    if record.calls.len() < IDS || record.calls.len() > IDS + cut {
        failures.push(format!(
            "{} handler calls for {IDS} events ({cut} attempts timed out)",
            record.calls.len()
        ));
    }
    failures
}
