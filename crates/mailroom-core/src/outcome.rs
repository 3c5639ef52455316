//! What a handler answers, and what the store is told to record.

use crate::retry::RetryPolicy;
use std::time::Duration;

/// A handler's verdict on one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Processed; the event is `done`.
    Success,
    /// Failed; try again later (at `after` if the handler asked, e.g. HTTP
    /// `Retry-After`, else by the retry policy).
    Retry {
        /// Why it failed; kept in the history.
        error: String,
        /// A delay the handler asked for.
        after: Option<Duration>,
    },
    /// The receiver asked the whole topic to slow down (HTTP 429 with
    /// `Retry-After`): the topic pauses for `after` on every instance, and
    /// this event is retried when the pause ends. The attempt counts against
    /// `max_attempts` like any failed one (only this event's: the others
    /// wait without trying).
    Throttled {
        /// Why it failed; kept in the history.
        error: String,
        /// How long the topic pauses, and this event waits.
        after: Duration,
    },
    /// Failed for good (HTTP 410, command exit 65): straight to `dead`.
    Permanent {
        /// Why it failed.
        error: String,
    },
}

impl Outcome {
    /// A retryable failure with no requested delay.
    pub fn retry(error: impl Into<String>) -> Self {
        Self::Retry {
            error: error.into(),
            after: None,
        }
    }

    /// A permanent failure.
    pub fn permanent(error: impl Into<String>) -> Self {
        Self::Permanent {
            error: error.into(),
        }
    }

    /// Turns the verdict on attempt number `attempt` (1-based, of an event
    /// whose budget is `max_attempts`) into what the store must record.
    /// `spread` in `[-1, 1]` feeds the policy's jitter.
    pub fn resolve(
        self,
        attempt: u32,
        max_attempts: u32,
        policy: &RetryPolicy,
        spread: f64,
    ) -> Completion {
        match self {
            Outcome::Success => Completion::Done,
            Outcome::Permanent { error } => Completion::Dead { error },
            Outcome::Retry { error, .. } if attempt >= max_attempts => Completion::Dead { error },
            Outcome::Retry { error, after } => Completion::Retry {
                delay: after.unwrap_or_else(|| policy.delay_after(attempt, spread)),
                error,
            },
            Outcome::Throttled { error, .. } if attempt >= max_attempts => {
                Completion::Dead { error }
            }
            Outcome::Throttled { error, after } => Completion::Retry {
                delay: after,
                error,
            },
        }
    }

    /// How long the topic must pause, for a [`Outcome::Throttled`] verdict.
    pub fn pause(&self) -> Option<Duration> {
        match self {
            Outcome::Throttled { after, .. } => Some(*after),
            _ => None,
        }
    }
}

/// The state change a store applies when an attempt ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Completion {
    /// `running` → `done`.
    Done,
    /// `running` → `pending`, due `delay` from now on the database clock.
    Retry {
        /// Wait before the next attempt.
        delay: Duration,
        /// Error text for the history and `last_error`.
        error: String,
    },
    /// `running` → `dead`.
    Dead {
        /// Error text for the history and `last_error`.
        error: String,
    },
}

/// Lets handlers return `Result<(), E>`: `Ok` is success, `Err` a retryable
/// failure whose text is kept in the history.
impl<E: std::fmt::Display> From<Result<(), E>> for Outcome {
    fn from(r: Result<(), E>) -> Self {
        match r {
            Ok(()) => Outcome::Success,
            Err(e) => Outcome::retry(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::Backoff;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            backoff: Backoff::Schedule(vec![Duration::from_secs(1), Duration::from_secs(2)]),
        }
    }

    #[test]
    fn a_throttled_attempt_waits_the_pause_and_spends_an_attempt() {
        let p = policy();
        let t = |attempt| {
            Outcome::Throttled {
                error: "HTTP 429".into(),
                after: Duration::from_secs(30),
            }
            .resolve(attempt, 3, &p, 0.0)
        };
        assert_eq!(
            t(1),
            Completion::Retry {
                delay: Duration::from_secs(30),
                error: "HTTP 429".into()
            }
        );
        assert_eq!(
            t(3),
            Completion::Dead {
                error: "HTTP 429".into()
            }
        );
    }

    #[test]
    fn failures_retry_until_the_budget_is_spent() {
        let p = policy();
        assert_eq!(
            Outcome::retry("x").resolve(1, 3, &p, 0.0),
            Completion::Retry {
                delay: Duration::from_secs(1),
                error: "x".into()
            }
        );
        assert_eq!(
            Outcome::retry("x").resolve(3, 3, &p, 0.0),
            Completion::Dead { error: "x".into() }
        );
    }

    #[test]
    fn a_requested_delay_wins_over_the_policy() {
        let out = Outcome::Retry {
            error: "busy".into(),
            after: Some(Duration::from_secs(90)),
        }
        .resolve(1, 3, &policy(), 0.0);
        assert_eq!(
            out,
            Completion::Retry {
                delay: Duration::from_secs(90),
                error: "busy".into()
            }
        );
    }

    #[test]
    fn permanent_failure_is_dead_at_once() {
        assert_eq!(
            Outcome::permanent("gone").resolve(1, 3, &policy(), 0.0),
            Completion::Dead {
                error: "gone".into()
            }
        );
        assert_eq!(
            Outcome::Success.resolve(3, 3, &policy(), 0.0),
            Completion::Done
        );
    }
}
