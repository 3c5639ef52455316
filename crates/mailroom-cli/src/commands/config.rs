//! `mailroom config check`: validate the configuration without a store and
//! print what it declares.

use super::load_config;
use crate::{Cli, ConfigCommand};
use anyhow::{Result, bail};
use mailroom_config::{Config, Topology};

pub(super) fn run(cli: &Cli, command: &ConfigCommand, json: bool) -> Result<()> {
    match command {
        ConfigCommand::Check => check(cli, json),
    }
}

fn check(cli: &Cli, json: bool) -> Result<()> {
    let config = load_config(cli)?;
    let addr = config.listen_addr()?;
    if !addr.ip().is_loopback() && config.api_tokens().is_empty() {
        bail!(
            "{}: listen: {addr} is not loopback and no api_token is set; serve would refuse to start",
            config.origin
        );
    }
    // Validates every topic, source, handler and secret, without a store.
    let topology = Topology::from_config(&config)?;
    let warnings = warnings(&config);
    if json {
        outln!(
            "{}",
            serde_json::json!({ "ok": true, "file": config.origin, "warnings": warnings })
        );
        return Ok(());
    }
    outln!("{}: ok", config.origin);
    outln!("  listen  {}", config.listen);
    outln!("  store   {}", config.store.url);
    print_topics(&topology);
    print_sources(&config);
    print_alerts(&topology);
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

fn print_topics(topology: &Topology) {
    let mut topics: Vec<_> = topology.topics.iter().collect();
    topics.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    for (t, handler) in topics {
        outln!(
            "  topic   {} ({}, concurrency {}, {} attempts, timeout {}, handler: {})",
            t.name,
            t.mode.name(),
            t.concurrency,
            t.retry.max_attempts,
            mailroom::duration::format(t.timeout),
            if handler.is_some() {
                "built-in"
            } else {
                "pull"
            }
        );
    }
}

fn print_sources(config: &Config) {
    for s in &config.sources {
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

fn print_alerts(topology: &Topology) {
    let a = &topology.alerts;
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
}
