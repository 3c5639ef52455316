//! Intake you can expose to the internet: signed webhooks over real HTTP,
//! `POST /v1/events` with `Idempotency-Key`, load shedding and read
//! deadlines. Each test on its own server and SQLite file.

mod idempotency;
mod logging;
mod shedding;
mod signed;
mod support;
mod timeouts;
