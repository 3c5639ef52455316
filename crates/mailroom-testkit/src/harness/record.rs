//! What the senders and the handlers saw: every acknowledgement and every
//! handler call, on one clock (since the run's start), so the checker can
//! compare them with the store.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One `200`/`201` answer to an intake request.
#[derive(Debug, Clone)]
pub struct Ack {
    /// The sender's dedup key.
    pub dedup_key: String,
    /// The event id mailroom answered with.
    pub event_id: String,
    /// `"duplicate": true` in the answer.
    pub duplicate: bool,
    /// Ordering key the event was sent with (sequential topics), if any.
    pub key: Option<String>,
    /// The sender's counter for that key: event `seq + 1` of a key is sent
    /// only after event `seq` was acknowledged, so this is arrival order.
    pub seq: u64,
    /// When the request that got this answer was sent.
    pub sent_at: Duration,
    /// When the answer arrived.
    pub at: Duration,
}

/// How a handler call ended, as the handler side saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The handler answered success (and, for a pull worker, the ack was accepted).
    Succeeded,
    /// The handler answered failure (non-2xx, reset, a non-zero exit...).
    Failed,
    /// The caller went away before the answer (timeout, kill).
    Cut,
    /// A pull worker's late completion was refused by its fencing token:
    /// it changed nothing, so it does not count as processing.
    Fenced,
}

/// One handler call.
#[derive(Debug, Clone)]
pub struct Call {
    /// `webhook-id`: the event id.
    pub event_id: String,
    /// `mailroom-attempt` (or the pull claim's token).
    pub attempt: u32,
    /// When the call arrived.
    pub start: Duration,
    /// When the handler began to answer (the first byte written, the ack
    /// sent), or `end` when it never did: the caller cannot know the
    /// verdict before this instant, so nothing it does on the verdict
    /// (the key's next event) can start before it.
    pub answered: Duration,
    /// When the answer was written, or the call was cut.
    pub end: Duration,
    /// How it ended.
    pub outcome: Outcome,
}

/// Everything one scenario recorded.
#[derive(Debug, Default, Clone)]
pub struct Record {
    /// Intake requests sent (retries included).
    pub sent: u64,
    /// Every `200`/`201` answer.
    pub acks: Vec<Ack>,
    /// Every handler call.
    pub calls: Vec<Call>,
    /// Spans (from, to) in which a completion may have been lost without a
    /// bug (a `kill -9` is a point, a full disk or a database outage a
    /// span): a completed event run again after one of them is the
    /// at-least-once allowance, not a duplicate.
    pub disruptions: Vec<(Duration, Duration)>,
    /// Intake answers that were neither an ack nor a connection error, by status.
    pub refusals: Vec<(u16, Duration)>,
    /// Every webhook intake request: when it was sent, when it was
    /// answered (or failed), and the status (0: no answer).
    pub answers: Vec<(Duration, Duration, u16)>,
}

/// The shared, lockable record and its clock.
#[derive(Debug, Clone)]
pub struct Recorder {
    epoch: Instant,
    inner: Arc<Mutex<Record>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty record whose clock starts now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            inner: Arc::default(),
        }
    }

    /// Time since the scenario started.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// The record, to add to it.
    pub fn lock(&self) -> MutexGuard<'_, Record> {
        // A panic while holding the lock would only have pushed a record.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a disruption that lasted from `from` to `to`.
    pub fn disrupted_between(&self, from: Duration, to: Duration) {
        self.lock().disruptions.push((from, to));
    }

    /// An instant on this record's clock.
    pub fn at(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.epoch)
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> Record {
        self.lock().clone()
    }
}
