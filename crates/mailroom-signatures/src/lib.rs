//! Verification of inbound webhook signatures, as mailroom's webhook intake
//! (`POST /webhooks/{source}`) needs it.
//!
//! Everything here is pure computation over the **raw body bytes** and the
//! request headers: no I/O, no clock (the caller passes "now" in unix
//! seconds), no allocation per request beyond what an error needs.
//!
//! # Components
//!
//! - [`Scheme`]: which signature convention a source uses (`standard-webhooks`,
//!   `stripe`, `github`, `shopify`, `slack`, `token`, `hmac`), with the
//!   parameters of the configurable ones ([`Encoding`] for `hmac`).
//! - [`Verifier`]: one scheme plus its secrets (several at once, for
//!   rotation) and a timestamp tolerance. Secrets are decoded and the HMAC
//!   key schedules precomputed once in [`Verifier::new`]; [`Verifier::verify`]
//!   checks one request.
//! - [`VerifyError`]: why a request was refused, as a reason class
//!   ([`VerifyError::reason`]) fit for a metric label or a problem+json
//!   `type`. Messages name the scheme and the header, never a secret or an
//!   expected signature. [`ConfigError`] is what [`Verifier::new`] rejects.
//! - [`Preset`]: provider presets (`stripe`, `github`, `shopify`, `slack`,
//!   `asaas`, `standard-webhooks`) giving the scheme and where the dedup key
//!   and the event type live, as [`Field`]s.
//!
//! # Invariants
//!
//! - Signatures and tokens are compared in constant time ([`subtle`]).
//! - Work per request is bounded: at most [`MAX_SIGNATURES`] candidate
//!   signatures of a list header are considered, and each configured secret
//!   costs one HMAC over the body.
//! - No input makes [`Verifier::verify`] panic (fuzzed: see `fuzz/` at the
//!   repository root).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderMap;
//! use mailroom_signatures::{Scheme, Verifier};
//!
//! // GitHub's documented example.
//! let verifier = Verifier::new(
//!     Scheme::GitHub,
//!     ["It's a Secret to Everybody"],
//!     Duration::from_secs(300),
//! )?;
//! let mut headers = HeaderMap::new();
//! headers.insert(
//!     "x-hub-signature-256",
//!     "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17".parse()?,
//! );
//! assert!(verifier.verify(&headers, b"Hello, World!", 0).is_ok());
//! assert_eq!(
//!     verifier.verify(&headers, b"Hello, World?", 0).unwrap_err().reason(),
//!     "no_match",
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod error;
mod parse;
mod preset;
mod scheme;
mod verifier;

pub use error::{ConfigError, UnknownName, VerifyError};
pub use preset::{Field, Preset};
pub use scheme::{Encoding, Scheme};
pub use verifier::{DEFAULT_TOLERANCE, MAX_SIGNATURES, Verifier};
