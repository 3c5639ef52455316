//! The PostgreSQL store's integration tests, in one test binary: the
//! shared conformance suite, the backend's own behaviour, PgBouncer, TLS
//! and a frozen network. Each test gets a fresh database on the server
//! `./scripts/test.sh` starts.

mod conformance;
mod frozen;
mod pgbouncer;
mod postgres;
mod tls;
