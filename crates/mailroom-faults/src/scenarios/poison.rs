//! (7) Poison events: the handler fails some events by HTTP 500, by a
//! connection reset, by never answering (cut by the topic's timeout), and,
//! as a `command` handler, by a non-zero exit code or by dying of a signal.
//! They go `dead` after exactly `max_attempts` with the error text of
//! their class; the rest flow; in a sequential topic the poisoned head
//! blocks its own key and no other. (Closure panics: `panic.rs`.)

use super::World;
use crate::Report;
use crate::backend::Backend;
use crate::check::{Expect, Row};
use crate::load::{Load, http, json_call, targets};
use crate::store;
use std::collections::BTreeMap;
use std::time::Duration;

pub(super) const MAX_ATTEMPTS: i64 = 3;
/// The one sequential key whose head is poisoned.
pub(super) const BLOCKED_KEY: &str = "c0-k0";
const CLASSES: [&str; 3] = ["500", "reset", "hang"];
/// How the `command` handler fails: `exit 3`, or `kill -KILL` of itself.
const COMMAND_CLASSES: [&str; 2] = ["exit", "signal"];

/// The `command` handler: posts the payload to the receiver (which records
/// the call and answers 500 to a poisoned event), exits 0 when it answered
/// 2xx; otherwise dies of SIGKILL (`"fail": "signal"`) or exits 3 with a
/// line on stderr. `$1` is the receiver's URL.
const COMMAND: &str = r#"body=$(cat)
if printf '%s' "$body" | curl -sS -f -o /dev/null --max-time 5 \
  -H "webhook-id: $MAILROOM_EVENT_ID" -H "mailroom-attempt: $MAILROOM_ATTEMPT" \
  -H 'content-type: application/json' --data-binary @- "$1" 2>/dev/null; then exit 0; fi
case "$body" in *'"fail":"signal"'*) kill -KILL $$ ;; esac
echo 'poisoned: exit 3' >&2
exit 3"#;

/// The text a dead event's `last_error` must hold, by class.
fn error_needle(class: &str) -> &'static str {
    match class {
        "500" => "HTTP 500",
        "reset" => "failed",
        "hang" => "timed out",
        "exit" => "exit code 3: poisoned: exit 3",
        _ => "killed by a signal",
    }
}

fn config(receiver: &str) -> String {
    // The config loader reads `$$` as a literal `$`.
    let script = COMMAND.replace('$', "$$");
    let command = serde_json::to_string(&["sh", "-c", &script, "sh", receiver]).unwrap_or_default();
    let topic = |name: &str, extra: &str, handler: &str| {
        // A command starts a shell and curl per attempt: more time, so a
        // loaded machine does not time the healthy ones out.
        let limits = if name == "pcmd" {
            "timeout = \"5s\"\nlease = \"10s\""
        } else {
            "timeout = \"1s\"\nlease = \"5s\""
        };
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
{limits}
retry = {{ max_attempts = {MAX_ATTEMPTS}, base = "50ms", max_delay = "200ms" }}
handler = {{ {handler} }}
"#
        )
    };
    let http = format!("http = {{ url = \"{receiver}\" }}");
    topic("poison", "", &http)
        + &topic("pseq", "mode = \"sequential\"\nkey = \"/k\"", &http)
        + &topic("pcmd", "", &format!("command = {command}"))
}

/// Every tenth event of `poison` fails, by each class in turn.
fn poison_single(c: usize, i: u64) -> Option<&'static str> {
    (i % 10 == 3).then(|| CLASSES[(c + i as usize) % CLASSES.len()])
}

/// Every tenth event of `pcmd` crashes its command, by each class in turn.
fn poison_command(c: usize, i: u64) -> Option<&'static str> {
    (i % 10 == 3).then(|| COMMAND_CLASSES[(c + i as usize) % COMMAND_CLASSES.len()])
}

