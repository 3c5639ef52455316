//! Five-field cron schedules (`minute hour day-of-month month day-of-week`),
//! evaluated in UTC, for batch topics' `schedule`. Each field takes
//! `*`, numbers, ranges `a-b`, lists `a,b` and steps `*/n` or `a-b/n`;
//! day-of-week is 0–7 with 0 and 7 both Sunday. As in Vixie cron, when both
//! day fields are restricted a day matches if either does.

use jiff::civil::DateTime;
use jiff::{Timestamp, ToSpan, tz::TimeZone};

/// A parsed five-field schedule: [`Cron::parse`] reads one, and
/// [`Cron::next_after`] finds when it fires next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    days_restricted: bool,
    weekdays_restricted: bool,
    text: String,
}

/// Why a schedule was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid cron schedule {text:?}: {reason} (expected 5 fields: minute hour day month weekday, e.g. \"0 0 * * *\")"
)]
pub struct CronError {
    text: String,
    reason: String,
}

fn field(spec: &str, min: u32, max: u32, name: &str) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    for part in spec.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (
                r,
                s.parse::<u32>()
                    .map_err(|_| format!("{name}: bad step {s:?}"))?,
            ),
            None => (part, 1),
        };
        if step == 0 {
            return Err(format!("{name}: step must be at least 1"));
        }
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let a = a.parse().map_err(|_| format!("{name}: bad number {a:?}"))?;
            let b = b.parse().map_err(|_| format!("{name}: bad number {b:?}"))?;
            (a, b)
        } else {
            let v = range
                .parse()
                .map_err(|_| format!("{name}: bad number {range:?}"))?;
            (v, if part.contains('/') { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("{name}: {part:?} is outside {min}-{max}"));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok((bits, spec != "*"))
}

impl Cron {
    /// Parses a five-field expression.
    pub fn parse(text: &str) -> Result<Cron, CronError> {
        let err = |reason: String| CronError {
            text: text.to_string(),
            reason,
        };
        let f: Vec<&str> = text.split_whitespace().collect();
        if f.len() != 5 {
            return Err(err(format!("{} fields", f.len())));
        }
        let (minutes, _) = field(f[0], 0, 59, "minute").map_err(err)?;
        let (hours, _) = field(f[1], 0, 23, "hour").map_err(err)?;
        let (days, days_restricted) = field(f[2], 1, 31, "day of month").map_err(err)?;
        let (months, _) = field(f[3], 1, 12, "month").map_err(err)?;
        let (mut weekdays, weekdays_restricted) = field(f[4], 0, 7, "day of week").map_err(err)?;
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1;
        }
        Ok(Cron {
            minutes,
            hours,
            days,
            months,
            weekdays,
            days_restricted,
            weekdays_restricted,
            text: text.to_string(),
        })
    }

    fn day_matches(&self, dt: DateTime) -> bool {
        let dom = self.days & (1 << dt.day()) != 0;
        let dow = self.weekdays & (1 << dt.weekday().to_sunday_zero_offset()) != 0;
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => dom || dow,
            (true, false) => dom,
            (false, true) => dow,
            (false, false) => true,
        }
    }

    /// The first fire time strictly after `after` (UTC), looking ahead at
    /// most five years (a schedule like "0 0 30 2 *" never fires: `None`).
    pub fn next_after(&self, after: Timestamp) -> Option<Timestamp> {
        let tz = TimeZone::UTC;
        let start = after.to_zoned(tz.clone()).datetime();
        // Next whole minute after `after`.
        let mut dt = start
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = start.checked_add(5.years()).ok()?;
        while dt < limit {
            if self.months & (1 << dt.month()) == 0 {
                dt = dt
                    .first_of_month()
                    .checked_add(1.month())
                    .ok()?
                    .with()
                    .hour(0)
                    .minute(0)
                    .build()
                    .ok()?;
                continue;
            }
            if !self.day_matches(dt) {
                dt = dt
                    .date()
                    .checked_add(1.day())
                    .ok()?
                    .to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if self.hours & (1 << dt.hour()) == 0 {
                dt = dt
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.minutes & (1 << dt.minute()) == 0 {
                dt = dt.checked_add(1.minute()).ok()?;
                continue;
            }
            return dt.to_zoned(tz).ok().map(|z| z.timestamp());
        }
        None
    }
}

impl std::fmt::Display for Cron {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn nightly_fires_at_the_next_midnight_utc() {
        let c = Cron::parse("0 0 * * *").unwrap();
        assert_eq!(
            c.next_after(at("2026-11-21T12:13:14Z")),
            Some(at("2026-11-22T00:00:00Z"))
        );
        assert_eq!(
            c.next_after(at("2026-11-21T23:59:59.5Z")),
            Some(at("2026-11-22T00:00:00Z"))
        );
        // Strictly after: at midnight itself, the next one is a day later.
        assert_eq!(
            c.next_after(at("2026-11-22T00:00:00Z")),
            Some(at("2026-11-23T00:00:00Z"))
        );
    }

    #[test]
    fn steps_ranges_lists_and_weekdays() {
        let every15 = Cron::parse("*/15 * * * *").unwrap();
        assert_eq!(
            every15.next_after(at("2026-01-01T10:16:00Z")),
            Some(at("2026-01-01T10:30:00Z"))
        );
        let weekdays9 = Cron::parse("0 9 * * 1-5").unwrap();
        // 2026-11-21 is a Saturday: next is Monday the 23rd.
        assert_eq!(
            weekdays9.next_after(at("2026-11-21T10:00:00Z")),
            Some(at("2026-11-23T09:00:00Z"))
        );
        let sunday = Cron::parse("30 6 * * 7").unwrap();
        assert_eq!(
            sunday.next_after(at("2026-11-21T10:00:00Z")),
            Some(at("2026-11-22T06:30:00Z"))
        );
        let list = Cron::parse("5,10 0 1 1,7 *").unwrap();
        assert_eq!(
            list.next_after(at("2026-02-01T00:00:00Z")),
            Some(at("2026-07-01T00:05:00Z"))
        );
    }

    #[test]
    fn impossible_and_malformed_schedules() {
        assert_eq!(
            Cron::parse("0 0 30 2 *")
                .unwrap()
                .next_after(at("2026-01-01T00:00:00Z")),
            None
        );
        for bad in [
            "",
            "* * * *",
            "60 * * * *",
            "* 24 * * *",
            "*/0 * * * *",
            "a * * * *",
            "5-1 * * * *",
        ] {
            assert!(Cron::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
