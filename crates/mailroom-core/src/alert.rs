//! Alerts: the `[alerts]` thresholds, and their evaluation as a plain
//! function of the numbers a store reports ([`TopicStats`] and
//! [`AttemptWindow`]). Who evaluates, how often and where the verdicts go
//! (logs, metrics, `/v1/stats`, `mailroom status`) is the engine's business.

use crate::event::Status;
use crate::store::TopicStats;
use std::time::Duration;

/// How far back `failure_rate` and `processing_time` look.
pub const ALERT_WINDOW: Duration = Duration::from_secs(300);

/// With fewer attempts finished in the window than this, a topic gets no
/// `failure_rate` verdict: one failure out of two is not a 50% failure rate.
pub const MIN_ATTEMPTS: u64 = 20;

/// The `[alerts]` thresholds; an unset one is not evaluated. Each alert
/// fires when its value is strictly above the threshold, as in the shipped
/// Prometheus rules.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AlertRules {
    /// Fires when a topic holds more dead events than this: failures wait
    /// for an operator.
    pub dead_letter_depth: Option<u64>,
    /// Fires when a topic holds more pending events than this: the
    /// handler is not keeping up.
    pub backlog: Option<u64>,
    /// Share of a topic's attempts finished in the window that failed
    /// (`retry`, `dead` or `lease_expired`), in `0..=1`.
    pub failure_rate: Option<f64>,
    /// The p95 duration of a topic's attempts finished in the window, or the
    /// age of its longest-running attempt, whichever is larger.
    pub processing_time: Option<Duration>,
}

impl AlertRules {
    /// Whether any threshold is set.
    pub fn any(&self) -> bool {
        self.dead_letter_depth.is_some()
            || self.backlog.is_some()
            || self.failure_rate.is_some()
            || self.processing_time.is_some()
    }

    /// Whether evaluating needs [`AttemptWindow`]s (the other rules only
    /// need [`TopicStats`]).
    pub fn needs_window(&self) -> bool {
        self.failure_rate.is_some() || self.processing_time.is_some()
    }

    /// Checks that every set threshold can be crossed and means something:
    /// `failure_rate` is a share in `(0, 1]`, `processing_time` is more than
    /// zero. Depth thresholds take any count (0: fire on the first event).
    pub fn validate(&self) -> Result<(), AlertRulesError> {
        if let Some(rate) = self.failure_rate
            && !(rate > 0.0 && rate <= 1.0)
        {
            return Err(AlertRulesError::FailureRate(rate));
        }
        if self.processing_time.is_some_and(|d| d.is_zero()) {
            return Err(AlertRulesError::ZeroProcessingTime);
        }
        Ok(())
    }
}

/// Why [`AlertRules`] were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AlertRulesError {
    /// `failure_rate` is not a share in `(0, 1]` (or not a number).
    #[error("a share of attempts in (0, 1], e.g. 0.05 for 5%; got {0}")]
    FailureRate(f64),
    /// `processing_time` is zero: every attempt would be too slow.
    #[error("must be more than 0")]
    ZeroProcessingTime,
}

impl AlertRulesError {
    /// The offending key inside `[alerts]`, e.g. `failure_rate`.
    pub fn key(&self) -> &'static str {
        match self {
            AlertRulesError::FailureRate(_) => "failure_rate",
            AlertRulesError::ZeroProcessingTime => "processing_time",
        }
    }
}

/// Which threshold an [`Alert`] crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlertKind {
    /// More dead events than `dead_letter_depth`.
    DeadLetterDepth,
    /// More pending events than `backlog`.
    Backlog,
    /// A larger share of failed attempts in the window than `failure_rate`.
    FailureRate,
    /// Attempts slower (p95, or the longest running) than
    /// `processing_time`.
    ProcessingTime,
}

impl AlertKind {
    /// The config key, also the name in logs, metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeadLetterDepth => "dead_letter_depth",
            Self::Backlog => "backlog",
            Self::FailureRate => "failure_rate",
            Self::ProcessingTime => "processing_time",
        }
    }
}

/// Recent attempts of one topic, as a store reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttemptWindow {
    /// The topic the attempts belong to.
    pub topic: String,
    /// Attempts finished in the window, whatever their outcome.
    pub finished: u64,
    /// Of those, the ones that did not end `done`.
    pub failed: u64,
    /// The p95 (nearest rank) duration of the attempts finished in the window.
    pub p95: Option<Duration>,
    /// How long the oldest attempt still running has been running.
    pub longest_running: Option<Duration>,
}

