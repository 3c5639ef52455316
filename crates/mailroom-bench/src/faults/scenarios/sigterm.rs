//! (10) Graceful stop (SIGTERM) under intake and processing load, with
//! slow handlers so attempts are in flight: they finish (none is cut),
//! nothing is left `running`, the exit is clean, every ack — including
//! those answered while stopping — is stored; after a restart the rest is
//! processed with no completed event run again (no disruption is excused).

use super::{World, recovery, seq_expect, two_topics};
use crate::backend::Backend;
use crate::faults::Report;
use crate::faults::load::{Load, targets};
use crate::faults::record::Outcome;
use crate::faults::store;
use std::time::Duration;

/// Each handler call takes this long, so many are in flight at the signal.
const HANDLER: Duration = Duration::from_millis(300);
/// Each client's pause between events: 8 clients a topic send about 80
/// events/s, a little more than 16 slots of 300 ms handle, so a backlog
/// builds but drains within seconds.
const PAUSE: Duration = Duration::from_millis(100);

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let load_for = if quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(6)
    };
    let world = World::new(&backend, HANDLER, two_topics).await?;
    let mut serve = world.serve().await?;
    let targets = targets(vec![serve.base.clone()]);
    let seq = Load {
        source: "seq",
        clients: 8,
        keys_per_client: 4,
        per_client: None,
        poison: None,
        pad: 200,
        pause: PAUSE,
    };
    let single = Load {
        source: "single",
        clients: 8,
        keys_per_client: 1,
        ..seq.clone()
    };
    let loads = [
        seq.start(&targets, &world.rec),
        single.start(&targets, &world.rec),
    ];
    tokio::time::sleep(load_for).await;
    let term_at = world.rec.now();
    serve.signal_term()?;
    let status = serve.wait_exit(Duration::from_secs(40)).await?;
    let exited_at = world.rec.now();
    let mut failures = Vec::new();
    if !status.success() {
        failures.push(format!("exit after SIGTERM: {status}"));
    }
    let running = store::rows(&world.fresh.url)
        .await?
        .iter()
        .filter(|r| r.status == "running")
        .count();
    if running > 0 {
        failures.push(format!("{running} events left running after the stop"));
    }
    // The receiver records a cut call when it sees the connection close.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let in_flight = in_flight_at(&world, term_at);
    if in_flight.1 > 0 {
        failures.push(format!(
            "{} of {} attempts in flight at SIGTERM were cut",
            in_flight.1, in_flight.0
        ));
    }
    let late = world
        .rec
        .lock()
        .acks
        .iter()
        .filter(|a| a.at > exited_at)
        .count();
    if late > 0 {
        failures.push(format!("{late} acks after the process exited"));
    }
    let restart_at = world.rec.now();
    let serve = world.serve().await?;
    *targets.write().unwrap_or_else(|e| e.into_inner()) = vec![serve.base.clone()];
    tokio::time::sleep(Duration::from_secs(1)).await;
    for l in loads {
        l.stop().await;
    }
    let drained =
        store::settle(&world.fresh.url, store::all_final, Duration::from_secs(60)).await?;
    let mut serve = serve;
    serve.signal_term()?;
    serve.wait_exit(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&seq_expect()).await?;
    let mut report = Report::new("sigterm", backend.name(), &record, verdict);
    report.failures.extend(failures);
    if in_flight.0 == 0 {
        report
            .failures
            .push("no attempt was in flight at SIGTERM: the attack did not happen".into());
    }
    if drained.is_none() {
        report
            .failures
            .push("events still open 60 s after the restart".into());
    }
    report.recovery = recovery(&record, &[restart_at]);
    report.notes.push(format!(
        "{} attempts in flight at SIGTERM all finished; stopped in {:.2}s; handler {}ms",
        in_flight.0,
        (exited_at - term_at).as_secs_f64(),
        HANDLER.as_millis()
    ));
    world.cleanup().await?;
    Ok(report)
}

/// Calls in flight at `at`: (how many, how many of them were cut).
fn in_flight_at(world: &World, at: Duration) -> (usize, usize) {
    let rec = world.rec.lock();
    let open: Vec<_> = rec
        .calls
        .iter()
        .filter(|c| c.start <= at && c.end >= at)
        .collect();
    let cut = open
        .iter()
        .filter(|c| c.outcome != Outcome::Succeeded)
        .count();
    (open.len(), cut)
}
