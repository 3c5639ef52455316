//! Behaviour per scheme that sources rely on.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use mailroom_signatures::{ConfigError, Encoding, Scheme, Verifier, VerifyError};

use crate::support::{
    NOW, SECRET, SECRET_2, all_schemes, required_headers, second_secret_for, secret_for, sign,
    signature_header, verifier,
};

const BODY: &[u8] = br#"{"id":"evt_1","type":"payment.received"}"#;

fn set(headers: &mut HeaderMap, name: &str, value: &[u8]) {
    headers.insert(
        HeaderName::from_bytes(name.as_bytes()).expect("name"),
        HeaderValue::from_bytes(value).expect("value"),
    );
}

/// A correctly signed request is accepted by every scheme.
#[test]
fn valid_signature_verifies() {
    for scheme in all_schemes() {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let h = sign(&scheme, secret_for(&scheme), BODY, NOW);
        assert_eq!(v.verify(&h, BODY, NOW), Ok(()), "{scheme:?}");
    }
}

/// A body changed after signing is refused as `no_match` by every scheme
/// that signs the body (all but `token`).
#[test]
fn tampered_body_is_refused() {
    for scheme in all_schemes() {
        if matches!(scheme, Scheme::Token { .. }) {
            continue;
        }
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let h = sign(&scheme, secret_for(&scheme), BODY, NOW);
        let err = v
            .verify(&h, br#"{"id":"evt_1","type":"payment.refunded"}"#, NOW)
            .expect_err("tampered");
        assert_eq!(err.reason(), "no_match", "{scheme:?}");
    }
}

/// `token` authenticates the sender, not the body: any body passes with the
/// right token (documented limitation of token providers such as Asaas).
#[test]
fn token_does_not_cover_the_body() {
    let scheme = Scheme::Token {
        header: "asaas-access-token".into(),
    };
    let v = verifier(&scheme, &[SECRET]);
    let h = sign(&scheme, SECRET, BODY, NOW);
    assert_eq!(v.verify(&h, b"anything else", NOW), Ok(()));
}

/// A request signed with a secret the verifier does not hold is refused.
#[test]
fn wrong_secret_is_refused() {
    for scheme in all_schemes() {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let h = sign(&scheme, second_secret_for(&scheme), BODY, NOW);
        assert_eq!(
            v.verify(&h, BODY, NOW).expect_err("wrong secret").reason(),
            "no_match",
            "{scheme:?}"
        );
    }
}

/// During rotation both the old and the new secret are accepted, and after
/// the old one is dropped its signatures are refused.
#[test]
fn rotated_secrets_are_all_accepted() {
    for scheme in all_schemes() {
        let (old, new) = (secret_for(&scheme), second_secret_for(&scheme));
        let both = verifier(&scheme, &[old, new]);
        for secret in [old, new] {
            let h = sign(&scheme, secret, BODY, NOW);
            assert_eq!(both.verify(&h, BODY, NOW), Ok(()), "{scheme:?}");
        }
        let only_new = verifier(&scheme, &[new]);
        let h = sign(&scheme, old, BODY, NOW);
        assert_eq!(
            only_new
                .verify(&h, BODY, NOW)
                .expect_err("retired")
                .reason(),
            "no_match",
            "{scheme:?}"
        );
    }
}

/// Timestamped schemes refuse a timestamp older than the tolerance, and
/// accept one exactly at its edge.
#[test]
fn stale_timestamp_is_refused() {
    for scheme in all_schemes().into_iter().filter(Scheme::is_timestamped) {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let h = sign(&scheme, secret_for(&scheme), BODY, NOW - 301);
        let err = v.verify(&h, BODY, NOW).expect_err("stale");
        assert_eq!(err.reason(), "stale_timestamp", "{scheme:?}");
        assert!(matches!(
            err,
            VerifyError::StaleTimestamp {
                age_secs: 301,
                tolerance_secs: 300,
                ..
            }
        ));
        let h = sign(&scheme, secret_for(&scheme), BODY, NOW - 300);
        assert_eq!(v.verify(&h, BODY, NOW), Ok(()), "{scheme:?} at the edge");
    }
}

/// Timestamped schemes refuse a timestamp further ahead than the tolerance,
/// and accept one exactly at its edge.
#[test]
fn future_timestamp_is_refused() {
    for scheme in all_schemes().into_iter().filter(Scheme::is_timestamped) {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let h = sign(&scheme, secret_for(&scheme), BODY, NOW + 301);
        let err = v.verify(&h, BODY, NOW).expect_err("future");
        assert_eq!(err.reason(), "future_timestamp", "{scheme:?}");
        let h = sign(&scheme, secret_for(&scheme), BODY, NOW + 300);
        assert_eq!(v.verify(&h, BODY, NOW), Ok(()), "{scheme:?} at the edge");
    }
}

/// The tolerance is the configured one, not a fixed five minutes.
#[test]
fn tolerance_is_configurable() {
    let v = Verifier::new(Scheme::Slack, [SECRET], Duration::from_secs(10)).expect("valid");
    let h = sign(&Scheme::Slack, SECRET, BODY, NOW - 11);
    assert_eq!(
        v.verify(&h, BODY, NOW).expect_err("stale").reason(),
        "stale_timestamp"
    );
    let h = sign(&Scheme::Slack, SECRET, BODY, NOW - 10);
    assert_eq!(v.verify(&h, BODY, NOW), Ok(()));
}

/// Schemes without a timestamp do not consult the clock, whatever it says.
#[test]
fn untimestamped_schemes_ignore_the_clock() {
    for scheme in all_schemes().into_iter().filter(|s| !s.is_timestamped()) {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let h = sign(&scheme, secret_for(&scheme), BODY, NOW);
        for now in [i64::MIN, 0, i64::MAX] {
            assert_eq!(v.verify(&h, BODY, now), Ok(()), "{scheme:?} at {now}");
        }
    }
}

/// Extreme clocks and timestamps do not overflow: they are refused, never
/// a panic.
#[test]
fn extreme_clocks_are_refused_without_overflow() {
    for scheme in all_schemes().into_iter().filter(Scheme::is_timestamped) {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let h = sign(&scheme, secret_for(&scheme), BODY, 999_999_999_999_999_999);
        for now in [i64::MIN, i64::MAX] {
            assert!(v.verify(&h, BODY, now).is_err(), "{scheme:?} at {now}");
        }
        let huge =
            Verifier::new(scheme.clone(), [secret_for(&scheme)], Duration::MAX).expect("valid");
        assert_eq!(huge.verify(&h, BODY, i64::MIN), Ok(()), "{scheme:?}");
    }
}

/// Removing any header a scheme needs gives `missing_header`, naming it.
#[test]
fn missing_header_is_named() {
    for scheme in all_schemes() {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        for name in required_headers(&scheme) {
            let mut h = sign(&scheme, secret_for(&scheme), BODY, NOW);
            h.remove(name.as_str());
            let err = v.verify(&h, BODY, NOW).expect_err("missing");
            assert_eq!(err.reason(), "missing_header", "{scheme:?} without {name}");
            assert!(err.to_string().contains(&name), "{err} names {name}");
            assert!(
                err.to_string().contains(scheme.name()),
                "{err} names the scheme"
            );
        }
        let err = v.verify(&HeaderMap::new(), BODY, NOW).expect_err("none");
        assert_eq!(err.reason(), "missing_header", "{scheme:?} with no headers");
    }
}

/// Header lookups ignore case: a token header configured in mixed case is
/// found, whatever case the sender used on the wire.
#[test]
fn header_names_are_case_insensitive() {
    let v = verifier(
        &Scheme::Token {
            header: "ASAAS-Access-Token".into(),
        },
        &[SECRET],
    );
    let mut h = HeaderMap::new();
    set(&mut h, "Asaas-Access-TOKEN", SECRET.as_bytes());
    assert_eq!(v.verify(&h, BODY, NOW), Ok(()));
}

/// Svix's `svix-*` spelling of the Standard Webhooks headers verifies.
#[test]
fn standard_webhooks_accepts_svix_headers() {
    let scheme = Scheme::StandardWebhooks;
    let signed = sign(&scheme, secret_for(&scheme), BODY, NOW);
    let mut h = HeaderMap::new();
    for (name, value) in &signed {
        let svix = name.as_str().replace("webhook-", "svix-");
        set(&mut h, &svix, value.as_bytes());
    }
    let v = verifier(&scheme, &[secret_for(&scheme)]);
    assert_eq!(v.verify(&h, BODY, NOW), Ok(()));
}

/// A signature-header value the scheme cannot parse is `bad_format`.
#[test]
fn malformed_signature_header_is_bad_format() {
    let cases: Vec<(Scheme, Vec<&[u8]>)> = vec![
        (
            Scheme::StandardWebhooks,
            vec![b"", b"   ", b"v2,abc", b"v1a,abcd", b"nocomma"],
        ),
        (
            Scheme::Stripe,
            vec![
                b"",
                b"garbage",
                b"v1=00",
                b"t=,v1=00",
                b"t=abc,v1=00",
                b"t=1700000000",
                b"t=1700000000,v0=00",
            ],
        ),
        (
            Scheme::GitHub,
            vec![b"", b"sha1=00", b"sha256=", b"sha256=zz", b"SHA256=00"],
        ),
        (Scheme::Shopify, vec![b"", b"!!!!", b"AAAA", b"00"]),
        (Scheme::Slack, vec![b"", b"v1=00", b"v0=", b"v0=nothex"]),
        (
            Scheme::Hmac {
                header: "x-signature".into(),
                prefix: Some("sha256=".into()),
                encoding: Encoding::Hex,
            },
            vec![b"", b"00", b"sha256=xyz"],
        ),
        (
            Scheme::Hmac {
                header: "x-signature".into(),
                prefix: None,
                encoding: Encoding::Base64,
            },
            vec![b"", b"not base64", b"AAAA"],
        ),
    ];
    for (scheme, values) in cases {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        let header = signature_header(&scheme);
        for value in values {
            let mut h = sign(&scheme, secret_for(&scheme), BODY, NOW);
            set(&mut h, &header, value);
            let err = v.verify(&h, BODY, NOW).expect_err("malformed");
            assert_eq!(
                err.reason(),
                "bad_format",
                "{scheme:?} with {header}: {:?} gave {err}",
                String::from_utf8_lossy(value)
            );
        }
    }
}

/// Timestamps that are not plain decimal integers, or do not fit, are
/// `bad_format` (never a panic or an overflow).
#[test]
fn malformed_timestamp_is_bad_format() {
    let bad: [&[u8]; 7] = [
        b"",
        b"abc",
        b"-1700000000",
        b"+1700000000",
        b"1700000000.5",
        b"99999999999999999999999999",
        b"1e9",
    ];
    for value in bad {
        for scheme in [Scheme::StandardWebhooks, Scheme::Slack] {
            let v = verifier(&scheme, &[secret_for(&scheme)]);
            let mut h = sign(&scheme, secret_for(&scheme), BODY, NOW);
            let name = &required_headers(&scheme)[if scheme == Scheme::Slack { 0 } else { 1 }];
            set(&mut h, name, value);
            let err = v.verify(&h, BODY, NOW).expect_err("bad timestamp");
            assert_eq!(err.reason(), "bad_format", "{scheme:?} ts {value:?}");
        }
        let v = verifier(&Scheme::Stripe, &[SECRET]);
        let mut stripe = b"t=".to_vec();
        stripe.extend_from_slice(value);
        stripe.extend_from_slice(b",v1=");
        stripe.extend_from_slice(&[b'0'; 64]);
        let mut h = HeaderMap::new();
        set(&mut h, "stripe-signature", &stripe);
        let err = v.verify(&h, BODY, NOW).expect_err("bad timestamp");
        assert_eq!(err.reason(), "bad_format", "stripe t={value:?}");
    }
}

/// Non-ASCII and oversized header values are refused without a panic.
#[test]
fn hostile_header_values_are_refused() {
    let long = vec![b'a'; 64 * 1024];
    let values: [&[u8]; 4] = [b"\xff\xfe\x80", "v1,é".as_bytes(), &long, b"\t"];
    for scheme in all_schemes() {
        let v = verifier(&scheme, &[secret_for(&scheme)]);
        for name in required_headers(&scheme) {
            for value in values {
                let mut h = sign(&scheme, secret_for(&scheme), BODY, NOW);
                set(&mut h, &name, value);
                assert!(v.verify(&h, BODY, NOW).is_err(), "{scheme:?} {name}");
            }
        }
    }
}

/// Standard Webhooks: entries of other versions and undecodable `v1`
/// entries are skipped, so one valid entry among them suffices.
#[test]
fn standard_webhooks_skips_foreign_entries() {
    let scheme = Scheme::StandardWebhooks;
    let v = verifier(&scheme, &[secret_for(&scheme)]);
    let mut h = sign(&scheme, secret_for(&scheme), BODY, NOW);
    let valid = h["webhook-signature"].to_str().expect("ascii").to_owned();
    let list = format!("v1a,AAAA  v2,xyz v1,!!! v1,{} {valid}", "A".repeat(44));
    set(&mut h, "webhook-signature", list.as_bytes());
    assert_eq!(v.verify(&h, BODY, NOW), Ok(()));
}

/// At most 16 `v1` entries of a list header are checked: a valid signature
/// in 16th place verifies, in 17th place it is ignored.
#[test]
fn list_headers_are_capped_at_16_signatures() {
    let scheme = Scheme::StandardWebhooks;
    let v = verifier(&scheme, &[secret_for(&scheme)]);
    let h = sign(&scheme, secret_for(&scheme), BODY, NOW);
    let valid = h["webhook-signature"].to_str().expect("ascii").to_owned();
    let junk = format!("v1,{}", "A".repeat(43) + "=");
    for (before, ok) in [(15, true), (16, false)] {
        let mut h = h.clone();
        let list = format!("{} {valid}", vec![junk.as_str(); before].join(" "));
        set(&mut h, "webhook-signature", list.as_bytes());
        assert_eq!(v.verify(&h, BODY, NOW).is_ok(), ok, "sw after {before}");
    }

    let scheme = Scheme::Stripe;
    let v = verifier(&scheme, &[SECRET]);
    let h = sign(&scheme, SECRET, BODY, NOW);
    let signed = h["stripe-signature"].to_str().expect("ascii").to_owned();
    let (t, v1) = signed.split_once(',').expect("t,v1");
    let junk = format!("v1={}", "0".repeat(64));
    for (before, ok) in [(15, true), (16, false)] {
        let header = format!("{t},{},{v1}", vec![junk.as_str(); before].join(","));
        let mut h = HeaderMap::new();
        set(&mut h, "stripe-signature", header.as_bytes());
        assert_eq!(v.verify(&h, BODY, NOW).is_ok(), ok, "stripe after {before}");
    }
}

/// Stripe: any of several `v1` entries may match, order and spaces after
/// commas do not matter, and a correct `v0` alone is not trusted.
#[test]
fn stripe_header_variants() {
    let v = verifier(&Scheme::Stripe, &[SECRET]);
    let h = sign(&Scheme::Stripe, SECRET, BODY, NOW);
    let signed = h["stripe-signature"].to_str().expect("ascii").to_owned();
    let (t, v1) = signed.split_once(',').expect("t,v1");
    let other = format!("v1={}", "ab".repeat(32));
    for header in [
        format!("{other},{v1},{t}"),
        format!("{t}, {other}, {v1}, v0=00, scheme=x"),
    ] {
        let mut h = HeaderMap::new();
        set(&mut h, "stripe-signature", header.as_bytes());
        assert_eq!(v.verify(&h, BODY, NOW), Ok(()), "{header}");
    }
    let v0_only = format!("{t},v0={}", v1.trim_start_matches("v1="));
    let mut h = HeaderMap::new();
    set(&mut h, "stripe-signature", v0_only.as_bytes());
    assert_eq!(
        v.verify(&h, BODY, NOW).expect_err("v0").reason(),
        "bad_format"
    );
}

/// Stripe's key is the whole `whsec_…` string, not a decoding of it.
#[test]
fn stripe_key_is_the_whole_secret() {
    let v = verifier(&Scheme::Stripe, &[SECRET]);
    let h = sign(
        &Scheme::Stripe,
        SECRET.trim_start_matches("whsec_"),
        BODY,
        NOW,
    );
    assert_eq!(
        v.verify(&h, BODY, NOW).expect_err("stripped").reason(),
        "no_match"
    );
}

/// A token of another length (longer, shorter, a prefix) is refused.
#[test]
fn token_must_match_exactly() {
    let scheme = Scheme::Token {
        header: "asaas-access-token".into(),
    };
    let v = verifier(&scheme, &[SECRET]);
    for token in [&SECRET[..5], &format!("{SECRET}x"), "", " "] {
        let mut h = HeaderMap::new();
        set(&mut h, "asaas-access-token", token.as_bytes());
        assert_eq!(
            v.verify(&h, BODY, NOW).expect_err("token").reason(),
            "no_match"
        );
    }
}

/// No error message, and no verifier `Debug` output, contains a secret or
/// the signature the verifier expected.
#[test]
fn errors_never_leak_secrets() {
    for scheme in all_schemes() {
        let secret = secret_for(&scheme);
        let v = verifier(&scheme, &[secret, second_secret_for(&scheme)]);
        let good = sign(&scheme, secret, BODY, NOW);
        let expected: Vec<String> = good
            .values()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        let errors = [
            v.verify(&good, b"tampered", NOW),
            v.verify(&sign(&scheme, "whsec_AAAAAAAA", BODY, NOW), BODY, NOW),
            v.verify(&sign(&scheme, secret, BODY, NOW - 10_000), BODY, NOW),
            v.verify(&HeaderMap::new(), BODY, NOW),
        ];
        for err in errors.into_iter().filter_map(Result::err) {
            let text = format!("{err} {err:?}");
            for s in [secret, second_secret_for(&scheme)] {
                assert!(!text.contains(s), "{text} leaks a secret");
                assert!(!text.contains(s.trim_start_matches("whsec_")), "{text}");
            }
            for sig in &expected {
                // Short values (ids, timestamps) are not secret.
                if sig.len() > 20 {
                    let bare = sig.split([',', '=']).max_by_key(|p| p.len()).unwrap_or(sig);
                    assert!(!text.contains(bare), "{text} leaks the expected signature");
                }
            }
        }
        let debug = format!("{v:?}");
        assert!(
            !debug.contains(secret.trim_start_matches("whsec_")),
            "{debug}"
        );
    }
}

/// Construction refuses an empty secret list, an empty secret, a Standard
/// Webhooks secret that is not base64, and an invalid header name; the
/// messages never echo the secret.
#[test]
fn bad_configuration_is_refused() {
    let tol = Duration::from_secs(300);
    let none: [&str; 0] = [];
    assert!(matches!(
        Verifier::new(Scheme::GitHub, none, tol),
        Err(ConfigError::NoSecrets { .. })
    ));
    assert!(matches!(
        Verifier::new(Scheme::GitHub, [SECRET, ""], tol),
        Err(ConfigError::EmptySecret { index: 1, .. })
    ));
    for bad in ["whsec_not base64!", "whsec_", "%%%%"] {
        let err = Verifier::new(Scheme::StandardWebhooks, [bad], tol).expect_err(bad);
        assert!(
            matches!(err, ConfigError::InvalidSecret { index: 0, .. }),
            "{bad}"
        );
        let payload = bad.trim_start_matches("whsec_");
        if !payload.is_empty() {
            assert!(
                !err.to_string().contains(payload),
                "{err} echoes the secret"
            );
        }
    }
    // Without the prefix a Standard Webhooks secret is plain base64.
    assert!(
        Verifier::new(
            Scheme::StandardWebhooks,
            ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],
            tol
        )
        .is_ok()
    );
    for header in ["", "bad header", "x\u{e9}"] {
        let scheme = Scheme::Token {
            header: header.into(),
        };
        assert!(matches!(
            Verifier::new(scheme, [SECRET], tol),
            Err(ConfigError::InvalidHeaderName { .. })
        ));
    }
}

/// Every error reports a stable reason class and its scheme's name.
#[test]
fn reasons_are_stable_tokens() {
    let v = verifier(&Scheme::Slack, &[SECRET]);
    let cases = [
        (HeaderMap::new(), "missing_header"),
        (
            sign(&Scheme::Slack, SECRET, BODY, NOW - 1000),
            "stale_timestamp",
        ),
        (
            sign(&Scheme::Slack, SECRET, BODY, NOW + 1000),
            "future_timestamp",
        ),
        (sign(&Scheme::Slack, SECRET_2, BODY, NOW), "no_match"),
    ];
    for (h, reason) in cases {
        let err = v.verify(&h, BODY, NOW).expect_err(reason);
        assert_eq!(err.reason(), reason);
        assert_eq!(err.scheme(), "slack");
    }
}

/// A verifier can be shared across request-handling threads.
#[test]
fn verifier_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Verifier>();
    assert_send_sync::<VerifyError>();
}
