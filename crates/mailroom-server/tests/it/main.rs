//! Integration tests of mailroom on SQLite, end to end: each test
//! starts the real server on `127.0.0.1:0` over a fresh SQLite file and talks
//! to it over HTTP, as a webhook sender, an operator and a receiver would.

mod api;
mod command_handler;
mod dashboard;
mod hardening;
mod http_handler;
mod intake;
mod leases;
mod openapi;
mod pull;
mod ready;
mod retries;
mod security;
mod support;
