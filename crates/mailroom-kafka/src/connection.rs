//! `[kafka]`: the settings every client of one cluster shares.

use crate::error::{KafkaError, Result};
use rdkafka::ClientConfig;

/// The cluster mailroom talks to (`[kafka] brokers = "host:port,..."`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConnection {
    /// The bootstrap brokers, `host:port` separated by commas.
    pub brokers: String,
}

impl KafkaConnection {
    /// How long a client waits for the cluster to answer an admin request,
    /// metadata or a commit before the operation fails.
    pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

    /// A cluster reached through `brokers` (`host:port,...`).
    pub fn new(brokers: impl Into<String>) -> Result<Self> {
        let brokers = brokers.into();
        let each: Vec<&str> = brokers.split(',').map(str::trim).collect();
        if each.iter().any(|b| b.is_empty()) {
            return Err(KafkaError::Invalid(format!(
                "kafka brokers {brokers:?}: give host:port, separated by commas"
            )));
        }
        if let Some(bad) = each.iter().find(|b| match b.rsplit_once(':') {
            Some((host, port)) => host.is_empty() || port.parse::<u16>().is_err(),
            None => true,
        }) {
            return Err(KafkaError::Invalid(format!(
                "kafka broker {bad:?} is not host:port"
            )));
        }
        Ok(Self {
            brokers: each.join(","),
        })
    }

    /// librdkafka's settings for a client of this cluster, which every
    /// client mailroom makes starts from (and an embedder's own may).
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("client.id", "mailroom")
            // librdkafka logs through its own logger otherwise; errors reach
            // mailroom through each call's result.
            .set("log.connection.close", "false");
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A brokers list is host:port pairs; anything else is refused when
    /// the configuration is read, not when a client first connects.
    #[test]
    fn brokers_are_host_port_pairs() {
        assert_eq!(
            KafkaConnection::new(" a:9092, b:9093 ")
                .map(|c| c.brokers)
                .ok(),
            Some("a:9092,b:9093".to_string())
        );
        for bad in ["", "a", "a:", ":9092", "a:x", "a:9092,", "a:70000"] {
            assert!(KafkaConnection::new(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
