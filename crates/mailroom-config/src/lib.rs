//! # mailroom-config
//!
//! `mailroom.toml`, the configuration file format (every key in
//! `docs/src/reference/configuration.md`), kept outside the runtime:
//!
//! 1. [`file`](mod@file): the serde types, one per table, unknown keys refused;
//! 2. [`Config::load`]: documented defaults → the file → `MAILROOM_*`
//!    environment overrides, with `${VAR}` interpolation in every string;
//! 3. [`Specs::from_config`]: the parsed file turned into the runtime's
//!    specs ([`mailroom::TopicSpec`], [`mailroom::SourceSpec`], retention,
//!    alerts) and built-in handlers, then [`Specs::into_builder`] an
//!    [`mailroom::EngineBuilder`].
//!
//! [`schema::schema`] is the file's JSON Schema, derived from the same
//! types (`mailroom config schema` prints it).
//!
//! Every error ([`ConfigError`]) names the file, the key path
//! (`topic[0].retry.base`) and what is wrong; `serve` refuses to start on
//! any of them.
//!
//! ```
//! let text = "[[topic]]\nname = \"emails\"\nhandler = { command = [\"true\"] }\n";
//! let config = mailroom_config::Config::from_toml("mailroom.toml", text, &|_| None)?;
//! let specs = mailroom_config::Specs::from_config(&config)?;
//! assert_eq!(specs.topics[0].0.name, "emails");
//! # Ok::<(), mailroom_config::ConfigError>(())
//! ```

#![deny(missing_docs)]

pub mod amqp;
mod error;
pub mod file;
mod handler;
mod interpolated;
mod load;
pub mod schema;
mod source;
mod specs;
mod topic;

pub use amqp::AmqpPlan;
pub use error::ConfigError;
pub use file::Config;
pub use load::locate;
pub use specs::{Specs, otlp_traces_url};
