//! `faults`: attacks a real `mailroom serve` (the release binary, as a child
//! process) under recorded load, then checks the record against the store
//! and prints one row per scenario. See the README for the matrix.
//!
//! - `record.rs`: acknowledgements and handler calls on one clock;
//! - `load.rs`: senders that record every ack; `receiver.rs`: the handler
//!   endpoint that records every call and misbehaves on request;
//! - `child.rs`: the mailroom process; `store.rs`: the SQL reads;
//! - `check.rs`: the checker, a plain function with its own unit tests;
//! - `scenarios/`: one file per attack.

mod check;
mod child;
mod load;
mod receiver;
mod record;
mod scenarios;
mod store;

use crate::backend::Backend;
use std::process::ExitCode;
use std::time::Duration;

pub use scenarios::ALL;

/// What the command was asked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub quick: bool,
    /// The stores to run on (SQLite, PostgreSQL or both).
    pub stores: Vec<Backend>,
    /// Run only the scenarios with these names.
    pub only: Vec<String>,
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

/// Runs the matrix; non-zero exit if any row failed.
pub async fn run(s: &Settings) -> anyhow::Result<ExitCode> {
    let mut reports = Vec::new();
    for backend in &s.stores {
        for sc in ALL {
            if !s.only.is_empty() && !s.only.iter().any(|o| o == sc.name) {
                continue;
            }
            if !(sc.applies)(backend) {
                continue;
            }
            eprintln!("faults: {} on {} ...", sc.name, backend.name());
            let report = match (sc.run)(s.quick, backend.clone()).await {
                Ok(r) => r,
                Err(e) => errored(sc.name, backend, &e),
            };
            eprintln!(
                "faults: {} on {}: {}",
                sc.name,
                backend.name(),
                verdict_word(&report)
            );
            reports.push(report);
        }
    }
    print_table(&reports);
    Ok(
        if reports.iter().all(Report::passed) && !reports.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
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
