//! [`Verifier`]: one scheme, its secrets, its tolerance.

use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::error::{ConfigError, VerifyError};
use crate::parse::{self, Candidates, Mac32};
use crate::scheme::{Encoding, Scheme};

type HmacSha256 = Hmac<Sha256>;

/// The tolerance every timestamped scheme's own reference library uses
/// (Standard Webhooks, Stripe and Slack all say five minutes).
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// How many candidate signatures of one list header (`webhook-signature`,
/// `Stripe-Signature`) are checked; later ones are ignored. Senders list one
/// per active secret, so a handful is plenty, and the cap keeps a hostile
/// header from buying unbounded comparisons.
pub const MAX_SIGNATURES: usize = 16;

// Statics rather than consts: `HeaderName` has interior mutability (it may
// hold `Bytes`), and `from_static` still runs at compile time here.
static WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
static WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
static WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
static SVIX_ID: HeaderName = HeaderName::from_static("svix-id");
static SVIX_TIMESTAMP: HeaderName = HeaderName::from_static("svix-timestamp");
static SVIX_SIGNATURE: HeaderName = HeaderName::from_static("svix-signature");
static STRIPE_SIGNATURE: HeaderName = HeaderName::from_static("stripe-signature");
static GITHUB_SIGNATURE: HeaderName = HeaderName::from_static("x-hub-signature-256");
static SHOPIFY_HMAC: HeaderName = HeaderName::from_static("x-shopify-hmac-sha256");
static SLACK_TIMESTAMP: HeaderName = HeaderName::from_static("x-slack-request-timestamp");
static SLACK_SIGNATURE: HeaderName = HeaderName::from_static("x-slack-signature");

/// Checks requests of one webhook source against one [`Scheme`] and one or
/// more secrets.
///
/// Several secrets are accepted at once so a secret can be rotated without
/// downtime: configure old and new, switch the sender, drop the old. A
/// request is accepted when any signature it carries matches any secret.
///
/// Built once per source at start-up; [`verify`](Self::verify) takes
/// `&self` and is cheap to share across requests (`Verifier` is `Send +
/// Sync`). Its `Debug` output shows the number of secrets, not the secrets.
#[derive(Clone)]
pub struct Verifier {
    scheme: Scheme,
    check: Check,
    /// Keyed HMAC states, one per secret, cloned per request so the key
    /// schedule is computed once. Empty for the `token` scheme.
    macs: Vec<HmacSha256>,
    tolerance: Duration,
}

/// The scheme with its header names parsed, ready to run.
#[derive(Clone)]
enum Check {
    StandardWebhooks,
    Stripe,
    GitHub,
    Shopify,
    Slack,
    Token {
        header: HeaderName,
        /// SHA-256 of each secret token. Comparing digests keeps the
        /// comparison constant-time even in the token's length.
        digests: Vec<Mac32>,
    },
    Hmac {
        header: HeaderName,
        prefix: Vec<u8>,
        encoding: Encoding,
    },
}

impl Check {
    /// Parses the scheme's header names; a token scheme keeps the digests
    /// of its secrets.
    fn new(scheme: &Scheme, secrets: &[&str]) -> Result<Self, ConfigError> {
        let header = |h: &str| {
            HeaderName::from_bytes(h.as_bytes()).map_err(|_| ConfigError::InvalidHeaderName {
                scheme: scheme.name(),
                header: h.to_owned(),
            })
        };
        Ok(match scheme {
            Scheme::StandardWebhooks => Check::StandardWebhooks,
            Scheme::Stripe => Check::Stripe,
            Scheme::GitHub => Check::GitHub,
            Scheme::Shopify => Check::Shopify,
            Scheme::Slack => Check::Slack,
            Scheme::Token { header: h } => Check::Token {
                header: header(h)?,
                digests: secrets
                    .iter()
                    .map(|s| Sha256::digest(s.as_bytes()).into())
                    .collect(),
            },
            Scheme::Hmac {
                header: h,
                prefix,
                encoding,
            } => Check::Hmac {
                header: header(h)?,
                prefix: prefix.as_deref().unwrap_or_default().as_bytes().to_vec(),
                encoding: *encoding,
            },
        })
    }
}

