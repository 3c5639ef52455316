//! The `mailroom` process under attack: the release binary beside this
//! one (or `MAILROOM_BIN`), run by `mailroom-testkit`'s harness.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

pub use mailroom_testkit::harness::{Serve, write_config};

/// The `mailroom` binary: beside this executable (`target/release`), or
/// `MAILROOM_BIN`.
pub fn mailroom_bin() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("MAILROOM_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().context("finding this executable")?;
    let bin = exe.with_file_name("mailroom");
    if !bin.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p mailroom-cli) or set MAILROOM_BIN",
            bin.display()
        );
    }
    Ok(bin)
}

/// Starts `mailroom --config <config> serve` on the store at `store_url`
/// and waits (up to 30 s) for the line naming the bound address.
pub async fn serve(config: &Path, store_url: &str) -> anyhow::Result<Serve> {
    Ok(Serve::spawn_async(&mailroom_bin()?, config, store_url).await?)
}
