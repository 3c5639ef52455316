//! Integration tests of mailroom-signatures, in one binary (one link step).
//!
//! - `vectors`: every published example of `tests/vectors/signatures.json`.
//! - `schemes`: per scheme, the cases users rely on: valid, tampered body,
//!   wrong secret, rotation, stale/future timestamps, missing/malformed
//!   headers, and errors that never leak a secret.
//! - `props`: property tests over arbitrary bodies.
//! - `presets`: provider presets.

mod presets;
mod props;
mod schemes;
mod support;
mod vectors;
