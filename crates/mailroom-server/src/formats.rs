//! The formats of request fields as `/openapi.json` states them and as the
//! server checks them, each from one definition, so that what the document
//! allows is exactly what the server accepts:
//!
//! - durations ([`DurationFormat`]): [`LEASE`] (`lease`, `retry_in` of the
//!   pull routes, 1ms to 1h) and [`DELAY`] (`delay` of `POST /v1/events`, up
//!   to 36500d). A number without leading zeros, at most three decimals,
//!   then one unit; the document's `pattern` is generated from the same
//!   bounds [`DurationFormat::parse`] checks;
//! - event ids ([`event_id`]): the hyphenated UUID form (`format: uuid`);
//! - the `Idempotency-Key` header ([`IDEMPOTENCY_KEY_PATTERN`]).
//!
//! Integer fields also take a JSON number with a zero fraction (`5.0`), as
//! JSON Schema's `integer` does ([`integer`], [`optional_integer`]).

use mailroom::EventId;
use serde::{Deserialize, Deserializer, de::Error};
use std::time::Duration;

/// A duration written as text: `<number><unit>`, the number without leading
/// zeros and with at most three decimals (`"250ms"`, `"1.5s"`, `"5m"`).
#[derive(Debug, Clone, Copy)]
pub struct DurationFormat {
    /// The units accepted, each with its length in milliseconds.
    units: &'static [(&'static str, u64)],
    /// The shortest duration accepted: zero, or one millisecond.
    positive: bool,
    /// The longest duration accepted, in milliseconds.
    max_ms: u64,
}

