//! The resolved shape of an engine: its topics and sources, built from
//! [`Config`](crate::config::Config) or by hand (library mode), validated
//! once so the data path never re-checks configuration.

use crate::config::{
    Config, ConfigError, FieldConfig, ModeName, OnDeadName, RetryConfig, TopicConfig,
};
use crate::handler::SharedHandler;
use mailroom_core::{Backoff, BatchSettings, Mode, OnDead, RetryPolicy, duration};
use std::time::Duration;

/// Where a value lives in an incoming request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A header (case-insensitive).
    Header(String),
    /// A JSON pointer into the body (RFC 6901).
    Json(String),
    /// The SHA-256 of the body (a dedup key of last resort).
    BodySha256,
}

impl Field {
    fn from_config(c: &FieldConfig, key: &str, cfg: &Config) -> Result<Field, ConfigError> {
        match (&c.header, &c.json) {
            (Some(h), None) => {
                http::HeaderName::try_from(h.as_str())
                    .map_err(|_| cfg.invalid(key, format!("{h:?} is not a valid header name")))?;
                Ok(Field::Header(h.clone()))
            }
            (None, Some(p)) => Field::json(p).map_err(|m| cfg.invalid(key, m)),
            _ => Err(cfg.invalid(
                key,
                "give exactly one of `header = \"...\"` or `json = \"/pointer\"`",
            )),
        }
    }

    /// A JSON pointer field; the pointer must be empty or start with `/`.
    pub fn json(pointer: &str) -> Result<Field, String> {
        if pointer.is_empty() || pointer.starts_with('/') {
            Ok(Field::Json(pointer.to_string()))
        } else {
            Err(format!(
                "{pointer:?} is not a JSON pointer (it must start with '/')"
            ))
        }
    }
}

/// A topic's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicSpec {
    /// Name.
    pub name: String,
    /// Processing mode.
    pub mode: Mode,
    /// Where the ordering/grouping key lives when the source doesn't say.
    pub key: Option<Field>,
    /// Key for keyless events in sequential topics (else 400 at intake).
    pub default_key: Option<String>,
    /// Attempts in flight at once.
    pub concurrency: u32,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Bound on one attempt.
    pub timeout: Duration,
    /// Lease length; always longer than `timeout`.
    pub lease: Duration,
}

impl TopicSpec {
    /// A `single` topic with SPEC defaults: concurrency 16, 15 attempts from
    /// 2 s, 30 s timeout, 35 s lease.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            mode: Mode::Single,
            key: None,
            default_key: None,
            concurrency: 16,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            lease: Duration::from_secs(35),
        }
    }

    /// Sets the mode.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets where the key lives.
    pub fn key(mut self, key: Field) -> Self {
        self.key = Some(key);
        self
    }

    /// Sets the concurrency (at least 1).
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Sets the retry policy.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Sets the attempt timeout; the lease becomes timeout + 5 s unless longer.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.lease = self.lease.max(timeout + Duration::from_secs(5));
        self
    }

    /// Sets the lease (must exceed the timeout; checked by the engine builder).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Checks the numbers, naming the first that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("name: must not be empty".into());
        }
        self.retry.validate().map_err(|e| format!("retry: {e}"))?;
        if self.lease <= self.timeout {
            return Err(format!(
                "lease ({}) must be longer than timeout ({})",
                duration::format(self.lease),
                duration::format(self.timeout)
            ));
        }
        if self.concurrency == 0 {
            return Err("concurrency: must be at least 1".into());
        }
        Ok(())
    }

    pub(crate) fn from_config(
        t: &TopicConfig,
        idx: usize,
        cfg: &Config,
    ) -> Result<Self, ConfigError> {
        let at = |k: &str| format!("topic[{idx}].{k}");
        let key = match (&t.key, &t.key_header) {
            (Some(_), Some(_)) => {
                return Err(cfg.invalid(at("key"), "give `key` or `key_header`, not both"));
            }
            (Some(p), None) => Some(Field::json(p).map_err(|m| cfg.invalid(at("key"), m))?),
            (None, Some(h)) => Some(Field::from_config(
                &FieldConfig {
                    header: Some(h.clone()),
                    json: None,
                },
                &at("key_header"),
                cfg,
            )?),
            (None, None) => None,
        };
        let mode = match t.mode {
            ModeName::Single => Mode::Single,
            ModeName::Sequential => Mode::Sequential {
                on_dead: match t.on_dead {
                    OnDeadName::Block => OnDead::Block,
                    OnDeadName::Skip => OnDead::Skip,
                },
            },
            ModeName::Batch => {
                let b = t.batch.clone().unwrap_or(crate::config::BatchConfig {
                    max_size: None,
                    max_wait: None,
                    schedule: None,
                    group_by: None,
                });
                let d = BatchSettings::default();
                Mode::Batch(BatchSettings {
                    max_size: b.max_size.unwrap_or(d.max_size).max(1),
                    max_wait: b.max_wait.unwrap_or(d.max_wait),
                    schedule: b.schedule,
                    group_by: b.group_by,
                })
            }
        };
        if t.batch.is_some() && t.mode != ModeName::Batch {
            return Err(cfg.invalid(
                at("batch"),
                "only batch topics take `batch = {...}` (set mode = \"batch\")",
            ));
        }
        let lease = t.lease.unwrap_or(t.timeout + Duration::from_secs(5));
        let spec = TopicSpec {
            name: t.name.clone(),
            mode,
            key,
            default_key: t.default_key.clone(),
            concurrency: t.concurrency,
            retry: retry_policy(&t.retry).map_err(|m| cfg.invalid(at("retry.schedule"), m))?,
            timeout: t.timeout,
            lease,
        };
        spec.validate()
            .map_err(|m| cfg.invalid(format!("topic[{idx}]"), m))?;
        Ok(spec)
    }
}

