//! `mailroom replay`: send events back to pending with a fresh attempt
//! budget, one by id or all matching a filter.

use super::{FilterExt, load_config, offline_engine};
use crate::progress::Progress;
use crate::{Cli, Filter};
use anyhow::{Result, bail};
use mailroom::answer::EventObject;
use mailroom::operate::{EventSearch, ListFilter, ReplayReport};
use mailroom::{Engine, Status};

/// Events replayed per page of a replay by filter (concurrently, so the
/// store groups them), and the steps of its progress.
const PAGE: u32 = 200;

pub(super) async fn run(cli: &Cli, id: Option<&str>, filter: &Filter, json: bool) -> Result<()> {
    let engine = offline_engine(&load_config(cli)?).await?;
    match id {
        Some(id) => {
            if !filter.is_empty() {
                bail!("give an event id or filters (--topic/--status/--key), not both");
            }
            one(&engine, id, json).await
        }
        None => matching(&engine, filter, json).await,
    }
}

async fn one(engine: &Engine, id: &str, json: bool) -> Result<()> {
    let e = engine.operator().replay(id.parse()?).await?;
    if json {
        outln!("{}", serde_json::to_string(&EventObject::summary(&e))?);
    } else {
        outln!(
            "{} is pending again (attempt {} of {} next)",
            e.id,
            e.attempts + 1,
            e.max_attempts
        );
    }
    Ok(())
}

async fn matching(engine: &Engine, filter: &Filter, json: bool) -> Result<()> {
    let filter = filter.to_list_filter(Some(Status::Dead))?;
    let status = filter.status.unwrap_or(Status::Dead);
    if status == Status::Running {
        bail!("running events cannot be replayed");
    }
    eprintln!("replaying {status} events…");
    let search = EventSearch {
        filter: ListFilter {
            limit: PAGE,
            ..filter
        },
        ..EventSearch::default()
    };
    let total = engine.operator().count(&search).await?;
    let bar = Progress::bar(json, total, "replaying");
    let done = engine
        .operator()
        .replay_each(search, |p| bar.set(p.handled()))
        .await;
    bar.finish();
    let done = done?;
    let report = ReplayReport {
        replayed: done.replayed,
        skipped_purged: done.purged,
    };
    if json {
        outln!("{}", serde_json::json!(report));
    } else {
        outln!("{} events are pending again", report.replayed);
        if report.skipped_purged > 0 {
            outln!(
                "{} skipped: their payload was purged by retention",
                report.skipped_purged
            );
        }
    }
    Ok(())
}
