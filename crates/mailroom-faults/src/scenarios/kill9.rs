//! (1) `kill -9` of mailroom under intake and processing load, restarted:
//! every acked event is stored and processed, a completed event runs again
//! only when a kill may have eaten its completion, per-key order holds.

use super::{World, recovery, seq_expect, stop_and_drain, two_loads, two_topics};
use crate::Report;
use crate::backend::Backend;
use crate::load::targets;
use std::time::Duration;

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let (kills, every) = if quick {
        (2, Duration::from_secs(2))
    } else {
        (5, Duration::from_secs(5))
    };
    let world = World::new(&backend, Duration::from_millis(2), two_topics).await?;
    let mut serve = world.serve().await?;
    let targets = targets(vec![serve.base.clone()]);
    let loads = two_loads()
        .iter()
        .map(|l| l.start(&targets, &world.rec))
        .collect();
    let mut faults = Vec::new();
    // The WARN/ERROR lines of each instance, shown when the row fails.
    let mut logs = Vec::new();
    for _ in 0..kills {
        tokio::time::sleep(every).await;
        faults.push(world.kill9(&mut serve).await);
        logs.extend(serve.problem_summary());
        serve = world.serve().await?;
        *targets.write().unwrap_or_else(|e| e.into_inner()) = vec![serve.base.clone()];
    }
    tokio::time::sleep(every).await;
    let mut notes = vec![format!("{kills} kills")];
    let stuck = stop_and_drain(loads, &world.fresh.url, &mut notes).await?;
    serve.signal_term()?;
    serve.exit_within(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&seq_expect()).await?;
    let mut report = Report::new("kill9", backend.name(), &record, verdict);
    report.recovery = recovery(&record, &faults);
    notes.insert(1, format!("{} handler calls", record.calls.len()));
    report.notes.push(notes.join("; "));
    report.failures.extend(stuck);
    if !report.passed() {
        logs.extend(serve.problem_summary());
        report.notes.extend(logs.into_iter().take(20));
    }
    world.cleanup().await?;
    Ok(report)
}
