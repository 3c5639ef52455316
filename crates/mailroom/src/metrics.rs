//! Every metric mailroom records, in one table ([`ALL`]): its name, type,
//! labels and help text, so each is spelled once. Call sites pass the name
//! constants to the `metrics` crate's macros with the table's labels; labels
//! stay bounded (source, topic, status, outcome, alert, reason: never event
//! ids). The binary installs the exporter (`mailroom_server::prometheus`),
//! which [`describe`]s every metric from this table (Prometheus `# HELP`) and
//! renders every `_seconds` histogram as a Prometheus histogram (buckets
//! 1 ms to 60 s). The metrics reference page is generated from [`ALL`].

/// How a metric is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down; the last value set.
    Gauge,
    /// A distribution of observations (durations, in seconds).
    Histogram,
}

impl Kind {
    /// The Prometheus `# TYPE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric, as [`ALL`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// Its name, e.g. `mailroom_events_received_total`.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// The label names every series carries.
    pub labels: &'static [&'static str],
    /// What it measures, one line per source line of its doc comment.
    pub help: &'static str,
}

impl Metric {
    /// The help text on one line, as `# HELP` and the reference print it.
    pub fn help_line(&self) -> String {
        self.help
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Declares each metric's name constant (documented by its help text) and
/// the [`ALL`] table from one list.
macro_rules! metrics {
    ($(
        $(#[doc = $help:literal])+
        $constant:ident = $name:literal, $kind:ident, [$($label:literal),*];
    )+) => {
        $(
            $(#[doc = $help])+
            pub const $constant: &str = $name;
        )+

        /// Every metric, in the order of the reference.
        pub const ALL: &[Metric] = &[$(
            Metric {
                name: $constant,
                kind: Kind::$kind,
                labels: &[$($label),*],
                help: concat!($($help, "\n"),+),
            },
        )+];
    };
}

metrics! {
    /// Events offered to intake, by outcome: `accepted`, `duplicate`, or
    /// `rejected` (refused by the topic's rules, unusable (no dedup key), or
    /// not stored); a failed signature counts in
    /// `mailroom_verification_failures_total` instead.
    EVENTS_RECEIVED = "mailroom_events_received_total", Counter, ["source", "topic", "outcome"];
    /// Seconds from a request's arrival to its durable acknowledgement.
    INGEST_DURATION = "mailroom_ingest_duration_seconds", Histogram, ["source"];
    /// Attempts ended, by outcome: `done`, `retry` or `dead`.
    EVENTS_PROCESSED = "mailroom_events_processed_total", Counter, ["topic", "outcome"];
    /// Pending events that became `expired`: older than their topic's
    /// `expire_after`, never run.
    EVENTS_EXPIRED = "mailroom_events_expired_total", Counter, ["topic"];
    /// Seconds each attempt took.
    PROCESSING_DURATION = "mailroom_processing_duration_seconds", Histogram, ["topic"];
    /// Events per topic and status.
    QUEUE_DEPTH = "mailroom_queue_depth", Gauge, ["topic", "status"];
    /// Dead events per topic.
    DEAD_LETTER_DEPTH = "mailroom_dead_letter_depth", Gauge, ["topic"];
    /// Age of the oldest pending event, in seconds.
    OLDEST_PENDING_AGE = "mailroom_oldest_pending_age_seconds", Gauge, ["topic"];
    /// Keys held back by a dead head (sequential topics).
    BLOCKED_KEYS = "mailroom_blocked_keys", Gauge, ["topic"];
    /// Events published to a broker by a publishing handler, by outcome:
    /// `confirmed`, `returned`, `nacked` or `error`.
    PUBLISHED = "mailroom_published_total", Counter, ["topic", "outcome"];
    /// 1 while the alert fires, else 0.
    ALERT_FIRING = "mailroom_alert_firing", Gauge, ["topic", "alert"];
    /// Webhook requests refused by the source's `rate_limit`.
    RATE_LIMITED = "mailroom_rate_limited_total", Counter, ["source"];
    /// Webhook signatures that failed verification, by reason.
    VERIFICATION_FAILURES = "mailroom_verification_failures_total", Counter, ["source", "reason"];
    /// Failed attempts to authenticate with the API token, by route (`api`,
    /// `dashboard`, `login`) and reason (`wrong_token`; `rate_limited`:
    /// refused unseen after too many wrong ones from the same client).
    /// Never labelled by client.
    AUTH_FAILURES = "mailroom_auth_failures_total", Counter, ["route", "reason"];
    /// HTTP requests shed (503) because too many were in flight.
    HTTP_SHED = "mailroom_http_shed_total", Counter, [];
    /// 1 while the AMQP connection (the broker URL without credentials) is
    /// up with its topology declared, else 0.
    AMQP_CONNECTED = "mailroom_amqp_connected", Gauge, ["connection"];
    /// Ready messages in a queue an AMQP source consumes, and in its
    /// dead-letter queue, as the broker last reported them (a passive
    /// declare every 10 s while the connection is up).
    BROKER_QUEUE_DEPTH = "mailroom_broker_queue_depth", Gauge, ["connection", "queue"];
}

/// Registers every metric's help text with the installed recorder (call
/// after installing it), so the exposition carries `# HELP` lines.
pub fn describe() {
    for m in ALL {
        let help = m.help_line();
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, help),
            Kind::Gauge => metrics::describe_gauge!(m.name, help),
            Kind::Histogram => metrics::describe_histogram!(m.name, help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are unique and follow Prometheus conventions: counters end in
    /// `_total`, histograms in `_seconds`; help text is never empty.
    #[test]
    fn names_are_unique_and_conventional() {
        let mut names: Vec<_> = ALL.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a name is listed twice");
        for m in ALL {
            assert!(m.name.starts_with("mailroom_"), "{}", m.name);
            match m.kind {
                Kind::Counter => assert!(m.name.ends_with("_total"), "{}", m.name),
                Kind::Histogram => assert!(m.name.ends_with("_seconds"), "{}", m.name),
                Kind::Gauge => assert!(!m.name.ends_with("_total"), "{}", m.name),
            }
            assert!(!m.help_line().is_empty(), "{} has no help", m.name);
            assert!(!m.help_line().contains('\n'));
        }
    }
}
