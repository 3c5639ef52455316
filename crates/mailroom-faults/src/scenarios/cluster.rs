//! (2) Three instances on one PostgreSQL database, one of them `kill -9`ed
//! and restarted repeatedly under load spread over all three: nothing
//! acked is lost, no event runs twice at once or again after completing
//! (but after a kill), per-key order holds across instances.

use super::{World, recovery, seq_expect, stop_and_drain, two_loads, two_topics};
use crate::Report;
use crate::backend::Backend;
use crate::child::Serve;
use crate::load::targets;
use std::time::Duration;

const INSTANCES: usize = 3;
/// The instance that is killed and restarted.
const VICTIM: usize = 2;

pub fn applies(b: &Backend) -> bool {
    matches!(b, Backend::Postgres { .. })
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let (kills, every) = if quick {
        (3, Duration::from_secs(2))
    } else {
        (8, Duration::from_secs(4))
    };
    let world = World::new(&backend, Duration::from_millis(2), two_topics).await?;
    let mut serves: Vec<Serve> = Vec::new();
    for _ in 0..INSTANCES {
        serves.push(world.serve().await?);
    }
    let targets = targets(serves.iter().map(|s| s.base.clone()).collect());
    let loads = two_loads()
        .iter()
        .map(|l| l.start(&targets, &world.rec))
        .collect();
    let mut faults = Vec::new();
    for _ in 0..kills {
        tokio::time::sleep(every).await;
        faults.push(world.kill9(&mut serves[VICTIM]).await);
        serves[VICTIM] = world.serve().await?;
        targets.write().unwrap_or_else(|e| e.into_inner())[VICTIM] = serves[VICTIM].base.clone();
    }
    tokio::time::sleep(every).await;
    let mut notes = Vec::new();
    let stuck = stop_and_drain(loads, &world.fresh.url, &mut notes).await?;
    for s in &mut serves {
        s.signal_term()?;
        s.exit_within(Duration::from_secs(30)).await?;
    }
    let (record, verdict) = world.check(&seq_expect()).await?;
    let mut report = Report::new("cluster", backend.name(), &record, verdict);
    report.recovery = recovery(&record, &faults);
    notes.insert(
        0,
        format!(
            "{INSTANCES} instances, instance {VICTIM} killed {kills} times; {} handler calls",
            record.calls.len()
        ),
    );
    report.notes.push(notes.join("; "));
    report.failures.extend(stuck);
    world.cleanup().await?;
    Ok(report)
}
