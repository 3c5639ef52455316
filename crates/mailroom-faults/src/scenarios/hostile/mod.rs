//! (9) Slow and hostile clients against a real `mailroom serve`: slow
//! header and slow body senders (one byte per second), oversized bodies
//! (with a length and chunked), malformed JSON to `/v1/events`, invalid
//! UTF-8 in a header value and in a header name, a flood of bad
//! signatures, huge numbers of seconds for a pull worker's lease and retry
//! (claim, nack, extend), control characters in an event's key and type,
//! and cross-site writes (a foreign `Origin` asking to cancel every event,
//! a foreign `Host` as DNS rebinding sends) against this token-less
//! instance, while a well-behaved client sends signed webhooks throughout;
//! then a login flood against a second instance with `api_token`
//! ([`login`]).
//!
//! Then unsigned posts to undeclared sources named after configured topics
//! (`reports`, a topic with no source of its name), directly and with a
//! same-host proxy's headers: a configured mailroom answers 404 and stores
//! nothing.
//!
//! Checks: every hostile request is answered as it should be (the table in
//! [`EXPECTED`]); the well-behaved client's p99 stays under [`P99_BOUND`] in
//! every window of the attack and all its events are stored and processed;
//! the server's RSS stays under [`MEMORY_BOUND`]; each class of rejection is
//! logged, in at most one line per class per window.
//!
//! SQLite only: the attacks end in the HTTP layer, before any store; the
//! well-behaved client's writes are the same on either store, and the
//! store's own faults are the other scenarios' business.

mod attacks;
mod good;
mod login;

use super::World;
use crate::backend::Backend;
use crate::check::Expect;
use crate::procfs;
use crate::{Report, store};
use attacks::{Flood, Probe, SECRET, Tally, github_signature, probe_loop, raw_loop, slowloris};
use good::{Calls, Usage, WellBehaved};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The server's header and body read deadlines in this scenario.
const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// RSS the server must stay under, whatever the attack.
const MEMORY_BOUND: u64 = 256 * 1024 * 1024;
/// The well-behaved client's p99, in every window of the attack.
const P99_BOUND: Duration = Duration::from_millis(100);
/// The server's `rejection_log_every` (its default).
const LOG_WINDOW: Duration = Duration::from_secs(10);
/// A source's `max_body` here; oversized bodies are four times that.
const MAX_BODY: usize = 64 * 1024;

/// Per attack class: the answers that are right, and the log class it lands in.
const EXPECTED: &[(&str, &[&str], &str)] = &[
    ("slow headers", &["closed", "408"], "header_timeout"),
    ("slow body", &["408"], "body_timeout"),
    ("oversized", &["413"], "too_large"),
    ("oversized chunked", &["413"], "too_large"),
    ("malformed json", &["400"], "bad_request"),
    ("utf8 header value", &["401"], "unauthorized"),
    ("utf8 header name", &["400"], "malformed"),
    ("bad signature", &["401"], "unauthorized"),
    ("huge lease on claim", &["400"], "bad_request"),
    ("huge retry_in on nack", &["400"], "bad_request"),
    ("huge lease on extend", &["400"], "bad_request"),
    ("control characters in key", &["400"], "bad_request"),
    ("control characters in type", &["400"], "bad_request"),
    ("cross-site write", &["403"], "forbidden"),
    ("foreign host", &["421"], "forbidden"),
];

pub fn applies(b: &Backend) -> bool {
    matches!(b, Backend::Sqlite)
}

/// A configured topic with no source of its name: unsigned posts to
/// `/webhooks/reports` must not reach it.
const UNDECLARED_TARGET: &str = "reports";

/// How hard to attack.
struct Scale {
    slow: usize,
    bad_per_sec: f64,
    attack: Duration,
}

