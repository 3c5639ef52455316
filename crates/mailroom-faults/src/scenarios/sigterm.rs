//! (10) Graceful stop (SIGTERM) under intake and processing load, with
//! slow handlers so attempts are in flight: they finish (none is cut),
//! nothing is left `running`, the exit is clean, every ack — including
//! those answered while stopping — is stored; after a restart the rest is
//! processed with no completed event run again (no disruption is excused).

use super::{World, recovery, seq_expect, stop_and_drain, two_loads, two_topics};
use crate::Report;
use crate::backend::Backend;
use crate::child::Serve;
use crate::load::{Load, targets};
use crate::record::Outcome;
use crate::store;
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
    let loads = two_loads()
        .into_iter()
        .map(|l| Load { pause: PAUSE, ..l }.start(&targets, &world.rec))
        .collect();
    tokio::time::sleep(load_for).await;
    let stopped = stop(&world, &mut serve).await?;
    let restart_at = world.rec.now();
    let mut serve = world.serve().await?;
    *targets.write().unwrap_or_else(|e| e.into_inner()) = vec![serve.base.clone()];
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut notes = Vec::new();
    let stuck = stop_and_drain(loads, &world.fresh.url, &mut notes).await?;
    serve.signal_term()?;
    serve.exit_within(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&seq_expect()).await?;
    let mut report = Report::new("sigterm", backend.name(), &record, verdict);
    report.failures.extend(stopped.failures);
    report.failures.extend(stuck);
    report.recovery = recovery(&record, &[restart_at]);
    notes.insert(
        0,
        format!(
            "{} attempts in flight at SIGTERM all finished; stopped in {:.2}s; handler {}ms",
            stopped.in_flight,
            (stopped.exited - stopped.at).as_secs_f64(),
            HANDLER.as_millis()
        ),
    );
    report.notes.push(notes.join("; "));
    world.cleanup().await?;
    Ok(report)
}

/// What the stop looked like.
struct Stopped {
    /// When SIGTERM was sent and when the process had exited.
    at: Duration,
    exited: Duration,
    /// Attempts in flight at the signal.
    in_flight: usize,
    failures: Vec<String>,
}

/// SIGTERM, then the stop's checks: a clean exit, nothing left `running`,
/// every attempt in flight at the signal finished (and there were some),
/// no ack after the exit.
async fn stop(world: &World, serve: &mut Serve) -> anyhow::Result<Stopped> {
    let at = world.rec.now();
    serve.signal_term()?;
    let status = serve.exit_within(Duration::from_secs(40)).await?;
    let exited = world.rec.now();
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
    let (in_flight, cut) = in_flight_at(world, at);
    if in_flight == 0 {
        failures.push("no attempt was in flight at SIGTERM: the attack did not happen".into());
    }
    if cut > 0 {
        failures.push(format!(
            "{cut} of {in_flight} attempts in flight at SIGTERM were cut"
        ));
    }
    let late = world
        .rec
        .lock()
        .acks
        .iter()
        .filter(|a| a.at > exited)
        .count();
    if late > 0 {
        failures.push(format!("{late} acks after the process exited"));
    }
    Ok(Stopped {
        at,
        exited,
        in_flight,
        failures,
    })
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
