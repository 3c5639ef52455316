//! The RabbitMQ side of a configuration: `[amqp]` turned
//! into a [`mailroom_amqp::Topology`], `[[source]] amqp = {...}` into
//! [`AmqpSourceSpec`]s and `handler = { amqp = {...} }` into
//! [`AmqpHandler`]s, grouped by broker URL in an [`AmqpPlan`].

use crate::error::ConfigError;
use crate::file::{
    AmqpArgument, AmqpConfig, AmqpDeadLetter, AmqpHandlerConfig, AmqpQueueConfig, Config,
    FieldConfig, SourceConfig, TopicDeadLetterConfig,
};
use crate::source::field;
use mailroom::Engine;
use mailroom::handler::SharedHandler;
use mailroom::{Backoff, RetryPolicy, TopicSpec};
use mailroom_amqp::{
    AmqpConnection, AmqpError, AmqpHandler, AmqpHandlerSpec, AmqpSource, AmqpSourceSpec,
    DeadLetterRoute, ExchangeSpec, ExchangeType, Overflow, QueueArgument, QueueSpec, QueueType,
    Topology, declare::TYPED_ARGUMENTS,
};
use std::sync::Arc;
use std::time::Duration;

/// Longest name AMQP 0-9-1 carries (a short string).
const MAX_NAME: usize = 255;

/// Everything AMQP a configuration runs, grouped by broker.
#[derive(Debug, Default)]
pub struct AmqpPlan {
    /// `[amqp].url`: where [`topology`](Self::topology) is declared.
    pub url: Option<String>,
    /// `[amqp]`'s exchanges, queues and bindings.
    pub topology: Topology,
    /// AMQP sources, each with its broker URL.
    pub sources: Vec<(String, AmqpSourceSpec)>,
    /// AMQP handlers, each with its broker URL and topic.
    pub handlers: Vec<AmqpHandlerPlan>,
}

/// A topic's AMQP handler and where it publishes.
#[derive(Debug)]
pub struct AmqpHandlerPlan {
    /// The broker it publishes to: handlers and sources sharing a URL share
    /// one connection.
    pub url: String,
    /// The topic it handles.
    pub topic: String,
    /// The handler (a clone of the one registered for the topic).
    pub handler: AmqpHandler,
}

impl AmqpPlan {
    /// No topology, source or handler: nothing to connect to.
    pub fn is_empty(&self) -> bool {
        self.urls().is_empty()
    }

    /// The distinct broker URLs, `[amqp].url` first.
    pub fn urls(&self) -> Vec<&str> {
        let mut urls: Vec<&str> = vec![];
        let all = self.url.iter().map(String::as_str);
        let all = all
            .chain(self.sources.iter().map(|(u, _)| u.as_str()))
            .chain(self.handlers.iter().map(|h| h.url.as_str()));
        for u in all {
            if !urls.contains(&u) {
                urls.push(u);
            }
        }
        urls
    }

    /// One supervised connection per broker URL: the topology on
    /// `[amqp].url`'s, each source and handler on its own URL's. The engine
    /// must hold the sources' topics (built from the same [`Specs`](crate::Specs)).
    pub fn connections(&self, engine: &Engine) -> Result<Vec<AmqpConnection>, AmqpError> {
        let mut connections = vec![];
        for url in self.urls() {
            let mut conn = AmqpConnection::new(url)?;
            if self.url.as_deref() == Some(url) {
                conn = conn.topology(self.topology.clone());
            }
            for (_, spec) in self.sources.iter().filter(|(u, _)| u == url) {
                conn = conn.source(AmqpSource::new(engine.clone(), spec.clone())?);
            }
            for h in self.handlers.iter().filter(|h| h.url == url) {
                conn = conn.handler(h.handler.clone());
            }
            connections.push(conn);
        }
        Ok(connections)
    }
}

