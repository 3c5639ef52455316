//! `mailroom skip <id>`: mark a dead event skipped so its key unblocks.

use super::{load_config, offline_engine, parse_id};
use crate::Cli;
use anyhow::Result;

pub(super) async fn run(cli: &Cli, id: &str, json: bool) -> Result<()> {
    let engine = offline_engine(&load_config(cli)?).await?;
    let e = engine.skip(parse_id(id)?).await?;
    if json {
        outln!("{}", e.to_json(false));
    } else {
        outln!("{} skipped; its key is unblocked", e.id);
    }
    Ok(())
}
