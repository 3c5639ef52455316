//! The crate's one error type.

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

/// `Result` with [`AmqpError`] as the default error.
pub type Result<T, E = AmqpError> = std::result::Result<T, E>;

/// What went wrong talking to the broker.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// The broker already holds this exchange or queue, declared with other
    /// settings (AMQP 0-9-1 `PRECONDITION_FAILED`, 406). The broker closed
    /// the channel; nothing after it was declared.
    #[error("{object} {name:?} already exists with a different {argument:?} ({reply})")]
    Inequivalent {
        /// `queue` or `exchange`.
        object: String,
        /// Its name.
        name: String,
        /// The argument or property that differs (`x-message-ttl`, `durable`, `type`...).
        argument: String,
        /// The broker's reply text, which also says both values.
        reply: String,
    },
    /// An AMQP operation failed (connection, channel, declare, publish...).
    #[error("{action}: {source}")]
    Broker {
        /// What was being done.
        action: String,
        /// lapin's error, carrying the broker's reply code and text if any.
        #[source]
        source: lapin::Error,
    },
    /// The broker did not answer within mailroom's limit (connecting,
    /// setting a connection up): a broker that is down, or a frozen network
    /// path that drops or holds packets without closing the connection.
    #[error("{action}: no answer from the broker within {} s", limit.as_secs())]
    NoAnswer {
        /// What was being done.
        action: String,
        /// How long mailroom waited.
        limit: std::time::Duration,
    },
    /// A name or value that AMQP cannot carry (a name over 255 bytes, a TTL
    /// over `u32::MAX` milliseconds...).
    #[error("{0}")]
    Invalid(String),
}

impl AmqpError {
    /// The broker (or AMQP itself) refused what was asked: a conflicting
    /// declare, a missing exchange, access refused, a name too long. Asking
    /// again will not help, unlike a broker that cannot be reached.
    pub fn is_refused(&self) -> bool {
        match self {
            AmqpError::Inequivalent { .. } | AmqpError::Invalid(_) => true,
            AmqpError::NoAnswer { .. } => false,
            AmqpError::Broker { source, .. } => matches!(
                source.kind(),
                lapin::ErrorKind::ProtocolError(e) if matches!(e.kind(), AMQPErrorKind::Soft(_))
            ),
        }
    }

    /// Wraps lapin's error for `action`, recognising the broker's
    /// "inequivalent arg" refusal so that it names the object and argument.
    pub(crate) fn broker(action: impl Into<String>, source: lapin::Error) -> Self {
        if let lapin::ErrorKind::ProtocolError(e) = source.kind() {
            if matches!(
                e.kind(),
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)
            ) {
                let reply = e.get_message().to_string();
                if let Some((object, name, argument)) = parse_inequivalent(&reply) {
                    return AmqpError::Inequivalent {
                        object,
                        name,
                        argument,
                        reply,
                    };
                }
            }
        }
        AmqpError::Broker {
            action: action.into(),
            source,
        }
    }
}

/// Reads RabbitMQ's text `PRECONDITION_FAILED - inequivalent arg
/// 'x-message-ttl' for queue 'q' in vhost '/': received ... but current is
/// ...` into (object, name, argument).
fn parse_inequivalent(reply: &str) -> Option<(String, String, String)> {
    let rest = reply.split_once("inequivalent arg '")?.1;
    let (argument, rest) = rest.split_once("' for ")?;
    let (object, rest) = rest.split_once(" '")?;
    let (name, _) = rest.split_once('\'')?;
    Some((object.to_string(), name.to_string(), argument.to_string()))
}

/// A name or key as an AMQP short string (at most 255 bytes).
pub(crate) fn short(what: &str, value: &str) -> Result<lapin::types::ShortString> {
    lapin::types::ShortString::try_new(value).map_err(|_| {
        AmqpError::Invalid(format!(
            "{what} {value:?} is longer than 255 bytes, the AMQP limit"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RabbitMQ's refusal text is read into the object, its name and the argument that differs.
    #[test]
    fn rabbitmq_inequivalent_replies_name_object_and_argument() {
        let reply = "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'orders.created' in vhost '/': received the value '1000' of type 'signedint' but current is none";
        assert_eq!(
            parse_inequivalent(reply),
            Some((
                "queue".to_string(),
                "orders.created".to_string(),
                "x-message-ttl".to_string()
            ))
        );
        let reply = "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'ev' in vhost '/': received 'topic' but current is 'direct'";
        assert_eq!(
            parse_inequivalent(reply),
            Some(("exchange".into(), "ev".into(), "type".into()))
        );
        assert_eq!(
            parse_inequivalent("PRECONDITION_FAILED - unknown delivery tag 1"),
            None
        );
    }
}
