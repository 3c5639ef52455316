//! Alerts: the `[alerts]` rules evaluated over the store's numbers on the
//! elected instance, each start and end logged, notified (`notify.rs`) and
//! the firing gauge set.

use super::notify::{Message, Notifier, State};
use crate::metrics as names;
use mailroom_core::alert::{ALERT_WINDOW, evaluate};
use mailroom_core::{Alert, AlertKind, AlertRules, Result, Store, TopicStats};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// The alerts firing now: `rules` over `stats` (read from the store when
/// `None`) and, if a rule needs them, the store's recent attempts.
pub(crate) async fn current_alerts(
    store: &dyn Store,
    rules: &AlertRules,
    stats: Option<&[TopicStats]>,
) -> Result<Vec<Alert>> {
    if !rules.any() {
        return Ok(Vec::new());
    }
    let read;
    let stats = match stats {
        Some(stats) => stats,
        None => {
            read = store.stats().await?;
            &read
        }
    };
    let windows = if rules.needs_window() {
        store.attempt_window(ALERT_WINDOW).await?
    } else {
        Vec::new()
    };
    Ok(evaluate(rules, stats, &windows))
}

/// Evaluates the rules every `every` and reports what changed.
pub(super) struct AlertReporter {
    store: Arc<dyn Store>,
    rules: AlertRules,
    every: Duration,
    last: Option<Instant>,
    /// The alerts firing at the last evaluation, by topic and kind.
    firing: HashMap<(String, AlertKind), Alert>,
    /// Where transitions are POSTed, if configured.
    notifier: Option<Notifier>,
}

impl AlertReporter {
    pub(super) fn new(
        store: Arc<dyn Store>,
        rules: AlertRules,
        every: Duration,
        notifier: Option<Notifier>,
    ) -> Self {
        Self {
            store,
            rules,
            every,
            last: None,
            firing: HashMap::new(),
            notifier,
        }
    }

    fn notify(&self, alert: &Alert, state: State) {
        if let Some(n) = &self.notifier {
            n.send(Message::new(alert, state));
        }
    }

    /// Evaluates the rules if any are set and their time has come.
    pub(super) async fn run_if_due(&mut self) {
        if !self.rules.any() || self.last.is_some_and(|t| t.elapsed() < self.every) {
            return;
        }
        match current_alerts(self.store.as_ref(), &self.rules, None).await {
            Ok(now) => self.report(now),
            Err(e) => warn!(error = %e, "alert evaluation failed"),
        }
        self.last = Some(Instant::now());
    }

    /// Forgets what was firing (another instance reports alerts now), so
    /// that taking over later logs what is still firing.
    pub(super) fn forget(&mut self) {
        self.firing.clear();
    }

    /// Logs and notifies the alerts that started or stopped firing since
    /// the last evaluation, and sets `mailroom_alert_firing{topic,alert}`
    /// to 1 or 0.
    fn report(&mut self, now: Vec<Alert>) {
        let mut next = HashMap::with_capacity(now.len());
        for alert in now {
            let key = (alert.topic.clone(), alert.kind);
            if !self.firing.contains_key(&key) {
                warn!(
                    topic = %alert.topic,
                    alert = alert.kind.as_str(),
                    value = alert.value,
                    threshold = alert.threshold,
                    "alert firing: {}",
                    alert.message
                );
                self.notify(&alert, State::Firing);
            }
            metrics::gauge!(names::ALERT_FIRING, "topic" => alert.topic.clone(), "alert" => alert.kind.as_str())
                .set(1.0);
            next.insert(key, alert);
        }
        for ((topic, kind), old) in std::mem::take(&mut self.firing) {
            if !next.contains_key(&(topic.clone(), kind)) {
                info!(
                    topic = %topic,
                    alert = kind.as_str(),
                    "alert resolved: {}",
                    old.message
                );
                self.notify(&old, State::Resolved);
                metrics::gauge!(names::ALERT_FIRING, "topic" => topic, "alert" => kind.as_str())
                    .set(0.0);
            }
        }
        self.firing = next;
    }
}