/// `[amqp]` of `cfg`, validated (an empty plan when absent).
pub(crate) fn plan(cfg: &Config) -> Result<AmqpPlan, ConfigError> {
    let Some(a) = &cfg.amqp else {
        return Ok(AmqpPlan::default());
    };
    if let Some(url) = &a.url {
        check_url(url, "amqp.url", cfg)?;
    } else if !a.exchanges.is_empty() || !a.queues.is_empty() || !a.bindings.is_empty() {
        return Err(cfg.invalid(
            "amqp.url",
            "missing: the broker to declare exchanges and queues on, e.g. \"amqp://127.0.0.1:5672/%2f\"",
        ));
    }
    let mut topology = Topology::default();
    for (i, e) in a.exchanges.iter().enumerate() {
        let at = format!("amqp.exchange[{i}]");
        check_name(&e.name, &format!("{at}.name"), cfg)?;
        if topology.exchanges.iter().any(|x| x.name == e.name) {
            return Err(cfg.invalid(at + ".name", format!("{:?} is declared twice", e.name)));
        }
        let kind: ExchangeType = e
            .kind
            .parse()
            .map_err(|m| cfg.invalid(format!("{at}.kind"), m))?;
        topology.exchanges.push(ExchangeSpec {
            durable: e.durable,
            ..ExchangeSpec::new(&e.name, kind)
        });
    }
    for (i, q) in a.queues.iter().enumerate() {
        let spec = queue(q, &format!("amqp.queue[{i}]"), &topology, cfg)?;
        topology.queues.push(spec);
    }
    extra_bindings(a, &mut topology, cfg)?;
    Ok(AmqpPlan {
        url: a.url.clone(),
        topology,
        ..AmqpPlan::default()
    })
}

fn queue(
    q: &AmqpQueueConfig,
    at: &str,
    topology: &Topology,
    cfg: &Config,
) -> Result<QueueSpec, ConfigError> {
    check_name(&q.name, &format!("{at}.name"), cfg)?;
    if topology.queues.iter().any(|x| x.name == q.name) {
        return Err(cfg.invalid(
            format!("{at}.name"),
            format!("{:?} is declared twice", q.name),
        ));
    }
    let (dead_letter, dead_letter_route) = match &q.dead_letter {
        AmqpDeadLetter::On(on) => (*on, DeadLetterRoute::default()),
        AmqpDeadLetter::Route(r) => {
            for (k, v) in [("exchange", &r.exchange), ("routing_key", &r.routing_key)] {
                if let Some(v) = v {
                    check_name(v, &format!("{at}.dead_letter.{k}"), cfg)?;
                }
            }
            let route = DeadLetterRoute {
                exchange: r.exchange.clone(),
                routing_key: r.routing_key.clone(),
            };
            (true, route)
        }
    };
    let queue_type = q
        .queue_type
        .as_deref()
        .map(|t| {
            t.parse::<QueueType>()
                .map_err(|m| cfg.invalid(format!("{at}.type"), m))
        })
        .transpose()?;
    let overflow = q
        .overflow
        .as_deref()
        .map(|o| {
            o.parse::<Overflow>()
                .map_err(|m| cfg.invalid(format!("{at}.overflow"), m))
        })
        .transpose()?;
    let mut extra = vec![];
    for (k, v) in &q.arguments {
        let key = format!("{at}.arguments.{k}");
        check_name(k, &key, cfg)?;
        if TYPED_ARGUMENTS.contains(&k.as_str()) {
            return Err(cfg.invalid(key, "set by its own key of [[amqp.queue]]"));
        }
        extra.push((k.clone(), argument(v)));
    }
    let mut spec = QueueSpec {
        durable: q.durable,
        ttl: q.ttl,
        max_length: q.max_length,
        dead_letter,
        dead_letter_route,
        queue_type,
        delivery_limit: q.delivery_limit,
        max_priority: q.max_priority,
        overflow,
        exclusive: q.exclusive,
        auto_delete: q.auto_delete,
        extra,
        ..QueueSpec::new(&q.name)
    };
    if q.ttl.is_some_and(|t| t.is_zero()) {
        return Err(cfg.invalid(format!("{at}.ttl"), "must be more than 0"));
    }
    for (j, b) in q.bind.iter().flat_map(|b| b.all()).enumerate() {
        let bat = match &q.bind {
            Some(crate::file::AmqpBinds::Many(_)) => format!("{at}.bind[{j}]"),
            _ => format!("{at}.bind"),
        };
        check_exchange(&b.exchange, &format!("{bat}.exchange"), topology, cfg)?;
        check_short(&b.routing_key, &format!("{bat}.routing_key"), cfg)?;
        spec = spec.bind(&b.exchange, &b.routing_key);
    }
    if q.max_priority == Some(0) {
        return Err(cfg.invalid(format!("{at}.max_priority"), "must be 1 to 255"));
    }
    // The broker's limits (TTL in u32 milliseconds, max length in i64) and
    // what a queue type refuses, named at the queue when not at one key.
    if let Err(e) = spec.arguments() {
        let key = if q.ttl.is_some_and(|t| t.as_millis() > u128::from(u32::MAX)) {
            format!("{at}.ttl")
        } else {
            at.to_string()
        };
        return Err(cfg.invalid(key, e.to_string()));
    }
    Ok(spec)
}

