//! Processing modes (SPEC §3).

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
    /// Default flush size (SPEC §3).
    pub const DEFAULT_MAX_SIZE: u32 = 100;
    /// Default longest wait of the oldest event before a flush (SPEC §3).
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(1);
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