/// Only the head of key `c0-k0` of `pseq` fails.
fn poison_head(c: usize, i: u64) -> Option<&'static str> {
    (c == 0 && i == 0).then_some("500")
}

/// The three loads: HTTP single, HTTP sequential, command single.
fn loads(per_client: u64) -> [Load; 3] {
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
    let command = Load {
        source: "pcmd",
        poison: Some(poison_command),
        ..single.clone()
    };
    [single, seq, command]
}

/// Each poisoned event's dedup key and class; the checker's promises.
fn poisoned(per_client: u64) -> (BTreeMap<String, &'static str>, Expect) {
    let mut classes = BTreeMap::new();
    for c in 0..4 {
        for i in 0..per_client {
            if let Some(class) = poison_single(c, i) {
                classes.insert(format!("poison-c{c}-{i}"), class);
            }
            if let Some(class) = poison_command(c, i) {
                classes.insert(format!("pcmd-c{c}-{i}"), class);
            }
        }
    }
    classes.insert("pseq-c0-0".into(), "500");
    let expect = Expect {
        sequential: ["pseq".to_string()].into(),
        dead: classes.keys().cloned().collect(),
        dead_attempts: MAX_ATTEMPTS,
        ..Expect::default()
    };
    (classes, expect)
}

/// All settled but the blocked key.
fn settled(rows: &[Row]) -> bool {
    rows.iter().all(|r| match r.status.as_str() {
        "running" => false,
        "pending" => r.topic == "pseq" && r.key.as_deref() == Some(BLOCKED_KEY),
        _ => true,
    })
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let per_client = if quick { 30 } else { 200 };
    let world = World::new(&backend, Duration::from_millis(2), config).await?;
    let mut serve = world.serve().await?;
    let targets = targets(vec![serve.base.clone()]);
    let running: Vec<_> = loads(per_client)
        .iter()
        .map(|l| l.start(&targets, &world.rec))
        .collect();
    for r in running {
        r.finish(Duration::from_secs(120)).await?;
    }
    let drained = store::settle(&world.fresh.url, settled, Duration::from_secs(60)).await?;
    let (classes, expect) = poisoned(per_client);
    let rows = store::rows(&world.fresh.url).await?;
    let errors = dead_errors(&serve.base, &rows).await?;
    serve.signal_term()?;
    serve.exit_within(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&expect).await?;
    let mut report = Report::new("poison", backend.name(), &record, verdict);
    if drained.is_none() {
        report
            .failures
            .push("events other than the blocked key still open after 60 s".into());
    }
    for (dk, e) in &errors {
        let class = classes.get(dk).copied().unwrap_or("?");
        if !e.contains(error_needle(class)) {
            report.failures.push(format!(
                "{dk} ({class}): dead with {e:?}, not {:?}",
                error_needle(class)
            ));
        }
    }
    report.notes.push(format!(
        "{} dead (500, reset, hang; command exit 3, SIGKILL; {MAX_ATTEMPTS} attempts each), {} blocked behind the dead head of pseq/{BLOCKED_KEY}; error texts e.g. {:?}",
        errors.len(),
        rows.iter().filter(|r| r.status == "pending").count(),
        samples(&errors)
    ));
    world.cleanup().await?;
    Ok(report)
}

/// The dead rows.
pub(super) fn dead_rows(rows: &[Row]) -> impl Iterator<Item = &Row> {
    rows.iter().filter(|r| r.status == "dead")
}

/// Each dead event's `last_error` by dedup key, read through the API.
async fn dead_errors(base: &str, rows: &[Row]) -> anyhow::Result<BTreeMap<String, String>> {
    let client = http();
    let mut out = BTreeMap::new();
    for r in dead_rows(rows) {
        let (_, v) = json_call(&client, &format!("{base}/v1/events/{}", r.id), None).await?;
        let e = v
            .get("last_error")
            .and_then(|e| e.as_str())
            .unwrap_or("")
            .to_owned();
        out.insert(r.dedup_key.clone(), e);
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
