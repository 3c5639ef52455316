//! (7) Poison events: the handler fails some events by HTTP 500, by a
//! connection reset, or by never answering (cut by the topic's timeout).
//! They go `dead` after exactly `max_attempts` with the error text; the
//! rest flow; in a sequential topic the poisoned head blocks its own key
//! and no other.

use super::World;
use crate::backend::Backend;
use crate::faults::Report;
use crate::faults::check::{Expect, Row};
use crate::faults::load::{Load, http, json_call, targets};
use crate::faults::store;
use std::collections::BTreeMap;
use std::time::Duration;

const MAX_ATTEMPTS: i64 = 3;
/// The one sequential key whose head is poisoned.
const BLOCKED_KEY: &str = "c0-k0";
const CLASSES: [&str; 3] = ["500", "reset", "hang"];

fn config(receiver: &str) -> String {
    let topic = |name: &str, extra: &str| {
        format!(
            r#"
[[source]]
name = "{name}"
topic = "{name}"
id = {{ json = "/id" }}

[[topic]]
name = "{name}"
{extra}
concurrency = 16
timeout = "1s"
lease = "2s"
retry = {{ max_attempts = {MAX_ATTEMPTS}, base = "50ms", max_delay = "200ms" }}
handler = {{ http = {{ url = "{receiver}" }} }}
"#
        )
    };
    topic("poison", "") + &topic("pseq", "mode = \"sequential\"\nkey = \"/k\"")
}

/// Every tenth event of `poison` fails, by each class in turn.
fn poison_single(c: usize, i: u64) -> Option<&'static str> {
    (i % 10 == 3).then(|| CLASSES[(c + i as usize) % CLASSES.len()])
}

/// Only the head of key `c0-k0` of `pseq` fails.
fn poison_head(c: usize, i: u64) -> Option<&'static str> {
    (c == 0 && i == 0).then_some("500")
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let per_client = if quick { 30 } else { 200 };
    let world = World::new(&backend, Duration::from_millis(2), config).await?;
    let mut serve = world.serve().await?;
    let targets = targets(vec![serve.base.clone()]);
    let single = Load {
        source: "poison",
        clients: 4,
        keys_per_client: 1,
        per_client: Some(per_client),
        poison: Some(poison_single),
        pad: 100,
        pause: Duration::ZERO,
    };
    let seq = Load {
        source: "pseq",
        keys_per_client: 3,
        poison: Some(poison_head),
        ..single.clone()
    };
    let (a, b) = (
        single.start(&targets, &world.rec),
        seq.start(&targets, &world.rec),
    );
    a.finish().await;
    b.finish().await;
    let settled = |rows: &[Row]| {
        rows.iter().all(|r| match r.status.as_str() {
            "running" => false,
            "pending" => r.topic == "pseq" && r.key.as_deref() == Some(BLOCKED_KEY),
            _ => true,
        })
    };
    let drained = store::settle(&world.fresh.url, settled, Duration::from_secs(60)).await?;
    let mut expect = Expect {
        sequential: ["pseq".to_string()].into(),
        dead_attempts: MAX_ATTEMPTS,
        ..Expect::default()
    };
    for c in 0..4 {
        for i in 0..per_client {
            if poison_single(c, i).is_some() {
                expect.dead.insert(format!("poison-c{c}-{i}"));
            }
        }
    }
    expect.dead.insert("pseq-c0-0".into());
    let errors = dead_errors(&serve.base, &world.fresh.url).await?;
    serve.signal_term()?;
    serve.wait_exit(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&expect).await?;
    let mut report = Report::new("poison", backend.name(), &record, verdict);
    if drained.is_none() {
        report
            .failures
            .push("events other than the blocked key still open after 60 s".into());
    }
    for (id, e) in errors.iter().filter(|(_, e)| e.is_empty()) {
        report
            .failures
            .push(format!("{id}: dead without an error text {e:?}"));
    }
    let blocked = store::rows(&world.fresh.url)
        .await?
        .iter()
        .filter(|r| r.status == "pending")
        .count();
    report.notes.push(format!(
        "{} dead (500, reset, hang; {MAX_ATTEMPTS} attempts each), {blocked} blocked behind the dead head of pseq/{BLOCKED_KEY}; error texts e.g. {:?}",
        errors.len(),
        samples(&errors)
    ));
    world.cleanup().await?;
    Ok(report)
}

/// Each dead event's `last_error`, read through the API.
async fn dead_errors(base: &str, url: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let client = http();
    let mut out = BTreeMap::new();
    for r in store::rows(url)
        .await?
        .into_iter()
        .filter(|r| r.status == "dead")
    {
        let (_, v) = json_call(&client, &format!("{base}/v1/events/{}", r.id), None).await?;
        let e = v
            .get("last_error")
            .and_then(|e| e.as_str())
            .unwrap_or("")
            .to_owned();
        out.insert(r.id, e);
    }
    Ok(out)
}

/// One error text per distinct beginning, shortened.
fn samples(errors: &BTreeMap<String, String>) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for e in errors.values() {
        let short: String = e.chars().take(60).collect();
        if !seen
            .iter()
            .any(|s| s.chars().take(20).eq(short.chars().take(20)))
        {
            seen.push(short);
        }
    }
    seen
}
