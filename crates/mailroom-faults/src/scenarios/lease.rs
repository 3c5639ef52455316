//! (6) A worker hangs past its lease: pull workers claim through
//! `/v1/topics/{topic}/claim` with a 1 s lease; on some events the first
//! claimer sleeps past it and acks late. The event must be rescued and run
//! again by another claim, and the late ack refused by its fencing token
//! (409) and change nothing. A late ack that is accepted shows up as two
//! overlapping successful runs of one event (a duplicate).

use super::{World, join_all};
use crate::Report;
use crate::backend::Backend;
use crate::check::Expect;
use crate::load::{Load, http, json_call, targets};
use crate::record::{Call, Outcome, Recorder};
use crate::store;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const LEASE: &str = "1s";
/// How long a hung worker sleeps before its late ack.
const HANG: Duration = Duration::from_millis(2500);
const WORKERS: usize = 4;

fn config(_: &str) -> String {
    "[[source]]\nname = \"jobs\"\ntopic = \"jobs\"\nid = { json = \"/id\" }\n\n[[topic]]\nname = \"jobs\"\ntimeout = \"500ms\"\nlease = \"1s\"\nretry = { max_attempts = 20, base = \"50ms\", max_delay = \"200ms\" }\n".into()
}

/// Every seventh event hangs its first claimer.
fn hangs(_: usize, i: u64) -> Option<&'static str> {
    (i % 7 == 2).then_some("hang")
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let per_client = if quick { 15 } else { 60 };
    let world = World::new(&backend, Duration::ZERO, config).await?;
    let mut serve = world.serve().await?;
    let targets = targets(vec![serve.base.clone()]);
    let load = Load {
        source: "jobs",
        clients: 4,
        keys_per_client: 1,
        per_client: Some(per_client),
        poison: Some(hangs),
        pad: 50,
        pause: Duration::ZERO,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let (base, rec, stop) = (serve.base.clone(), world.rec.clone(), stop.clone());
        workers.spawn(async move { worker(w, &base, &rec, &stop).await });
    }
    let load = load.start(&targets, &world.rec);
    load.finish(Duration::from_secs(120)).await?;
    let drained =
        store::settle(&world.fresh.url, store::all_final, Duration::from_secs(60)).await?;
    // Let the last hung workers deliver their late acks.
    tokio::time::sleep(HANG).await;
    stop.store(true, Ordering::SeqCst);
    join_all(workers, Duration::from_secs(30), "the pull workers").await?;
    serve.signal_term()?;
    serve.exit_within(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&Expect::default()).await?;
    let hung = (0..4)
        .map(|c| (0..per_client).filter(|i| hangs(c, *i).is_some()).count())
        .sum::<usize>();
    let mut report = Report::new("lease", backend.name(), &record, verdict);
    if report.fenced != hung {
        report.failures.push(format!(
            "{hung} workers hung past their lease, {} late acks refused",
            report.fenced
        ));
    }
    if drained.is_none() {
        report
            .failures
            .push("events still open 60 s after the load".into());
    }
    report.notes.push(format!(
        "{WORKERS} pull workers, lease {LEASE}; {hung} hung {}ms then acked late: each refused (409) and the event run again",
        HANG.as_millis()
    ));
    world.cleanup().await?;
    Ok(report)
}

/// A pull worker: claims one event at a time; on a `"fail": "hang"` event's
/// first claim (token 1) it sleeps past the lease before acking.
async fn worker(w: usize, base: &str, rec: &Recorder, stop: &AtomicBool) {
    let client = http();
    let claim_url = format!("{base}/v1/topics/jobs/claim");
    while !stop.load(Ordering::SeqCst) {
        let body = serde_json::json!({"max": 1, "lease": LEASE, "worker": format!("w{w}")});
        let claimed = json_call(&client, &claim_url, Some(&body)).await.ok();
        let events = claimed
            .and_then(|(_, v)| v.get("events")?.as_array().cloned())
            .unwrap_or_default();
        if events.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for e in events {
            run_claim(&client, base, rec, &e).await;
        }
    }
}

/// Works one claimed event and acks it; records the run with how the ack went.
async fn run_claim(client: &reqwest::Client, base: &str, rec: &Recorder, e: &serde_json::Value) {
    let id = e
        .get("id")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    let token = e
        .get("token")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    let start = rec.now();
    let hang = e.pointer("/payload/fail").and_then(|f| f.as_str()) == Some("hang");
    if hang && token == 1 {
        tokio::time::sleep(HANG).await;
    }
    let url = format!("{base}/v1/events/{id}/ack");
    let answered = rec.now();
    let ack = json_call(client, &url, Some(&serde_json::json!({"token": token}))).await;
    let outcome = match ack.map(|(status, _)| status) {
        Ok(200) => Outcome::Succeeded,
        Ok(409) => Outcome::Fenced,
        _ => Outcome::Failed,
    };
    let call = Call {
        event_id: id,
        attempt: u32::try_from(token).unwrap_or(0),
        start,
        answered,
        end: rec.now(),
        outcome,
    };
    rec.lock().calls.push(call);
}