/// `lease` and `retry_in`: from 1ms to 1h, in `ms`, `s`, `m` or `h`.
pub const LEASE: DurationFormat = DurationFormat {
    units: &[("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)],
    positive: true,
    max_ms: 3_600_000,
};

/// `delay`: from 0 to 36500d, in `ms`, `s`, `m`, `h` or `d`.
pub const DELAY: DurationFormat = DurationFormat {
    units: &[
        ("ms", 1),
        ("s", 1_000),
        ("m", 60_000),
        ("h", 3_600_000),
        ("d", 86_400_000),
    ],
    positive: false,
    max_ms: 36_500 * 86_400_000,
};

/// Why a duration was refused: the text names the format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DurationError(String);

/// The decimals a duration may have.
const MAX_DECIMALS: usize = 3;
/// A fraction of one to three digits, not all zero.
const NONZERO_FRACTION: &str = r"\.(?:[1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9])";

impl DurationFormat {
    /// The shortest and longest durations, for messages and descriptions.
    pub fn bounds(&self) -> (&'static str, String) {
        let min = if self.positive { "1ms" } else { "0" };
        (min, mailroom::duration::format(self.max()))
    }

    fn max(&self) -> Duration {
        Duration::from_millis(self.max_ms)
    }

    /// The unit names, as a list for messages.
    fn unit_names(&self) -> String {
        self.units
            .iter()
            .map(|(u, _)| *u)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Parses `text`; anything the [`pattern`](Self::pattern) does not match
    /// is an error naming the format.
    pub fn parse(&self, text: &str) -> Result<Duration, DurationError> {
        let (min, max) = self.bounds();
        let err = || {
            DurationError(format!(
                "invalid duration {text:?}: expected a number (at most {MAX_DECIMALS} decimals, no leading zeros) and one unit ({}), from {min} to {max}, e.g. \"500ms\", \"1.5s\" or \"5m\"",
                self.unit_names()
            ))
        };
        let digits_end = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (int, rest) = text.split_at(digits_end);
        if int.is_empty() || (int.len() > 1 && int.starts_with('0')) {
            return Err(err());
        }
        let (frac, unit) = match rest.strip_prefix('.') {
            Some(r) => {
                let end = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
                if end == 0 || end > MAX_DECIMALS {
                    return Err(err());
                }
                r.split_at(end)
            }
            None => ("", rest),
        };
        let &(_, unit_ms) = self
            .units
            .iter()
            .find(|(u, _)| *u == unit)
            .ok_or_else(err)?;
        let int: u64 = int.parse().map_err(|_| err())?;
        // Thousandths of the unit, then microseconds: exact, no float.
        let frac: u64 = format!("{frac:0<3}").parse().map_err(|_| err())?;
        let micros = int
            .checked_mul(1000)
            .and_then(|t| t.checked_add(frac))
            .and_then(|t| t.checked_mul(unit_ms))
            .ok_or_else(err)?;
        let min_micros = if self.positive { 1000 } else { 0 };
        if micros < min_micros || micros > self.max_ms.saturating_mul(1000) {
            return Err(err());
        }
        Ok(Duration::from_micros(micros))
    }

    /// The ECMA-262 regular expression of exactly what [`parse`](Self::parse)
    /// accepts: per unit, the numbers below its maximum with any fraction,
    /// and the maximum itself with a zero fraction.
    pub fn pattern(&self) -> String {
        let per_unit: Vec<String> = self
            .units
            .iter()
            .map(|&(unit, unit_ms)| {
                let max = self.max_ms / unit_ms;
                let mut alts = below(max);
                if !self.positive {
                    alts.insert(0, "0".into());
                }
                let mut branches = Vec::new();
                if !alts.is_empty() {
                    branches.push(format!(r"(?:{})(?:\.[0-9]{{1,3}})?", alts.join("|")));
                }
                if self.positive && unit_ms >= 1000 {
                    // Below one unit: a zero integer part needs a fraction that
                    // is not all zeros (the smallest, 0.001 of a second, is 1ms).
                    branches.push(format!("0{NONZERO_FRACTION}"));
                }
                if max > 0 {
                    branches.push(format!(r"{max}(?:\.0{{1,3}})?"));
                }
                format!("(?:{}){unit}", branches.join("|"))
            })
            .collect();
        format!("^(?:{})$", per_unit.join("|"))
    }

    /// The document's description of the format.
    pub fn describe(&self) -> String {
        let (min, max) = self.bounds();
        format!(
            "A duration from {min} to {max}: a number without leading zeros, with at most {MAX_DECIMALS} decimals, and one unit ({}), e.g. `\"500ms\"`, `\"1.5s\"`, `\"5m\"`.",
            self.unit_names()
        )
    }
}

/// Alternatives matching the integers from 1 up to `max - 1`, written
/// without leading zeros (0 is the caller's).
fn below(max: u64) -> Vec<String> {
    let digits: Vec<u8> = max.to_string().bytes().map(|b| b - b'0').collect();
    let n = digits.len();
    let mut alts = Vec::new();
    // Fewer digits than `max`.
    match n {
        0 | 1 => {}
        2 => alts.push("[1-9]".into()),
        _ => alts.push(format!("[1-9][0-9]{{0,{}}}", n - 2)),
    }
    // As many digits, smaller at the first place they differ.
    for i in 0..n {
        let lowest = u8::from(i == 0);
        let d = digits[i];
        if d > lowest {
            let prefix: String = digits[..i].iter().map(|d| char::from(b'0' + d)).collect();
            let class = if d - 1 == lowest {
                format!("{lowest}")
            } else {
                format!("[{lowest}-{}]", d - 1)
            };
            let rest = n - i - 1;
            let tail = match rest {
                0 => String::new(),
                1 => "[0-9]".into(),
                r => format!("[0-9]{{{r}}}"),
            };
            alts.push(format!("{prefix}{class}{tail}"));
        }
    }
    alts
}

/// An event id as the document states it: the hyphenated UUID form
/// (`format: uuid`). Anything else names no event.
pub fn event_id(text: &str) -> Result<EventId, mailroom::ParseEventIdError> {
    let hyphenated = text.len() == 36
        && text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
    if hyphenated {
        text.parse()
    } else {
        Err(mailroom::ParseEventIdError {
            text: text.chars().take(64).collect(),
        })
    }
}

/// The `Idempotency-Key` header: visible ASCII, spaces allowed inside, 1 to
/// 512 characters (the quotes of the draft's sf-string form count).
pub const IDEMPOTENCY_KEY_PATTERN: &str = "^[!-~](?:[ -~]{0,510}[!-~])?$";

/// Whether `key` matches [`IDEMPOTENCY_KEY_PATTERN`].
pub fn is_idempotency_key(key: &str) -> bool {
    let b = key.as_bytes();
    let visible = |c: &u8| (b'!'..=b'~').contains(c);
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            b.len() <= 512
                && visible(first)
                && visible(last)
                && b.iter().all(|c| (b' '..=b'~').contains(c))
        }
        _ => false,
    }
}

/// An integer field: a JSON integer, or a number with a zero fraction
/// (`5.0`), which JSON Schema's `integer` includes, within `T`'s range.
pub fn integer<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    let n = serde_json::Number::deserialize(d)?;
    number_to::<T, D::Error>(&n)
}

