//! `mailroom migrate`: apply pending schema migrations, then exit; or print
//! the grants a role needs to run mailroom under `[store] migrate = "never"`
//! (docs/src/guides/operations.md, "Migrations and least privilege").

use super::{connect, load_config};
use crate::Cli;
use anyhow::{Context, Result, bail};
use mailroom::SchemaFit;

pub(super) async fn run(cli: &Cli, print_grants: Option<&str>, json: bool) -> Result<()> {
    if let Some(role) = print_grants {
        out!("{}", grants(role)?);
        return Ok(());
    }
    let config = load_config(cli)?;
    let url = mailroom::redact::url(&config.store.url);
    let store = connect(&config).await?;
    let done = store
        .migrate()
        .await
        .with_context(|| format!("cannot migrate the store {url}"))?;
    let schema = done.schema;
    if json {
        let answer = serde_json::json!({
            "store": url,
            "from": done.from,
            "to": schema.database,
            "build": schema.build,
            "applied": done.applied(),
        });
        outln!("{answer}");
    } else if done.applied() {
        outln!(
            "{url}: migrated the schema from version {} to {}",
            done.from,
            schema.database
        );
    } else if schema.fit() == SchemaFit::Current {
        outln!("{url}: schema up to date (version {})", schema.database);
    } else {
        outln!("{url}: nothing applied: {}", schema.explain());
    }
    Ok(())
}

/// [`mailroom_postgres::grants`], for a role name given.
fn grants(role: &str) -> Result<String> {
    if role.is_empty() || role.contains('\0') {
        bail!("--print-grants needs a role name");
    }
    Ok(mailroom_postgres::grants(role))
}
