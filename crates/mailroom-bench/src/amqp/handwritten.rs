//! The outbox relay as it is usually written by hand: poll the outbox table
//! for unsent rows, publish one message, wait for its confirm, mark the row
//! sent, next row.
//!
//! The table lives in SQLite with mailroom's durability (WAL, `synchronous
//! = FULL`), so the store costs the same per commit on both sides. Rows are
//! read a page of 100 at a time, and the poll interval such relays sleep
//! when the table is empty is not counted: only the loop over the backlog.

use super::{Ctx, Meter, Phase, Route};
use anyhow::{Context, bail};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{Channel, Confirmation};
use rusqlite::Connection;
use std::time::Duration;

const PAGE: i64 = 100;

/// The outbox table with mailroom's durability. `claimed_at` is the
/// durable relay floor's (`relay_floor`); this relay leaves it empty.
pub(super) fn open(path: &std::path::Path) -> anyhow::Result<Connection> {
    let db = super::open_durable(path).context("opening the outbox database")?;
    db.busy_timeout(Duration::from_secs(10))?;
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS outbox (
             id INTEGER PRIMARY KEY,
             event_type TEXT NOT NULL,
             payload BLOB NOT NULL,
             created_at INTEGER NOT NULL,
             claimed_at INTEGER,
             sent_at INTEGER);
         CREATE INDEX IF NOT EXISTS outbox_unsent ON outbox (id) WHERE sent_at IS NULL;",
    )?;
    Ok(db)
}

/// The application's side: N rows committed into the outbox table.
pub(super) fn preload(db: &Connection, n: u64, body: &[u8]) -> anyhow::Result<()> {
    let tx = db.unchecked_transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO outbox (event_type, payload, created_at) VALUES ('created', ?1, unixepoch())",
        )?;
        for _ in 0..n {
            insert.execute([body])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The relay loop over the backlog; returns the rows sent and commits made.
fn relay_loop(
    db: &Connection,
    ch: &Channel,
    route: &Route,
    rt: &tokio::runtime::Handle,
) -> anyhow::Result<(u64, u64)> {
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let mut select = db.prepare(
        "SELECT id, event_type, payload FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT ?1",
    )?;
    let mut mark = db.prepare("UPDATE outbox SET sent_at = unixepoch() WHERE id = ?1")?;
    let (mut sent, mut commits) = (0u64, 0u64);
    loop {
        let rows = select
            .query_map([PAGE], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            return Ok((sent, commits));
        }
        for (id, event_type, payload) in rows {
            let props = super::lapin_only::properties(format!("h-{id}"))
                .with_type(event_type.as_str().into());
            let confirmation = rt.block_on(async {
                ch.basic_publish(
                    route.exchange.as_str().into(),
                    route.routing_key.as_str().into(),
                    options,
                    &payload,
                    props,
                )
                .await?
                .await
            })?;
            if !matches!(confirmation, Confirmation::Ack(None)) {
                bail!("row {id} not confirmed as routed: {confirmation:?}");
            }
            mark.execute([id])?;
            sent += 1;
            commits += 1;
        }
    }
}

/// Runs the hand-written relay over a backlog of N rows.
pub async fn relay(ctx: &Ctx, route: &Route) -> anyhow::Result<Phase> {
    let n = ctx.settings.handwritten_messages;
    let dir = tempfile::tempdir().context("a temporary directory")?;
    let path = dir.path().join("app.db");
    let body = crate::ingest::body(ctx.settings.body_size);
    let db = open(&path)?;
    preload(&db, n, &body)?;
    let ch = ctx.channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .context("confirm.select")?;
    let meter = Meter::start(ctx.broker_pid.as_deref());
    let rt = tokio::runtime::Handle::current();
    let (route2, ch2) = (route.clone(), ch.clone());
    let (sent, commits) =
        tokio::task::spawn_blocking(move || relay_loop(&db, &ch2, &route2, &rt)).await??;
    let phase = meter.finish(
        "hand-written relay: poll, publish, confirm, mark".into(),
        sent,
        Some(commits),
    );
    anyhow::ensure!(sent == n, "sent {sent} of {n}");
    let _ = ch.close(200, "OK".into()).await;
    ctx.expect_queued(&route.queue, n, "rows").await?;
    Ok(phase)
}