/// A threshold a topic is over.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    /// The topic over the threshold.
    pub topic: String,
    /// Which `[alerts]` threshold it crossed.
    pub kind: AlertKind,
    /// The measured value (seconds for `processing_time`).
    pub value: f64,
    /// The configured threshold (seconds for `processing_time`).
    pub threshold: f64,
    /// One line for a human: what crossed which threshold, for logs and
    /// the dashboard.
    pub message: String,
}

/// The alerts firing now, ordered by topic then kind.
pub fn evaluate(rules: &AlertRules, stats: &[TopicStats], windows: &[AttemptWindow]) -> Vec<Alert> {
    let mut alerts: Vec<Alert> = stats.iter().flat_map(|s| depth_alerts(rules, s)).collect();
    for w in windows {
        alerts.extend(
            rules
                .failure_rate
                .and_then(|limit| failure_rate_alert(limit, w)),
        );
        alerts.extend(
            rules
                .processing_time
                .and_then(|limit| processing_time_alert(limit, w)),
        );
    }
    alerts.sort_by(|a, b| (&a.topic, a.kind).cmp(&(&b.topic, b.kind)));
    alerts
}

/// `dead_letter_depth` and `backlog`: counts of one topic's events.
fn depth_alerts(rules: &AlertRules, s: &TopicStats) -> impl Iterator<Item = Alert> {
    let depths = [
        (
            AlertKind::DeadLetterDepth,
            rules.dead_letter_depth,
            Status::Dead,
            "dead",
        ),
        (
            AlertKind::Backlog,
            rules.backlog,
            Status::Pending,
            "pending",
        ),
    ];
    depths
        .into_iter()
        .filter_map(move |(kind, limit, status, what)| {
            let count = s.count(status);
            let limit = limit.filter(|limit| count > *limit)?;
            Some(Alert {
                topic: s.topic.clone(),
                kind,
                value: count as f64,
                threshold: limit as f64,
                message: format!("{}: {count} {what} events (threshold {limit})", s.topic),
            })
        })
}

/// `failure_rate`: judged only once the window holds [`MIN_ATTEMPTS`].
fn failure_rate_alert(limit: f64, w: &AttemptWindow) -> Option<Alert> {
    if w.finished < MIN_ATTEMPTS {
        return None;
    }
    let rate = w.failed as f64 / w.finished as f64;
    (rate > limit).then(|| Alert {
        topic: w.topic.clone(),
        kind: AlertKind::FailureRate,
        value: rate,
        threshold: limit,
        message: format!(
            "{}: {:.1}% of attempts failed in the last {} ({} of {}; threshold {:.1}%)",
            w.topic,
            rate * 100.0,
            crate::duration::format(ALERT_WINDOW),
            w.failed,
            w.finished,
            limit * 100.0
        ),
    })
}

