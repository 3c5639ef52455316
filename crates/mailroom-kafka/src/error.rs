//! The crate's one error type.

/// `Result` with [`KafkaError`] as the default error.
pub type Result<T, E = KafkaError> = std::result::Result<T, E>;

/// What went wrong talking to the Kafka cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// A Kafka operation failed (creating a client, a request the broker
    /// refused or did not answer in time).
    #[error("{action}: {source}")]
    Broker {
        /// What was being done.
        action: String,
        /// librdkafka's error, carrying the broker's error code if any.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The broker refused one topic of a request (CreateTopics,
    /// DescribeConfigs): its error code's name.
    #[error("{action} {topic:?}: the broker answered {code}")]
    Refused {
        /// What was being done.
        action: String,
        /// The topic.
        topic: String,
        /// The broker's error code, by name.
        code: String,
    },
    /// A setting Kafka cannot carry, or one the engine does not know (a
    /// topic the source stores into, no brokers).
    #[error("{0}")]
    Invalid(String),
}
