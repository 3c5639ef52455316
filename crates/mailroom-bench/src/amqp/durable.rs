//! The ack-after-commit floor: the least any consumer that acknowledges a
//! delivery only after it is durably stored must do, with no engine. lapin
//! consumes with `basic.qos(prefetch)`; one writer thread inserts every
//! delivery that has arrived (`message_id` as the primary key: the dedup a
//! redelivery needs) into SQLite with mailroom's durability (WAL,
//! `synchronous = FULL`) in one transaction, commits, and hands the batch
//! back to be acked: a group commit at its best. mailroom's inbound is
//! measured against this floor to say how much of the distance to the
//! store-less consume floor is the store's, and how much is mailroom's.

use super::{Ctx, Phase};
use anyhow::Context;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use rusqlite::Connection;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// The writer thread: commits whatever has arrived, then sends it back.
fn writer(
    db: Connection,
    mut arrived: mpsc::UnboundedReceiver<Delivery>,
    committed: mpsc::UnboundedSender<Vec<Delivery>>,
    commits: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    while let Some(first) = arrived.blocking_recv() {
        let mut batch = vec![first];
        while let Ok(more) = arrived.try_recv() {
            batch.push(more);
        }
        let tx = db.unchecked_transaction()?;
        {
            let mut insert = tx
                .prepare_cached("INSERT OR IGNORE INTO inbox (message_id, body) VALUES (?1, ?2)")?;
            for d in &batch {
                let id = d.properties.message_id().as_ref().map(|s| s.as_str());
                insert.execute(rusqlite::params![id.unwrap_or_default(), &d.data])?;
            }
        }
        tx.commit()?;
        commits.fetch_add(1, Ordering::Relaxed);
        if committed.send(batch).is_err() {
            break;
        }
    }
    Ok(())
}

fn open(path: &std::path::Path) -> anyhow::Result<Connection> {
    let db = super::open_durable(path).context("opening the floor's database")?;
    db.execute_batch(
        "CREATE TABLE inbox (message_id TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID;",
    )?;
    Ok(db)
}

/// Consumes the N messages of `queue` with `basic.qos(prefetch)`, acking
/// each after the commit that stored it.
pub async fn consume(ctx: &Ctx, queue: &str, prefetch: u16) -> anyhow::Result<Phase> {
    let n = ctx.settings.messages;
    let dir = tempfile::tempdir()?;
    let db = open(&dir.path().join("floor.db"))?;
    let (arrive, arrived) = mpsc::unbounded_channel();
    let (commit, mut committed) = mpsc::unbounded_channel();
    let commits = Arc::new(AtomicU64::new(0));
    let thread = {
        let commits = commits.clone();
        std::thread::Builder::new()
            .name("floor-writer".into())
            .spawn(move || writer(db, arrived, commit, commits))?
    };
    let (ch, meter, mut consumer) = ctx.consumer(queue, prefetch).await?;
    let (mut received, mut acked) = (0, 0);
    let mut acks = FuturesUnordered::new();
    while acked < n {
        tokio::select! {
            Some(sent) = acks.next() => {
                let sent: lapin::Result<bool> = sent;
                sent.context("basic.ack")?;
                acked += 1;
            }
            Some(batch) = committed.recv() => {
                for d in batch {
                    acks.push(async move { d.ack(BasicAckOptions::default()).await });
                }
            }
            next = tokio::time::timeout(ctx.settings.timeout, consumer.next()), if received < n => {
                let delivery = next
                    .context("no delivery in time")?
                    .context("the consumer ended")?
                    .context("receiving")?;
                arrive.send(delivery).context("the writer thread ended")?;
                received += 1;
            }
            else => anyhow::bail!("the writer thread ended with {acked} of {n} acked"),
        }
    }
    let phase = meter.finish(
        format!("ack-after-commit floor: lapin + SQLite, prefetch {prefetch}"),
        n,
        Some(commits.load(Ordering::Relaxed)),
    );
    drop(arrive);
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("the writer thread panicked"))??;
    let _ = ch.close(200, "OK".into()).await;
    anyhow::ensure!(
        ctx.ready(queue).await? == 0,
        "{queue} is not empty after the ack-after-commit floor"
    );
    Ok(phase)
}
