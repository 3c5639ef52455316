//! (7, closures) Poison events whose Rust closure handler panics: closures
//! exist only in the library, so this part runs the `mailroom` engine in
//! process, with its real dispatcher, over a fresh store. A panicking
//! attempt is a retry; after `max_attempts` the event is `dead` with
//! "handler panicked"; the rest flow; a sequential key whose head panics
//! blocks only itself.

use super::poison::{BLOCKED_KEY, MAX_ATTEMPTS, dead_rows};
use super::{Task, join_all};
use crate::Report;
use crate::backend::Backend;
use crate::check::{self, Expect, Row};
use crate::record::{Ack, Call, Outcome as Seen, Recorder};
use crate::store;
use mailroom::handler::handler_fn;
use mailroom::{Backoff, Draft, Engine, Event, Field, Mode, OnDead, RetryPolicy, TopicSpec};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What a poisoned closure panics with (and the panic hook keeps quiet about).
const PANIC_TEXT: &str = "poisoned: closure panic";
const CLIENTS: usize = 4;

fn topics() -> [TopicSpec; 2] {
    let retry = RetryPolicy {
        max_attempts: u32::try_from(MAX_ATTEMPTS).unwrap_or(3),
        backoff: Backoff::Exponential {
            base: Duration::from_millis(50),
            factor: 2.0,
            max_delay: Duration::from_millis(200),
            jitter: 0.2,
        },
    };
    let spec = |name: &str| {
        TopicSpec::new(name)
            .concurrency(16)
            .timeout(Duration::from_secs(1))
            .lease(Duration::from_secs(2))
            .retry(retry.clone())
    };
    [
        spec("fn"),
        spec("fnseq")
            .mode(Mode::Sequential {
                on_dead: OnDead::Block,
            })
            .key(Field::Json("/k".into())),
    ]
}

/// Every tenth event of `fn` panics; in `fnseq` only the head of `c0-k0`.
fn poisoned(topic: &str, c: usize, i: u64) -> bool {
    if topic == "fn" {
        i % 10 == 3
    } else {
        c == 0 && i == 0
    }
}

/// The closure: records the call, then panics on a poisoned event.
fn handler(rec: Recorder) -> mailroom::handler::SharedHandler {
    handler_fn(move |event: Event| {
        let rec = rec.clone();
        async move {
            let start = rec.now();
            let poison = event
                .payload
                .as_ref()
                .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                .is_some_and(|v| v.get("fail").is_some_and(|f| f == "panic"));
            let now = rec.now();
            rec.lock().calls.push(Call {
                event_id: event.id.to_string(),
                attempt: event.attempts,
                start,
                answered: now,
                end: now,
                outcome: if poison {
                    Seen::Failed
                } else {
                    Seen::Succeeded
                },
            });
            if poison {
                panic!("{PANIC_TEXT}");
            }
            Ok::<(), String>(())
        }
    })
}

/// One producer: `per_client` events of `topic` over three keys, each
/// enqueued after the previous one was acknowledged.
async fn produce(engine: Engine, rec: Recorder, topic: &'static str, c: usize, per_client: u64) {
    for i in 0..per_client {
        let key = format!("c{c}-k{}", i % 3);
        let dedup_key = format!("{topic}-c{c}-{i}");
        let fail = poisoned(topic, c, i).then_some("panic");
        let body = serde_json::json!({"id": dedup_key, "k": key, "n": i / 3, "fail": fail});
        let draft = Draft::json(topic, &body)
            .dedup_key(dedup_key.clone())
            .key(key.clone());
        // A refusal here is a finding: the event goes unacked and the
        // checker never expects it; the row count below shows it.
        let sent_at = rec.now();
        let Ok(inserted) = engine.enqueue(draft).await else {
            continue;
        };
        let at = rec.now();
        let mut r = rec.lock();
        r.sent += 1;
        r.acks.push(Ack {
            dedup_key,
            event_id: inserted.id.to_string(),
            duplicate: inserted.duplicate,
            key: Some(key),
            seq: i / 3,
            sent_at,
            at,
        });
    }
}

