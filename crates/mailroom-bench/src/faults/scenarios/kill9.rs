//! (1) `kill -9` of mailroom under intake and processing load, restarted:
//! every acked event is stored and processed, a completed event runs again
//! only when a kill may have eaten its completion, per-key order holds.

use super::{World, recovery, seq_expect, two_topics};
use crate::backend::Backend;
use crate::faults::Report;
use crate::faults::load::{Load, targets};
use crate::faults::store;
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
    let seq = Load {
        source: "seq",
        clients: 8,
        keys_per_client: 4,
        per_client: None,
        poison: None,
        pad: 200,
        pause: Duration::ZERO,
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
    let mut faults = Vec::new();
    for _ in 0..kills {
        tokio::time::sleep(every).await;
        world.rec.disrupted();
        faults.push(world.rec.now());
        serve.kill9().await;
        serve = world.serve().await?;
        *targets.write().unwrap_or_else(|e| e.into_inner()) = vec![serve.base.clone()];
    }
    tokio::time::sleep(every).await;
    for l in loads {
        l.stop().await;
    }
    let drained =
        store::settle(&world.fresh.url, store::all_final, Duration::from_secs(60)).await?;
    serve.signal_term()?;
    serve.wait_exit(Duration::from_secs(30)).await?;
    let (record, verdict) = world.check(&seq_expect()).await?;
    let mut report = Report::new("kill9", backend.name(), &record, verdict);
    report.recovery = recovery(&record, &faults);
    report.notes.push(format!(
        "{kills} kills; {} handler calls; drained {} after the load",
        record.calls.len(),
        drained.map_or("NOT within 60 s".into(), |d| format!(
            "in {:.1}s",
            d.as_secs_f64()
        ))
    ));
    if drained.is_none() {
        report
            .failures
            .push("events still pending/running 60 s after the load".into());
    }
    world.cleanup().await?;
    Ok(report)
}