fn config(receiver: &str) -> String {
    let t = READ_TIMEOUT.as_secs();
    format!(
        r#"
[limits]
header_read_timeout = "{t}s"
body_read_timeout = "{t}s"

[[source]]
name = "signed"
topic = "signed"
id = {{ json = "/id" }}
max_body = {MAX_BODY}
verify = {{ scheme = "github", secret = "{SECRET}" }}

[[topic]]
name = "signed"
concurrency = 16
handler = {{ http = {{ url = "{receiver}" }} }}

[[topic]]
name = "{UNDECLARED_TARGET}"
handler = {{ http = {{ url = "{receiver}" }} }}

[[topic]]
name = "pulled"
"#
    )
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let scale = if quick {
        Scale {
            slow: 200,
            bad_per_sec: 1000.0,
            attack: Duration::from_secs(12),
        }
    } else {
        Scale {
            slow: 2000,
            bad_per_sec: 10_000.0,
            attack: Duration::from_secs(40),
        }
    };
    check_fd_limit(2 * scale.slow as u64 + 1024)?;
    let world = World::new(&backend, Duration::ZERO, config).await?;
    let mut serve = world.serve().await?;
    let pid = serve.pid().to_string();
    let addr: SocketAddr = serve.base.trim_start_matches("http://").parse()?;
    let rss = Rss::start(pid.clone());
    let good = WellBehaved::start(&serve.base, &world.rec, 4)?;
    let shared = WellBehaved::start_shared(&serve.base, &world.rec, 4);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = rss.peak();
    let from = world.rec.now();
    let usage = Usage::begin(&pid, &serve.base).await;
    let tally = Tally::default();
    attack(addr, &serve.base, &scale, &tally).await?;
    let to = world.rec.now();
    let undeclared = post_undeclared(&serve.base).await;
    let usage = usage.end(&pid, &serve.base).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let calls = good.stop().await;
    let shared = shared.stop().await;
    let drained =
        store::settle(&world.fresh.url, store::all_final, Duration::from_secs(30)).await?;
    let (logged, others) = (rejection_lines(&serve), serve.problem_summary());
    serve.signal_term()?;
    serve.exit_within(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&Expect::default()).await?;
    let mut report = Report::new("hostile", backend.name(), &record, verdict);
    login::run(world.dir.path(), &mut report).await?;
    let answers = tally.snapshot();
    report.sent += answers.values().sum::<u64>();
    judge_answers(&answers, scale.attack, &mut report);
    judge_latency(&calls, (from, to), !quick, &mut report);
    note_shared_latency(&shared, (from, to), &mut report);
    judge_memory(rss_before, rss.peak(), &mut report);
    judge_undeclared(
        &undeclared,
        &store::rows(&world.fresh.url).await?,
        &mut report,
    );
    report.notes.extend(usage);
    // The attack ends when its last connection does, often well after
    // `scale.attack` on a loaded host: the log bound follows what ran.
    judge_logs(&logged, to - from, &others, &mut report);
    if drained.is_none() {
        report
            .failures
            .push("well-behaved events still open 30 s after the attack".into());
    }
    world.cleanup().await?;
    Ok(report)
}

