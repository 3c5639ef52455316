//! A whole [`Config`] turned into the runtime's validated specs and built-in
//! handlers: what `serve` hands to the engine and `mailroom config check`
//! prints.

use crate::amqp::AmqpPlan;
use crate::error::ConfigError;
use crate::file::Config;
use crate::handler::handler;
use crate::source::source_spec;
use crate::topic::topic_spec;
use mailroom::handler::SharedHandler;
use mailroom::handler::http::HttpHandler;
use mailroom::{AlertNotify, AlertRules, EngineBuilder, Retention, SourceSpec, Store, TopicSpec};
use std::sync::Arc;

/// Everything a configuration declares, validated and built (handlers
/// included), without a store.
#[derive(Debug)]
pub struct Specs {
    /// Topics, each with its built-in handler (`None`: pulled).
    pub topics: Vec<(TopicSpec, Option<SharedHandler>)>,
    /// The `[[source]]` webhook endpoints, validated (AMQP sources are in
    /// `amqp`).
    pub sources: Vec<SourceSpec>,
    /// `[amqp]`, AMQP sources and AMQP handlers, by broker. Take it out
    /// (`std::mem::take`) before [`into_builder`](Self::into_builder) to
    /// start its connections once the engine is built.
    pub amqp: AmqpPlan,
    /// `[retention]`: how long payloads and dedup rows are kept.
    pub retention: Retention,
    /// `[alerts]`: the thresholds maintenance evaluates.
    pub alerts: AlertRules,
    /// Where alert transitions are POSTed (`[alerts] notify`).
    pub alert_notify: Option<AlertNotify>,
}

impl Specs {
    /// Validates `config` and builds its topics, handlers and sources; the
    /// first problem is an error naming its key.
    pub fn from_config(config: &Config) -> Result<Specs, ConfigError> {
        let mut amqp = crate::amqp::plan(config)?;
        let mut topics = Vec::new();
        for (i, t) in config.topics.iter().enumerate() {
            let mut spec = topic_spec(t, i, config)?;
            let handler = match &t.handler {
                Some(h) => handler(h, &spec, i, config, &mut amqp)?,
                None => None,
            };
            if let Some(dl) = &t.dead_letter {
                let (relay, relay_handler) =
                    crate::amqp::dead_letter(dl, &spec, i, config, &mut amqp)?;
                spec.dead_letter = Some(relay.name.clone());
                topics.push((relay, Some(relay_handler)));
            }
            topics.push((spec, handler));
        }
        let mut sources = Vec::new();
        for (i, s) in config.sources.iter().enumerate() {
            let Some(consumer) = crate::amqp::source(s, i, config)? else {
                sources.push(source_spec(s, i, config)?);
                continue;
            };
            // An AMQP source's undeclared topic gets defaults, as a webhook source's does.
            let topic = &consumer.1.topic;
            if !topics.iter().any(|(t, _)| &t.name == topic) {
                topics.push((TopicSpec::new(topic.clone()), None));
            }
            amqp.sources.push(consumer);
        }
        otlp_traces_url(config)?;
        Ok(Specs {
            topics,
            sources,
            amqp,
            alerts: alert_rules(config)?,
            alert_notify: alert_notify(config)?,
            retention: Retention {
                done: config.retention.done,
                dead: config.retention.dead,
                dedup: config.retention.dedup,
            },
        })
    }

    /// An engine builder over `store` holding these topics (with their
    /// built-in handlers), sources, retention and alert thresholds.
    pub fn into_builder(self, store: Arc<dyn Store>) -> EngineBuilder {
        let mut b = mailroom::Engine::builder(store)
            .retention(self.retention)
            .alerts(self.alerts);
        if let Some(n) = self.alert_notify {
            b = b.alert_notify(n);
        }
        for (spec, handler) in self.topics {
            if let Some(h) = handler {
                b = b.handler(spec.name.clone(), h);
            }
            b = b.topic(spec);
        }
        for s in self.sources {
            b = b.source(s);
        }
        b
    }
}

fn alert_rules(config: &Config) -> Result<AlertRules, ConfigError> {
    let a = &config.alerts;
    let rules = AlertRules {
        dead_letter_depth: a.dead_letter_depth,
        backlog: a.backlog,
        failure_rate: a.failure_rate,
        processing_time: a.processing_time,
    };
    rules.validate().map_err(|error| ConfigError::Alerts {
        file: config.origin.clone(),
        key: format!("alerts.{}", error.key()),
        error,
    })?;
    Ok(rules)
}

