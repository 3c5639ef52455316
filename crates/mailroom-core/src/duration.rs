//! Human durations as written in `mailroom.toml` and on the command line:
//! an integer followed by one unit, `ms`, `s`, `m`, `h` or `d`
//! (`"100ms"`, `"2s"`, `"5m"`, `"1h"`, `"7d"`). Fractions such as `"1.5s"`
//! are accepted too. Nothing else is: a typo is an error, never a default.

use std::time::Duration;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected a number and a unit (ms, s, m, h, d), e.g. \"2s\" or \"7d\""
)]
pub struct ParseDurationError {
    /// The text that was refused.
    pub input: String,
}

/// Parses `"100ms"`, `"2s"`, `"5m"`, `"1h"`, `"7d"` (and fractions like `"1.5s"`).
pub fn parse(input: &str) -> Result<Duration, ParseDurationError> {
    let err = || ParseDurationError {
        input: input.to_owned(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(err)?;
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(err());
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let unit_secs = match unit.trim() {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return Err(err()),
    };
    let secs = value * unit_secs;
    if !secs.is_finite() || !(0.0..=100.0 * 365.0 * 86400.0).contains(&secs) {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Formats a duration back into the shortest exact form `parse` accepts.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    const UNITS: [(u128, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    for (size, unit) in UNITS {
        if ms >= size && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// `serde(with = "mailroom_core::duration::serde_str")` for `Duration` fields.
pub mod serde_str {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::time::Duration;

    /// Serializes as `"2s"`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*d))
    }

    /// Deserializes from `"2s"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse(&text).map_err(D::Error::custom)
    }
}

/// Same as [`serde_str`] for `Option<Duration>` fields.
pub mod serde_opt {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};
    use std::time::Duration;

    /// Serializes as `"2s"` or nothing.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&super::format(*d)),
            None => s.serialize_none(),
        }
    }

    /// Deserializes from `"2s"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| super::parse(&t).map_err(D::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_documented_unit() {
        assert_eq!(parse("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for bad in ["", "s", "10", "10x", "-1s", "1.2.3s", "ms5", "1e400s"] {
            assert!(parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn format_round_trips() {
        for text in ["100ms", "2s", "5m", "1h", "7d", "1500ms"] {
            assert_eq!(format(parse(text).unwrap_or_default()), text);
        }
    }
}
