//! Maintenance: the periodic work one elected instance does for everyone
//! sharing a store (lease rescue, expiry, retention, alerts), as one service that
//! runs until shutdown.
//!
//! The tasks share one election: each period the service renews (or tries
//! to take) the `maintenance` lease, and only its holder runs them. Lease
//! rescue, expiry and the folding of the stats counters run every period;
//! retention and alerts on their own, longer schedules. A task is a small
//! struct that knows its schedule and does one round when asked.

mod alerts;
mod expiry;
mod notify;
mod rescue;
mod retention;

pub(crate) use alerts::current_alerts;
pub use notify::AlertNotify;

use crate::dispatch::TopicRuntime;
use crate::dispatch::idle::sleep;
use alerts::AlertReporter;
use expiry::ExpirySweep;
use mailroom_core::{AlertRules, Retention, Store};
use rescue::LeaseRescue;
use retention::RetentionRun;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The name of the lease the maintenance instance holds.
const ROLE: &str = "maintenance";

/// What the maintenance service looks after.
pub(crate) struct Maintenance {
    pub store: Arc<dyn Store>,
    pub topics: Vec<Arc<TopicRuntime>>,
    pub retention: Retention,
    pub alerts: AlertRules,
    /// How often the elected instance evaluates `alerts`.
    pub alert_every: Duration,
    /// Where alert transitions are POSTed.
    pub notify: Option<AlertNotify>,
    pub period: Duration,
    pub worker: String,
}

impl Maintenance {
    /// Runs until `shutdown`. With several instances on one store, only the
    /// holder of the `maintenance` lease (renewed every period, expiring
    /// after a few) does the work.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let Self {
            store,
            topics,
            retention,
            alerts,
            alert_every,
            notify,
            period,
            worker,
        } = self;
        let notifier = notify.map(|n| notify::Notifier::start(n, shutdown.clone()));
        let expiry = ExpirySweep::new(store.clone(), topics.clone());
        let rescue = LeaseRescue::new(store.clone(), topics);
        let mut retention = RetentionRun::new(store.clone(), retention);
        let mut alerts = AlertReporter::new(store.clone(), alerts, alert_every, notifier);
        let ttl = (period * 5).max(Duration::from_secs(5));
        loop {
            let round = async {
                match store.try_lead(ROLE, &worker, ttl).await {
                    Ok(true) => {
                        rescue.run_once().await;
                        expiry.run_once().await;
                        if let Err(e) = store.fold_counters().await {
                            warn!(error = %e, "folding the stats counters failed");
                        }
                        retention.run_if_due().await;
                        alerts.run_if_due().await;
                    }
                    // Another instance reports alerts now; forget ours, so
                    // that taking over later logs what is still firing.
                    Ok(false) => alerts.forget(),
                    Err(e) => warn!(error = %e, "maintenance election failed"),
                }
            };
            // A round can be long (the first retention over a large backlog
            // deletes chunk after chunk): shutdown does not wait for it.
            // Each chunk is its own transaction; the next instance to lead
            // goes on.
            tokio::select! {
                () = round => {}
                () = shutdown.cancelled() => break,
            }
            if !sleep(period, &shutdown).await {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stalled::Stalled;

    /// Shutdown while retention is still purging: maintenance stops at
    /// once instead of waiting for the purge to end.
    #[tokio::test]
    async fn shutdown_does_not_wait_for_a_long_purge() {
        let maintenance = Maintenance {
            store: Arc::new(Stalled),
            topics: vec![],
            retention: Retention::default(),
            alerts: AlertRules::default(),
            alert_every: Duration::from_secs(10),
            notify: None,
            period: Duration::from_millis(100),
            worker: "w".into(),
        };
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(maintenance.run(shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!running.is_finished(), "the purge cannot have ended");
        shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(2), running).await;
        assert!(
            stopped.is_ok(),
            "maintenance still running 2 s after shutdown"
        );
    }
}