fn argument(v: &AmqpArgument) -> QueueArgument {
    match v {
        AmqpArgument::Bool(b) => QueueArgument::Bool(*b),
        AmqpArgument::Int(n) => QueueArgument::Int(*n),
        AmqpArgument::Text(t) => QueueArgument::Text(t.clone()),
    }
}

/// `[[amqp.binding]]`: each names a declared queue and exchange.
fn extra_bindings(
    a: &AmqpConfig,
    topology: &mut Topology,
    cfg: &Config,
) -> Result<(), ConfigError> {
    for (i, b) in a.bindings.iter().enumerate() {
        let at = format!("amqp.binding[{i}]");
        check_exchange(&b.exchange, &format!("{at}.exchange"), topology, cfg)?;
        check_short(&b.routing_key, &format!("{at}.routing_key"), cfg)?;
        let Some(q) = topology.queues.iter_mut().find(|q| q.name == b.queue) else {
            return Err(cfg.invalid(
                format!("{at}.queue"),
                format!("{:?} is not declared in [[amqp.queue]]", b.queue),
            ));
        };
        *q = std::mem::replace(q, QueueSpec::new("")).bind(&b.exchange, &b.routing_key);
    }
    Ok(())
}

/// A bound exchange must be declared, or be one the broker always has.
fn check_exchange(
    name: &str,
    key: &str,
    topology: &Topology,
    cfg: &Config,
) -> Result<(), ConfigError> {
    if topology.exchanges.iter().any(|e| e.name == name) || name.starts_with("amq.") {
        return Ok(());
    }
    Err(cfg.invalid(
        key,
        format!("exchange {name:?} is not declared in [[amqp.exchange]]"),
    ))
}

fn check_name(name: &str, key: &str, cfg: &Config) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(cfg.invalid(key, "must not be empty"));
    }
    check_short(name, key, cfg)
}

fn check_short(value: &str, key: &str, cfg: &Config) -> Result<(), ConfigError> {
    if value.len() > MAX_NAME {
        return Err(cfg.invalid(key, format!("longer than {MAX_NAME} bytes, the AMQP limit")));
    }
    Ok(())
}

/// An `amqp://` or `amqps://` URL whose TLS parameters hold (their files
/// are read now, so a missing CA file stops the start naming it).
fn check_url(url: &str, key: &str, cfg: &Config) -> Result<(), ConfigError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "amqp" | "amqps") && u.host_str().is_some() => {
            mailroom_amqp::Broker::parse(url)
                .map(|_| ())
                .map_err(|e| cfg.invalid(key, e.to_string()))
        }
        _ => Err(cfg.invalid(
            key,
            "not an AMQP URL like \"amqp://user:password@host:5672/%2f\"",
        )),
    }
}

/// `url`, else `[amqp].url`, at `key`.
fn url_or_default(url: &Option<String>, key: &str, cfg: &Config) -> Result<String, ConfigError> {
    let url = url
        .clone()
        .or_else(|| cfg.amqp.as_ref().and_then(|a| a.url.clone()))
        .ok_or_else(|| cfg.invalid(key, "missing (and [amqp] has no url to default to)"))?;
    check_url(&url, key, cfg)?;
    Ok(url)
}

/// `source[idx]` with `amqp = {...}`: its consumer's spec and broker URL.
/// Webhook-only keys are refused, since a queue has no requests to verify
/// and a message no request to bound or limit.
pub(crate) fn source(
    s: &SourceConfig,
    idx: usize,
    cfg: &Config,
) -> Result<Option<(String, AmqpSourceSpec)>, ConfigError> {
    let Some(a) = &s.amqp else { return Ok(None) };
    let at = |k: &str| format!("source[{idx}].{k}");
    let webhook_only = [
        ("preset", s.preset.is_some()),
        ("verify", s.verify.is_some()),
        ("max_body", s.max_body.is_some()),
        ("rate_limit", s.rate_limit.is_some()),
    ];
    if let Some((k, _)) = webhook_only.iter().find(|(_, given)| *given) {
        return Err(cfg.invalid(
            at(k),
            "webhook sources only: a queue's messages are not HTTP requests (the broker authenticates and bounds them)",
        ));
    }
    let url = url_or_default(&a.url, &at("amqp.url"), cfg)?;
    check_name(&a.queue, &at("amqp.queue"), cfg)?;
    if a.prefetch == 0 {
        return Err(cfg.invalid(
            at("amqp.prefetch"),
            "must be at least 1 (it bounds the deliveries stored at once)",
        ));
    }
    let field_at =
        |f: &Option<FieldConfig>, k: &str| f.as_ref().map(|f| field(f, &at(k), cfg)).transpose();
    let spec = AmqpSourceSpec {
        prefetch: a.prefetch,
        key: field_at(&s.key, "key")?,
        id: field_at(&s.id, "id")?,
        event_type: field_at(&s.event_type, "type")?,
        deliver_at: field_at(&s.deliver_at, "deliver_at")?,
        priority: field_at(&s.priority, "priority")?,
        version: field_at(&s.version, "version")?,
        ..AmqpSourceSpec::new(
            &s.name,
            s.topic.clone().unwrap_or_else(|| s.name.clone()),
            &a.queue,
        )
    };
    Ok(Some((url, spec)))
}