/// [`integer`] for an optional field (`null` or absent is `None`).
pub fn optional_integer<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    Option::<serde_json::Number>::deserialize(d)?
        .map(|n| number_to::<T, D::Error>(&n))
        .transpose()
}

fn number_to<T: TryFrom<i64> + TryFrom<u64>, E: Error>(n: &serde_json::Number) -> Result<T, E> {
    let out_of_range = || E::custom(format!("{n} is not an integer in range"));
    if let Some(u) = n.as_u64() {
        return T::try_from(u).map_err(|_| out_of_range());
    }
    if let Some(i) = n.as_i64() {
        return T::try_from(i).map_err(|_| out_of_range());
    }
    match n.as_f64() {
        // Exactly representable integers only: |x| < 2^53.
        Some(f) if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 => {
            if f >= 0.0 {
                T::try_from(f as u64).map_err(|_| out_of_range())
            } else {
                T::try_from(f as i64).map_err(|_| out_of_range())
            }
        }
        _ => Err(out_of_range()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease the document allows is accepted as the duration it says,
    /// the smallest and largest included.
    #[test]
    fn leases_the_document_allows_are_accepted() {
        for (text, ms) in [
            ("1ms", 1),
            ("250ms", 250),
            ("2.5ms", 2),
            ("3600000ms", 3_600_000),
            ("0.001s", 1),
            ("1.5s", 1500),
            ("30s", 30_000),
            ("3600s", 3_600_000),
            ("3600.000s", 3_600_000),
            ("0.5m", 30_000),
            ("59.999m", 3_599_940),
            ("60m", 3_600_000),
            ("0.001h", 3_600),
            ("1h", 3_600_000),
            ("1.0h", 3_600_000),
        ] {
            assert_eq!(
                LEASE.parse(text).map(|d| d.as_millis()),
                Ok(ms),
                "{text} should be {ms} ms"
            );
        }
        assert_eq!(LEASE.parse("1.5ms"), Ok(Duration::from_micros(1500)));
    }

    /// A lease outside 1ms..1h, or written other than the pattern says, is
    /// refused with a message naming the format.
    #[test]
    fn leases_the_document_does_not_allow_are_refused() {
        for text in [
            "",
            "0ms",
            "0s",
            "0.000s",
            "0.0001s",
            "3600001ms",
            "3600.001s",
            "60.001m",
            "1.001h",
            "2h",
            "1d",
            "01s",
            " 1s",
            "1s ",
            "1 s",
            "1.s",
            ".5s",
            "0.5ms",
            "1e3ms",
            "-1s",
            "1S",
            "1.2345s",
            "99999999999999999999s",
        ] {
            let e = LEASE.parse(text).expect_err(text);
            assert!(e.0.contains("from 1ms to 1h"), "{text}: {e}");
        }
    }

    /// A delay may be zero and up to 36500 days, in days too.
    #[test]
    fn delays_from_zero_to_36500_days_are_accepted() {
        assert_eq!(DELAY.parse("0s"), Ok(Duration::ZERO));
        assert_eq!(DELAY.parse("0.5ms"), Ok(Duration::from_micros(500)));
        assert_eq!(DELAY.parse("3d"), Ok(Duration::from_secs(3 * 86_400)));
        assert_eq!(
            DELAY.parse("36500d"),
            Ok(Duration::from_secs(36_500 * 86_400))
        );
        assert!(DELAY.parse("36500.001d").is_err());
        assert!(DELAY.parse("36501d").is_err());
    }

    /// The generated pattern has the expected shape for a small bound (the
    /// agreement with `parse` on many strings is checked against Python's
    /// regular expressions in the openapi integration test).
    #[test]
    fn the_lease_pattern_bounds_each_unit() {
        let p = LEASE.pattern();
        assert!(p.starts_with("^(?:") && p.ends_with(")$"), "{p}");
        assert!(p.contains(r"3600000(?:\.0{1,3})?)ms"), "{p}");
        assert!(p.contains(r"1(?:\.0{1,3})?)h"), "{p}");
        assert!(!p.contains('d'), "{p}");
    }

    /// Integers below a bound, without leading zeros.
    #[test]
    fn below_lists_the_smaller_integers() {
        assert_eq!(below(1), Vec::<String>::new());
        assert_eq!(below(20), ["[1-9]", "1[0-9]"]);
        assert_eq!(below(60), ["[1-9]", "[1-5][0-9]"]);
        assert_eq!(
            below(3_600_000),
            ["[1-9][0-9]{0,5}", "[1-2][0-9]{6}", "3[0-5][0-9]{5}"]
        );
    }

    /// Ids are the hyphenated UUID form only.
    #[test]
    fn event_ids_are_hyphenated_uuids() {
        let id = EventId::new().to_string();
        assert!(event_id(&id).is_ok());
        assert!(event_id(&id.replace('-', "")).is_err());
        assert!(event_id(&format!("urn:uuid:{id}")).is_err());
        assert!(event_id(&format!("{{{id}}}")).is_err());
        assert!(event_id("").is_err());
    }

    /// Keys are visible ASCII with inner spaces, 1 to 512 characters.
    #[test]
    fn idempotency_keys_are_visible_ascii() {
        assert!(is_idempotency_key("order-1"));
        assert!(is_idempotency_key("\"quoted key\""));
        assert!(is_idempotency_key(&"k".repeat(512)));
        for bad in ["", " a", "a ", "é", "a\tb", &"k".repeat(513)] {
            assert!(!is_idempotency_key(bad), "{bad:?}");
        }
    }

    #[derive(Debug, Deserialize)]
    struct Token {
        #[serde(deserialize_with = "integer")]
        token: u32,
        #[serde(default, deserialize_with = "optional_integer")]
        max: Option<u32>,
    }

    /// `5.0` is the integer 5, as JSON Schema's `integer` says; `5.5`, a
    /// negative or an out-of-range number is refused.
    #[test]
    fn integral_numbers_are_integers() {
        let t: Token = serde_json::from_str(r#"{"token": 856.0, "max": 2}"#).expect("integral");
        assert_eq!((t.token, t.max), (856, Some(2)));
        let t: Token = serde_json::from_str(r#"{"token": 7, "max": null}"#).expect("null");
        assert_eq!((t.token, t.max), (7, None));
        for bad in [
            r#"{"token": 5.5}"#,
            r#"{"token": -1}"#,
            r#"{"token": 4294967296}"#,
            r#"{"token": 1e300}"#,
            r#"{"token": "5"}"#,
        ] {
            assert!(serde_json::from_str::<Token>(bad).is_err(), "{bad}");
        }
    }
}
