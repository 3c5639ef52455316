//! Feeds arbitrary header values and bodies to a verifier of every scheme.
//!
//! Invariants checked: `Verifier::verify` and `Verifier::new` never panic,
//! and no error message contains a configured secret.
//!
//! Input format (so seeds can be written by hand and mutations stay
//! meaningful): the first line is "now" in unix seconds (anything
//! unparseable means 0); then `name: value` lines, one header each, until an
//! empty line; the rest is the body. Lines end with `\n`.
#![no_main]

use std::sync::LazyLock;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use mailroom_signatures::{DEFAULT_TOLERANCE, Encoding, Preset, Scheme, Verifier};

/// The secrets of the published vectors (crates/mailroom-signatures/tests/
/// vectors/signatures.json), so the seed corpus reaches the accepting paths.
const SW: [&str; 2] = [
    "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
];
const STRIPE: &str = "whsec_test_secret";
const GITHUB: &str = "It's a Secret to Everybody";
const SHOPIFY: &str = "shop-secret";
const SLACK: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const TOKEN: &str = "asaas-token-secret";

static VERIFIERS: LazyLock<Vec<(Verifier, Vec<&'static str>)>> = LazyLock::new(|| {
    let configs: Vec<(Scheme, Vec<&'static str>)> = vec![
        (Scheme::StandardWebhooks, SW.to_vec()),
        (Scheme::Stripe, vec![STRIPE, "whsec_rotated"]),
        (Scheme::GitHub, vec![GITHUB]),
        (Scheme::Shopify, vec![SHOPIFY]),
        (Scheme::Slack, vec![SLACK]),
        (Preset::Asaas.scheme(), vec![TOKEN, "asaas-rotated-token"]),
        (
            Scheme::Hmac {
                header: "x-hub-signature-256".into(),
                prefix: Some("sha256=".into()),
                encoding: Encoding::Hex,
            },
            vec![GITHUB],
        ),
        (
            Scheme::Hmac {
                header: "x-shopify-hmac-sha256".into(),
                prefix: None,
                encoding: Encoding::Base64,
            },
            vec![SHOPIFY],
        ),
    ];
    configs
        .into_iter()
        .map(|(scheme, secrets)| {
            let v = Verifier::new(scheme, secrets.iter().copied(), DEFAULT_TOLERANCE)
                .expect("fuzz configuration is valid");
            (v, secrets)
        })
        .collect()
});

fn parse(data: &[u8]) -> (i64, HeaderMap, &[u8]) {
    let mut rest = data;
    let mut line = || -> Option<&[u8]> {
        let at = rest.iter().position(|&b| b == b'\n')?;
        let (l, r) = rest.split_at(at);
        rest = &r[1..];
        Some(l)
    };
    let now = line()
        .and_then(|l| std::str::from_utf8(l).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let mut headers = HeaderMap::new();
    while let Some(l) = line() {
        if l.is_empty() {
            break;
        }
        let Some(colon) = l.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = l.split_at(colon);
        let value = value[1..].strip_prefix(b" ").unwrap_or(&value[1..]);
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    (now, headers, rest)
}

fuzz_target!(|data: &[u8]| {
    let (now, headers, body) = parse(data);
    for (verifier, secrets) in VERIFIERS.iter() {
        if let Err(err) = verifier.verify(&headers, body, now) {
            let text = format!("{err} {err:?}");
            for secret in secrets {
                assert!(!text.contains(secret), "error leaks a secret: {text}");
            }
            assert!(!err.reason().is_empty());
        }
    }

    // Construction with hostile secrets and header names never panics.
    if let Ok(text) = std::str::from_utf8(body) {
        let schemes = [
            Scheme::StandardWebhooks,
            Scheme::Stripe,
            Scheme::Token {
                header: text.to_owned(),
            },
            Scheme::Hmac {
                header: text.to_owned(),
                prefix: Some(text.to_owned()),
                encoding: Encoding::Base64,
            },
        ];
        for scheme in schemes {
            let tolerance = Duration::from_secs(now.unsigned_abs());
            if let Ok(v) = Verifier::new(scheme, [text, "x"], tolerance) {
                let _ = v.verify(&headers, body, now);
            }
        }
    }
});