/// What the scenario promises: the poisoned events dead after
/// `MAX_ATTEMPTS`, the rest done, `fnseq/c0-k0` blocked behind its head.
fn expect(per_client: u64) -> Expect {
    let mut expect = Expect {
        sequential: ["fnseq".to_string()].into(),
        dead_attempts: MAX_ATTEMPTS,
        ..Expect::default()
    };
    for topic in ["fn", "fnseq"] {
        for c in 0..CLIENTS {
            for i in (0..per_client).filter(|i| poisoned(topic, c, *i)) {
                expect.dead.insert(format!("{topic}-c{c}-{i}"));
            }
        }
    }
    expect
}

/// All settled but the blocked key.
fn settled(rows: &[Row]) -> bool {
    rows.iter().all(|r| match r.status.as_str() {
        "running" => false,
        "pending" => r.topic == "fnseq" && r.key.as_deref() == Some(BLOCKED_KEY),
        _ => true,
    })
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let per_client = if quick { 30 } else { 200 };
    let fresh = backend.fresh().await?;
    let store = mailroom::open_store(&fresh.url, true).await?;
    store.migrate().await?;
    let rec = Recorder::new();
    let [single, seq] = topics();
    let engine = Engine::builder(store)
        .topic(single)
        .topic(seq)
        .handler("fn", handler(rec.clone()))
        .handler("fnseq", handler(rec.clone()))
        .build()?;
    let _quiet = QuietPanics::install();
    let shutdown = CancellationToken::new();
    let running = Task::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    let mut producers = tokio::task::JoinSet::new();
    for topic in ["fn", "fnseq"] {
        for c in 0..CLIENTS {
            producers.spawn(produce(engine.clone(), rec.clone(), topic, c, per_client));
        }
    }
    join_all(producers, Duration::from_secs(120), "the producers").await?;
    let drained = store::settle(&fresh.url, settled, Duration::from_secs(60)).await?;
    shutdown.cancel();
    running
        .join(Duration::from_secs(30), "the engine, after its shutdown,")
        .await?;
    let rows = store::rows(&fresh.url).await?;
    let record = rec.snapshot();
    let verdict = check::check(&record, &rows, &expect(per_client));
    let mut report = Report::new("panic", backend.name(), &record, verdict);
    if drained.is_none() {
        report
            .failures
            .push("events other than the blocked key still open after 60 s".into());
    }
    let errors = dead_errors(&engine, &rows).await?;
    for (id, e) in errors.iter().filter(|(_, e)| !e.contains("panicked")) {
        report
            .failures
            .push(format!("{id}: dead without the panic in its error: {e:?}"));
    }
    report.notes.push(format!(
        "in-process engine, closure handlers: {} dead by panic ({MAX_ATTEMPTS} attempts each), {} blocked behind fnseq/{BLOCKED_KEY}; error e.g. {:?}",
        errors.len(),
        rows.iter().filter(|r| r.status == "pending").count(),
        errors.values().next()
    ));
    drop(engine);
    fresh.cleanup().await?;
    Ok(report)
}

/// Each dead event's `last_error`, through the engine.
async fn dead_errors(engine: &Engine, rows: &[Row]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for r in dead_rows(rows) {
        let event = engine.operator().get(r.id.parse()?).await?;
        let e = event.and_then(|e| e.last_error).unwrap_or_default();
        out.insert(r.id.clone(), e);
    }
    Ok(out)
}

/// While alive, the panic hook keeps quiet about the poisoned closures'
/// panics (expected, dozens of them) and passes every other panic on.
struct QuietPanics;

impl QuietPanics {
    fn install() -> Self {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied());
            if text != Some(PANIC_TEXT) {
                previous(info);
            }
        }));
        Self
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        // Back to the default hook (the bench installs none of its own).
        let _ = std::panic::take_hook();
    }
}