/// `processing_time`: the window's p95 or the longest running attempt,
/// whichever is worse, and the message says which.
fn processing_time_alert(limit: Duration, w: &AttemptWindow) -> Option<Alert> {
    let p95 = w.p95.unwrap_or_default();
    let running = w.longest_running.unwrap_or_default();
    let (worst, what) = if running > p95 {
        (running, "an attempt has been running for".to_string())
    } else {
        let window = crate::duration::format(ALERT_WINDOW);
        (p95, format!("p95 attempt duration in the last {window} is"))
    };
    (worst > limit).then(|| Alert {
        topic: w.topic.clone(),
        kind: AlertKind::ProcessingTime,
        value: worst.as_secs_f64(),
        threshold: limit.as_secs_f64(),
        message: format!(
            "{}: {what} {:.1}s (threshold {})",
            w.topic,
            worst.as_secs_f64(),
            crate::duration::format(limit)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(topic: &str, pending: u64, dead: u64) -> TopicStats {
        let mut s = TopicStats {
            topic: topic.into(),
            ..TopicStats::default()
        };
        s.counts.insert(Status::Pending.as_str(), pending);
        s.counts.insert(Status::Dead.as_str(), dead);
        s
    }

    fn window(
        topic: &str,
        finished: u64,
        failed: u64,
        p95_ms: u64,
        running_ms: u64,
    ) -> AttemptWindow {
        AttemptWindow {
            topic: topic.into(),
            finished,
            failed,
            p95: Some(Duration::from_millis(p95_ms)),
            longest_running: (running_ms > 0).then(|| Duration::from_millis(running_ms)),
        }
    }

    const RULES: AlertRules = AlertRules {
        dead_letter_depth: Some(10),
        backlog: Some(1000),
        failure_rate: Some(0.05),
        processing_time: Some(Duration::from_secs(5)),
    };

    #[test]
    fn nothing_fires_at_or_under_the_thresholds() {
        let alerts = evaluate(
            &RULES,
            &[stats("a", 1000, 10)],
            &[window("a", 100, 5, 5000, 5000)],
        );
        assert_eq!(alerts, vec![]);
    }

    #[test]
    fn each_threshold_fires_above_its_value() {
        let alerts = evaluate(
            &RULES,
            &[stats("a", 1001, 11)],
            &[window("a", 100, 6, 5001, 0)],
        );
        let kinds: Vec<_> = alerts.iter().map(|a| a.kind).collect();
        assert_eq!(
            kinds,
            vec![
                AlertKind::DeadLetterDepth,
                AlertKind::Backlog,
                AlertKind::FailureRate,
                AlertKind::ProcessingTime
            ]
        );
        assert_eq!(alerts[0].value, 11.0);
        assert_eq!(alerts[1].value, 1001.0);
        assert!((alerts[2].value - 0.06).abs() < 1e-9);
        assert!((alerts[3].value - 5.001).abs() < 1e-9);
        assert!(alerts[3].message.contains("p95"), "{}", alerts[3].message);
    }

    #[test]
    fn a_long_running_attempt_counts_as_slow_processing() {
        let alerts = evaluate(&RULES, &[], &[window("a", 0, 0, 0, 60_000)]);
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].kind, AlertKind::ProcessingTime);
        assert!(
            alerts[0].message.contains("running for 60.0s"),
            "{}",
            alerts[0].message
        );
    }

    #[test]
    fn few_attempts_give_no_failure_rate_verdict() {
        let alerts = evaluate(&RULES, &[], &[window("a", MIN_ATTEMPTS - 1, 10, 0, 0)]);
        assert_eq!(alerts, vec![]);
        let alerts = evaluate(&RULES, &[], &[window("a", MIN_ATTEMPTS, 10, 0, 0)]);
        assert_eq!(alerts.len(), 1);
    }

    #[test]
    fn unset_rules_never_fire() {
        let alerts = evaluate(
            &AlertRules::default(),
            &[stats("a", u64::MAX, u64::MAX)],
            &[window("a", 100, 100, 1_000_000, 1_000_000)],
        );
        assert_eq!(alerts, vec![]);
    }

    #[test]
    fn alerts_come_ordered_by_topic_then_kind() {
        let alerts = evaluate(
            &RULES,
            &[stats("b", 0, 11), stats("a", 0, 11)],
            &[window("a", 100, 100, 0, 0)],
        );
        let got: Vec<_> = alerts.iter().map(|a| (a.topic.as_str(), a.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("a", AlertKind::DeadLetterDepth),
                ("a", AlertKind::FailureRate),
                ("b", AlertKind::DeadLetterDepth)
            ]
        );
    }

    /// Rules that could never fire sensibly are refused, naming the key;
    /// depth thresholds take any count and unset rules are always valid.
    #[test]
    fn thresholds_that_cannot_work_are_refused_by_key() {
        assert_eq!(RULES.validate(), Ok(()));
        assert_eq!(AlertRules::default().validate(), Ok(()));
        let depth_zero = AlertRules {
            dead_letter_depth: Some(0),
            backlog: Some(0),
            ..AlertRules::default()
        };
        assert_eq!(depth_zero.validate(), Ok(()));
        for bad in [0.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            let rules = AlertRules {
                failure_rate: Some(bad),
                ..RULES
            };
            let err = rules.validate().expect_err("out-of-range failure_rate");
            assert_eq!(err.key(), "failure_rate", "{bad}");
        }
        let all_slow = AlertRules {
            processing_time: Some(Duration::ZERO),
            ..RULES
        };
        assert_eq!(
            all_slow.validate(),
            Err(AlertRulesError::ZeroProcessingTime)
        );
        assert_eq!(AlertRulesError::ZeroProcessingTime.key(), "processing_time");
    }
}
