//! `dlq`: a poison stream into a topic whose dead events are also
//! published to the broker (`dead_letter = { amqp = {...} }`) while the
//! broker is stopped and started again. Checks: the checker's usual rules
//! on the topic's own events (every third dead after exactly its attempts,
//! the rest done), and every dead event's death in the broker's dead-letter
//! queue exactly once (by message id `<event id>/<attempt>`; a redelivery
//! to this consumer after a lost ack is not a second publish), nothing
//! else there.

use super::broker::{self, Node, Received};
use super::{World, recovery};
use crate::backend::Backend;
use crate::check::{self, Expect};
use crate::load::{Load, targets};
use crate::{Report, store};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DLQ: &str = "faults.dlq";
const MAX_ATTEMPTS: i64 = 3;

fn config(amqp: &str, receiver: &str) -> String {
    format!(
        r##"
[amqp]
url = "{amqp}"
[[amqp.exchange]]
name = "faults.dead"
kind = "topic"
[[amqp.queue]]
name = "{DLQ}"
bind = {{ exchange = "faults.dead", routing_key = "#" }}

[[source]]
name = "dl"
topic = "dl"
id = {{ json = "/id" }}

[[topic]]
name = "dl"
concurrency = 16
timeout = "2s"
lease = "6s"
retry = {{ max_attempts = {MAX_ATTEMPTS}, base = "50ms", max_delay = "200ms" }}
handler = {{ http = {{ url = "{receiver}" }} }}
dead_letter = {{ amqp = {{ exchange = "faults.dead", routing_key = "{{topic}}" }} }}
"##
    )
}

/// Every third event fails with HTTP 500 until it is dead.
fn poison(_c: usize, i: u64) -> Option<&'static str> {
    (i % 3 == 1).then_some("500")
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let secs = |s: [u64; 3]| s.map(Duration::from_secs);
    let [before, down, after] = if quick {
        secs([3, 3, 3])
    } else {
        secs([10, 10, 10])
    };
    let node = Node::start().await?;
    let world = World::new(&backend, Duration::ZERO, |r| config(&node.url, r)).await?;
    let mut serve = world.serve().await?;
    let got = Arc::new(Mutex::new(Received::default()));
    let stop_counting = Arc::new(AtomicBool::new(false));
    let counter = tokio::spawn(broker::count(
        node.url.clone(),
        DLQ,
        got.clone(),
        stop_counting.clone(),
    ));
    let load = Load {
        source: "dl",
        clients: 4,
        keys_per_client: 1,
        per_client: None,
        poison: Some(poison),
        pad: 100,
        pause: Duration::from_millis(20),
    };
    let running = load.start(&targets(vec![serve.base.clone()]), &world.rec);
    tokio::time::sleep(before).await;
    let stopped_at = world.rec.now();
    node.stop().await?;
    tokio::time::sleep(down).await;
    node.start_again().await?;
    let back = world.rec.now();
    world.rec.disrupted_between(stopped_at, back);
    tokio::time::sleep(after).await;
    running.stop().await;
    let settled = |rows: &[check::Row]| {
        rows.iter()
            .all(|r| !matches!(r.status.as_str(), "pending" | "running"))
    };
    let drained = store::settle(&world.fresh.url, settled, Duration::from_secs(90)).await?;
    // The copies are published once settled; give the consumer a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_counting.store(true, Ordering::SeqCst);
    let _ = counter.await;
    serve.signal_term()?;
    serve.exit_within(Duration::from_secs(30)).await?;

    let rows = store::rows(&world.fresh.url).await?;
    let (own, copies): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.topic == "dl");
    let record = world.rec.snapshot();
    let dead_keys: HashSet<String> = record
        .acks
        .iter()
        .filter(|a| a.dedup_key.starts_with("dl-"))
        .filter_map(|a| {
            let i: u64 = a.dedup_key.rsplit('-').next()?.parse().ok()?;
            poison(0, i).map(|_| a.dedup_key.clone())
        })
        .collect();
    let expect = Expect {
        dead: dead_keys,
        dead_attempts: MAX_ATTEMPTS,
        ..Expect::default()
    };
    let verdict = check::check(&record, &own, &expect);
    let mut report = Report::new("dlq", backend.name(), &record, verdict);
    let deaths: HashSet<String> = own
        .iter()
        .filter(|r| r.status == "dead")
        .map(|r| format!("{}/{}", r.id, r.attempts))
        .collect();
    let received = got.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let missing: Vec<&String> = deaths
        .iter()
        .filter(|d| !received.by_id.contains_key(*d))
        .collect();
    let twice: Vec<(&String, u32)> = received
        .by_id
        .iter()
        .filter(|(_, (first, _))| *first > 1)
        .map(|(id, (first, _))| (id, *first))
        .collect();
    let stray: Vec<&String> = received
        .by_id
        .keys()
        .filter(|id| !deaths.contains(*id))
        .collect();
    if !missing.is_empty() {
        report.failures.push(format!(
            "{} of {} dead events never reached {DLQ}, e.g. {:?}",
            missing.len(),
            deaths.len(),
            missing.iter().take(3).collect::<Vec<_>>()
        ));
    }
    if !twice.is_empty() {
        report.failures.push(format!(
            "{} deaths published more than once to {DLQ}, e.g. {:?}",
            twice.len(),
            twice.iter().take(3).collect::<Vec<_>>()
        ));
    }
    if !stray.is_empty() {
        report.failures.push(format!(
            "{} messages in {DLQ} are no death, e.g. {:?}",
            stray.len(),
            stray.iter().take(3).collect::<Vec<_>>()
        ));
    }
    if drained.is_none() {
        report
            .failures
            .push("events still open 90 s after the load stopped".into());
    }
    let redelivered: u32 = received.by_id.values().map(|(_, again)| again).sum();
    report.recovery = recovery(&record, &[back]);
    report.notes.push(format!(
        "broker down {:.1}s; {} dead, {} in {DLQ} ({redelivered} redelivered to the consumer after a lost ack), {} dead-letter copies stored",
        (back - stopped_at).as_secs_f64(),
        deaths.len(),
        received.by_id.len(),
        copies.len()
    ));
    world.cleanup().await?;
    Ok(report)
}
