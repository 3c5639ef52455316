//! The writer thread: every write, grouped into shared transactions.
//!
//! Callers send a [`Job`] through a bounded queue. The thread blocks for the
//! first one, drains up to `max_batch − 1` more without waiting, runs them all
//! inside one `BEGIN IMMEDIATE` transaction (each in its own savepoint, so one
//! failing job does not undo the others), commits once — one fsync for the
//! whole group — and only then answers every caller (nothing is
//! acknowledged before it is durable). If the commit fails, every caller in
//! the group gets [`StoreError::Unavailable`].

use crate::options::SqliteOptions;
use crate::sql::db;
use mailroom_core::{Result, StoreError};
use rusqlite::Connection;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// A write waiting for the writer thread.
trait Job: Send {
    /// Runs the write inside the open transaction; the answer waits for the commit.
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Answer>;
    /// Answers without running (the transaction could not start).
    fn abort(self: Box<Self>, error: StoreError);
}

/// A job's result, held until its transaction is committed.
trait Answer: Send {
    /// Whether the job's own changes should be kept.
    fn succeeded(&self) -> bool;
    /// Delivers the result, or `Unavailable` if the commit failed.
    fn deliver(self: Box<Self>, commit: Result<(), &str>);
}

struct Task<F, T> {
    work: F,
    reply: oneshot::Sender<Result<T>>,
}

impl<F, T> Job for Task<F, T>
where
    F: FnOnce(&Connection) -> Result<T> + Send,
    T: Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> Box<dyn Answer> {
        let result = (self.work)(conn);
        Box::new(Reply {
            result,
            reply: self.reply,
        })
    }

    fn abort(self: Box<Self>, error: StoreError) {
        // The caller may have gone away; nothing to do then.
        let _ = self.reply.send(Err(error));
    }
}

struct Reply<T> {
    result: Result<T>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T: Send> Answer for Reply<T> {
    fn succeeded(&self) -> bool {
        self.result.is_ok()
    }

    fn deliver(self: Box<Self>, commit: Result<(), &str>) {
        let result = match commit {
            Ok(()) => self.result,
            Err(why) => Err(StoreError::Unavailable(why.to_owned())),
        };
        let _ = self.reply.send(result);
    }
}

/// What a caller does when the queue is full.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WhenFull {
    /// Fail with [`StoreError::Overloaded`] (intake and completions: the
    /// caller sheds load instead of parking the runtime).
    Shed,
    /// Wait for room (operator and maintenance writes, claims).
    Wait,
}

/// Handle to the writer thread. Dropping it lets the thread finish the
/// queued work and waits for it to close the database.
pub(crate) struct Writer {
    queue: Option<mpsc::Sender<Box<dyn Job>>>,
    thread: Option<JoinHandle<()>>,
    commits: Arc<AtomicU64>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("commits", &self.commits())
            .finish_non_exhaustive()
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("sqlite writer thread has stopped".into())
}

impl Writer {
    /// Starts the thread that owns `conn`.
    pub(crate) fn start(conn: Connection, opts: &SqliteOptions) -> Result<Self> {
        let (tx, rx) = mpsc::channel(opts.queue_capacity);
        let commits = Arc::new(AtomicU64::new(0));
        let group = if opts.group_commit { opts.max_batch } else { 1 };
        let counter = Arc::clone(&commits);
        let thread = std::thread::Builder::new()
            .name("mailroom-sqlite-writer".into())
            .spawn(move || run(conn, rx, group, &counter))
            .map_err(|e| StoreError::Unavailable(format!("starting the sqlite writer: {e}")))?;
        Ok(Self {
            queue: Some(tx),
            thread: Some(thread),
            commits,
        })
    }

