//! Signature verification of webhook sources, delegated to
//! `mailroom-signatures` (every documented scheme, constant-time, several
//! secrets for rotation).

use super::IntakeError;
use crate::spec::SourceSpec;
use http::HeaderMap;

/// Verification comes first: a request that fails gets 401 and learns
/// nothing about stored events, not even whether its dedup key is known.
pub(crate) fn check(
    source: &SourceSpec,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), IntakeError> {
    match &source.verifier {
        None => Ok(()),
        Some(v) => v
            .verify(headers, body, jiff::Timestamp::now().as_second())
            .map_err(IntakeError::Unauthorized),
    }
}