/// `handler = { amqp = {...} }` of `topic[idx]`: the handler and its broker URL.
pub(crate) fn handler(
    h: &AmqpHandlerConfig,
    idx: usize,
    cfg: &Config,
) -> Result<(String, AmqpHandler), ConfigError> {
    publisher(h, &format!("topic[{idx}].handler.amqp"), cfg, false)
}

/// A publisher configured at `at`; `dead_letters`: it publishes
/// dead-letter copies.
fn publisher(
    h: &AmqpHandlerConfig,
    at: &str,
    cfg: &Config,
    dead_letters: bool,
) -> Result<(String, AmqpHandler), ConfigError> {
    let at = |k: &str| format!("{at}.{k}");
    let url = url_or_default(&h.url, &at("url"), cfg)?;
    check_short(&h.exchange, &at("exchange"), cfg)?;
    if h.routing_key.is_empty() && h.exchange.is_empty() {
        return Err(cfg.invalid(
            at("routing_key"),
            "the default exchange (\"\") routes by queue name: give the queue's name",
        ));
    }
    if let Some(bad) = unknown_placeholder(&h.routing_key) {
        return Err(cfg.invalid(
            at("routing_key"),
            format!("unknown placeholder {{{bad}}}: use {{type}}, {{topic}} or {{key}}"),
        ));
    }
    if h.expiration
        .is_some_and(|e| e.is_zero() || e.as_millis() > u128::from(u32::MAX))
    {
        return Err(cfg.invalid(
            at("expiration"),
            format!("must be more than 0 and at most {} ms", u32::MAX),
        ));
    }
    let spec = AmqpHandlerSpec {
        envelope: h.envelope,
        environment: cfg.telemetry.environment.clone(),
        expiration: h.expiration,
        priority: h.priority,
        dead_letters,
        ..AmqpHandlerSpec::new(&h.exchange, &h.routing_key)
    };
    Ok((url, AmqpHandler::new(spec)))
}

/// The topic `dead_letter = { amqp = {...} }` of `topic[idx]` (`spec`)
/// hands its dead letters to, named `<topic>.dead-letter`, and its
/// publisher (also recorded in `plan`, to be attached to its connection).
/// Its copies are retried for about a month (every 5 minutes at most), so
/// a broker away for long still gets every dead event.
pub(crate) fn dead_letter(
    dl: &TopicDeadLetterConfig,
    spec: &TopicSpec,
    idx: usize,
    cfg: &Config,
    plan: &mut AmqpPlan,
) -> Result<(TopicSpec, SharedHandler), ConfigError> {
    let at = format!("topic[{idx}].dead_letter");
    let Some(a) = &dl.amqp else {
        return Err(cfg.invalid(at, "give amqp = { exchange, routing_key }"));
    };
    let name = format!("{}{DEAD_LETTER_SUFFIX}", spec.name);
    if cfg.topics.iter().any(|t| t.name == name) {
        return Err(cfg.invalid(
            at,
            format!("its dead letters go through topic {name:?}, which is declared too: rename that topic"),
        ));
    }
    let as_handler = AmqpHandlerConfig {
        url: a.url.clone(),
        exchange: a.exchange.clone(),
        routing_key: a.routing_key.clone(),
        envelope: a.envelope,
        expiration: None,
        priority: None,
    };
    let (url, publisher) = publisher(&as_handler, &format!("{at}.amqp"), cfg, true)?;
    let relay = TopicSpec::new(name.clone()).retry(RetryPolicy {
        max_attempts: DEAD_LETTER_ATTEMPTS,
        backoff: Backoff::Exponential {
            base: Duration::from_secs(1),
            factor: 2.0,
            max_delay: Duration::from_secs(300),
            jitter: RetryPolicy::DEFAULT_JITTER,
        },
    });
    plan.handlers.push(AmqpHandlerPlan {
        url,
        topic: name,
        handler: publisher.clone(),
    });
    Ok((relay, Arc::new(publisher)))
}

