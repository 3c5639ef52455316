//! The engine's integration tests, in one test binary: a module per
//! concern (the store helpers each module needs sit with its tests).

mod accept;
mod ahead;
mod alerts;
mod attempts;
mod batch;
mod dead_letter;
mod delays;
mod handlers;
mod library;
mod limits;
mod outbox_sqlite;
mod recording;
mod sequential;
