//! The run: every scenario on every store asked for, each under a
//! deadline, one printed row each.

use crate::backend::Backend;
use crate::scenarios::Scenario;
use crate::{check, record};
use std::process::ExitCode;
use std::time::Duration;

pub use crate::scenarios::ALL;

/// What the command was asked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub quick: bool,
    /// The stores to run on (SQLite, PostgreSQL or both).
    pub stores: Vec<Backend>,
    /// Run only the scenarios with these names.
    pub only: Vec<String>,
    /// Run only this shard of the rows.
    pub shard: Option<Shard>,
}

/// Shard `k` of `n` (1-based): the rows whose index in the run, counted
/// from 0, is `k - 1` modulo `n`.
#[derive(Debug, Clone, Copy)]
pub struct Shard {
    pub k: usize,
    pub n: usize,
}

/// One printed row.
#[derive(Debug, Clone)]
pub struct Report {
    pub scenario: &'static str,
    pub store: &'static str,
    pub sent: u64,
    pub acked: usize,
    pub lost: usize,
    pub duplicates: usize,
    pub order: usize,
    pub fenced: usize,
    /// Completed events run again after a disruption (allowed, counted).
    pub reruns: usize,
    /// How long the service took to come back (scenario-specific; see README).
    pub recovery: Option<Duration>,
    /// Checks of the scenario beyond the checker's (each one a failure).
    pub failures: Vec<String>,
    /// What the run did, in a few words.
    pub notes: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.lost == 0 && self.duplicates == 0 && self.order == 0 && self.failures.is_empty()
    }

    /// The row for a finished scenario: the checker's verdict plus its own checks.
    pub fn new(
        scenario: &'static str,
        store: &'static str,
        record: &record::Record,
        verdict: check::Verdict,
    ) -> Self {
        Self {
            scenario,
            store,
            sent: record.sent,
            acked: verdict.acked,
            lost: verdict.lost,
            duplicates: verdict.duplicates,
            order: verdict.order,
            fenced: verdict.fenced,
            reruns: verdict.excused,
            recovery: None,
            failures: verdict.findings,
            notes: Vec::new(),
        }
    }
}

/// Runs the matrix; non-zero exit if any row failed (or on SIGTERM/SIGINT,
/// after stopping the scenario running and printing the rows so far).
pub async fn run(s: &Settings) -> anyhow::Result<ExitCode> {
    let mut interrupts = Interrupts::install()?;
    let mut reports = Vec::new();
    let mut row = 0;
    for backend in &s.stores {
        for sc in ALL {
            if !s.only.is_empty() && !s.only.iter().any(|o| o == sc.name) {
                continue;
            }
            if !(sc.applies)(backend) {
                continue;
            }
            row += 1;
            if s.shard.is_some_and(|Shard { k, n }| (row - 1) % n != k - 1) {
                continue;
            }
            eprintln!("faults: {} on {} ...", sc.name, backend.name());
            let report = tokio::select! {
                r = run_one(sc, s.quick, backend) => r,
                signal = interrupts.next() => {
                    // Dropping the scenario kills its children and stops its
                    // private servers: a SIGKILL would leave them running.
                    eprintln!("faults: {signal} during {} on {}: stopped", sc.name, backend.name());
                    print_table(&reports);
                    return Ok(ExitCode::FAILURE);
                }
            };
            let word = verdict_word(&report);
            eprintln!("faults: {} on {}: {word}", sc.name, backend.name());
            reports.push(report);
        }
    }
    print_table(&reports);
    Ok(
        // No row at all is a mistake, unless a shard was left none (more
        // shards than rows).
        if reports.iter().all(Report::passed) && (!reports.is_empty() || s.shard.is_some()) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}

/// One scenario's row: its own, or a failed one when it errs or outlives
/// its deadline (then it is dropped: its processes killed, its private
/// servers stopped).
async fn run_one(sc: &Scenario, quick: bool, backend: &Backend) -> Report {
    let limit = deadline(quick);
    match tokio::time::timeout(limit, (sc.run)(quick, backend.clone())).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => errored(sc.name, backend, &e),
        Err(_) => {
            let e = anyhow::anyhow!("timed out after {} s", limit.as_secs());
            errored(sc.name, backend, &e)
        }
    }
}

/// How long one scenario may run before it is a failed row. The slowest
/// quick scenario takes about a minute on a loaded 2-core host (`rabbitmq`:
/// a broker started twice); every wait inside a scenario has its own
/// bound, this one catches what they miss, so a scenario never hangs the
/// matrix.
fn deadline(quick: bool) -> Duration {
    Duration::from_secs(if quick { 240 } else { 600 })
}

/// SIGTERM and SIGINT (`timeout` in scripts/test.sh, Ctrl-C), caught for
/// the whole run so that none is missed between two scenarios.
struct Interrupts {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn install() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves on the next signal, naming it.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// A scenario that could not run to its check fails with the reason.
fn errored(name: &'static str, backend: &Backend, e: &anyhow::Error) -> Report {
    Report {
        scenario: name,
        store: backend.name(),
        sent: 0,
        acked: 0,
        lost: 0,
        duplicates: 0,
        order: 0,
        fenced: 0,
        reruns: 0,
        recovery: None,
        failures: vec![format!("did not complete: {e:#}")],
        notes: Vec::new(),
    }
}

fn verdict_word(r: &Report) -> &'static str {
    if r.passed() { "pass" } else { "FAIL" }
}

fn print_table(reports: &[Report]) {
    println!(
        "{:<10} {:<8} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>6} {:>9}  result",
        "scenario",
        "store",
        "sent",
        "acked",
        "lost",
        "dup",
        "order",
        "fenced",
        "reruns",
        "recovery"
    );
    for r in reports {
        let recovery = r
            .recovery
            .map_or_else(|| "-".into(), |d| format!("{:.2}s", d.as_secs_f64()));
        println!(
            "{:<10} {:<8} {:>7} {:>7} {:>5} {:>5} {:>5} {:>6} {:>6} {:>9}  {}",
            r.scenario,
            r.store,
            r.sent,
            r.acked,
            r.lost,
            r.duplicates,
            r.order,
            r.fenced,
            r.reruns,
            recovery,
            verdict_word(r)
        );
        for n in &r.notes {
            println!("    {n}");
        }
        for f in &r.failures {
            println!("    FAIL: {f}");
        }
    }
}