/// The dead-letter topic of topic `t` is `t` + this.
pub const DEAD_LETTER_SUFFIX: &str = ".dead-letter";

/// Attempts a dead-letter copy gets: about 30 days at one every 5 minutes.
const DEAD_LETTER_ATTEMPTS: u32 = 30 * 24 * 12;

/// The first `{name}` in `template` other than `type`, `topic` and `key`.
fn unknown_placeholder(template: &str) -> Option<&str> {
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let close = after.find('}')?;
        let name = &after[..close];
        if !matches!(name, "type" | "topic" | "key") {
            return Some(name);
        }
        rest = &after[close + 1..];
    }
    None
}

#[cfg(test)]
mod tests {
    use crate::{Config, Specs};
    use mailroom::Field;
    use mailroom_amqp::{Binding, ExchangeType};
    use std::time::Duration;

    fn specs(toml: &str) -> Result<Specs, String> {
        let config = Config::from_toml("m.toml", toml, &|_| None).map_err(|e| e.to_string())?;
        Specs::from_config(&config).map_err(|e| e.to_string())
    }

    fn refused(toml: &str) -> String {
        specs(toml).map(|_| ()).unwrap_err()
    }

    /// `dead_letter = { amqp = {...} }` gives the topic a dead-letter topic
    /// `<topic>.dead-letter`, published by a dead-letter publisher on the
    /// broker's connection (`[amqp].url` unless the route names one), with
    /// retries for a long outage; wrong routes are refused by key.
    #[test]
    fn a_broker_dead_letter_route_becomes_a_dead_letter_topic() {
        let t = specs(
            "[amqp]\nurl = \"amqp://x\"\n[[topic]]\nname = \"payments\"\nhandler = { pull = true }\ndead_letter = { amqp = { exchange = \"dlx\", routing_key = \"{topic}.dead\" } }\n",
        )
        .unwrap();
        let payments = t.topics.iter().find(|(s, _)| s.name == "payments").unwrap();
        assert_eq!(
            payments.0.dead_letter.as_deref(),
            Some("payments.dead-letter")
        );
        let relay = t
            .topics
            .iter()
            .find(|(s, _)| s.name == "payments.dead-letter")
            .unwrap();
        assert!(relay.1.is_some(), "the dead-letter topic has its publisher");
        assert!(relay.0.retry.max_attempts >= 1000);
        let h = &t.amqp.handlers[0];
        assert_eq!(
            (h.url.as_str(), h.topic.as_str()),
            ("amqp://x", "payments.dead-letter")
        );
        assert!(h.handler.spec().dead_letters);
        assert_eq!(h.handler.spec().exchange, "dlx");

        let cases = [
            (
                "[[topic]]\nname = \"t\"\ndead_letter = {}\n",
                "topic[0].dead_letter",
            ),
            (
                "[[topic]]\nname = \"t\"\ndead_letter = { amqp = { exchange = \"e\", routing_key = \"k\" } }\n",
                "topic[0].dead_letter.amqp.url",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[topic]]\nname = \"t\"\ndead_letter = { amqp = { exchange = \"e\", routing_key = \"{id}\" } }\n",
                "topic[0].dead_letter.amqp.routing_key",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[topic]]\nname = \"t\"\ndead_letter = { amqp = { exchange = \"e\", routing_key = \"k\" } }\n[[topic]]\nname = \"t.dead-letter\"\n",
                "topic[0].dead_letter",
            ),
        ];
        for (toml, key) in cases {
            let err = refused(toml);
            assert!(
                err.starts_with(&format!("m.toml: {key}")),
                "{toml}\n=> {err}"
            );
        }
    }

    /// The RabbitMQ part of the documented example configuration: a queue
    /// consumed as a source, an outbox topic publishing to an exchange, and
    /// the topology that binds them.
    const EXAMPLE: &str = r#"
[[source]]
name = "simulacoes"
topic = "simulacoes"
amqp = { url = "amqp://127.0.0.1:5672/%2f", queue = "simulacoes.created", prefetch = 10 }

[[topic]]
name = "outbox"
handler = { amqp = { url = "amqp://127.0.0.1:5672/%2f", exchange = "simulacoes.events", routing_key = "{type}" } }

