//! CPU and memory of the processes under load, read at the window's edges
//! and sampled while it runs.

use super::load::Window;
use crate::backend::postgres_cpu;
use crate::procfs;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// CPU readings at the window's edges.
pub(super) struct CpuProbe {
    pids: Vec<String>,
    before: BTreeMap<String, Duration>,
    pg_before: BTreeMap<String, Duration>,
    self_before: Option<Duration>,
}

/// CPU per thread name, summed over `pids` (instances of one program).
pub(super) fn threads_cpu_of(pids: &[String]) -> BTreeMap<String, Duration> {
    let mut out = BTreeMap::new();
    for pid in pids {
        for (name, t) in procfs::threads_cpu(pid) {
            *out.entry(name).or_insert(Duration::ZERO) += t;
        }
    }
    out
}

/// What [`CpuProbe`] measured: mailroom's threads, the load generator,
/// PostgreSQL's processes.
pub(super) struct CpuShares {
    pub(super) mailroom: BTreeMap<String, f64>,
    pub(super) loadgen: f64,
    pub(super) postgres: BTreeMap<String, f64>,
}

impl CpuProbe {
    pub(super) async fn at_window_start(pids: Vec<String>, window: Window) -> Self {
        tokio::time::sleep_until(window.from.into()).await;
        Self {
            before: threads_cpu_of(&pids),
            pg_before: postgres_cpu(),
            self_before: procfs::process_cpu("self"),
            pids,
        }
    }

    /// `direct` means mailroom and the load generator are this process, so
    /// the load generator's share is not separable.
    pub(super) async fn at_window_end(self, window: Window) -> CpuShares {
        tokio::time::sleep_until(window.to.into()).await;
        let span = window.to - window.from;
        let after = threads_cpu_of(&self.pids);
        let mailroom = procfs::cpu_share(&self.before, &after, span);
        let postgres = procfs::cpu_share(&self.pg_before, &postgres_cpu(), span);
        let loadgen = match (self.self_before, procfs::process_cpu("self")) {
            (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64() / span.as_secs_f64(),
            _ => f64::NAN,
        };
        CpuShares {
            mailroom,
            loadgen,
            postgres,
        }
    }
}

/// The highest VmRSS of some processes, sampled until stopped.
pub(super) struct RssSampler {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<procfs::RssPeak>>,
}

impl RssSampler {
    pub(super) fn start(pids: &[String]) -> Self {
        let stop = CancellationToken::new();
        let tasks = pids
            .iter()
            .map(|pid| tokio::spawn(procfs::sample_rss(pid.clone(), stop.clone())))
            .collect();
        Self { stop, tasks }
    }

    /// The largest peak of any of the processes, in bytes.
    pub(super) async fn stop(self) -> anyhow::Result<u64> {
        self.stop.cancel();
        let mut peak = 0;
        for t in self.tasks {
            peak = peak.max(t.await?.sampled_max);
        }
        Ok(peak)
    }
}
