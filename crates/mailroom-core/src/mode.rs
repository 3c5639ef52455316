//! Processing modes: `single` (independent events, up to `concurrency` at
//! once), `sequential` (strict order per key, many keys in parallel) and
//! `batch` (events delivered together).

use crate::cron::{Cron, CronError};
use std::time::Duration;

/// How a topic's events are handed to its handler.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Mode {
    /// Independently, up to `concurrency` at once.
    #[default]
    Single,
    /// Strict order per key; many keys in parallel.
    Sequential {
        /// What a dead head does to its key.
        on_dead: OnDead,
    },
    /// Delivered together.
    Batch(BatchSettings),
}

impl Mode {
    /// `single`, `sequential` or `batch`.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Sequential { .. } => "sequential",
            Mode::Batch(_) => "batch",
        }
    }

    /// What a claim of this mode must respect per key:
    /// [`ClaimRequest::per_key`](crate::ClaimRequest::per_key).
    pub fn per_key(&self) -> Option<OnDead> {
        match self {
            Mode::Sequential { on_dead } => Some(*on_dead),
            _ => None,
        }
    }
}

/// What a dead head of a sequential key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDead {
    /// The key stays blocked until an operator replays or skips the head.
    #[default]
    Block,
    /// The next event of the key may go.
    Skip,
}

/// When a batch topic flushes.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSettings {
    /// Flush when this many events are waiting.
    pub max_size: u32,
    /// Flush when the oldest waiting event has waited this long.
    pub max_wait: Duration,
    /// Flush on this cron schedule (UTC) instead of by size/wait.
    pub schedule: Option<String>,
    /// One batch per value of this key.
    pub group_by: Option<String>,
}

impl BatchSettings {
    /// Default flush size: a batch leaves once this many events wait.
    pub const DEFAULT_MAX_SIZE: u32 = 100;
    /// Default longest wait of the oldest event before a flush.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(1);

    /// Checks the flush size, the cron schedule and the `group_by` pointer.
    pub fn validate(&self) -> Result<(), BatchError> {
        if self.max_size == 0 {
            return Err(BatchError::NoSize);
        }
        if let Some(s) = &self.schedule {
            Cron::parse(s)?;
        }
        match &self.group_by {
            Some(p) if !p.starts_with('/') => Err(BatchError::GroupBy(p.clone())),
            _ => Ok(()),
        }
    }
}

/// Why [`BatchSettings`] were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// `max_size` is 0.
    #[error("max_size must be at least 1")]
    NoSize,
    /// `schedule` is not a cron expression.
    #[error(transparent)]
    Schedule(#[from] CronError),
    /// `group_by` is not a JSON pointer.
    #[error("group_by {0:?} is not a JSON pointer (it must start with '/')")]
    GroupBy(String),
}

impl BatchError {
    /// The offending key inside `batch = {...}`, e.g. `schedule`.
    pub fn key(&self) -> &'static str {
        match self {
            BatchError::NoSize => "max_size",
            BatchError::Schedule(_) => "schedule",
            BatchError::GroupBy(_) => "group_by",
        }
    }
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            max_size: Self::DEFAULT_MAX_SIZE,
            max_wait: Self::DEFAULT_MAX_WAIT,
            schedule: None,
            group_by: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Default batch settings pass; a zero size, a bad cron or a `group_by`
    /// that is no JSON pointer are refused, each naming its key.
    #[test]
    fn batch_settings_are_checked_key_by_key() {
        assert_eq!(BatchSettings::default().validate(), Ok(()));
        let with = |f: fn(&mut BatchSettings)| {
            let mut b = BatchSettings::default();
            f(&mut b);
            b.validate().map_err(|e| e.key())
        };
        assert_eq!(with(|b| b.max_size = 0), Err("max_size"));
        assert_eq!(
            with(|b| b.schedule = Some("0 0 * *".into())),
            Err("schedule")
        );
        assert_eq!(with(|b| b.schedule = Some("0 0 * * *".into())), Ok(()));
        assert_eq!(
            with(|b| b.group_by = Some("tenant".into())),
            Err("group_by")
        );
        assert_eq!(with(|b| b.group_by = Some("/tenant".into())), Ok(()));
    }
}
