//! The published examples of `tests/vectors/signatures.json` (signatures
//! from providers' docs and reference libraries, recomputed independently;
//! each says whether a correct verifier accepts it), each checked with the
//! verifier's clock at the vector's `now`.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};
use mailroom_signatures::{DEFAULT_TOLERANCE, Scheme, Verifier, VerifyError};
use serde::Deserialize;

#[derive(Deserialize)]
struct File {
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Vector {
    scheme: String,
    origin: String,
    secret: String,
    now: Option<i64>,
    headers: BTreeMap<String, String>,
    body: String,
    valid: bool,
}

fn vectors() -> Vec<Vector> {
    let raw = include_str!("../vectors/signatures.json");
    serde_json::from_str::<File>(raw)
        .expect("vectors parse")
        .vectors
}

fn scheme(name: &str) -> Scheme {
    match name {
        "standard-webhooks" => Scheme::StandardWebhooks,
        "stripe" => Scheme::Stripe,
        "github" => Scheme::GitHub,
        "shopify" => Scheme::Shopify,
        "slack" => Scheme::Slack,
        other => panic!("vector of unknown scheme {other}"),
    }
}

/// Verifies vector `index` and returns the verifier's answer.
fn run(index: usize) -> (Vector, Result<(), VerifyError>) {
    let v = vectors().into_iter().nth(index).expect("vector exists");
    let verifier = Verifier::new(scheme(&v.scheme), [&v.secret], DEFAULT_TOLERANCE)
        .expect("vector secret is valid");
    let mut headers = HeaderMap::new();
    for (k, val) in &v.headers {
        headers.insert(
            HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(val).expect("value"),
        );
    }
    // Schemes without a timestamp have `now: null`; any clock will do.
    let result = verifier.verify(&headers, v.body.as_bytes(), v.now.unwrap_or(0));
    assert_eq!(
        result.is_ok(),
        v.valid,
        "vector {index} ({}, {}): expected valid={}, got {result:?}",
        v.scheme,
        v.origin,
        v.valid
    );
    (v, result)
}

/// The file holds the 8 vectors these tests name one by one; a vector added
/// to the file must get its own test.
#[test]
fn vector_file_has_the_expected_count() {
    assert_eq!(vectors().len(), 8);
}

/// Standard Webhooks' Rust reference example verifies.
#[test]
fn vector_0_standard_webhooks_rust_reference() {
    let (v, r) = run(0);
    assert_eq!(v.scheme, "standard-webhooks");
    assert_eq!(r, Ok(()));
}

/// A list with one bogus and one valid `v1` entry verifies (rotation).
#[test]
fn vector_1_standard_webhooks_one_of_several() {
    let (v, r) = run(1);
    assert_eq!(v.scheme, "standard-webhooks");
    assert_eq!(r, Ok(()));
}

/// A one-character change of the body is refused as a mismatch.
#[test]
fn vector_2_standard_webhooks_changed_body() {
    let (_, r) = run(2);
    assert_eq!(r.expect_err("invalid").reason(), "no_match");
}

/// The first example ten minutes later is refused as stale.
#[test]
fn vector_3_standard_webhooks_stale() {
    let (_, r) = run(3);
    assert_eq!(r.expect_err("invalid").reason(), "stale_timestamp");
}

/// Stripe's scheme verifies and the `v0` entry is ignored.
#[test]
fn vector_4_stripe_ignores_v0() {
    let (v, r) = run(4);
    assert_eq!(v.scheme, "stripe");
    assert_eq!(r, Ok(()));
}

/// GitHub's documented example verifies.
#[test]
fn vector_5_github_docs() {
    let (v, r) = run(5);
    assert_eq!(v.scheme, "github");
    assert_eq!(r, Ok(()));
}

/// The Shopify example verifies.
#[test]
fn vector_6_shopify() {
    let (v, r) = run(6);
    assert_eq!(v.scheme, "shopify");
    assert_eq!(r, Ok(()));
}

/// Slack's documented example verifies at its own `now` (its timestamp is
/// from 2018).
#[test]
fn vector_7_slack_docs() {
    let (v, r) = run(7);
    assert_eq!(v.scheme, "slack");
    assert_eq!(r, Ok(()));
}

/// Every vector answers as the file says, and every valid one is refused
/// when verified at the current wall-clock time, proving the clock really
/// is the caller's (timestamped vectors are years old).
#[test]
fn every_vector_answers_as_published() {
    for (i, v) in vectors().iter().enumerate() {
        let _checked_inside = run(i);
        if v.valid && v.now.is_some() {
            let verifier =
                Verifier::new(scheme(&v.scheme), [&v.secret], DEFAULT_TOLERANCE).expect("valid");
            let mut headers = HeaderMap::new();
            for (k, val) in &v.headers {
                headers.insert(
                    HeaderName::from_bytes(k.as_bytes()).expect("name"),
                    HeaderValue::from_str(val).expect("value"),
                );
            }
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs() as i64;
            let err = verifier
                .verify(&headers, v.body.as_bytes(), wall)
                .expect_err("old timestamp");
            assert_eq!(err.reason(), "stale_timestamp", "vector {i}");
        }
    }
}