/// One keyed HMAC state per secret, decoded as `scheme` says.
fn hmac_keys(scheme: &Scheme, secrets: &[&str]) -> Result<Vec<HmacSha256>, ConfigError> {
    let invalid = |index, problem| ConfigError::InvalidSecret {
        scheme: scheme.name(),
        index,
        problem,
    };
    let mut macs = Vec::with_capacity(secrets.len());
    for (index, secret) in secrets.iter().enumerate() {
        let key = key_bytes(scheme, secret).ok_or_else(|| {
            invalid(
                index,
                "not valid base64 after the optional `whsec_` prefix, or empty",
            )
        })?;
        // HMAC accepts keys of any length; the error arm is unreachable
        // but is mapped rather than unwrapped.
        let mac = HmacSha256::new_from_slice(&key)
            .map_err(|_| invalid(index, "unusable as an HMAC-SHA256 key"))?;
        macs.push(mac);
    }
    Ok(macs)
}

impl Verifier {
    /// Builds a verifier for `scheme` that accepts a signature made with any
    /// of `secrets`.
    ///
    /// Secrets are decoded here, once: for `standard-webhooks` the part after
    /// an optional `whsec_` prefix must be base64 (standard alphabet), as the
    /// [Standard Webhooks spec](https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#signature-scheme)
    /// says; every other scheme uses the secret's bytes as given (Stripe's
    /// key is the whole `whsec_…` string). `tolerance` bounds how far a
    /// signed timestamp may be from "now", either way; non-timestamped
    /// schemes ignore it. [`DEFAULT_TOLERANCE`] is five minutes.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when no secret is given, a secret is empty or cannot
    /// be decoded, or a configured header name is invalid.
    pub fn new<I>(scheme: Scheme, secrets: I, tolerance: Duration) -> Result<Self, ConfigError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let name = scheme.name();
        let secrets: Vec<I::Item> = secrets.into_iter().collect();
        let secrets: Vec<&str> = secrets.iter().map(AsRef::as_ref).collect();
        if secrets.is_empty() {
            return Err(ConfigError::NoSecrets { scheme: name });
        }
        if let Some(index) = secrets.iter().position(|s| s.is_empty()) {
            return Err(ConfigError::EmptySecret {
                scheme: name,
                index,
            });
        }
        let check = Check::new(&scheme, &secrets)?;
        let macs = if matches!(check, Check::Token { .. }) {
            Vec::new()
        } else {
            hmac_keys(&scheme, &secrets)?
        };
        Ok(Self {
            scheme,
            check,
            macs,
            tolerance,
        })
    }

    /// The scheme this verifier checks.
    pub fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// The timestamp tolerance (ignored by non-timestamped schemes).
    pub fn tolerance(&self) -> Duration {
        self.tolerance
    }

    /// Checks one request: its headers and its **raw** body bytes, exactly
    /// as received (before any JSON parsing or re-encoding). `now_unix` is
    /// the current time in unix seconds; timestamped schemes refuse a
    /// timestamp more than the tolerance away from it, in either direction.
    ///
    /// Header names are matched case-insensitively; when a header is sent
    /// more than once, only its first value counts.
    ///
    /// # Errors
    ///
    /// [`VerifyError`], whose [`reason`](VerifyError::reason) is the class:
    /// missing header, bad format, stale or future timestamp, no match.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_unix: i64,
    ) -> Result<(), VerifyError> {
        match &self.check {
            Check::StandardWebhooks => self.standard_webhooks(headers, body, now_unix),
            Check::Stripe => self.stripe(headers, body, now_unix),
            Check::GitHub => self.github(headers, body),
            Check::Shopify => self.shopify(headers, body),
            Check::Slack => self.slack(headers, body, now_unix),
            Check::Token { header, digests } => self.token(headers, header, digests),
            Check::Hmac {
                header,
                prefix,
                encoding,
            } => self.hmac(headers, body, header, prefix, *encoding),
        }
    }

    /// GitHub: `sha256=<hex>` of the body.
    fn github(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), VerifyError> {
        let value = self.header(headers, &GITHUB_SIGNATURE)?;
        let sig = value
            .strip_prefix(b"sha256=")
            .ok_or_else(|| self.bad(&GITHUB_SIGNATURE, "expected `sha256=<hex>`"))?;
        let sig = parse::hex32(sig)
            .ok_or_else(|| self.bad(&GITHUB_SIGNATURE, "signature is not 64 hex digits"))?;
        self.matches(&[body], &[sig])
    }

    /// Shopify: bare base64 of the body's MAC.
    fn shopify(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), VerifyError> {
        let value = self.header(headers, &SHOPIFY_HMAC)?;
        let sig = parse::base64_32(value)
            .ok_or_else(|| self.bad(&SHOPIFY_HMAC, "signature is not 32 bytes of padded base64"))?;
        self.matches(&[body], &[sig])
    }

    /// Slack: `v0=<hex>` of `v0:{ts}:{body}`, the timestamp checked first.
    fn slack(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let ts = self.header(headers, &SLACK_TIMESTAMP)?;
        self.check_timestamp(&SLACK_TIMESTAMP, ts, now)?;
        let value = self.header(headers, &SLACK_SIGNATURE)?;
        let sig = value
            .strip_prefix(b"v0=")
            .ok_or_else(|| self.bad(&SLACK_SIGNATURE, "expected `v0=<hex>`"))?;
        let sig = parse::hex32(sig)
            .ok_or_else(|| self.bad(&SLACK_SIGNATURE, "signature is not 64 hex digits"))?;
        self.matches(&[b"v0:", ts, b":", body], &[sig])
    }

    /// A shared token: its digest against every secret's, in constant time.
    fn token(
        &self,
        headers: &HeaderMap,
        header: &HeaderName,
        digests: &[Mac32],
    ) -> Result<(), VerifyError> {
        let value = self.header(headers, header)?;
        let presented: Mac32 = Sha256::digest(value).into();
        let mut found = Choice::from(0);
        for digest in digests {
            found |= digest.ct_eq(&presented);
        }
        if bool::from(found) {
            Ok(())
        } else {
            Err(self.no_match())
        }
    }

    /// The generic HMAC of the body, after the configured prefix.
    fn hmac(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        header: &HeaderName,
        prefix: &[u8],
        encoding: Encoding,
    ) -> Result<(), VerifyError> {
        let value = self.header(headers, header)?;
        let sig = value
            .strip_prefix(prefix)
            .ok_or_else(|| self.bad(header, "does not start with the configured prefix"))?;
        let sig = match encoding {
            Encoding::Hex => parse::hex32(sig)
                .ok_or_else(|| self.bad(header, "signature is not 64 hex digits"))?,
            Encoding::Base64 => parse::base64_32(sig)
                .ok_or_else(|| self.bad(header, "signature is not 32 bytes of padded base64"))?,
        };
        self.matches(&[body], &[sig])
    }

    /// [Standard Webhooks](https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md#verifying-webhook-authenticity):
    /// `{id}.{timestamp}.{body}`, signature list `v1,<b64> v1,<b64> …`.
    /// Entries of other versions (e.g. the asymmetric `v1a`) and undecodable
    /// ones are skipped, as the reference libraries do, so a sender may list
    /// signatures for secrets this side does not have.
    fn standard_webhooks(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        // Svix sends the same headers with a `svix-` prefix; each is looked
        // up under either spelling, like the reference libraries do.
        let either = |primary: &HeaderName, alias: &HeaderName| {
            headers
                .get(primary)
                .or_else(|| headers.get(alias))
                .map(HeaderValue::as_bytes)
                .ok_or_else(|| self.missing(primary))
        };
        let id = either(&WEBHOOK_ID, &SVIX_ID)?;
        let ts = either(&WEBHOOK_TIMESTAMP, &SVIX_TIMESTAMP)?;
        self.check_timestamp(&WEBHOOK_TIMESTAMP, ts, now)?;
        let list = either(&WEBHOOK_SIGNATURE, &SVIX_SIGNATURE)?;

        let mut candidates = Candidates::new();
        let mut versioned = 0;
        for entry in list.split(|&b| b == b' ').filter(|e| !e.is_empty()) {
            let Some((b"v1", sig)) = entry.split_once_byte(b',') else {
                continue;
            };
            versioned += 1;
            if versioned > MAX_SIGNATURES {
                break;
            }
            if let Some(sig) = parse::base64_32(sig) {
                candidates.push(sig);
            }
        }
        if versioned == 0 {
            return Err(self.bad(&WEBHOOK_SIGNATURE, "no `v1,<base64>` entry"));
        }
        self.matches(&[id, b".", ts, b".", body], candidates.as_slice())
    }

    /// [Stripe](https://docs.stripe.com/webhooks#verify-manually):
    /// `t=<ts>,v1=<hex>,…`; the signed payload is `{t}.{body}`. `v0` and
    /// unknown keys are ignored (Stripe documents `v0` as a test-mode
    /// signature that must not be trusted); the first `t` counts, as in
    /// Stripe's own libraries.
    fn stripe(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let value = self.header(headers, &STRIPE_SIGNATURE)?;
        let mut ts = None;
        let mut candidates = Candidates::new();
        let mut versioned = 0;
        for item in value.split(|&b| b == b',') {
            match item.trim_ascii().split_once_byte(b'=') {
                Some((b"t", t)) if ts.is_none() => ts = Some(t),
                Some((b"v1", sig)) => {
                    versioned += 1;
                    if versioned <= MAX_SIGNATURES {
                        if let Some(sig) = parse::hex32(sig) {
                            candidates.push(sig);
                        }
                    }
                }
                _ => {}
            }
        }
        let ts = ts.ok_or_else(|| self.bad(&STRIPE_SIGNATURE, "no `t=` timestamp"))?;
        self.check_timestamp(&STRIPE_SIGNATURE, ts, now)?;
        if versioned == 0 {
            return Err(self.bad(&STRIPE_SIGNATURE, "no `v1=` signature"));
        }
        self.matches(&[ts, b".", body], candidates.as_slice())
    }

    /// Whether the HMAC of the concatenated `parts` under any secret equals
    /// any candidate. Every pair is compared, in constant time.
    fn matches(&self, parts: &[&[u8]], candidates: &[Mac32]) -> Result<(), VerifyError> {
        let mut found = Choice::from(0);
        if !candidates.is_empty() {
            for key in &self.macs {
                let mut mac = key.clone();
                for part in parts {
                    mac.update(part);
                }
                let tag = mac.finalize().into_bytes();
                for candidate in candidates {
                    found |= tag.as_slice().ct_eq(candidate.as_slice());
                }
            }
        }
        if bool::from(found) {
            Ok(())
        } else {
            Err(self.no_match())
        }
    }

    fn check_timestamp(
        &self,
        header: &HeaderName,
        raw: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        let ts = parse::timestamp(raw).map_err(|problem| self.bad(header, problem))?;
        // i128 so that no pair of i64 and u64 can overflow.
        let behind = i128::from(now) - i128::from(ts);
        let tolerance = i128::from(self.tolerance.as_secs());
        let saturate = |d: i128| u64::try_from(d).unwrap_or(u64::MAX);
        if behind > tolerance {
            Err(VerifyError::StaleTimestamp {
                scheme: self.scheme.name(),
                age_secs: saturate(behind),
                tolerance_secs: self.tolerance.as_secs(),
            })
        } else if -behind > tolerance {
            Err(VerifyError::FutureTimestamp {
                scheme: self.scheme.name(),
                ahead_secs: saturate(-behind),
                tolerance_secs: self.tolerance.as_secs(),
            })
        } else {
            Ok(())
        }
    }

    fn header<'h>(
        &self,
        headers: &'h HeaderMap,
        name: &HeaderName,
    ) -> Result<&'h [u8], VerifyError> {
        headers
            .get(name)
            .map(HeaderValue::as_bytes)
            .ok_or_else(|| self.missing(name))
    }

    fn missing(&self, header: &HeaderName) -> VerifyError {
        VerifyError::MissingHeader {
            scheme: self.scheme.name(),
            header: header.clone(),
        }
    }

    fn bad(&self, header: &HeaderName, problem: &'static str) -> VerifyError {
        VerifyError::BadFormat {
            scheme: self.scheme.name(),
            header: header.clone(),
            problem,
        }
    }

    fn no_match(&self) -> VerifyError {
        VerifyError::NoMatch {
            scheme: self.scheme.name(),
        }
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secrets = match &self.check {
            Check::Token { digests, .. } => digests.len(),
            _ => self.macs.len(),
        };
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("secrets", &format_args!("<{secrets} redacted>"))
            .field("tolerance", &self.tolerance)
            .finish()
    }
}

/// The HMAC key for `secret` under `scheme`, or `None` when it cannot be
/// decoded.
fn key_bytes(scheme: &Scheme, secret: &str) -> Option<Vec<u8>> {
    match scheme {
        Scheme::StandardWebhooks => {
            let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
            STANDARD.decode(encoded).ok().filter(|k| !k.is_empty())
        }
        _ => Some(secret.as_bytes().to_vec()),
    }
}

/// `split_once` for byte slices (std has it only for `str`).
trait SplitOnceByte {
    fn split_once_byte(&self, sep: u8) -> Option<(&[u8], &[u8])>;
}

impl SplitOnceByte for [u8] {
    fn split_once_byte(&self, sep: u8) -> Option<(&[u8], &[u8])> {
        let at = self.iter().position(|&b| b == sep)?;
        Some((self.get(..at)?, self.get(at + 1..)?))
    }
}
