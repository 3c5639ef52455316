//! The network to PostgreSQL frozen under intake and drain load: a
//! `FreezeProxy` between `mailroom serve` and the database holds every
//! packet (`pghold`: they flow again, late, at the heal) or drops them
//! (`pgdrop`: the connections open during the freeze stay open and never
//! carry data again), with no RST either way, then heals. The checker
//! reads the database directly.
//!
//! Checks, beyond the checker's: during the freeze intake answers 503 (and
//! only 503), each request within [`ANSWER_BOUND`] (no request hangs);
//! nothing is acked for a request sent during the freeze; after the heal
//! `/readyz` is green, intake acks and handlers are called again, each
//! within [`HEALED_WITHIN`]; everything drains.

use super::{World, seq_expect, stop_and_drain, two_loads, two_topics};
use crate::Report;
use crate::backend::Backend;
use crate::load::targets;
use crate::record::Record;
use mailroom_testkit::{Freeze, FreezeProxy};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest wait for an intake answer during the freeze: the store's data
/// path limit (5 s) plus room for a loaded machine.
const ANSWER_BOUND: Duration = Duration::from_secs(10);

/// How soon after the heal the service must be healthy again.
pub const HEALED_WITHIN: Duration = Duration::from_secs(10);

pub fn applies(b: &Backend) -> bool {
    matches!(b, Backend::Postgres { .. })
}

pub async fn run_hold(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    run(quick, backend, Freeze::Hold, "pghold").await
}

pub async fn run_drop(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    run(quick, backend, Freeze::Drop, "pgdrop").await
}

/// How long the traffic stays frozen: 30 s, 12 s with `--quick` (longer
/// than every client-side limit, 5 s, and than the server's
/// `idle_in_transaction_session_timeout`, 10 s, so the same bounds act).
pub fn freeze_for(quick: bool) -> Duration {
    Duration::from_secs(if quick { 12 } else { 30 })
}

/// `/readyz` polled every 100 ms: (sent, answered, status; 0 for no
/// answer within 30 s).
pub type Probes = Arc<Mutex<Vec<(Duration, Duration, u16)>>>;

