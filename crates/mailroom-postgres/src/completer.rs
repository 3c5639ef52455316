//! Group commit for completions, the other hot write of the data path.
//!
//! Same shape as the insert `writer`: a bounded queue, one task that
//! drains what is waiting and records it all with one statement — a fenced
//! `UPDATE ... FROM UNNEST(...)` plus the history rows — and one commit,
//! then answers each caller. A completion whose token is not current
//! changes nothing and gets [`StoreError::StaleToken`] (or `NotFound`),
//! exactly as if it had run alone; of two completions with the same token in
//! one group, one wins and the other is stale. The statement is
//! [`sql::complete_many`](crate::sql::complete_many).
//!
//! Unlike an insert, a completion waits for room in a full queue rather
//! than failing with [`StoreError::Overloaded`]: the attempt has run, and
//! an outcome refused would leave its event to its lease. The waiting
//! holds back its topic loop (its places among the outcomes being
//! recorded), which is the backpressure the queue is there for.

use crate::db::Db;
use crate::sql::complete_many;
use crate::timeouts::{DATA_LIMIT, bounded};
use mailroom_core::{Completion, EventId, FencingToken, Result, StoreError};
use tokio::sync::{mpsc, oneshot};

struct Job {
    id: EventId,
    token: FencingToken,
    completion: Completion,
    reply: oneshot::Sender<Result<()>>,
}

/// Handle to the completion task; it ends when every handle is dropped.
#[derive(Debug)]
pub(crate) struct Completer {
    queue: mpsc::Sender<Job>,
}

fn stopped() -> StoreError {
    StoreError::Unavailable("postgres completion task has stopped".into())
}

impl Completer {
    /// Starts the task; `group` is the most completions per transaction.
    pub(crate) fn start(pool: Db, group: usize, capacity: usize) -> Self {
        let (queue, rx) = mpsc::channel(capacity);
        tokio::spawn(run(pool, rx, group.max(1)));
        Self { queue }
    }

    /// Queues a completion, waiting for room if the queue is full, and
    /// waits for its committed answer.
    pub(crate) async fn complete(
        &self,
        id: EventId,
        token: FencingToken,
        completion: Completion,
    ) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Job {
                id,
                token,
                completion,
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(pool: Db, mut rx: mpsc::Receiver<Job>, group: usize) {
    let mut batch: Vec<Job> = Vec::with_capacity(group);
    while crate::writer::next_group(&mut rx, &mut batch, group).await {
        if batch.len() < group {
            // Outcomes come in bursts (a claim's events end together): one
            // yield lets the attempts finishing beside these queue theirs,
            // so the group and its commit take them too. Measured on the
            // single drain: 1.07x events/s, 0.95x PostgreSQL CPU per event.
            tokio::task::yield_now().await;
            crate::writer::take_queued(&mut rx, &mut batch, group);
        }
        let items: Vec<_> = batch
            .iter()
            .map(|job| (job.id, job.token, &job.completion))
            .collect();
        // Past the limit the group's outcome is unknown: each caller is
        // told it failed and tries again, and a retry of one that did
        // commit finds its token stale.
        let recorded = bounded(
            DATA_LIMIT,
            "committing completions",
            complete_many(&pool, &items),
        );
        match recorded.await {
            Ok(answers) => {
                for (job, answer) in batch.drain(..).zip(answers) {
                    // The caller may have gone away; nothing to do then.
                    let _ = job.reply.send(answer);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, jobs = batch.len(), "completion group failed");
                let why = e.to_string();
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(StoreError::Unavailable(why.clone())));
                }
            }
        }
    }
}
