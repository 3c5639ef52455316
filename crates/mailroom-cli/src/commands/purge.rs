//! `mailroom purge --older-than D`: drop payloads of finished events older
//! than `D`, and rows past the dedup window.

use super::{load_config, offline_engine};
use crate::Cli;
use crate::progress::Progress;
use anyhow::Result;

pub(super) async fn run(cli: &Cli, older_than: &str, json: bool) -> Result<()> {
    let d = mailroom::duration::parse(older_than)?;
    let engine = offline_engine(&load_config(cli)?).await?;
    eprintln!("purging finished events older than {older_than}…");
    let spinner = Progress::spinner(json, "purging");
    let report = engine.operator().purge(d).await;
    spinner.finish();
    let report = report?;
    if json {
        outln!(
            "{}",
            serde_json::json!({ "payloads_dropped": report.payloads_dropped, "rows_deleted": report.rows_deleted })
        );
    } else {
        outln!(
            "payloads dropped: {}, rows deleted (past the dedup window of {}): {}",
            report.payloads_dropped,
            mailroom::duration::format(engine.operator().retention().dedup.max(d)),
            report.rows_deleted
        );
    }
    Ok(())
}
