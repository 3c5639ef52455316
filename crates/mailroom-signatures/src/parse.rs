//! Small, allocation-free decoders for header fragments. Each one checks
//! the length before decoding, so an oversized value costs nothing.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::verifier::MAX_SIGNATURES;

/// An HMAC-SHA256 output.
pub(crate) type Mac32 = [u8; 32];

/// Hex length of a [`Mac32`].
const HEX_LEN: usize = 64;
/// Padded base64 length of a [`Mac32`].
const BASE64_LEN: usize = 44;
/// Decimal digits that always fit an `i64` (which holds 19).
const MAX_TIMESTAMP_DIGITS: usize = 18;

/// Up to [`MAX_SIGNATURES`] decoded signatures, kept on the stack.
pub(crate) struct Candidates {
    items: [Mac32; MAX_SIGNATURES],
    len: usize,
}

impl Candidates {
    pub(crate) fn new() -> Self {
        Self {
            items: [[0; 32]; MAX_SIGNATURES],
            len: 0,
        }
    }

    /// Adds `mac`; beyond capacity it is ignored, which bounds the work a
    /// sender can ask for.
    pub(crate) fn push(&mut self, mac: Mac32) {
        if let Some(slot) = self.items.get_mut(self.len) {
            *slot = mac;
            self.len += 1;
        }
    }

    pub(crate) fn as_slice(&self) -> &[Mac32] {
        self.items.get(..self.len).unwrap_or(&[])
    }
}

/// 64 hex digits (either case) to 32 bytes.
pub(crate) fn hex32(s: &[u8]) -> Option<Mac32> {
    if s.len() != HEX_LEN {
        return None;
    }
    let mut out = [0; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// 44 characters of padded standard base64 to 32 bytes.
pub(crate) fn base64_32(s: &[u8]) -> Option<Mac32> {
    if s.len() != BASE64_LEN {
        return None;
    }
    // One spare byte: the engine sizes its check from the encoded length.
    let mut buf = [0; 33];
    let n = STANDARD.decode_slice(s, &mut buf).ok()?;
    let mut out = [0; 32];
    out.copy_from_slice(buf.get(..n).filter(|b| b.len() == 32)?);
    Some(out)
}

/// A unix timestamp written as plain decimal digits, as every timestamped
/// scheme sends it. Signs, spaces and exponents are refused rather than
/// normalised because the signature covers the text exactly as sent.
pub(crate) fn timestamp(s: &[u8]) -> Result<i64, &'static str> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return Err("timestamp is not a decimal integer");
    }
    if s.len() > MAX_TIMESTAMP_DIGITS {
        return Err("timestamp is out of range");
    }
    Ok(s.iter()
        .fold(0_i64, |acc, d| acc * 10 + i64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoders refuse wrong lengths and bad alphabets instead of panicking.
    #[test]
    fn decoders_refuse_garbage() {
        assert!(hex32(&[b'a'; 63]).is_none());
        assert!(hex32(&[b'g'; 64]).is_none());
        assert!(hex32(&[b'A'; 64]).is_some());
        assert!(base64_32(&[b'A'; 43]).is_none());
        assert!(base64_32(&[b'!'; 44]).is_none());
        // 44 chars without padding decode to 33 bytes: not a MAC.
        assert!(base64_32(&[b'A'; 44]).is_none());
        assert!(base64_32(b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").is_some());
    }

    /// Timestamps accept only bounded plain digits.
    #[test]
    fn timestamps_are_plain_bounded_digits() {
        assert_eq!(timestamp(b"1614265330"), Ok(1_614_265_330));
        assert_eq!(
            timestamp(b"999999999999999999"),
            Ok(999_999_999_999_999_999)
        );
        assert!(timestamp(b"9999999999999999999").is_err());
        assert!(timestamp(b"").is_err());
        assert!(timestamp(b"-1").is_err());
        assert!(timestamp(b"+1").is_err());
        assert!(timestamp(b" 1").is_err());
        assert!(timestamp("１".as_bytes()).is_err());
    }
}