[amqp]
url = "amqp://127.0.0.1:5672/%2f"
[[amqp.exchange]]
name = "simulacoes.events"
kind = "topic"
[[amqp.queue]]
name = "simulacoes.created"
bind = { exchange = "simulacoes.events", routing_key = "simulacao.created" }
ttl = "7d"
dead_letter = true
"#;

    /// The documented example parses into one topology, one source and one
    /// handler, all on one broker.
    #[test]
    fn the_documented_example_becomes_a_plan_on_one_connection() {
        let t = specs(EXAMPLE).unwrap();
        let plan = &t.amqp;
        assert_eq!(plan.urls(), vec!["amqp://127.0.0.1:5672/%2f"]);
        let ex = &plan.topology.exchanges[0];
        assert_eq!(
            (ex.name.as_str(), ex.kind, ex.durable),
            ("simulacoes.events", ExchangeType::Topic, true)
        );
        let q = &plan.topology.queues[0];
        assert_eq!(q.name, "simulacoes.created");
        assert_eq!(q.ttl, Some(Duration::from_secs(7 * 86400)));
        assert!(q.dead_letter && q.durable);
        assert_eq!(
            q.bindings,
            vec![Binding {
                exchange: "simulacoes.events".into(),
                routing_key: "simulacao.created".into()
            }]
        );
        let (url, source) = &plan.sources[0];
        assert_eq!(url, "amqp://127.0.0.1:5672/%2f");
        assert_eq!(
            (
                source.name.as_str(),
                source.topic.as_str(),
                source.queue.as_str(),
                source.prefetch
            ),
            ("simulacoes", "simulacoes", "simulacoes.created", 10)
        );
        assert_eq!(plan.handlers[0].topic, "outbox");
        assert_eq!(plan.handlers[0].handler.spec().routing_key, "{type}");
        assert!(!plan.handlers[0].handler.spec().envelope);
        // The source's undeclared topic exists, with defaults and no handler.
        assert!(
            t.topics
                .iter()
                .any(|(s, h)| s.name == "simulacoes" && h.is_none())
        );
        assert!(
            t.topics
                .iter()
                .any(|(s, h)| s.name == "outbox" && h.is_some())
        );
        assert!(
            t.sources.is_empty(),
            "an AMQP source is not a webhook source"
        );
    }

    /// Sources and handlers without `url` use `[amqp].url`; prefetch defaults to 10; `key` and
    /// `envelope` are read; bindings come from `bind` lists and `[[amqp.binding]]`.
    #[test]
    fn defaults_lists_and_extra_bindings() {
        let t = specs(
            r#"
[amqp]
url = "amqp://guest:guest@rabbit/%2f"
exchange = [{ name = "ev", kind = "direct", durable = false }]
queue = [{ name = "q", durable = false, max_length = 500, bind = [{ exchange = "ev", routing_key = "a" }, { exchange = "amq.topic", routing_key = "b.#" }] }]
binding = [{ queue = "q", exchange = "ev", routing_key = "c" }]

[[source]]
name = "in"
key = { json = "/customer" }
amqp = { queue = "q" }

[[topic]]
name = "out"
handler = { amqp = { exchange = "ev", routing_key = "{topic}.{key}", envelope = true } }
"#,
        )
        .unwrap();
        let plan = &t.amqp;
        assert_eq!(plan.urls(), vec!["amqp://guest:guest@rabbit/%2f"]);
        assert!(!plan.topology.exchanges[0].durable);
        let q = &plan.topology.queues[0];
        assert_eq!((q.durable, q.max_length), (false, Some(500)));
        let keys: Vec<_> = q.bindings.iter().map(|b| b.routing_key.as_str()).collect();
        assert_eq!(keys, ["a", "b.#", "c"]);
        assert_eq!(plan.sources[0].1.prefetch, 10);
        assert_eq!(plan.sources[0].1.key, Some(Field::Json("/customer".into())));
        assert!(plan.handlers[0].handler.spec().envelope);
    }

    /// Queue types, limits, flags, raw arguments and a named dead-letter
    /// route, and a handler's per-message expiration and priority, are read
    /// into the specs declared and published.
    #[test]
    fn queue_keys_and_publish_properties_are_read() {
        use mailroom_amqp::{DeadLetterRoute, Overflow, QueueArgument, QueueType};
        let t = specs(
            r#"
[amqp]
url = "amqp://x/%2f"
[[amqp.queue]]
name = "q"
type = "quorum"
delivery_limit = 5
overflow = "reject-publish"
dead_letter = { exchange = "dead", routing_key = "q-dead" }
arguments = { "x-queue-leader-locator" = "balanced", "x-single-active-consumer" = true, "x-max-length-bytes" = 1000 }
[[amqp.queue]]
name = "p"
type = "classic"
max_priority = 10
exclusive = true
auto_delete = true
[[topic]]
name = "t"
handler = { amqp = { exchange = "e", routing_key = "k", expiration = "10m", priority = 3 } }
"#,
        )
        .unwrap();
        let q = &t.amqp.topology.queues[0];
        assert_eq!(q.queue_type, Some(QueueType::Quorum));
        assert_eq!(q.delivery_limit, Some(5));
        assert_eq!(q.overflow, Some(Overflow::RejectPublish));
        assert!(q.dead_letter);
        assert_eq!(
            q.dead_letter_route,
            DeadLetterRoute {
                exchange: Some("dead".into()),
                routing_key: Some("q-dead".into())
            }
        );
        assert_eq!(
            q.extra,
            [
                ("x-max-length-bytes".to_string(), QueueArgument::Int(1000)),
                (
                    "x-queue-leader-locator".to_string(),
                    QueueArgument::Text("balanced".into())
                ),
                (
                    "x-single-active-consumer".to_string(),
                    QueueArgument::Bool(true)
                ),
            ]
        );
        let p = &t.amqp.topology.queues[1];
        assert_eq!(
            (p.queue_type, p.max_priority, p.exclusive, p.auto_delete),
            (Some(QueueType::Classic), Some(10), true, true)
        );
        let h = t.amqp.handlers[0].handler.spec();
        assert_eq!(
            (h.expiration, h.priority),
            (Some(Duration::from_secs(600)), Some(3))
        );
    }

    /// A topic whose handler publishes to RabbitMQ runs 1024 attempts at
    /// once unless it sets `concurrency` (its attempts wait on confirms);
    /// a batch topic, and a topic with another handler, keep 16.
    #[test]
    fn publishing_topics_default_to_a_deep_concurrency() {
        let t = specs(
            r#"
[amqp]
url = "amqp://x/%2f"
[[topic]]
name = "relay"
handler = { amqp = { exchange = "e", routing_key = "k" } }
[[topic]]
name = "tuned"
concurrency = 64
handler = { amqp = { exchange = "e", routing_key = "k" } }
[[topic]]
name = "batched"
mode = "batch"
handler = { amqp = { exchange = "e", routing_key = "k" } }
[[topic]]
name = "web"
handler = { http = { url = "http://127.0.0.1:9/" } }
"#,
        )
        .unwrap();
        let concurrency = |name: &str| {
            t.topics
                .iter()
                .find(|(s, _)| s.name == name)
                .map(|(s, _)| s.concurrency)
        };
        assert_eq!(
            concurrency("relay"),
            Some(mailroom_amqp::AmqpHandlerSpec::DEFAULT_CONCURRENCY)
        );
        assert_eq!(concurrency("relay"), Some(1024));
        assert_eq!(concurrency("tuned"), Some(64));
        assert_eq!(concurrency("batched"), Some(16));
        assert_eq!(concurrency("web"), Some(16));
    }

    /// Sources and handlers on other brokers get their own connections, `[amqp].url` first.
    #[test]
    fn one_connection_per_distinct_url() {
        let t = specs(
            r#"
[amqp]
url = "amqp://a/%2f"
[[source]]
name = "s1"
amqp = { queue = "q1", url = "amqp://b/%2f" }
[[source]]
name = "s2"
amqp = { queue = "q2" }
[[topic]]
name = "t"
handler = { amqp = { exchange = "", routing_key = "q", url = "amqp://b/%2f" } }
"#,
        )
        .unwrap();
        assert_eq!(t.amqp.urls(), vec!["amqp://a/%2f", "amqp://b/%2f"]);
        assert!(specs("").unwrap().amqp.is_empty());
    }

    /// Every mistake is refused with the key path that holds it.
    #[test]
    fn mistakes_name_their_key() {
        let cases = [
            (
                "[amqp]\n[[amqp.exchange]]\nname = \"e\"\nkind = \"topic\"\n",
                "amqp.url",
            ),
            ("[amqp]\nurl = \"http://x\"\n", "amqp.url"),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.exchange]]\nname = \"e\"\nkind = \"round-robin\"\n",
                "amqp.exchange[0].kind",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.exchange]]\nname = \"\"\nkind = \"topic\"\n",
                "amqp.exchange[0].name",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.exchange]]\nname = \"e\"\nkind = \"topic\"\n[[amqp.exchange]]\nname = \"e\"\nkind = \"topic\"\n",
                "amqp.exchange[1].name",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\nbind = { exchange = \"nope\" }\n",
                "amqp.queue[0].bind.exchange",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\nttl = \"0s\"\n",
                "amqp.queue[0].ttl",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\nttl = \"60d\"\n",
                "amqp.queue[0].ttl",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\nttl = \"soon\"\n",
                "amqp.queue[0].ttl",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\nlazy = true\n",
                "amqp.queue[0]",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\ntype = \"lazy\"\n",
                "amqp.queue[0].type",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\noverflow = \"spill\"\n",
                "amqp.queue[0].overflow",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\nmax_priority = 0\n",
                "amqp.queue[0].max_priority",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\ndelivery_limit = 3\n",
                "amqp.queue[0]",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\ntype = \"stream\"\ndead_letter = true\n",
                "amqp.queue[0]",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\ntype = \"quorum\"\nexclusive = true\n",
                "amqp.queue[0]",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\narguments = { \"x-message-ttl\" = 5 }\n",
                "amqp.queue[0].arguments.x-message-ttl",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.queue]]\nname = \"q\"\ndead_letter = { exchange = \"\" }\n",
                "amqp.queue[0].dead_letter.exchange",
            ),
            (
                "[[topic]]\nname = \"t\"\nhandler = { amqp = { url = \"amqp://x\", exchange = \"e\", routing_key = \"k\", expiration = \"0s\" } }\n",
                "topic[0].handler.amqp.expiration",
            ),
            (
                "[amqp]\nurl = \"amqp://x\"\n[[amqp.binding]]\nqueue = \"q\"\nexchange = \"amq.direct\"\n",
                "amqp.binding[0].queue",
            ),
            (
                "[[source]]\nname = \"s\"\namqp = { queue = \"q\" }\n",
                "source[0].amqp.url",
            ),
            (
                "[[source]]\nname = \"s\"\namqp = { url = \"amqp://x\", queue = \"q\", prefetch = 0 }\n",
                "source[0].amqp.prefetch",
            ),
            (
                "[[source]]\nname = \"s\"\namqp = { url = \"amqp://x\", queue = \"\" }\n",
                "source[0].amqp.queue",
            ),
            (
                "[[source]]\nname = \"s\"\namqp = { url = \"amqp://x\" }\n",
                "source[0].amqp",
            ),
            (
                "[[source]]\nname = \"s\"\nverify = { scheme = \"github\", secret = \"x\" }\namqp = { url = \"amqp://x\", queue = \"q\" }\n",
                "source[0].verify",
            ),
            (
                "[[source]]\nname = \"s\"\nkey = { json = \"no-slash\" }\namqp = { url = \"amqp://x\", queue = \"q\" }\n",
                "source[0].key",
            ),
            (
                "[[topic]]\nname = \"t\"\nhandler = { amqp = { exchange = \"e\", routing_key = \"k\" } }\n",
                "topic[0].handler.amqp.url",
            ),
            (
                "[[topic]]\nname = \"t\"\nhandler = { amqp = { url = \"amqp://x\", exchange = \"e\", routing_key = \"{id}\" } }\n",
                "topic[0].handler.amqp.routing_key",
            ),
            (
                "[[topic]]\nname = \"t\"\nhandler = { amqp = { url = \"amqp://x\", exchange = \"e\" } }\n",
                "topic[0].handler.amqp",
            ),
        ];
        for (toml, key) in cases {
            let err = refused(toml);
            assert!(
                err.starts_with(&format!("m.toml: {key}")),
                "{toml}\n=> {err}"
            );
        }
    }
    /// An amqps URL whose CA file or key cannot be read stops the start with
    /// the key path, the parameter and the file named, never the password.
    #[test]
    fn unreadable_tls_files_name_their_key_and_file() {
        let cases = [
            (
                "[amqp]\nurl = \"amqps://u:secret@x/%2f?cacertfile=/nonexistent/ca.pem\"\n",
                "m.toml: amqp.url",
                "cacertfile=/nonexistent/ca.pem: cannot read it",
            ),
            (
                "[[source]]\nname = \"s\"\namqp = { url = \"amqps://u:secret@x/%2f?certfile=/nonexistent/c.pem&keyfile=/nonexistent/c.key\", queue = \"q\" }\n",
                "m.toml: source[0].amqp.url",
                "certfile=/nonexistent/c.pem: cannot read it",
            ),
            (
                "[[topic]]\nname = \"t\"\nhandler = { amqp = { url = \"amqps://u:secret@x/%2f?verify=sometimes\", exchange = \"e\", routing_key = \"k\" } }\n",
                "m.toml: topic[0].handler.amqp.url",
                "verify=sometimes",
            ),
        ];
        for (toml, key, why) in cases {
            let err = refused(toml);
            assert!(
                err.starts_with(key) && err.contains(why),
                "{toml}\n=> {err}"
            );
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
