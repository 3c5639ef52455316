//! A test-only signer, written independently of the verifier (straight from
//! each provider's documentation), so the two cannot share a bug unnoticed;
//! the published vectors pin both to the providers' real output.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use http::HeaderMap;
use mailroom_signatures::{Encoding, Scheme, Verifier};
use sha2::Sha256;
use std::time::Duration;

/// A fixed "now" for generated requests.
pub const NOW: i64 = 1_700_000_000;

/// Standard Webhooks secrets (base64 after `whsec_`).
pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub const SW_SECRET_2: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// A secret for every other scheme, and a second one for rotation.
pub const SECRET: &str = "whsec_first_secret_value";
pub const SECRET_2: &str = "whsec_second_secret_value";

/// Every scheme, with the token/hmac parameters the tests use.
pub fn all_schemes() -> Vec<Scheme> {
    vec![
        Scheme::StandardWebhooks,
        Scheme::Stripe,
        Scheme::GitHub,
        Scheme::Shopify,
        Scheme::Slack,
        Scheme::Token {
            header: "Asaas-Access-Token".into(),
        },
        Scheme::Hmac {
            header: "x-signature".into(),
            prefix: Some("sha256=".into()),
            encoding: Encoding::Hex,
        },
        Scheme::Hmac {
            header: "x-signature".into(),
            prefix: None,
            encoding: Encoding::Base64,
        },
    ]
}

/// The primary secret a scheme's tests use.
pub fn secret_for(scheme: &Scheme) -> &'static str {
    match scheme {
        Scheme::StandardWebhooks => SW_SECRET,
        _ => SECRET,
    }
}

/// The rotation secret a scheme's tests use.
pub fn second_secret_for(scheme: &Scheme) -> &'static str {
    match scheme {
        Scheme::StandardWebhooks => SW_SECRET_2,
        _ => SECRET_2,
    }
}

/// A verifier with the given secrets and the default 5 minute tolerance.
pub fn verifier(scheme: &Scheme, secrets: &[&str]) -> Verifier {
    Verifier::new(
        scheme.clone(),
        secrets.iter().copied(),
        Duration::from_secs(300),
    )
    .expect("valid test configuration")
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

/// Headers a correct sender would attach to `body` at time `ts`.
pub fn sign(scheme: &Scheme, secret: &str, body: &[u8], ts: i64) -> HeaderMap {
    let ts_s = ts.to_string();
    let mut h = HeaderMap::new();
    let mut set = |name: &str, value: String| {
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
            value.parse().expect("value"),
        );
    };
    match scheme {
        Scheme::StandardWebhooks => {
            let key = STANDARD
                .decode(secret.trim_start_matches("whsec_"))
                .expect("base64 secret");
            let id = "msg_test";
            let sig = hmac(&key, &[id.as_bytes(), b".", ts_s.as_bytes(), b".", body]);
            set("webhook-id", id.into());
            set("webhook-timestamp", ts_s);
            set("webhook-signature", format!("v1,{}", STANDARD.encode(sig)));
        }
        Scheme::Stripe => {
            let sig = hmac(secret.as_bytes(), &[ts_s.as_bytes(), b".", body]);
            set(
                "stripe-signature",
                format!("t={ts_s},v1={}", hex::encode(sig)),
            );
        }
        Scheme::GitHub => {
            let sig = hmac(secret.as_bytes(), &[body]);
            set(
                "x-hub-signature-256",
                format!("sha256={}", hex::encode(sig)),
            );
        }
        Scheme::Shopify => {
            let sig = hmac(secret.as_bytes(), &[body]);
            set("x-shopify-hmac-sha256", STANDARD.encode(sig));
        }
        Scheme::Slack => {
            let sig = hmac(secret.as_bytes(), &[b"v0:", ts_s.as_bytes(), b":", body]);
            set("x-slack-request-timestamp", ts_s);
            set("x-slack-signature", format!("v0={}", hex::encode(sig)));
        }
        Scheme::Token { header } => set(header, secret.into()),
        Scheme::Hmac {
            header,
            prefix,
            encoding,
        } => {
            let sig = hmac(secret.as_bytes(), &[body]);
            let enc = match encoding {
                Encoding::Hex => hex::encode(sig),
                Encoding::Base64 => STANDARD.encode(sig),
            };
            set(header, format!("{}{enc}", prefix.as_deref().unwrap_or("")));
        }
        other => panic!("no signer for {other:?}"),
    }
    h
}

/// The headers a scheme's signature depends on, lower-case: the ones a
/// "missing header" test removes one at a time.
pub fn required_headers(scheme: &Scheme) -> Vec<String> {
    match scheme {
        Scheme::StandardWebhooks => vec![
            "webhook-id".into(),
            "webhook-timestamp".into(),
            "webhook-signature".into(),
        ],
        Scheme::Stripe => vec!["stripe-signature".into()],
        Scheme::GitHub => vec!["x-hub-signature-256".into()],
        Scheme::Shopify => vec!["x-shopify-hmac-sha256".into()],
        Scheme::Slack => vec![
            "x-slack-request-timestamp".into(),
            "x-slack-signature".into(),
        ],
        Scheme::Token { header } | Scheme::Hmac { header, .. } => vec![header.to_lowercase()],
        other => panic!("unknown scheme {other:?}"),
    }
}

/// The header carrying the signature (or token).
pub fn signature_header(scheme: &Scheme) -> String {
    required_headers(scheme).pop().expect("at least one")
}