/// `[telemetry] otlp_endpoint`: the traces URL (`<endpoint>/v1/traces`) of
/// an http(s) collector, or `None` when export is off.
pub fn otlp_traces_url(config: &Config) -> Result<Option<reqwest::Url>, ConfigError> {
    let Some(endpoint) = &config.telemetry.otlp_endpoint else {
        return Ok(None);
    };
    let http = |u: &reqwest::Url| matches!(u.scheme(), "http" | "https") && u.has_host();
    reqwest::Url::parse(endpoint)
        .ok()
        .filter(http)
        .and_then(|_| {
            let base = endpoint.trim_end_matches('/');
            reqwest::Url::parse(&format!("{base}/v1/traces")).ok()
        })
        .map(Some)
        .ok_or_else(|| {
            config.invalid(
                "telemetry.otlp_endpoint",
                format!("{endpoint:?} is not an http(s) URL"),
            )
        })
}

/// `[alerts] notify = { http = {...} }`: an http(s) URL and a decodable secret.
fn alert_notify(config: &Config) -> Result<Option<AlertNotify>, ConfigError> {
    let Some(n) = &config.alerts.notify else {
        return Ok(None);
    };
    let url = reqwest::Url::parse(&n.http.url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| {
            config.invalid(
                "alerts.notify.http.url",
                format!(
                    "{:?} is not an http(s) URL",
                    mailroom::redact::url(&n.http.url)
                ),
            )
        })?;
    let secret = n
        .http
        .secret
        .as_deref()
        .map(HttpHandler::decode_secret)
        .transpose()
        .map_err(|m| config.invalid("alerts.notify.http.secret", m))?;
    let mut notify = AlertNotify::new(url, secret);
    if let Some(t) = n.http.timeout {
        notify.timeout = t;
    }
    Ok(Some(notify))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn specs(toml: &str) -> Result<Specs, String> {
        let config = Config::from_toml("m.toml", toml, &|_| None).map_err(|e| e.to_string())?;
        Specs::from_config(&config).map_err(|e| e.to_string())
    }

    /// `[alerts]` thresholds become the engine's rules; out-of-range ones are refused by key.
    #[test]
    fn alert_thresholds_become_rules_and_bad_ones_are_named() {
        let t = specs(
            "[alerts]\ndead_letter_depth = 10\nbacklog = 1000\nfailure_rate = 0.05\nprocessing_time = \"5s\"\n",
        )
        .unwrap();
        assert_eq!(
            t.alerts,
            AlertRules {
                dead_letter_depth: Some(10),
                backlog: Some(1000),
                failure_rate: Some(0.05),
                processing_time: Some(Duration::from_secs(5)),
            }
        );
        assert!(!specs("").unwrap().alerts.any());
        for bad in ["0", "1.5", "-0.1", "nan"] {
            let err = specs(&format!("[alerts]\nfailure_rate = {bad}\n"))
                .map(|_| ())
                .unwrap_err();
            assert!(err.contains("alerts.failure_rate"), "{bad}: {err}");
        }
        let err = specs("[alerts]\nprocessing_time = \"0s\"\n")
            .map(|_| ())
            .unwrap_err();
        assert!(err.contains("alerts.processing_time"), "{err}");
    }

    /// `[alerts] notify` becomes the engine's notifier; a URL that is not
    /// http(s), an undecodable secret or an unknown key is refused by key.
    #[test]
    fn alert_notifications_need_an_http_url_and_a_decodable_secret() {
        let t = specs(
            "[alerts]\nbacklog = 1\nnotify = { http = { url = \"http://127.0.0.1:9/alerts\", secret = \"whsec_c2VjcmV0\", timeout = \"3s\" } }\n",
        )
        .unwrap();
        let n = t.alert_notify.expect("notify");
        assert_eq!(n.url.as_str(), "http://127.0.0.1:9/alerts");
        assert_eq!(n.secret.as_deref(), Some(&b"secret"[..]));
        assert_eq!(n.timeout, Duration::from_secs(3));
        assert!(specs("").unwrap().alert_notify.is_none());
        for (notify, key) in [
            (
                r#"{ http = { url = "ftp://x/" } }"#,
                "alerts.notify.http.url",
            ),
            (
                r#"{ http = { url = "not a url" } }"#,
                "alerts.notify.http.url",
            ),
            (
                r#"{ http = { url = "http://x/", secret = "whsec_%%" } }"#,
                "alerts.notify.http.secret",
            ),
            (
                r#"{ http = { url = "http://x/", sekret = "s" } }"#,
                "sekret",
            ),
        ] {
            let err = specs(&format!("[alerts]\nnotify = {notify}\n")).unwrap_err();
            assert!(err.contains(key), "{notify}: {err}");
        }
    }

    /// Refused alert thresholds carry the runtime's typed reason (the one the
    /// engine builder gives hand-built rules) at their key, with the text
    /// `config check` printed before.
    #[test]
    fn an_otlp_endpoint_becomes_the_traces_url_and_a_bad_one_is_named() {
        let traces = |text: &str| {
            let config = Config::from_toml("m.toml", text, &|_| None).unwrap();
            otlp_traces_url(&config).map(|u| u.map(|u| u.to_string()))
        };
        assert_eq!(traces("").unwrap(), None);
        for endpoint in ["http://127.0.0.1:4318", "http://127.0.0.1:4318/"] {
            let text = format!("[telemetry]\notlp_endpoint = \"{endpoint}\"\n");
            assert_eq!(
                traces(&text).unwrap().as_deref(),
                Some("http://127.0.0.1:4318/v1/traces")
            );
        }
        for bad in ["127.0.0.1:4318", "ftp://collector", "http://"] {
            let text = format!("[telemetry]\notlp_endpoint = \"{bad}\"\n");
            let err = traces(&text).unwrap_err().to_string();
            assert!(
                err.starts_with("m.toml: telemetry.otlp_endpoint: "),
                "{err}"
            );
            let config = Config::from_toml("m.toml", &text, &|_| None).unwrap();
            assert!(
                Specs::from_config(&config).is_err(),
                "config check refuses {bad}"
            );
        }
    }

    #[test]
    fn refused_alerts_name_the_key_and_carry_the_rules_error() {
        let config =
            Config::from_toml("m.toml", "[alerts]\nfailure_rate = 1.5\n", &|_| None).unwrap();
        let err = Specs::from_config(&config).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Alerts { key, error: mailroom::AlertRulesError::FailureRate(_), .. } if key == "alerts.failure_rate"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "m.toml: alerts.failure_rate: a share of attempts in (0, 1], e.g. 0.05 for 5%; got 1.5"
        );
        let err = specs("[alerts]\nprocessing_time = \"0s\"\n").unwrap_err();
        assert_eq!(err, "m.toml: alerts.processing_time: must be more than 0");
    }

    /// A topic and retention left unset in the file get exactly the runtime's
    /// defaults (`TopicSpec::new`, `Retention::default`): one home for each.
    /// A command handler is a bare argv or a table with the variables it
    /// is also given; a name that is no variable name is refused, naming
    /// the key.
    #[test]
    fn command_handlers_take_an_argv_or_a_table_with_env() {
        for handler in [
            "{ command = [\"./handle.sh\", \"-v\"] }",
            "{ command = { argv = [\"./handle.sh\"], env = [\"HANDLER_TOKEN\", \"_X1\"] } }",
            "{ command = { argv = [\"./handle.sh\"] } }",
        ] {
            let t = specs(&format!(
                "[[topic]]\nname = \"jobs\"\nhandler = {handler}\n"
            ));
            assert!(t.is_ok_and(|t| t.topics[0].1.is_some()), "{handler}");
        }
        let err = specs(
            "[[topic]]\nname = \"jobs\"\nhandler = { command = { argv = [\"x\"], env = [\"A=B\"] } }\n",
        )
        .expect_err("refused");
        assert!(
            err.to_string().contains("topic[0].handler.command.env"),
            "{err}"
        );
    }

    #[test]
    fn unset_keys_take_the_runtime_defaults() {
        let t = specs("[[topic]]\nname = \"jobs\"\n").unwrap();
        assert_eq!(t.topics[0].0, TopicSpec::new("jobs"));
        assert_eq!(t.retention, Retention::default());
        let t = specs("[[topic]]\nname = \"jobs\"\nretry = { base = \"5s\" }\n").unwrap();
        let mut expected = TopicSpec::new("jobs");
        if let mailroom::Backoff::Exponential { base, .. } = &mut expected.retry.backoff {
            *base = Duration::from_secs(5);
        }
        assert_eq!(t.topics[0].0, expected);
    }

    /// A topic the runtime refuses is reported at the key that set the bad
    /// value, carrying the runtime's own typed reason (the same the engine
    /// builder gives a hand-built spec).
    #[test]
    fn refused_topics_name_the_key_and_carry_the_spec_error() {
        let refused = |topic: &str| {
            let toml = format!("[[topic]]\nname = \"t\"\n{topic}\n");
            let config = Config::from_toml("m.toml", &toml, &|_| None).unwrap();
            match Specs::from_config(&config) {
                Err(ConfigError::Topic { key, error, .. }) => (key, error),
                other => panic!("{topic}: {other:?}"),
            }
        };
        let (key, error) = refused("timeout = \"30s\"\nlease = \"30s\"");
        assert_eq!(key, "topic[0].lease");
        assert!(matches!(error, mailroom::SpecError::LeaseTooShort { .. }));
        let (key, _) = refused("mode = \"batch\"\nbatch = { schedule = \"0 0 * *\" }");
        assert_eq!(key, "topic[0].batch.schedule");
        let (key, _) = refused("mode = \"batch\"\nbatch = { max_size = 0 }");
        assert_eq!(key, "topic[0].batch.max_size");
        let (key, _) = refused("retry = { jitter = 1.5 }");
        assert_eq!(key, "topic[0].retry.jitter");
        let err = specs("[[topic]]\nname = \"t\"\nlease = \"1s\"\n").unwrap_err();
        assert_eq!(
            err,
            "m.toml: topic[0].lease: lease (1s) must be longer than timeout (30s)"
        );
    }

    /// Scheduling limits: `rate` and `max_running` are read into the spec, and
    /// a malformed rate, a `max_running` of 0 or a limit on a batch topic is
    /// refused at its key.
    #[test]
    fn topic_limits_are_read_and_refused_at_their_key() {
        let config = Config::from_toml(
            "m.toml",
            "[[topic]]\nname = \"t\"\nrate = \"50/m\"\nmax_running = 4\n",
            &|_| None,
        )
        .unwrap();
        let (t, _) = Specs::from_config(&config).unwrap().topics.remove(0);
        assert_eq!(t.rate.map(|r| r.to_string()).as_deref(), Some("50/m"));
        assert_eq!(t.max_running, Some(4));
        assert_eq!(
            specs("[[topic]]\nname = \"t\"\nrate = \"50/d\"\n")
                .map(|_| ())
                .unwrap_err(),
            "m.toml: topic[0].rate: \"50/d\" is not a rate (expected N/s, N/m or N/h with N at least 1, e.g. \"50/s\")"
        );
        assert_eq!(
            specs("[[topic]]\nname = \"t\"\nmax_running = 0\n")
                .map(|_| ())
                .unwrap_err(),
            "m.toml: topic[0].max_running: max_running must be at least 1"
        );
        let err = specs("[[topic]]\nname = \"t\"\nmode = \"batch\"\nrate = \"5/s\"\n");
        let err = err.map(|_| ()).unwrap_err();
        assert!(
            err.starts_with("m.toml: topic[0].rate: rate is not supported on batch"),
            "{err}"
        );
    }

    /// A source the runtime refuses is reported at its key with the runtime's
    /// typed reason, and the message `config check` prints is unchanged.
    #[test]
    fn refused_sources_name_the_key_and_carry_the_spec_error() {
        let config =
            Config::from_toml("m.toml", "[[source]]\nname = \"a b\"\n", &|_| None).unwrap();
        let err = Specs::from_config(&config).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Source { key, error: mailroom::SourceSpecError::Name, .. } if key == "source[0].name"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "m.toml: source[0].name: use letters, digits, '-', '_' or '.' (it is a URL segment)"
        );
        let err = specs("[[source]]\nname = \"s\"\nmax_body = 0\n").unwrap_err();
        assert_eq!(err, "m.toml: source[0].max_body: must be more than 0");
    }
}
