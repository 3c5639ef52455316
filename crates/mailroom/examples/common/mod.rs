//! What every example does around its topic: a throwaway SQLite store, and
//! running the engine until the events it was given are done.

use mailroom::{Engine, Status, Store};
use std::error::Error;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A migrated SQLite store in a file of `dir` (grouped commits on).
pub async fn temp_store(
    dir: &tempfile::TempDir,
    file: &str,
) -> Result<Arc<dyn Store>, Box<dyn Error>> {
    let url = format!("sqlite://{}", dir.path().join(file).display());
    let store = mailroom::open_store(&url, true).await?;
    store.migrate().await?;
    Ok(store)
}

/// Runs `engine` until `done` events are `done`, then shuts it down and
/// waits for attempts in flight, as a service would on SIGTERM.
pub async fn run_until_done(engine: &Engine, done: u64) -> Result<(), Box<dyn Error>> {
    let shutdown = CancellationToken::new();
    let running = tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    while engine
        .operator()
        .stats()
        .await?
        .iter()
        .map(|s| s.count(Status::Done))
        .sum::<u64>()
        < done
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    running.await?;
    Ok(())
}
