//! Properties over arbitrary bodies: what a sender signs verifies, and any
//! single-byte change of it does not.

use proptest::prelude::*;

use crate::support::{NOW, all_schemes, secret_for, sign, verifier};
use mailroom_signatures::Scheme;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A valid signature over any body (empty, binary, non-UTF-8) verifies
    /// under every scheme.
    #[test]
    fn any_signed_body_verifies(body in proptest::collection::vec(any::<u8>(), 0..2048)) {
        for scheme in all_schemes() {
            let v = verifier(&scheme, &[secret_for(&scheme)]);
            let h = sign(&scheme, secret_for(&scheme), &body, NOW);
            prop_assert_eq!(v.verify(&h, &body, NOW), Ok(()), "{:?}", scheme);
        }
    }

    /// Changing any single byte of a signed body makes every body-signing
    /// scheme refuse it as `no_match` (`token` does not sign the body).
    #[test]
    fn any_single_byte_change_fails(
        body in proptest::collection::vec(any::<u8>(), 1..2048),
        at in any::<prop::sample::Index>(),
        flip in 1..=255u8,
    ) {
        let mut tampered = body.clone();
        let i = at.index(body.len());
        tampered[i] ^= flip;
        for scheme in all_schemes() {
            if matches!(scheme, Scheme::Token { .. }) {
                continue;
            }
            let v = verifier(&scheme, &[secret_for(&scheme)]);
            let h = sign(&scheme, secret_for(&scheme), &body, NOW);
            let err = v.verify(&h, &tampered, NOW);
            prop_assert_eq!(err.map_err(|e| e.reason()), Err("no_match"), "{:?}", scheme);
        }
    }

    /// Arbitrary bytes in every header a scheme reads never make it panic,
    /// and never verify without the secret.
    #[test]
    fn arbitrary_headers_never_panic(
        values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..128), 3),
        body in proptest::collection::vec(any::<u8>(), 0..64),
        now in any::<i64>(),
    ) {
        for scheme in all_schemes() {
            let v = verifier(&scheme, &[secret_for(&scheme)]);
            let mut h = http::HeaderMap::new();
            for (name, value) in crate::support::required_headers(&scheme).iter().zip(&values) {
                if let Ok(value) = http::HeaderValue::from_bytes(value) {
                    h.insert(http::HeaderName::from_bytes(name.as_bytes()).expect("name"), value);
                }
            }
            // A random token could equal the secret only by astronomical luck.
            prop_assert!(v.verify(&h, &body, now).is_err(), "{:?}", scheme);
        }
    }
}