fn retry_policy(r: &RetryConfig) -> Result<RetryPolicy, String> {
    let backoff = match &r.schedule {
        Some(steps) => Backoff::Schedule(
            steps
                .iter()
                .map(|s| duration::parse(s).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?,
        ),
        None => Backoff::Exponential {
            base: r.base,
            factor: r.factor,
            max_delay: r.max_delay,
            jitter: r.jitter,
        },
    };
    Ok(RetryPolicy {
        max_attempts: r.max_attempts,
        backoff,
    })
}

/// A webhook source's settings.
#[derive(Debug, Clone)]
pub struct SourceSpec {
    /// URL segment and `source` of its events.
    pub name: String,
    /// Topic its events go to.
    pub topic: String,
    /// Where the dedup key lives, first present wins; empty means the
    /// default chain (`webhook-id`, `Idempotency-Key`, `/id`, SHA-256 of the body).
    pub id: Vec<Field>,
    /// Where the event type lives.
    pub event_type: Option<Field>,
    /// Where the ordering key lives (overrides the topic's).
    pub key: Option<Field>,
    /// Signature verification, checked before anything else.
    pub verifier: Option<mailroom_signatures::Verifier>,
    /// Largest accepted body in bytes.
    pub max_body: u64,
    /// Requests accepted per time unit (`rate_limit = "1000/s"`); `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
}

/// A source's request budget, `"<n>/s"`, `"<n>/m"` or `"<n>/h"`, enforced by
/// the server as a token bucket holding at most `requests` (so a burst of
/// one period is allowed) and refilled at `requests / per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests per period (at least 1).
    pub requests: u32,
    /// The period.
    pub per: Duration,
}

impl std::str::FromStr for RateLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("{s:?} is not a rate: write \"<n>/s\", \"<n>/m\" or \"<n>/h\", e.g. \"1000/s\"")
        };
        let (n, unit) = s.trim().split_once('/').ok_or_else(bad)?;
        let requests: u32 = n.trim().parse().map_err(|_| bad())?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        if requests == 0 {
            return Err(format!("{s:?}: the number of requests must be at least 1"));
        }
        Ok(RateLimit { requests, per })
    }
}

/// Default `max_body`: 1 MiB.
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;

