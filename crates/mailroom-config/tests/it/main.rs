//! The configuration crate's integration tests, in one test binary.

mod schema;
