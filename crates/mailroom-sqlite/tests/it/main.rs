//! The SQLite store's integration tests, in one test binary: the shared
//! conformance suite and the backend's own behaviour.

mod conformance;
mod sqlite;
