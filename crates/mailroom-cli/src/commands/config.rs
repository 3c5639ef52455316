//! `mailroom config check`: validate the configuration without a store and
//! print what it declares. `mailroom config schema`: print the file's JSON
//! Schema.

use super::load_config;
use crate::{Cli, ConfigCommand};
use anyhow::Result;
use mailroom::redact::url as redact;
use mailroom_amqp::QueueSpec;
use mailroom_config::{AmqpPlan, Config, Specs};

pub(super) fn run(cli: &Cli, command: &ConfigCommand, json: bool) -> Result<()> {
    match command {
        ConfigCommand::Check => check(cli, json),
        ConfigCommand::Schema => {
            let schema = serde_json::to_string_pretty(&mailroom_config::schema::schema())?;
            outln!("{schema}");
            Ok(())
        }
    }
}

fn check(cli: &Cli, json: bool) -> Result<()> {
    let config = load_config(cli)?;
    // What serve refuses: a public listener without a strong api_token.
    config.checked_listen_addr()?;
    let undeclared = config.accept_undeclared_sources()?;
    // Validates every topic, source, handler and secret, without a store.
    let specs = Specs::from_config(&config)?;
    super::serve::load_tls(&config)?;
    let warnings = warnings(&config);
    if json {
        outln!(
            "{}",
            serde_json::json!({ "ok": true, "file": config.origin, "warnings": warnings,
                "accept_undeclared_sources": undeclared, "amqp": amqp_json(&specs.amqp) })
        );
        return Ok(());
    }
    outln!("{}: ok", config.origin);
    outln!("  listen  {}", config.listen);
    outln!("  store   {}", redact(&config.store.url));
    if undeclared {
        outln!("  undeclared sources accepted (loopback): POST /webhooks/<name> into topic <name>");
    }
    if let Some(tls) = &config.tls {
        outln!(
            "  tls     https: cert_file {}, key_file {} (SIGHUP re-reads them)",
            tls.cert_file.display(),
            tls.key_file.display()
        );
    }
    print_topics(&config, &specs);
    print_sources(&config);
    print_amqp(&specs.amqp);
    print_alerts(&specs);
    for w in &warnings {
        outln!("warning: {w}");
    }
    Ok(())
}

/// Sources that send to a topic the file does not declare.
fn warnings(config: &Config) -> Vec<String> {
    let mut warnings = Vec::new();
    for (i, s) in config.sources.iter().enumerate() {
        let topic = s.topic.clone().unwrap_or_else(|| s.name.clone());
        if !config.topics.iter().any(|t| t.name == topic) {
            warnings.push(format!(
                "source[{i}] ({}) sends to undeclared topic {topic:?}: it gets default settings and no handler (pull)",
                s.name
            ));
        }
    }
    warnings
}

fn print_topics(config: &Config, specs: &Specs) {
    let mut topics: Vec<_> = specs.topics.iter().collect();
    topics.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    for (t, handler) in topics {
        let mut limits = String::new();
        if let Some(rate) = t.rate {
            limits.push_str(&format!(", rate {rate}"));
        }
        if let Some(n) = t.max_running {
            limits.push_str(&format!(", max_running {n}"));
        }
        outln!(
            "  topic   {} ({}, concurrency {}{limits}, {} attempts, timeout {}, handler: {})",
            t.name,
            t.mode.name(),
            t.concurrency,
            t.retry.max_attempts,
            mailroom::duration::format(t.timeout),
            match handler {
                Some(_) => handler_label(config, &t.name),
                None => "pull".to_owned(),
            }
        );
    }
}

/// What a topic's handler does, as its config says: `http POST <url>`
/// (its secrets masked), `command <program>`, `amqp`; `built-in`
/// for a handler the file does not describe.
fn handler_label(config: &Config, topic: &str) -> String {
    let spec = config
        .topics
        .iter()
        .find(|t| t.name == topic)
        .and_then(|t| t.handler.as_ref());
    let Some(spec) = spec else {
        return "built-in".to_owned();
    };
    if let Some(http) = &spec.http {
        // File names only, never what they hold.
        let tls: Vec<String> = [
            ("ca_file", &http.ca_file),
            ("client_cert", &http.client_cert),
            ("client_key", &http.client_key),
        ]
        .into_iter()
        .filter_map(|(k, p)| p.as_ref().map(|p| format!("{k} {}", p.display())))
        .collect();
        return match tls.is_empty() {
            true => format!("http POST {}", redact(&http.url)),
            false => format!("http POST {} ({})", redact(&http.url), tls.join(", ")),
        };
    }
    if let Some(program) = spec.command.as_ref().and_then(|c| c.argv().first()) {
        return format!("command {program}");
    }
    if spec.amqp.is_some() {
        // Its exchange and routing key are on the `handler` line of the AMQP part.
        return "amqp".to_owned();
    }
    "built-in".to_owned()
}