/// Polls `base/readyz` until the task is dropped.
pub fn probe_ready(base: String, rec: crate::record::Recorder) -> (Probes, super::Task<()>) {
    let probes: Probes = Arc::default();
    let out = probes.clone();
    let task = super::Task::spawn(async move {
        let http = crate::load::http();
        loop {
            let sent = rec.now();
            let status = match http.get(format!("{base}/readyz")).send().await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            };
            out.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((sent, rec.now(), status));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (probes, task)
}

/// The first `/readyz` 200 to a probe sent after `t`, on the record's clock.
pub fn ready_after(probes: &Probes, t: Duration) -> Option<Duration> {
    let probes = probes.lock().unwrap_or_else(|e| e.into_inner());
    probes
        .iter()
        .filter(|(sent, _, status)| *sent >= t && *status == 200)
        .map(|(_, at, _)| *at)
        .min()
}

async fn run(
    quick: bool,
    backend: Backend,
    mode: Freeze,
    name: &'static str,
) -> anyhow::Result<Report> {
    let before = Duration::from_secs(3);
    let frozen_for = freeze_for(quick);
    let world = World::new(&backend, Duration::from_millis(2), two_topics).await?;
    let host = world
        .fresh
        .url
        .split_once('@')
        .and_then(|(_, rest)| rest.split('/').next())
        .ok_or_else(|| anyhow::anyhow!("no host:port in the store URL"))?
        .to_owned();
    let proxy = FreezeProxy::start(&host).await?;
    let mut serve =
        super::super::child::serve(&world.config, &proxy.url_for(&world.fresh.url)).await?;
    let targets = targets(vec![serve.base.clone()]);
    let loads = two_loads()
        .iter()
        .map(|l| l.start(&targets, &world.rec))
        .collect();
    let (probes, prober) = probe_ready(serve.base.clone(), world.rec.clone());
    tokio::time::sleep(before).await;

    // Requests sent after `frozen` meet a frozen proxy; those sent before
    // `healed` may be answered after the heal.
    proxy.set(mode);
    let frozen = world.rec.now();
    tokio::time::sleep(frozen_for).await;
    let healed = world.rec.now();
    proxy.heal();
    // Load goes on until the service is back (or the bound has passed),
    // and a little longer.
    let started = std::time::Instant::now();
    while started.elapsed() < HEALED_WITHIN + Duration::from_secs(2)
        && Healing::measure(&world.rec.snapshot(), &probes, healed)
            .latest()
            .is_none()
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(prober);

    let mut notes = Vec::new();
    let stuck = stop_and_drain(loads, &world.fresh.url, &mut notes).await?;
    serve.signal_term()?;
    let exit = serve.exit_within(Duration::from_secs(30)).await?;
    let snapshot = world.rec.snapshot();
    let back = Healing::measure(&snapshot, &probes, healed);
    // Completions and claims cut off by the freeze are redone after their
    // leases: reruns until the service is back are the allowance.
    let until = back.latest().map_or(healed + HEALED_WITHIN, |d| healed + d);
    world.rec.disrupted_between(frozen, until);
    let (record, verdict) = world.check(&seq_expect()).await?;
    let mut report = Report::new(name, backend.name(), &record, verdict);
    report.recovery = back.latest();
    report.failures.extend(stuck);
    let during = Freezing::measure(&record, frozen, healed);
    report.failures.extend(during.judge());
    report.failures.extend(back.judge());
    if !exit.success() {
        report.failures.push(format!("mailroom exited with {exit}"));
    }
    notes.insert(
        0,
        format!(
            "traffic to PostgreSQL {} for {:.0}s at {:.1}s; {}; after the heal {}",
            match mode {
                Freeze::Hold => "held",
                _ => "dropped",
            },
            frozen_for.as_secs_f64(),
            frozen.as_secs_f64(),
            during.describe(),
            back.describe()
        ),
    );
    report.notes.push(notes.join("; "));
    report.notes.push(log_lines(&serve));
    world.cleanup().await?;
    Ok(report)
}

/// The WARN/ERROR lines mailroom logged, most frequent first (at most
/// 4, each with its count): what an operator sees.
pub fn log_lines(serve: &super::super::child::Serve) -> String {
    let lines: Vec<String> = serve
        .problem_summary()
        .into_iter()
        .take(4)
        .map(|l| l.chars().take(120).collect())
        .collect();
    format!("log: {}", lines.join(" | "))
}

/// What intake did while the traffic was frozen.
struct Freezing {
    /// From the freeze to the first 503 (to a request sent after it).
    first_503: Option<Duration>,
    /// The longest wait for an answer to a request sent during the freeze.
    slowest: Option<Duration>,
    /// Answers other than 503 to requests sent during the freeze.
    other: Vec<u16>,
    refused: usize,
    /// Acks, before the heal, to requests sent during the freeze.
    acked: usize,
    /// Requests sent during the freeze and never answered (cut at 30 s).
    unanswered: usize,
}

impl Freezing {
    fn measure(record: &Record, from: Duration, to: Duration) -> Self {
        let during = |sent: Duration| sent >= from && sent < to;
        let answers: Vec<&(Duration, Duration, u16)> = record
            .answers
            .iter()
            .filter(|(s, _, _)| during(*s))
            .collect();
        Self {
            first_503: answers
                .iter()
                .filter(|(_, _, st)| *st == 503)
                .map(|(_, at, _)| *at - from)
                .min(),
            slowest: answers.iter().map(|(s, at, _)| *at - *s).max(),
            other: answers
                .iter()
                .map(|(_, _, st)| *st)
                .filter(|st| *st != 503 && *st != 200)
                .collect(),
            refused: answers.iter().filter(|(_, _, st)| *st == 503).count(),
            // An ack after the heal is fine: its commit went through then.
            acked: answers
                .iter()
                .filter(|(_, at, st)| *st == 200 && *at < to)
                .count(),
            unanswered: answers.iter().filter(|(_, _, st)| *st == 0).count(),
        }
    }

    fn judge(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.first_503.is_none() {
            failures.push("no 503 during the freeze".into());
        }
        if let Some(s) = self.slowest.filter(|s| *s > ANSWER_BOUND) {
            failures.push(format!(
                "an intake request waited {:.1}s during the freeze (bound {} s)",
                s.as_secs_f64(),
                ANSWER_BOUND.as_secs()
            ));
        }
        if self.acked > 0 {
            failures.push(format!(
                "{} acks during the freeze to requests sent during it",
                self.acked
            ));
        }
        if self.unanswered > 0 {
            failures.push(format!(
                "{} intake requests during the freeze got no answer",
                self.unanswered
            ));
        }
        if let Some(s) = self.other.iter().find(|s| **s != 0) {
            failures.push(format!("intake answered {s} during the freeze"));
        }
        failures
    }

    fn describe(&self) -> String {
        format!(
            "first 503 after {}, slowest answer {}, {} answers 503",
            show(self.first_503),
            show(self.slowest),
            self.refused
        )
    }
}

/// How long after the heal each part of the service was back.
pub struct Healing {
    pub ready: Option<Duration>,
    pub acked: Option<Duration>,
    pub called: Option<Duration>,
}

impl Healing {
    pub fn measure(record: &Record, probes: &Probes, healed: Duration) -> Self {
        Self {
            ready: ready_after(probes, healed).map(|t| t - healed),
            acked: record
                .acks
                .iter()
                .filter(|a| a.sent_at >= healed)
                .map(|a| a.at - healed)
                .min(),
            called: record
                .calls
                .iter()
                .filter(|c| c.start >= healed)
                .map(|c| c.start - healed)
                .min(),
        }
    }

    /// The slowest of the three, if all came back.
    pub fn latest(&self) -> Option<Duration> {
        Some(self.ready?.max(self.acked?).max(self.called?))
    }

    pub fn judge(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for (what, t) in [
            ("/readyz green", self.ready),
            ("an intake ack", self.acked),
            ("a handler call", self.called),
        ] {
            match t {
                Some(t) if t <= HEALED_WITHIN => {}
                Some(t) => failures.push(format!(
                    "{what} only {:.1}s after the heal (bound {} s)",
                    t.as_secs_f64(),
                    HEALED_WITHIN.as_secs()
                )),
                None => failures.push(format!("no {what} after the heal")),
            }
        }
        failures
    }

    pub fn describe(&self) -> String {
        format!(
            "/readyz green in {}, first ack in {}, first handler call in {}",
            show(self.ready),
            show(self.acked),
            show(self.called)
        )
    }
}

pub fn show(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{:.2}s", d.as_secs_f64()))
}
