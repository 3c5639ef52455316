//! `[[topic]]` → [`TopicSpec`].

use crate::error::ConfigError;
use crate::file::FieldConfig;
use crate::file::{Config, ModeName, OnDeadName, RetryConfig, TopicConfig};
use crate::source::field;
use mailroom::{
    Backoff, BatchSettings, Field, Mode, OnDead, Rate, RetryPolicy, TopicSpec, duration,
};

/// The spec of `topic[idx]`, validated.
pub(crate) fn topic_spec(
    t: &TopicConfig,
    idx: usize,
    cfg: &Config,
) -> Result<TopicSpec, ConfigError> {
    let at = |k: &str| format!("topic[{idx}].{k}");
    let key = match (&t.key, &t.key_header) {
        (Some(_), Some(_)) => {
            return Err(cfg.invalid(at("key"), "give `key` or `key_header`, not both"));
        }
        (Some(p), None) => Some(Field::json(p).map_err(|e| cfg.invalid(at("key"), e.to_string()))?),
        (None, Some(h)) => Some(field(
            &FieldConfig {
                header: Some(h.clone()),
                json: None,
            },
            &at("key_header"),
            cfg,
        )?),
        (None, None) => None,
    };
    if t.batch.is_some() && t.mode != ModeName::Batch {
        return Err(cfg.invalid(
            at("batch"),
            "only batch topics take `batch = {...}` (set mode = \"batch\")",
        ));
    }
    let lease = t.lease.unwrap_or(t.timeout + TopicSpec::LEASE_MARGIN);
    let rate = t
        .rate
        .as_deref()
        .map(Rate::parse)
        .transpose()
        .map_err(|e| cfg.invalid(at("rate"), e.to_string()))?;
    let spec = TopicSpec {
        name: t.name.clone(),
        mode: mode(t),
        key,
        default_key: t.default_key.clone(),
        concurrency: t.concurrency.unwrap_or_else(|| default_concurrency(t)),
        retry: retry_policy(&t.retry).map_err(|m| cfg.invalid(at("retry.schedule"), m))?,
        timeout: t.timeout,
        lease,
        rate,
        max_running: t.max_running,
        expire_after: t.expire_after,
        max_wait_for_priority: t.max_wait_for_priority,
        dead_letter: None,
    };
    spec.validate().map_err(|error| ConfigError::Topic {
        file: cfg.origin.clone(),
        key: at(&error.key()),
        error,
    })?;
    Ok(spec)
}

/// A topic's concurrency when the file sets none: an AMQP handler's
/// attempts wait on the broker's confirms, so its rate is its depth over
/// the confirm latency and it needs far more in flight than a handler that
/// works (a batch topic's deliveries are already many events each).
fn default_concurrency(t: &TopicConfig) -> u32 {
    let publishes = t.handler.as_ref().is_some_and(|h| h.amqp.is_some());
    if publishes && t.mode != ModeName::Batch {
        mailroom_amqp::AmqpHandlerSpec::DEFAULT_CONCURRENCY
    } else {
        TopicSpec::DEFAULT_CONCURRENCY
    }
}

fn mode(t: &TopicConfig) -> Mode {
    match t.mode {
        ModeName::Single => Mode::Single,
        ModeName::Sequential => Mode::Sequential {
            on_dead: match t.on_dead {
                OnDeadName::Block => OnDead::Block,
                OnDeadName::Skip => OnDead::Skip,
            },
        },
        ModeName::Batch => {
            let b = t.batch.clone().unwrap_or_default();
            let d = BatchSettings::default();
            Mode::Batch(BatchSettings {
                max_size: b.max_size.unwrap_or(d.max_size),
                max_wait: b.max_wait.unwrap_or(d.max_wait),
                schedule: b.schedule,
                group_by: b.group_by,
            })
        }
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
