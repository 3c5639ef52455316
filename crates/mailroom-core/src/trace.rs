//! W3C Trace Context `traceparent` (<https://www.w3.org/TR/trace-context/#traceparent-header>):
//! `version-traceid-parentid-flags`, e.g.
//! `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`.
//!
//! mailroom stores the one received with an event (a malformed one is
//! ignored, as the recommendation says, never an error) and sends a child
//! of it with every handler call: same trace id and flags, a new parent
//! (span) id per attempt, so a trace crosses the inbox.

use std::fmt;

/// A valid W3C `traceparent` (version, trace id, parent span id, flags),
/// parsed from what an event arrived with; [`TraceParent::child`] makes the
/// one a handler call sends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: [u8; 32],
    parent_id: [u8; 16],
    flags: [u8; 2],
}

/// Length of a version-00 `traceparent`, and of the part of a later
/// version's that this version understands.
const LEN: usize = 55;

fn hex(field: &[u8]) -> bool {
    field
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

impl TraceParent {
    /// Parses a received header. `None` when malformed: wrong length or
    /// separators, upper-case or non-hex digits, version `ff`, an all-zero
    /// trace or parent id, or a version-00 value with trailing data. A later
    /// version is read by its first 55 characters, as the spec says.
    pub fn parse(value: &str) -> Option<Self> {
        let b = value.trim().as_bytes();
        if b.len() < LEN || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let (version, trace, parent, flags) = (&b[0..2], &b[3..35], &b[36..52], &b[53..55]);
        if !(hex(version) && hex(trace) && hex(parent) && hex(flags)) || version == b"ff" {
            return None;
        }
        if (version == b"00" && b.len() != LEN) || (b.len() > LEN && b[LEN] != b'-') {
            return None;
        }
        if trace.iter().all(|c| *c == b'0') || parent.iter().all(|c| *c == b'0') {
            return None;
        }
        Some(Self {
            trace_id: trace.try_into().ok()?,
            parent_id: parent.try_into().ok()?,
            flags: flags.try_into().ok()?,
        })
    }

    /// The trace id, 32 lower-case hex digits.
    pub fn trace_id(&self) -> &str {
        std::str::from_utf8(&self.trace_id).unwrap_or_default()
    }

    /// The parent (span) id, 16 lower-case hex digits.
    pub fn parent_id(&self) -> &str {
        std::str::from_utf8(&self.parent_id).unwrap_or_default()
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        std::str::from_utf8(&self.flags)
            .ok()
            .and_then(|f| u8::from_str_radix(f, 16).ok())
            .unwrap_or(0)
    }

    /// A child: the same trace and flags under span `span_id` (an all-zero
    /// id is invalid, so it is replaced by 1).
    pub fn child(&self, span_id: u64) -> Self {
        let span = format!("{:016x}", span_id.max(1));
        let mut parent_id = [0u8; 16];
        parent_id.copy_from_slice(span.as_bytes());
        Self { parent_id, ..*self }
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        write!(
            f,
            "00-{}-{}-{}",
            s(&self.trace_id),
            s(&self.parent_id),
            s(&self.flags)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// The spec's example parses and prints back; a child keeps the trace
    /// id and flags and changes the parent id.
    #[test]
    fn parses_and_makes_children() {
        let t = TraceParent::parse(GOOD).expect("valid");
        assert_eq!(t.to_string(), GOOD);
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.flags(), 1);
        let c = t.child(0xabc);
        assert_eq!(
            c.to_string(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000abc-01"
        );
        assert_eq!(t.child(0).parent_id(), "0000000000000001");
        // A later version: its first 55 characters, printed as version 00.
        let later = format!("cc{}-what-comes-next", &GOOD[2..]);
        assert_eq!(TraceParent::parse(&later).expect("later").to_string(), GOOD);
    }

    /// Malformed values are refused, never half-read.
    #[test]
    fn refuses_malformed_values() {
        let zeros_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let zeros_parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        for bad in [
            "",
            "garbage",
            &GOOD[..54],
            &format!("{GOOD}-extra"),
            &GOOD.to_uppercase(),
            &GOOD.replace('-', "_"),
            &format!("ff{}", &GOOD[2..]),
            &format!("cc{}x", &GOOD[2..]),
            zeros_trace,
            zeros_parent,
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }
}
