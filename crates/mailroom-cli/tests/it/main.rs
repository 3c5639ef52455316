//! The integration tests of the `mailroom` binary, in one test binary (one
//! link of the whole graph instead of one per file): a module per concern.
//! `support` starts the binary (`mailroom serve`, one-shot verbs) through
//! the test harness of `mailroom-testkit`.

mod amqp;
mod cluster;
mod dashboard;
mod docs;
mod examples;
mod https;
mod kill9;
mod least_privilege;
mod metrics;
mod operator;
mod pg_outage;
mod pg_tls;
mod reference;
mod support;
mod trace;
mod undeclared;
