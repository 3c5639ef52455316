//! The wall clock, injectable so cron-scheduled batches can be tested without
//! waiting for midnight. Leases and due times never use it: they run on the
//! store's clock.

use jiff::Timestamp;

/// A source of "now" (UTC).
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now, in UTC: what batch schedules are compared against.
    fn now(&self) -> Timestamp;
}

/// The real wall clock, what an engine uses unless one is injected.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// The system clock shifted by a fixed offset: a test can start "just before
/// midnight" and watch a nightly schedule fire in real time.
#[derive(Debug, Clone, Copy)]
pub struct OffsetClock {
    offset_ms: i64,
}

impl OffsetClock {
    /// A clock that reads `start` now and advances in real time from there.
    pub fn starting_at(start: Timestamp) -> Self {
        Self {
            offset_ms: start.as_millisecond() - Timestamp::now().as_millisecond(),
        }
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> Timestamp {
        let ms = Timestamp::now().as_millisecond() + self.offset_ms;
        Timestamp::from_millisecond(ms).unwrap_or(Timestamp::MAX)
    }
}
