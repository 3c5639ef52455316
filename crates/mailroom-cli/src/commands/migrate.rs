//! `mailroom migrate`: apply pending schema migrations, then exit.

use super::{load_config, open};
use crate::Cli;
use anyhow::Result;

pub(super) async fn run(cli: &Cli) -> Result<()> {
    let config = load_config(cli)?;
    open(&config).await?;
    outln!(
        "{}: schema is up to date",
        mailroom::redact::url(&config.store.url)
    );
    Ok(())
}