fn print_sources(config: &Config) {
    for s in config.sources.iter().filter(|s| s.amqp.is_none()) {
        outln!(
            "  source  POST /webhooks/{} -> {}{}",
            s.name,
            s.topic.as_deref().unwrap_or(&s.name),
            s.verify
                .as_ref()
                .map(|v| format!(
                    " (verify: {})",
                    v.scheme.as_deref().or(s.preset.as_deref()).unwrap_or("?")
                ))
                .unwrap_or_default()
        );
    }
}

fn print_alerts(specs: &Specs) {
    let a = &specs.alerts;
    let mut rules = Vec::new();
    if let Some(n) = a.dead_letter_depth {
        rules.push(format!("dead_letter_depth > {n}"));
    }
    if let Some(n) = a.backlog {
        rules.push(format!("backlog > {n}"));
    }
    if let Some(r) = a.failure_rate {
        rules.push(format!("failure_rate > {}%", r * 100.0));
    }
    if let Some(d) = a.processing_time {
        rules.push(format!(
            "processing_time > {}",
            mailroom::duration::format(d)
        ));
    }
    if !rules.is_empty() {
        outln!("  alerts  {} (per topic)", rules.join(", "));
    }
    if let Some(n) = &specs.alert_notify {
        let signed = if n.secret.is_some() {
            "signed"
        } else {
            "unsigned"
        };
        outln!(
            "  notify  POST {} on each alert's start and end ({signed})",
            redact(n.url.as_str())
        );
    }
}

/// `[amqp]` (declared at start) and the AMQP sources and handlers `serve` runs.
fn print_amqp(plan: &AmqpPlan) {
    if let Some(url) = &plan.url {
        outln!(
            "  amqp    {} (declared at start and by `mailroom amqp declare`)",
            redact(url)
        );
    }
    for e in &plan.topology.exchanges {
        let durable = if e.durable { "durable" } else { "transient" };
        outln!(
            "          exchange {} ({}, {durable})",
            e.name,
            e.kind.as_str()
        );
    }
    for q in &plan.topology.queues {
        outln!("          queue {}", queue_line(q));
    }
    for (url, s) in &plan.sources {
        outln!(
            "  source  amqp {} queue {} -> {} (prefetch {}, ack after commit)",
            redact(url),
            s.queue,
            s.topic,
            s.prefetch
        );
    }
    for h in &plan.handlers {
        let spec = h.handler.spec();
        outln!(
            "  handler {} -> amqp {} exchange {:?} routing key {:?}{} (confirms, mandatory)",
            h.topic,
            redact(&h.url),
            spec.exchange,
            spec.routing_key,
            if spec.envelope { ", envelope" } else { "" }
        );
    }
}

fn queue_line(q: &QueueSpec) -> String {
    let mut parts = vec![if q.durable { "durable" } else { "transient" }.to_string()];
    if let Some(ttl) = q.ttl {
        parts.push(format!("ttl {}", mailroom::duration::format(ttl)));
    }
    if let Some(n) = q.max_length {
        parts.push(format!("max_length {n}"));
    }
    if q.dead_letter {
        parts.push(format!(
            "dead letters -> {} -> {}",
            q.dead_letter_exchange(),
            q.dead_letter_queue()
        ));
    }
    let binds: Vec<String> = q
        .bindings
        .iter()
        .map(|b| format!("{} {:?}", b.exchange, b.routing_key))
        .collect();
    if !binds.is_empty() {
        parts.push(format!("bound to {}", binds.join(", ")));
    }
    format!("{} ({})", q.name, parts.join(", "))
}

fn amqp_json(plan: &AmqpPlan) -> serde_json::Value {
    let queues: Vec<_> = plan
        .topology
        .queues
        .iter()
        .map(|q| {
            let bindings: Vec<_> = q
                .bindings
                .iter()
                .map(|b| serde_json::json!({"exchange": b.exchange, "routing_key": b.routing_key}))
                .collect();
            serde_json::json!({"name": q.name, "durable": q.durable,
                "ttl": q.ttl.map(mailroom::duration::format), "max_length": q.max_length,
                "dead_letter_queue": q.dead_letter.then(|| q.dead_letter_queue()),
                "bindings": bindings})
        })
        .collect();
    let exchanges: Vec<_> = plan
        .topology
        .exchanges
        .iter()
        .map(|e| serde_json::json!({"name": e.name, "kind": e.kind.as_str(), "durable": e.durable}))
        .collect();
    let sources: Vec<_> = plan
        .sources
        .iter()
        .map(|(url, s)| {
            serde_json::json!({"name": s.name, "url": redact(url), "queue": s.queue,
            "topic": s.topic, "prefetch": s.prefetch})
        })
        .collect();
    let handlers: Vec<_> = plan
        .handlers
        .iter()
        .map(|h| {
            serde_json::json!({"topic": h.topic, "url": redact(&h.url),
            "exchange": h.handler.spec().exchange, "routing_key": h.handler.spec().routing_key,
            "envelope": h.handler.spec().envelope})
        })
        .collect();
    serde_json::json!({"url": plan.url.as_deref().map(redact), "exchanges": exchanges,
        "queues": queues, "sources": sources, "handlers": handlers})
}
