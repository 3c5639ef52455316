//! Why a configuration was refused: always the file, the key and what is wrong.

/// A configuration error, naming where it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{file}: not valid TOML: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A key has a wrong value, or is unknown.
    #[error("{file}: {key}: {message}")]
    Invalid {
        /// The file (or `environment`).
        file: String,
        /// Dotted key path, e.g. `topic[0].retry.base`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A topic the runtime refuses ([`TopicSpec::validate`](mailroom::TopicSpec::validate)),
    /// at the key of the file that set the bad value.
    #[error("{file}: {key}: {error}")]
    Topic {
        /// The file (or `environment`).
        file: String,
        /// Dotted key path, e.g. `topic[0].lease`.
        key: String,
        /// The runtime's reason.
        error: mailroom::SpecError,
    },
    /// A source the runtime refuses ([`SourceSpec::validate`](mailroom::SourceSpec::validate)),
    /// at the key of the file that set the bad value.
    #[error("{file}: {key}: {error}")]
    Source {
        /// The file (or `environment`).
        file: String,
        /// Dotted key path, e.g. `source[0].max_body`.
        key: String,
        /// The runtime's reason.
        error: mailroom::SourceSpecError,
    },
    /// Alert thresholds the runtime refuses
    /// ([`AlertRules::validate`](mailroom::AlertRules::validate)), at their key.
    #[error("{file}: {key}: {error}")]
    Alerts {
        /// The file (or `environment`).
        file: String,
        /// Dotted key path, e.g. `alerts.failure_rate`.
        key: String,
        /// The runtime's reason.
        error: mailroom::AlertRulesError,
    },
}
