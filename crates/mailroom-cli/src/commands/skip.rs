//! `mailroom skip <id>`: mark a dead event skipped so its key unblocks.

use super::{load_config, offline_engine};
use crate::Cli;
use anyhow::Result;
use mailroom::answer::EventObject;

pub(super) async fn run(cli: &Cli, id: &str, json: bool) -> Result<()> {
    let engine = offline_engine(&load_config(cli)?).await?;
    let e = engine.operator().skip(id.parse()?).await?;
    if json {
        outln!("{}", serde_json::to_string(&EventObject::summary(&e))?);
    } else {
        outln!("{} skipped; its key is unblocked", e.id);
    }
    Ok(())
}
