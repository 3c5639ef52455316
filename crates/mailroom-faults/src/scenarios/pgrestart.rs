//! (3) PostgreSQL stopped with `pg_ctl stop -m immediate` (a crash: no
//! checkpoint, every connection cut) under intake and processing load,
//! held down, then started again. Nothing acked is lost; while the
//! database is down intake answers 503, never 200; once it is back intake
//! and processing resume by themselves and everything drains.
//!
//! It runs on a PostgreSQL cluster of its own (`PrivatePostgres`: initdb
//! and pg_ctl on a free loopback port in a temp dir), never on the server
//! of `--postgres-url`, which others share.

use super::{World, seq_expect, stop_and_drain, two_loads, two_topics};
use crate::Report;
use crate::backend::Backend;
use crate::load::targets;
use crate::record::Record;
use anyhow::Context;
use mailroom_testkit::PrivatePostgres;
use std::sync::Arc;
use std::time::Duration;

pub fn applies(b: &Backend) -> bool {
    matches!(b, Backend::Postgres { .. })
}

/// When the database went down and came back, on the record's clock.
struct Outage {
    /// Before `pg_ctl stop`.
    stop: Duration,
    /// `pg_ctl stop` returned: the server is gone.
    down: Duration,
    /// Before `pg_ctl start`.
    start: Duration,
    /// `pg_ctl start` returned: the server accepts connections.
    up: Duration,
}

/// Runs a blocking `pg_ctl` step off the runtime; a panic (the step
/// failed) becomes an error.
async fn pg_ctl(pg: &Arc<PrivatePostgres>, step: fn(&PrivatePostgres)) -> anyhow::Result<()> {
    let pg = pg.clone();
    tokio::task::spawn_blocking(move || step(&pg))
        .await
        .context("pg_ctl step failed")
}

pub async fn run(quick: bool, _shared: Backend) -> anyhow::Result<Report> {
    // Held down longer than the store's pool waits for a connection (its
    // acquire timeout, 5 s): an insert that found no statement in flight
    // when the server went away waits that long before it fails, and a
    // shorter outage could end before any request was refused (1 run in
    // about 10 with 3 s: every request waited, then was acked).
    let (before, held) = if quick {
        (Duration::from_secs(2), Duration::from_secs(6))
    } else {
        (Duration::from_secs(5), Duration::from_secs(10))
    };
    let pg = Arc::new(
        tokio::task::spawn_blocking(PrivatePostgres::start)
            .await
            .context("starting a private PostgreSQL")?,
    );
    let backend = Backend::Postgres {
        admin_url: pg.url().to_owned(),
    };
    let result = attack(&pg, &backend, before, held).await;
    // Stops the server and deletes its directory (blocking).
    tokio::task::spawn_blocking(move || drop(pg)).await?;
    result
}

async fn attack(
    pg: &Arc<PrivatePostgres>,
    backend: &Backend,
    before: Duration,
    held: Duration,
) -> anyhow::Result<Report> {
    let world = World::new(backend, Duration::from_millis(2), two_topics).await?;
    let mut serve = world.serve().await?;
    let targets = targets(vec![serve.base.clone()]);
    let loads = two_loads()
        .iter()
        .map(|l| l.start(&targets, &world.rec))
        .collect();
    tokio::time::sleep(before).await;
    let stop = world.rec.now();
    pg_ctl(pg, PrivatePostgres::stop_immediate).await?;
    let down = world.rec.now();
    tokio::time::sleep(held).await;
    let start = world.rec.now();
    pg_ctl(pg, PrivatePostgres::start_again).await?;
    let outage = Outage {
        stop,
        down,
        start,
        up: world.rec.now(),
    };
    tokio::time::sleep(before).await;
    let mut notes = Vec::new();
    let stuck = stop_and_drain(loads, &world.fresh.url, &mut notes).await?;
    serve.signal_term()?;
    let exit = serve.exit_within(Duration::from_secs(30)).await?;
    // Completions that failed while the database was away, or on a
    // connection it cut, are redone after their lease: the outage lasts
    // until the first ack after the restart.
    let back = first_ack_after(&world.rec.snapshot(), outage.up);
    world
        .rec
        .disrupted_between(outage.stop, back.unwrap_or(outage.up));
    let (record, verdict) = world.check(&seq_expect()).await?;
    let mut report = Report::new("pgrestart", backend.name(), &record, verdict);
    report.recovery = back.map(|b| b - outage.up);
    report.failures.extend(stuck);
    report.failures.extend(judge(&record, &outage, back));
    if !exit.success() {
        report.failures.push(format!("mailroom exited with {exit}"));
    }
    notes.insert(0, describe(&record, &outage, held, back));
    report.notes.push(notes.join("; "));
    if !report.passed() {
        report
            .notes
            .extend(serve.problem_summary().into_iter().take(20));
    }
    world.cleanup().await?;
    Ok(report)
}

fn first_ack_after(record: &Record, t: Duration) -> Option<Duration> {
    record.acks.iter().map(|a| a.at).filter(|at| *at > t).min()
}

/// The outage's own checks: no ack for a request sent while the database
/// was down (one sent before the stop may have committed and be answered
/// late); 503s, and
/// only 503s, from its stop until the first ack after it was back (a
/// request waits up to the pool's acquire timeout, 5 s, while mailroom
/// probes the database, so the 503s may come after `pg_ctl start`); acks
/// again once it was back.
fn judge(record: &Record, o: &Outage, back: Option<Duration>) -> Vec<String> {
    let mut failures = Vec::new();
    let acked_down = record
        .acks
        .iter()
        .filter(|a| a.sent_at > o.down && a.at < o.start)
        .count();
    if acked_down > 0 {
        failures.push(format!(
            "{acked_down} acks to requests sent while PostgreSQL was down"
        ));
    }
    let refused: Vec<u16> = refusals(record, o, back).map(|(s, _)| *s).collect();
    if !refused.contains(&503) {
        failures.push("no 503 while PostgreSQL was down".into());
    }
    if let Some(other) = refused.iter().find(|s| **s != 503) {
        failures.push(format!("intake answered {other} while PostgreSQL was down"));
    }
    if back.is_none() {
        failures.push("no ack after PostgreSQL came back".into());
    }
    failures
}

/// Intake answers other than 200 from the stop until the first ack after.
fn refusals<'a>(
    record: &'a Record,
    o: &Outage,
    back: Option<Duration>,
) -> impl Iterator<Item = &'a (u16, Duration)> {
    let (from, to) = (o.down, back.unwrap_or(o.up));
    record
        .refusals
        .iter()
        .filter(move |(_, at)| *at > from && *at <= to)
}

fn describe(record: &Record, o: &Outage, held: Duration, back: Option<Duration>) -> String {
    let refused = refusals(record, o, back).filter(|(s, _)| *s == 503).count();
    let acks_down = record
        .acks
        .iter()
        .filter(|a| a.sent_at > o.down && a.at < o.start)
        .count();
    format!(
        "private PostgreSQL stopped (-m immediate) at {:.1}s, held down {:.0}s, up again {:.1}s later; {refused} answers 503 and {acks_down} acks to requests sent while down; {} handler calls",
        o.stop.as_secs_f64(),
        held.as_secs_f64(),
        (o.up - o.start).as_secs_f64(),
        record.calls.len()
    )
}