    /// Write transactions committed so far.
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Runs `work` on the writer thread and returns its result once committed.
    pub(crate) async fn call<F, T>(&self, when_full: WhenFull, work: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let queue = self.queue.as_ref().ok_or_else(stopped)?;
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(Task { work, reply });
        match when_full {
            WhenFull::Shed => queue.try_send(job).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => StoreError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => stopped(),
            })?,
            WhenFull::Wait => queue.send(job).await.map_err(|_| stopped())?,
        }
        answer.await.map_err(|_| stopped())?
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop once the queue is drained.
        self.queue = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("sqlite writer thread panicked");
        }
    }
}

fn run(conn: Connection, mut rx: mpsc::Receiver<Box<dyn Job>>, group: usize, commits: &AtomicU64) {
    let mut batch: Vec<Box<dyn Job>> = Vec::with_capacity(group);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < group {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_group(&conn, &mut batch, commits);
    }
    tracing::debug!("sqlite writer stopped: every handle was dropped");
}

fn step(conn: &Connection, sql: &str, context: &'static str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute([]))
        .map(drop)
        .map_err(db(context))
}

/// Runs `batch` in one transaction, counting it in `commits` (before anyone
/// is answered) if it committed.
fn commit_group(conn: &Connection, batch: &mut Vec<Box<dyn Job>>, commits: &AtomicU64) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let why = format!("sqlite: starting a write transaction: {e}");
        tracing::warn!(error = %e, jobs = batch.len(), "sqlite write transaction could not start");
        for job in batch.drain(..) {
            job.abort(StoreError::Unavailable(why.clone()));
        }
        return;
    }
    let (answers, broken) = run_jobs(conn, batch);
    let committed = match broken {
        Some(why) => Err(why),
        None => conn
            .execute_batch("COMMIT")
            .map_err(|e| format!("sqlite: committing: {e}")),
    };
    match committed {
        Ok(()) => {
            commits.fetch_add(1, Ordering::Relaxed);
            for answer in answers {
                answer.deliver(Ok(()));
            }
        }
        Err(why) => {
            tracing::warn!(error = %why, jobs = answers.len(), "sqlite write group failed; nothing in it was committed");
            if !conn.is_autocommit()
                && let Err(e) = conn.execute_batch("ROLLBACK")
            {
                tracing::error!(error = %e, "sqlite rollback failed");
            }
            for answer in answers {
                answer.deliver(Err(&why));
            }
        }
    }
}

/// Runs the jobs of `batch` one savepoint each, inside the open
/// transaction. Once the transaction is broken the jobs not run yet are
/// aborted, and the reason is returned beside the answers held so far.
fn run_jobs(
    conn: &Connection,
    batch: &mut Vec<Box<dyn Job>>,
) -> (Vec<Box<dyn Answer>>, Option<String>) {
    let mut answers: Vec<Box<dyn Answer>> = Vec::with_capacity(batch.len());
    let mut jobs = batch.drain(..);
    let broken = jobs
        .by_ref()
        .find_map(|job| run_in_savepoint(conn, job, &mut answers).err());
    if let Some(why) = &broken {
        for job in jobs {
            job.abort(StoreError::Unavailable(why.clone()));
        }
    }
    (answers, broken)
}

/// One job in its own savepoint: kept if it succeeded, rolled back to the
/// savepoint if not. `Err` says why the whole transaction is broken.
fn run_in_savepoint(
    conn: &Connection,
    job: Box<dyn Job>,
    answers: &mut Vec<Box<dyn Answer>>,
) -> Result<(), String> {
    if let Err(e) = step(conn, "SAVEPOINT job", "opening a savepoint") {
        let why = e.to_string();
        job.abort(e);
        return Err(why);
    }
    let answer = job.run(conn);
    if conn.is_autocommit() {
        // SQLite rolled the whole transaction back (I/O error, disk full...).
        answers.push(answer);
        return Err("sqlite: the write transaction was rolled back".into());
    }
    let end = if answer.succeeded() {
        step(conn, "RELEASE job", "releasing a savepoint")
    } else {
        step(conn, "ROLLBACK TO job", "rolling back a savepoint")
            .and_then(|()| step(conn, "RELEASE job", "releasing a savepoint"))
    };
    answers.push(answer);
    end.map_err(|e| e.to_string())
}