impl SourceSpec {
    /// A source with the default dedup chain, no verification, 1 MiB bodies.
    pub fn new(name: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            topic: topic.into(),
            id: vec![],
            event_type: None,
            key: None,
            verifier: None,
            max_body: DEFAULT_MAX_BODY,
            rate_limit: None,
        }
    }

    pub(crate) fn from_config(
        s: &crate::config::SourceConfig,
        idx: usize,
        cfg: &Config,
    ) -> Result<Self, ConfigError> {
        let at = |k: &str| format!("source[{idx}].{k}");
        if s.name.is_empty()
            || !s
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(cfg.invalid(
                at("name"),
                "use letters, digits, '-', '_' or '.' (it is a URL segment)",
            ));
        }
        let field = |f: &Option<FieldConfig>, k: &str| {
            f.as_ref()
                .map(|f| Field::from_config(f, &at(k), cfg))
                .transpose()
        };
        let mut spec = SourceSpec {
            name: s.name.clone(),
            topic: s.topic.clone().unwrap_or_else(|| s.name.clone()),
            id: field(&s.id, "id")?.into_iter().collect(),
            event_type: field(&s.event_type, "type")?,
            key: field(&s.key, "key")?,
            verifier: None,
            max_body: s.max_body.map(|b| b.0).unwrap_or(DEFAULT_MAX_BODY),
            rate_limit: s
                .rate_limit
                .as_deref()
                .map(|r| r.parse().map_err(|m| cfg.invalid(at("rate_limit"), m)))
                .transpose()?,
        };
        if spec.max_body == 0 {
            return Err(cfg.invalid(at("max_body"), "must be more than 0"));
        }
        crate::intake::verify::configure(&mut spec, s, &at, cfg)?;
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_per_second_minute_and_hour() {
        let r: RateLimit = "1000/s".parse().unwrap();
        assert_eq!((r.requests, r.per), (1000, Duration::from_secs(1)));
        let r: RateLimit = " 60 / m ".parse().unwrap();
        assert_eq!((r.requests, r.per), (60, Duration::from_secs(60)));
        assert_eq!(
            "5/h".parse::<RateLimit>().unwrap().per,
            Duration::from_secs(3600)
        );
        for bad in ["", "1000", "0/s", "-1/s", "x/s", "10/d", "1.5/s"] {
            assert!(bad.parse::<RateLimit>().is_err(), "{bad:?}");
        }
    }

    fn topology(toml: &str) -> Result<Topology, String> {
        let config = Config::from_toml("m.toml", toml, &|_| None).map_err(|e| e.to_string())?;
        Topology::from_config(&config).map_err(|e| e.to_string())
    }

    #[test]
    fn alert_thresholds_become_rules_and_bad_ones_are_named() {
        let t = topology(
            "[alerts]\ndead_letter_depth = 10\nbacklog = 1000\nfailure_rate = 0.05\nprocessing_time = \"5s\"\n",
        )
        .unwrap();
        assert_eq!(
            t.alerts,
            mailroom_core::AlertRules {
                dead_letter_depth: Some(10),
                backlog: Some(1000),
                failure_rate: Some(0.05),
                processing_time: Some(Duration::from_secs(5)),
            }
        );
        assert!(!topology("").unwrap().alerts.any());
        for bad in ["0", "1.5", "-0.1", "nan"] {
            let err = topology(&format!("[alerts]\nfailure_rate = {bad}\n"))
                .map(|_| ())
                .unwrap_err();
            assert!(err.contains("alerts.failure_rate"), "{bad}: {err}");
        }
        let err = topology("[alerts]\nprocessing_time = \"0s\"\n")
            .map(|_| ())
            .unwrap_err();
        assert!(err.contains("alerts.processing_time"), "{err}");
    }
}

/// Everything a configuration declares, validated and built (handlers
/// included), without a store: what `Engine::from_config` assembles and what
/// `mailroom config check` inspects.
#[derive(Debug)]
pub struct Topology {
    /// Topics, each with its built-in handler (`None`: pulled).
    pub topics: Vec<(TopicSpec, Option<SharedHandler>)>,
    /// Webhook sources.
    pub sources: Vec<SourceSpec>,
    /// Retention windows.
    pub retention: mailroom_core::Retention,
    /// Alert thresholds.
    pub alerts: mailroom_core::AlertRules,
}

impl Topology {
    /// Validates `config` and builds its topics, handlers and sources; the
    /// first problem is an error naming its key.
    pub fn from_config(config: &Config) -> Result<Topology, ConfigError> {
        if config.amqp.is_some() {
            return Err(config.invalid("amqp", "AMQP topology is not available in this build yet"));
        }
        let mut topics = Vec::new();
        for (i, t) in config.topics.iter().enumerate() {
            let spec = TopicSpec::from_config(t, i, config)?;
            if let Mode::Batch(b) = &spec.mode
                && let Some(s) = &b.schedule
            {
                mailroom_core::cron::Cron::parse(s).map_err(|e| {
                    config.invalid(format!("topic[{i}].batch.schedule"), e.to_string())
                })?;
            }
            let handler = match &t.handler {
                Some(h) => crate::handler_config::build(h, &spec, i, config)?,
                None => None,
            };
            topics.push((spec, handler));
        }
        let mut sources = Vec::new();
        for (i, s) in config.sources.iter().enumerate() {
            if s.amqp.is_some() {
                return Err(config.invalid(
                    format!("source[{i}].amqp"),
                    "AMQP sources are not available in this build yet",
                ));
            }
            sources.push(SourceSpec::from_config(s, i, config)?);
        }
        let a = &config.alerts;
        if let Some(rate) = a.failure_rate
            && !(rate > 0.0 && rate <= 1.0)
        {
            return Err(config.invalid(
                "alerts.failure_rate",
                format!("a share of attempts in (0, 1], e.g. 0.05 for 5%; got {rate}"),
            ));
        }
        if a.processing_time.is_some_and(|d| d.is_zero()) {
            return Err(config.invalid("alerts.processing_time", "must be more than 0"));
        }
        Ok(Topology {
            topics,
            sources,
            alerts: mailroom_core::AlertRules {
                dead_letter_depth: a.dead_letter_depth,
                backlog: a.backlog,
                failure_rate: a.failure_rate,
                processing_time: a.processing_time,
            },
            retention: mailroom_core::Retention {
                done: config.retention.done,
                dead: config.retention.dead,
                dedup: config.retention.dedup,
            },
        })
    }
}