/// Every attack at once, until the attack's end.
async fn attack(addr: SocketAddr, base: &str, s: &Scale, tally: &Tally) -> anyhow::Result<()> {
    let until = Instant::now() + s.attack;
    let grace = READ_TIMEOUT + Duration::from_secs(3);
    let mut tasks = tokio::task::JoinSet::new();
    let slow_body = b"POST /webhooks/signed HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000\r\nx-hub-signature-256: sha256=00\r\n\r\n{".to_vec();
    for i in 0..s.slow {
        // Spread the connects over two seconds, as a real crowd arrives.
        let delay = Duration::from_secs(2) * i as u32 / s.slow as u32;
        let (class, head) = if i % 2 == 0 {
            (
                "slow headers",
                b"POST /webhooks/signed HTTP/1.1\r\nhost: localhost\r\n".to_vec(),
            )
        } else {
            ("slow body", slow_body.clone())
        };
        let tally = tally.clone();
        tasks.spawn(async move {
            tokio::time::sleep(delay).await;
            slowloris(addr, class, head, tally, grace, until).await;
        });
    }
    for f in floods(base, s)? {
        let http = crate::load::http();
        tasks.spawn(f.run(http, tally.clone(), until));
    }
    for requests in raw_requests() {
        let pause = Duration::from_millis(50);
        tasks.spawn(raw_loop(addr, requests, tally.clone(), pause, until));
    }
    let http = crate::load::http();
    let pause = Duration::from_millis(20);
    tasks.spawn(probe_loop(http, probes(base), tally.clone(), pause, until));
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// The request floods: bad signatures, oversized bodies, malformed JSON.
fn floods(base: &str, s: &Scale) -> anyhow::Result<Vec<Flood>> {
    let bodies = |n: usize| -> Vec<bytes::Bytes> {
        (0..16)
            .map(|i| format!("{{\"id\":\"bad-{i}\",\"pad\":\"{}\"}}", "x".repeat(n)).into())
            .collect()
    };
    let wrong = github_signature("not-the-secret", b"{}")?;
    let json = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
    let malformed = [
        "{\"topic\": ",
        "[1, 2",
        "{\"topic\": \"signed\", \"payload\": }",
        "{\"topic\": \"signed\", \"payload\": {\"a\": 1}, \"extra\": true}",
        "\u{feff}{}",
        "{\"topic\": 7, \"payload\": 1}",
        "null",
        "",
    ];
    Ok(vec![
        Flood {
            class: "bad signature",
            url: format!("{base}/webhooks/signed"),
            headers: json("x-hub-signature-256", &wrong),
            bodies: bodies(200),
            per_sec: s.bad_per_sec,
            workers: (s.bad_per_sec / 80.0).ceil() as usize,
        },
        Flood {
            class: "oversized",
            url: format!("{base}/webhooks/signed"),
            headers: json("x-hub-signature-256", &wrong),
            bodies: bodies(4 * MAX_BODY),
            per_sec: 20.0,
            workers: 4,
        },
        // Had one cancel passed, the well-behaved events it caught would
        // never be processed: the check counts them lost.
        Flood {
            class: "cross-site write",
            url: format!("{base}/v1/cancel"),
            headers: vec![
                ("origin".into(), "https://evil.example".into()),
                ("content-type".into(), "application/json".into()),
            ],
            bodies: vec![bytes::Bytes::from_static(br#"{"all": true}"#)],
            per_sec: 20.0,
            workers: 2,
        },
        Flood {
            class: "foreign host",
            url: format!("{base}/v1/cancel"),
            headers: vec![
                ("host".into(), "rebind.evil.example".into()),
                ("content-type".into(), "application/json".into()),
            ],
            bodies: vec![bytes::Bytes::from_static(br#"{"all": true}"#)],
            per_sec: 20.0,
            workers: 2,
        },
        Flood {
            class: "malformed json",
            url: format!("{base}/v1/events"),
            headers: vec![
                ("idempotency-key".into(), "k".into()),
                ("content-type".into(), "application/json".into()),
            ],
            bodies: malformed.iter().map(|b| bytes::Bytes::from(*b)).collect(),
            per_sec: 200.0,
            workers: 4,
        },
    ])
}

/// Numbers and text a JSON client can send that a request must refuse
/// (400 naming the field) without panicking: a lease or retry delay of
/// 1e308 seconds, control characters in a key or type. The nack and extend
/// are refused before their event is looked up, so any event id serves.
fn probes(base: &str) -> Vec<Probe> {
    let id = "0190a000-0000-7000-8000-000000000000";
    let event = |key: &str, kind: &str| serde_json::json!({"topic": "signed", "key": key, "type": kind, "payload": {"hostile": true}});
    vec![
        Probe {
            class: "huge lease on claim",
            url: format!("{base}/v1/topics/pulled/claim"),
            body: serde_json::json!({"max": 1, "lease": 1e308}),
            field: "lease",
        },
        Probe {
            class: "huge retry_in on nack",
            url: format!("{base}/v1/events/{id}/nack"),
            body: serde_json::json!({"token": 1, "retry_in": 1e300}),
            field: "retry_in",
        },
        Probe {
            class: "huge lease on extend",
            url: format!("{base}/v1/events/{id}/extend"),
            body: serde_json::json!({"token": 1, "lease": 1e300}),
            field: "lease",
        },
        Probe {
            class: "control characters in key",
            url: format!("{base}/v1/events"),
            body: event("k\r\nX-Evil: 1", "order.paid"),
            field: "key",
        },
        Probe {
            class: "control characters in type",
            url: format!("{base}/v1/events"),
            body: event("k", "t\u{1b}[31m\0"),
            field: "type",
        },
    ]
}

/// Raw requests no HTTP client would send: invalid UTF-8 in a header value
/// and in a header name, and a chunked body over `max_body`.
fn raw_requests() -> Vec<Vec<(&'static str, Vec<u8>)>> {
    let head = "POST /webhooks/signed HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n";
    let mut value = format!("{head}content-length: 2\r\nx-hub-signature-256: sha256=").into_bytes();
    value.extend_from_slice(b"\xff\xfe\xc3\x28\r\n\r\n{}");
    let mut name = format!("{head}content-length: 2\r\nx-sig-").into_bytes();
    name.extend_from_slice(b"\xff\xfe: 1\r\n\r\n{}");
    let chunk = vec![b'x'; 4 * MAX_BODY];
    let mut chunked = format!(
        "{head}transfer-encoding: chunked\r\nx-hub-signature-256: sha256=00\r\n\r\n{:x}\r\n",
        chunk.len()
    )
    .into_bytes();
    chunked.extend_from_slice(&chunk);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    vec![
        vec![("utf8 header value", value), ("utf8 header name", name)],
        vec![("oversized chunked", chunked)],
    ]
}

/// Unsigned posts to undeclared sources named after a configured topic, as
/// sent directly and through a same-host reverse proxy (its headers); the
/// answers by status (`error` when none came).
async fn post_undeclared(base: &str) -> BTreeMap<String, u64> {
    let http = crate::load::http();
    let mut answers = BTreeMap::new();
    for i in 0..50 {
        let mut req = http
            .post(format!("{base}/webhooks/{UNDECLARED_TARGET}"))
            .header("webhook-id", format!("forged-{i}"))
            .header("content-type", "application/json")
            .body(format!("{{\"id\":\"forged-{i}\"}}"));
        if i % 2 == 1 {
            req = req
                .header("x-forwarded-for", "203.0.113.7")
                .header("x-forwarded-proto", "https")
                .header("forwarded", "for=203.0.113.7;proto=https");
        }
        let answer = match req.send().await {
            Ok(resp) => resp.status().as_u16().to_string(),
            Err(_) => "error".to_string(),
        };
        *answers.entry(answer).or_default() += 1;
    }
    answers
}

/// Every post to an undeclared source was answered 404, and nothing reached
/// the topic it named.
fn judge_undeclared(answers: &BTreeMap<String, u64>, rows: &[crate::check::Row], r: &mut Report) {
    let total: u64 = answers.values().sum();
    let refused = answers.get("404").copied().unwrap_or(0);
    let stored = rows
        .iter()
        .filter(|row| row.topic == UNDECLARED_TARGET)
        .count();
    r.sent += total;
    r.notes.push(format!(
        "undeclared source named after a topic: {total} sent, {refused} answered 404, {stored} stored"
    ));
    if refused < total || stored > 0 {
        r.failures.push(format!(
            "undeclared source /webhooks/{UNDECLARED_TARGET}: answers {answers:?}, {stored} events stored"
        ));
    }
}

/// Samples the server's `VmRSS` every 100 ms; keeps the peak.
struct Rss {
    peak: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Rss {
    fn start(pid: String) -> Self {
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let p = peak.clone();
        let task = tokio::spawn(async move {
            while let Some(rss) = procfs::status_bytes(&pid, "VmRSS") {
                p.fetch_max(rss, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self { peak, task }
    }

    fn peak(&self) -> u64 {
        self.peak.load(Ordering::SeqCst)
    }
}

impl Drop for Rss {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every class was attacked, and answered only as it should be.
fn judge_answers(
    answers: &BTreeMap<(&'static str, String), u64>,
    attack: Duration,
    r: &mut Report,
) {
    for (class, right, _) in EXPECTED {
        let of_class: Vec<_> = answers.iter().filter(|((c, _), _)| c == class).collect();
        let total: u64 = of_class.iter().map(|(_, n)| **n).sum();
        let ok: u64 = of_class
            .iter()
            .filter(|((_, o), _)| right.contains(&o.as_str()))
            .map(|(_, n)| **n)
            .sum();
        let wrong: Vec<String> = of_class
            .iter()
            .filter(|((_, o), _)| !right.contains(&o.as_str()))
            .map(|((_, o), n)| format!("{n}x {o}"))
            .collect();
        r.notes.push(format!(
            "{class}: {total} sent ({:.0}/s), {ok} answered {}{}",
            total as f64 / attack.as_secs_f64(),
            right.join("/"),
            if wrong.is_empty() {
                String::new()
            } else {
                format!("; else {}", wrong.join(", "))
            }
        ));
        if total == 0 {
            r.failures.push(format!(
                "{class}: no request completed: the attack did not happen"
            ));
        } else if ok < total {
            r.failures.push(format!(
                "{class}: {} of {total} not answered {}",
                total - ok,
                right.join("/")
            ));
        }
    }
}

/// The second client's p99, on the attackers' runtime: how much of a
/// latency measured there is the load generator's own scheduling.
fn note_shared_latency(calls: &Calls, (from, to): (Duration, Duration), r: &mut Report) {
    let mut during: Vec<Duration> = calls
        .iter()
        .filter(|c| c.0 >= from && c.0 < to && c.2 == 200)
        .map(|c| c.1)
        .collect();
    let p =
        p99(&mut during).map_or_else(|| "-".into(), |d| format!("{:.1}ms", d.as_secs_f64() * 1e3));
    r.notes.push(format!(
        "the same client on the attackers' runtime (reported, not judged): p99 {p} over {} requests",
        during.len()
    ));
}

/// p99 of `latencies` (sorted in place).
fn p99(latencies: &mut [Duration]) -> Option<Duration> {
    latencies.sort();
    let i = (latencies.len() * 99).div_ceil(100).checked_sub(1)?;
    latencies.get(i).copied()
}

/// The well-behaved client: all answered 200; p99 under the bound over the
/// attack and in each of its 5-second windows. The bound is a performance
/// target: judged on the default run (a release build), only reported by
/// `--quick` (CI's debug build, whose p99 says little).
fn judge_latency(calls: &Calls, (from, to): (Duration, Duration), judged: bool, r: &mut Report) {
    let failed = calls.iter().filter(|c| c.2 != 200).count();
    if failed > 0 {
        r.failures.push(format!(
            "well-behaved: {failed} of {} not answered 200",
            calls.len()
        ));
    }
    let during = |a: Duration, b: Duration| -> Vec<Duration> {
        calls
            .iter()
            .filter(|c| c.0 >= a && c.0 < b)
            .map(|c| c.1)
            .collect()
    };
    let before = p99(&mut during(Duration::ZERO, from));
    let mut all = during(from, to);
    let overall = p99(&mut all);
    let mut worst = Duration::ZERO;
    let mut at = from;
    while at < to {
        let mut w = during(at, at + Duration::from_secs(5));
        if w.len() >= 20 {
            worst = worst.max(p99(&mut w).unwrap_or_default());
        }
        at += Duration::from_secs(5);
    }
    let ms = |d: Option<Duration>| {
        d.map_or_else(|| "-".into(), |d| format!("{:.1}ms", d.as_secs_f64() * 1e3))
    };
    r.notes.push(format!(
        "well-behaved client (own thread and runtime): {} requests during the attack, p99 {} (before it {}), worst 5 s window p99 {}",
        all.len(),
        ms(overall),
        ms(before),
        ms(Some(worst))
    ));
    let over = worst.max(overall.unwrap_or(Duration::MAX));
    match before {
        _ if over < P99_BOUND => {}
        _ if !judged => r.notes.push(format!(
            "p99 bound ({}ms) not judged with --quick (debug build)",
            P99_BOUND.as_millis()
        )),
        // The machine's own floor (a debug build, a loaded host) is over
        // the bound before any attack: the bound cannot be judged, only
        // the attack's effect, which must stay within twice that floor.
        Some(floor) if floor >= P99_BOUND && over <= 2 * floor => r.notes.push(format!(
            "p99 bound not judged: the p99 before the attack ({}) is already over {}ms on this host",
            ms(Some(floor)),
            P99_BOUND.as_millis()
        )),
        _ => r.failures.push(format!("well-behaved p99 over {}ms", P99_BOUND.as_millis())),
    }
}

fn judge_memory(before: u64, peak: u64, r: &mut Report) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    r.notes.push(format!(
        "server RSS: {:.0} MiB before the attack, peak {:.0} MiB (bound {:.0} MiB)",
        mib(before),
        mib(peak),
        mib(MEMORY_BOUND)
    ));
    if peak == 0 {
        r.failures.push("could not read the server's RSS".into());
    } else if peak > MEMORY_BOUND {
        r.failures
            .push(format!("server RSS peaked at {:.0} MiB", mib(peak)));
    }
}

/// The server's rejection log lines by class: (lines, requests they count).
fn rejection_lines(serve: &crate::child::Serve) -> BTreeMap<String, (u64, u64)> {
    let mut by: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for line in serve.problems() {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let fields = v.get("fields").unwrap_or(&v);
        if let Some(class) = fields["class"].as_str() {
            let e = by.entry(class.to_owned()).or_default();
            e.0 += 1;
            e.1 += fields["rejected"].as_u64().unwrap_or(0);
        }
    }
    by
}

/// Each class logged, in at most one line per window (plus the first).
fn judge_logs(
    logged: &BTreeMap<String, (u64, u64)>,
    attack: Duration,
    others: &[String],
    r: &mut Report,
) {
    let most = attack.as_secs().div_ceil(LOG_WINDOW.as_secs()) + 2;
    let classes: std::collections::BTreeSet<&str> = EXPECTED.iter().map(|e| e.2).collect();
    let mut said = Vec::new();
    for class in classes {
        let (lines, counted) = logged.get(class).copied().unwrap_or_default();
        said.push(format!("{class} {lines} lines/{counted} counted"));
        if lines == 0 {
            r.failures.push(format!("{class}: rejections never logged"));
        } else if lines > most {
            r.failures
                .push(format!("{class}: {lines} log lines, more than {most}"));
        }
    }
    r.notes.push(format!("server log: {}", said.join(", ")));
    let other: Vec<&String> = others
        .iter()
        .filter(|o| !o.contains("requests rejected"))
        .collect();
    if !other.is_empty() {
        r.notes.push(format!(
            "other warnings: {}",
            other
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
}

/// Fails early, with the fix, when this process may not open enough files
/// (the child inherits the limit).
fn check_fd_limit(needed: u64) -> anyhow::Result<()> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse::<u64>().ok());
    match soft {
        Some(n) if n < needed => anyhow::bail!(
            "open files limit {n} is under the {needed} this scenario needs: raise it (ulimit -n {needed})"
        ),
        _ => Ok(()),
    }
}
