//! Scheduling limits: a topic's `rate` (attempts started per
//! second, minute or hour) and the token budget that enforces it.
//!
//! The budget is a token bucket whose capacity is one *grant*: the tokens an
//! instance takes at a time. It refills at the rate, so over any window of
//! `T` seconds at most `rate × T + grant` tokens are taken, however many
//! instances share it. PostgreSQL keeps the bucket in a table (one row per
//! topic, refilled on the database clock); SQLite in memory, with the same
//! arithmetic ([`TokenBucket`]).

use std::time::Duration;

/// A topic's `rate`: at most `count` attempts started per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Attempts per period (at least 1).
    pub count: u32,
    /// The period: one second, minute or hour.
    pub per: Duration,
}

/// Why a rate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a rate (expected N/s, N/m or N/h with N at least 1, e.g. \"50/s\")")]
pub struct RateError(pub String);

impl Rate {
    /// Parses `"50/s"`, `"100/m"`, `"3/h"`.
    pub fn parse(s: &str) -> Result<Rate, RateError> {
        let err = || RateError(s.to_string());
        let (n, unit) = s.trim().split_once('/').ok_or_else(err)?;
        let count: u32 = n.trim().parse().map_err(|_| err())?;
        let per = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(err()),
        };
        if count == 0 {
            return Err(err());
        }
        Ok(Rate { count, per })
    }

    /// Tokens per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.count) / self.per.as_secs_f64()
    }

    /// The tokens an instance takes from the shared budget at a time, and
    /// the budget's capacity: a tenth of a second's worth, at least one.
    /// Small, so the total stays within the rate plus one grant; large
    /// enough that a busy topic asks the database about ten times a second.
    pub fn grant(&self) -> u32 {
        let tenth = (self.per_second() / 10.0).floor();
        if tenth >= f64::from(u32::MAX) {
            u32::MAX
        } else if tenth >= 1.0 {
            // In range: checked just above.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let g = tenth as u32;
            g
        } else {
            1
        }
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "m",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

/// What a take from a rate budget gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Tokens granted (attempts that may start now), at most the ask.
    pub granted: u32,
    /// With nothing granted: how long until the budget holds what was asked
    /// (at most one grant's worth).
    pub wait: Duration,
}

/// The budget's arithmetic, shared by the in-memory (SQLite) budget and the
/// tests; PostgreSQL's `mailroom.take_tokens` computes the same in SQL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    /// Tokens left at `at` (fractional between refills).
    pub tokens: f64,
    /// When `tokens` was last brought up to date, in seconds on the
    /// caller's monotonic clock.
    pub at: f64,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn full(rate: Rate, now: f64) -> Self {
        Self {
            tokens: f64::from(rate.grant()),
            at: now,
        }
    }

    /// Refills by the time since the last take (capped at one grant), then
    /// takes up to `want` whole tokens.
    pub fn take(&mut self, rate: Rate, want: u32, now: f64) -> Grant {
        let cap = f64::from(rate.grant());
        let avail = (self.tokens + rate.per_second() * (now - self.at).max(0.0)).min(cap);
        let granted = avail.floor().min(f64::from(want)).max(0.0);
        self.tokens = avail - granted;
        self.at = now.max(self.at);
        let wait = if granted >= 1.0 {
            Duration::ZERO
        } else {
            let need = f64::from(want).min(cap);
            Duration::from_secs_f64(((need - self.tokens) / rate.per_second()).max(0.001))
        };
        // `granted` is a whole number in [0, want].
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let granted = granted as u32;
        Grant { granted, wait }
    }

    /// Gives back `n` tokens taken but not used (a claim came back short).
    pub fn give_back(&mut self, rate: Rate, n: u32) {
        self.tokens = (self.tokens + f64::from(n)).min(f64::from(rate.grant()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_per_second_minute_and_hour() {
        assert_eq!(Rate::parse("50/s").map(|r| r.per_second()), Ok(50.0));
        assert_eq!(Rate::parse("120/m").map(|r| r.per_second()), Ok(2.0));
        assert_eq!(Rate::parse(" 36 / h ").map(|r| r.per_second()), Ok(0.01));
        for bad in ["", "50", "50/d", "0/s", "-1/s", "x/s", "50/"] {
            assert!(Rate::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            Rate::parse("50/m").map(|r| r.to_string()).as_deref(),
            Ok("50/m")
        );
    }

    #[test]
    fn a_grant_is_a_tenth_of_a_second_at_least_one() {
        let grant = |s| Rate::parse(s).map(|r| r.grant());
        assert_eq!(grant("100/s"), Ok(10));
        assert_eq!(grant("50/s"), Ok(5));
        assert_eq!(grant("9/s"), Ok(1));
        assert_eq!(grant("50/h"), Ok(1));
    }

    /// Taking as fast as allowed for 10 s gives the rate × 10 s plus the
    /// first full bucket, never more, in any one-second window.
    #[test]
    fn the_bucket_holds_any_window_to_the_rate_plus_one_grant() {
        let rate = Rate::parse("100/s").expect("rate");
        let mut b = TokenBucket::full(rate, 0.0);
        let mut starts = Vec::new();
        let mut now = 0.0;
        while now < 10.0 {
            let g = b.take(rate, 7, now);
            starts.extend(std::iter::repeat_n(now, g.granted as usize));
            now += if g.granted == 0 {
                g.wait.as_secs_f64()
            } else {
                0.003
            };
        }
        assert!((995..=1011).contains(&starts.len()), "{}", starts.len());
        for w in 0..90 {
            let from = f64::from(w) / 10.0;
            let n = starts
                .iter()
                .filter(|&&t| t >= from && t < from + 1.0)
                .count();
            assert!(n <= 110, "{n} starts in [{from}, {from}+1)");
        }
    }

    #[test]
    fn nothing_granted_says_how_long_to_wait_and_give_back_is_capped() {
        let rate = Rate::parse("10/s").expect("rate");
        let mut b = TokenBucket::full(rate, 0.0);
        assert_eq!(b.take(rate, 5, 0.0).granted, 1);
        let g = b.take(rate, 5, 0.02);
        assert_eq!(g.granted, 0);
        assert!((g.wait.as_secs_f64() - 0.08).abs() < 1e-6, "{g:?}");
        b.give_back(rate, 3);
        assert_eq!(b.tokens, 1.0);
    }
}
