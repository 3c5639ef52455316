//! The durable relay floor: the least any outbox relay that records its
//! work in the store must do, with no engine; the relay's analogue of the
//! ack-after-commit floor ([`super::durable`]).
//!
//! N rows wait in the hand-written relay's outbox table (SQLite, WAL,
//! `synchronous = FULL`). One writer thread owns the database, as
//! mailroom's store has one writer: it takes every request that has
//! arrived, claims (reads the next group of pending rows and marks them
//! claimed) and marks published rows done, all in one transaction, one
//! commit: a group commit at its best. Meanwhile `groups` groups of `size`
//! rows are published, every publish of a group sent (persistent,
//! `mandatory`, on one channel in confirm mode), then its confirms awaited,
//! and the confirmed group goes back to the writer to be marked done.
//!
//! [`Claim::Read`] leaves out the claim's write (a plain read, the relay
//! trusting that nothing else publishes): the difference between the two
//! is what recording the claim costs.

use super::{Ctx, Meter, Phase, Route};
use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::Channel;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

/// How the relay takes the rows it publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Marked claimed in a commit before they are published.
    Commit,
    /// Only read; the one commit per row is the one marking it done.
    Read,
}

impl Claim {
    fn name(self, size: u32, groups: u32) -> String {
        let what = match self {
            Self::Commit => "claim + done commits",
            Self::Read => "done commits only",
        };
        format!("durable relay floor: {what}, {size} x {groups}")
    }
}

/// An outbox row: id, event type, payload.
type Row = (i64, String, Vec<u8>);

/// What the writer thread is asked to do.
enum Op {
    /// The next `limit` pending rows (claimed first, under [`Claim::Commit`]).
    Take(i64, oneshot::Sender<Vec<Row>>),
    /// Mark these rows published.
    Done(Vec<i64>),
}

/// The writer thread: runs every request that has arrived in one
/// transaction; answers the takes once it has committed, and reports the
/// rows marked done.
fn writer(
    db: Connection,
    claim: Claim,
    mut ops: mpsc::UnboundedReceiver<Op>,
    done: mpsc::UnboundedSender<u64>,
) -> anyhow::Result<u64> {
    let (mut after, mut commits) = (0i64, 0u64);
    while let Some(first) = ops.blocking_recv() {
        let mut batch = vec![first];
        while let Ok(more) = ops.try_recv() {
            batch.push(more);
        }
        let tx = db.unchecked_transaction()?;
        let (mut taken, mut marked, mut wrote) = (Vec::new(), 0u64, false);
        for op in batch {
            match op {
                Op::Take(limit, reply) => {
                    let rows = take(&tx, after, limit, claim)?;
                    after = rows.last().map_or(after, |r| r.0);
                    wrote |= claim == Claim::Commit && !rows.is_empty();
                    taken.push((reply, rows));
                }
                Op::Done(ids) => {
                    let mut mark =
                        tx.prepare_cached("UPDATE outbox SET sent_at = unixepoch() WHERE id = ?1")?;
                    for id in &ids {
                        mark.execute([id])?;
                    }
                    marked += ids.len() as u64;
                    wrote = true;
                }
            }
        }
        tx.commit()?;
        commits += u64::from(wrote);
        for (reply, rows) in taken {
            let _ = reply.send(rows);
        }
        if marked > 0 && done.send(marked).is_err() {
            break;
        }
    }
    Ok(commits)
}

/// The next `limit` unsent rows after `after`, marked claimed under
/// [`Claim::Commit`].
fn take(tx: &Connection, after: i64, limit: i64, claim: Claim) -> anyhow::Result<Vec<Row>> {
    let mut select = tx.prepare_cached(
        "SELECT id, event_type, payload FROM outbox
         WHERE sent_at IS NULL AND id > ?1 ORDER BY id LIMIT ?2",
    )?;
    let rows = select
        .query_map([after, limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<Vec<Row>, _>>()?;
    if claim == Claim::Commit {
        let mut mark =
            tx.prepare_cached("UPDATE outbox SET claimed_at = unixepoch() WHERE id = ?1")?;
        for (id, _, _) in &rows {
            mark.execute([id])?;
        }
    }
    Ok(rows)
}

/// Publishes a group pipelined (every publish sent, then every confirm
/// awaited) and returns its ids once all are confirmed as routed.
async fn publish(ch: &Channel, route: &Route, rows: Vec<Row>) -> anyhow::Result<Vec<i64>> {
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let mut confirms = Vec::with_capacity(rows.len());
    for (id, event_type, payload) in &rows {
        let props =
            super::lapin_only::properties(format!("d-{id}")).with_type(event_type.as_str().into());
        let confirm = ch
            .basic_publish(
                route.exchange.as_str().into(),
                route.routing_key.as_str().into(),
                options,
                payload,
                props,
            )
            .await
            .context("basic.publish")?;
        confirms.push(confirm);
    }
    super::lapin_only::await_routed(confirms).await?;
    Ok(rows.into_iter().map(|r| r.0).collect())
}

/// Relays the N rows of a fresh outbox, `groups` groups of `size` rows in
/// flight, until every row is marked done.
pub async fn relay(ctx: &Ctx, route: &Route, claim: Claim) -> anyhow::Result<Phase> {
    let s = &ctx.settings;
    let n = s.messages;
    let (size, groups) = match s.relay_batch_size {
        0 => (s.relay_concurrency, 1),
        size => (size, s.relay_batch_concurrency),
    };
    let dir = tempfile::tempdir().context("a temporary directory")?;
    let db = super::handwritten::open(&dir.path().join("outbox.db"))?;
    super::handwritten::preload(&db, n, &crate::ingest::body(s.body_size))?;
    let ch = ctx.channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .context("confirm.select")?;
    let (op, ops) = mpsc::unbounded_channel();
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let thread = std::thread::Builder::new()
        .name("floor-writer".into())
        .spawn(move || writer(db, claim, ops, done_tx))?;
    let meter = Meter::start(ctx.broker_pid.as_deref());
    let (mut taken, mut marked) = (0u64, 0u64);
    let (mut takes, mut publishing) = (FuturesUnordered::new(), FuturesUnordered::new());
    while marked < n {
        while takes.len() + publishing.len() < groups as usize && taken < n {
            let limit = u64::from(size).min(n - taken);
            let (reply, rows) = oneshot::channel();
            op.send(Op::Take(limit as i64, reply))
                .context("the writer thread ended")?;
            takes.push(rows);
            taken += limit;
        }
        tokio::select! {
            Some(rows) = takes.next() => {
                let rows: Vec<Row> = rows.context("the writer thread ended")?;
                anyhow::ensure!(!rows.is_empty(), "no row left to take, {marked} of {n} done");
                publishing.push(publish(&ch, route, rows));
            }
            Some(ids) = publishing.next() => {
                op.send(Op::Done(ids?)).context("the writer thread ended")?;
            }
            Some(k) = done.recv() => marked += k,
            else => bail!("the writer thread ended with {marked} of {n} done"),
        }
    }
    drop(op);
    let commits = thread
        .join()
        .map_err(|_| anyhow::anyhow!("the writer thread panicked"))??;
    let phase = meter.finish(claim.name(size, groups), n, Some(commits));
    let _ = ch.close(200, "OK".into()).await;
    ctx.expect_queued(&route.queue, n, "rows").await?;
    Ok(phase)
}
