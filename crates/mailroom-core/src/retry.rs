//! Retry policy: how long to wait after a failed attempt, and when to give up.
//!
//! After the n-th failed attempt the next one is due at
//! `min(base × factor^(n-1), max_delay)`, ± `jitter` × that delay,
//! or at the n-th entry of an explicit schedule (the last entry repeats).

use std::time::Duration;

/// How delays between attempts grow.
#[derive(Debug, Clone, PartialEq)]
pub enum Backoff {
    /// `min(base × factor^(n-1), max_delay)` ± `jitter` × delay.
    Exponential {
        /// Delay after the first failure.
        base: Duration,
        /// Growth per failure.
        factor: f64,
        /// Upper bound on any delay.
        max_delay: Duration,
        /// Relative spread in `[0, 1]`: 0.2 means ±20 %.
        jitter: f64,
    },
    /// Explicit delays: the n-th failure waits `schedule[n-1]`; the last repeats.
    Schedule(Vec<Duration>),
}

/// A topic's retry policy: how many attempts an event gets before it goes
/// `dead`, and how long it waits after each failure.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts before an event goes `dead` (the first attempt included).
    pub max_attempts: u32,
    /// The wait after each failed attempt: exponential, or an explicit
    /// schedule.
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    /// The documented defaults: 15 attempts, from 2 s doubling up to 1 h,
    /// ±20 % jitter.
    fn default() -> Self {
        Self {
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::Exponential {
                base: Self::DEFAULT_BASE,
                factor: Self::DEFAULT_FACTOR,
                max_delay: Self::DEFAULT_MAX_DELAY,
                jitter: Self::DEFAULT_JITTER,
            },
        }
    }
}

impl RetryPolicy {
    /// Default attempts before `dead`.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 15;
    /// Default delay after the first failure.
    pub const DEFAULT_BASE: Duration = Duration::from_secs(2);
    /// Default growth per failure.
    pub const DEFAULT_FACTOR: f64 = 2.0;
    /// Default cap on any delay.
    pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(3600);
    /// Default relative spread.
    pub const DEFAULT_JITTER: f64 = 0.2;

    /// The delay after failed attempt number `attempt` (1-based).
    ///
    /// `spread` is a random number in `[-1, 1]` supplied by the caller, so
    /// this stays deterministic and testable; it is scaled by `jitter`.
    pub fn delay_after(&self, attempt: u32, spread: f64) -> Duration {
        let n = attempt.max(1);
        match &self.backoff {
            Backoff::Schedule(steps) => steps
                .get(n as usize - 1)
                .or(steps.last())
                .copied()
                .unwrap_or(Duration::ZERO),
            Backoff::Exponential {
                base,
                factor,
                max_delay,
                jitter,
            } => {
                let exp = factor.powi(i32::try_from(n - 1).unwrap_or(i32::MAX));
                let raw = base.as_secs_f64() * exp;
                let capped = if raw.is_finite() {
                    raw.min(max_delay.as_secs_f64())
                } else {
                    max_delay.as_secs_f64()
                };
                let spread = spread.clamp(-1.0, 1.0) * jitter.clamp(0.0, 1.0);
                Duration::from_secs_f64((capped * (1.0 + spread)).max(0.0))
            }
        }
    }

    /// Checks the policy's numbers, naming the first that is wrong.
    pub fn validate(&self) -> Result<(), RetryPolicyError> {
        if self.max_attempts == 0 {
            return Err(RetryPolicyError::NoAttempts);
        }
        match &self.backoff {
            Backoff::Exponential { factor, jitter, .. } => {
                if !(factor.is_finite() && *factor >= 1.0) {
                    return Err(RetryPolicyError::Factor(*factor));
                }
                if !(0.0..=1.0).contains(jitter) {
                    return Err(RetryPolicyError::Jitter(*jitter));
                }
            }
            Backoff::Schedule(steps) if steps.is_empty() => {
                return Err(RetryPolicyError::EmptySchedule);
            }
            Backoff::Schedule(_) => {}
        }
        Ok(())
    }
}

/// Why a [`RetryPolicy`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryPolicyError {
    /// `max_attempts` is 0.
    #[error("max_attempts must be at least 1")]
    NoAttempts,
    /// `factor` is below 1 or not a number.
    #[error("factor must be a number >= 1.0, got {0}")]
    Factor(f64),
    /// `jitter` is outside `[0, 1]`.
    #[error("jitter must be between 0 and 1, got {0}")]
    Jitter(f64),
    /// An explicit schedule with no delay.
    #[error("schedule must list at least one delay")]
    EmptySchedule,
}

impl RetryPolicyError {
    /// The offending key inside `retry = {...}`, e.g. `jitter`.
    pub fn key(&self) -> &'static str {
        match self {
            RetryPolicyError::NoAttempts => "max_attempts",
            RetryPolicyError::Factor(_) => "factor",
            RetryPolicyError::Jitter(_) => "jitter",
            RetryPolicyError::EmptySchedule => "schedule",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(jitter: f64) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 15,
            backoff: Backoff::Exponential {
                base: Duration::from_secs(2),
                factor: 2.0,
                max_delay: Duration::from_secs(3600),
                jitter,
            },
        }
    }

    /// Exponential delays double from `base` and never exceed `max_delay`.
    #[test]
    fn exponential_doubles_from_base_and_caps_at_max_delay() {
        let p = exp(0.0);
        assert_eq!(p.delay_after(1, 0.0), Duration::from_secs(2));
        assert_eq!(p.delay_after(2, 0.0), Duration::from_secs(4));
        assert_eq!(p.delay_after(5, 0.0), Duration::from_secs(32));
        assert_eq!(p.delay_after(12, 0.0), Duration::from_secs(3600));
        assert_eq!(p.delay_after(1000, 0.0), Duration::from_secs(3600));
    }

    /// Jitter moves a delay by at most ± `jitter` × delay, whatever spread is passed.
    #[test]
    fn jitter_stays_within_its_band() {
        let p = exp(0.2);
        assert_eq!(p.delay_after(3, 1.0), Duration::from_secs_f64(8.0 * 1.2));
        assert_eq!(p.delay_after(3, -1.0), Duration::from_secs_f64(8.0 * 0.8));
        // Out-of-range spread is clamped, never widening the band.
        assert_eq!(p.delay_after(3, 7.0), Duration::from_secs_f64(8.0 * 1.2));
    }

    /// An explicit schedule is followed step by step, then its last step repeats.
    #[test]
    fn schedule_is_followed_then_its_last_step_repeats() {
        let p = RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Schedule(vec![
                Duration::from_secs(5),
                Duration::from_secs(10),
                Duration::from_secs(20),
            ]),
        };
        assert_eq!(p.delay_after(1, 1.0), Duration::from_secs(5));
        assert_eq!(p.delay_after(3, 0.0), Duration::from_secs(20));
        assert_eq!(p.delay_after(4, 0.0), Duration::from_secs(20));
    }

    /// A bad policy is refused with a typed error naming the offending key.
    #[test]
    fn validation_names_the_bad_number() {
        assert!(RetryPolicy::default().validate().is_ok());
        let mut p = exp(1.5);
        assert_eq!(p.validate(), Err(RetryPolicyError::Jitter(1.5)));
        assert!(p.validate().unwrap_err().to_string().contains("jitter"));
        p.max_attempts = 0;
        assert_eq!(p.validate().unwrap_err().key(), "max_attempts");
        p.max_attempts = 1;
        p.backoff = Backoff::Schedule(vec![]);
        assert_eq!(p.validate().unwrap_err().key(), "schedule");
    }
}
