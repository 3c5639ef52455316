//! `mailroom cancel`: withdraw pending events, one by id or every
//! pending one matching `--topic`/`--key`, after showing how many match.

use super::{load_config, offline_engine};
use crate::Cli;
use anyhow::{Result, bail};
use mailroom::Engine;
use mailroom::answer::EventObject;
use mailroom::operate::ListFilter;
use std::io::{BufRead, IsTerminal, Write};

/// How a cancel by filter goes.
#[derive(Debug)]
pub(super) struct Bulk {
    pub topic: Option<String>,
    pub key: Option<String>,
    /// Count only.
    pub dry_run: bool,
    /// Do not ask.
    pub yes: bool,
}

pub(super) async fn run(cli: &Cli, id: Option<&str>, bulk: Bulk, json: bool) -> Result<()> {
    let filtered = bulk.topic.is_some() || bulk.key.is_some();
    let engine = offline_engine(&load_config(cli)?).await?;
    match id {
        Some(_) if filtered => bail!("give an event id or filters (--topic/--key), not both"),
        Some(id) => one(&engine, id, json).await,
        None if !filtered => {
            bail!("give an event id, or --topic and/or --key to cancel the matching pending events")
        }
        None => matching(&engine, bulk, json).await,
    }
}

async fn one(engine: &Engine, id: &str, json: bool) -> Result<()> {
    let e = engine.operator().cancel(id.parse()?).await?;
    if json {
        outln!("{}", serde_json::to_string(&EventObject::summary(&e))?);
    } else {
        outln!("{} cancelled; it will not run unless replayed", e.id);
    }
    Ok(())
}

async fn matching(engine: &Engine, bulk: Bulk, json: bool) -> Result<()> {
    let filter = ListFilter {
        topic: bulk.topic.clone(),
        key: bulk.key.clone(),
        ..ListFilter::default()
    };
    let preview = engine.operator().cancel_matching(&filter, true).await?;
    if bulk.dry_run || preview.matching == 0 {
        if json {
            outln!("{}", serde_json::json!(preview));
        } else {
            outln!("{} pending events match", preview.matching);
        }
        return Ok(());
    }
    if !bulk.yes && !confirmed(preview.matching)? {
        bail!("nothing cancelled");
    }
    let report = engine.operator().cancel_matching(&filter, false).await?;
    if json {
        outln!("{}", serde_json::json!(report));
    } else {
        outln!("{} events cancelled", report.cancelled);
    }
    Ok(())
}

/// Asks on the terminal; without one, refuses (the caller says `--yes`).
fn confirmed(matching: u64) -> Result<bool> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!(
            "{matching} pending events match; add --yes to cancel them (stdin is not a terminal)"
        );
    }
    eprint!("{matching} pending events match. Cancel them? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}
