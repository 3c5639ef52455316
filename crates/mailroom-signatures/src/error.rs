//! Errors: why a request was refused, why a configuration was rejected.
//!
//! Messages are safe to log and to show to the sender (webhook intake
//! answers a failed verification with 401 problem+json): they name the
//! scheme, the header and the reason class, never a secret, a token or the
//! signature mailroom expected.

use http::HeaderName;

/// Why [`Verifier::verify`](crate::Verifier::verify) refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// A header the scheme needs is absent. For `standard-webhooks` this
    /// means neither the `webhook-*` nor the `svix-*` spelling was sent;
    /// the error names the `webhook-*` one.
    #[error("{scheme} verification failed: missing header `{header}`")]
    MissingHeader {
        /// The scheme's name (see [`Scheme::name`](crate::Scheme::name)).
        scheme: &'static str,
        /// The header that was expected.
        header: HeaderName,
    },
    /// A header is present but does not have the scheme's shape (bad
    /// encoding, wrong length, a timestamp that is not a decimal integer,
    /// no entry of the expected version).
    #[error("{scheme} verification failed: malformed `{header}` header: {problem}")]
    BadFormat {
        /// The scheme's name.
        scheme: &'static str,
        /// The malformed header.
        header: HeaderName,
        /// What is wrong with it, in a fixed phrase (never the value).
        problem: &'static str,
    },
    /// The signed timestamp is older than now minus the tolerance: a
    /// replay, or a sender whose clock is behind.
    #[error(
        "{scheme} verification failed: timestamp is {age_secs}s old, beyond the {tolerance_secs}s tolerance"
    )]
    StaleTimestamp {
        /// The scheme's name.
        scheme: &'static str,
        /// How far the timestamp is behind now, in seconds (saturating).
        age_secs: u64,
        /// The configured tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The signed timestamp is later than now plus the tolerance: a sender
    /// whose clock is ahead, or a request forged to outlive the window.
    #[error(
        "{scheme} verification failed: timestamp is {ahead_secs}s in the future, beyond the {tolerance_secs}s tolerance"
    )]
    FutureTimestamp {
        /// The scheme's name.
        scheme: &'static str,
        /// How far the timestamp is ahead of now, in seconds (saturating).
        ahead_secs: u64,
        /// The configured tolerance, in seconds.
        tolerance_secs: u64,
    },
    /// The request is well formed but no signature (or token) matches any
    /// configured secret: a wrong or rotated-out secret, or a changed body.
    #[error("{scheme} verification failed: no signature matches a configured secret")]
    NoMatch {
        /// The scheme's name.
        scheme: &'static str,
    },
}

impl VerifyError {
    /// The reason class as a stable snake_case token, for a metric label
    /// (bounded cardinality) or a problem+json `type` suffix:
    /// `missing_header`, `bad_format`, `stale_timestamp`,
    /// `future_timestamp`, `no_match`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingHeader { .. } => "missing_header",
            Self::BadFormat { .. } => "bad_format",
            Self::StaleTimestamp { .. } => "stale_timestamp",
            Self::FutureTimestamp { .. } => "future_timestamp",
            Self::NoMatch { .. } => "no_match",
        }
    }

    /// The name of the scheme that refused the request.
    pub fn scheme(&self) -> &'static str {
        match self {
            Self::MissingHeader { scheme, .. }
            | Self::BadFormat { scheme, .. }
            | Self::StaleTimestamp { scheme, .. }
            | Self::FutureTimestamp { scheme, .. }
            | Self::NoMatch { scheme } => scheme,
        }
    }
}

/// Why [`Verifier::new`](crate::Verifier::new) rejected a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No secret was given; a verifier needs at least one.
    #[error("{scheme}: at least one secret is required")]
    NoSecrets {
        /// The scheme's name.
        scheme: &'static str,
    },
    /// A secret is the empty string, which would let anyone sign.
    #[error("{scheme}: secrets[{index}] is empty")]
    EmptySecret {
        /// The scheme's name.
        scheme: &'static str,
        /// Position of the secret in the list, from 0.
        index: usize,
    },
    /// A secret cannot be decoded into a key (for `standard-webhooks`: it
    /// is not base64 after the optional `whsec_` prefix, or decodes to
    /// nothing).
    #[error("{scheme}: secrets[{index}] is invalid: {problem}")]
    InvalidSecret {
        /// The scheme's name.
        scheme: &'static str,
        /// Position of the secret in the list, from 0.
        index: usize,
        /// What is wrong with it, in a fixed phrase (never the secret).
        problem: &'static str,
    },
    /// The configured header name (`token`, `hmac`) is not a valid HTTP
    /// header name.
    #[error("{scheme}: `{header}` is not a valid header name")]
    InvalidHeaderName {
        /// The scheme's name.
        scheme: &'static str,
        /// The header name as configured.
        header: String,
    },
}

/// A name that is not one of the known presets or encodings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}`; expected one of: {expected}")]
pub struct UnknownName {
    /// What was being parsed: `preset` or `encoding`.
    pub what: &'static str,
    /// The name given.
    pub name: String,
    /// The accepted names, comma-separated.
    pub expected: &'static str,
}
