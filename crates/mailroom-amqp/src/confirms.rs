//! Which publish a broker verdict belongs to (AMQP 0-9-1 publisher confirms
//! with `mandatory`).
//!
//! A `basic.return` carries no delivery tag. lapin queues a return until the
//! next confirm it completes and attaches it to that one; a multiple
//! `basic.ack` completes its tags in hash-map order. So the confirm that
//! carries a returned message is often another publish's, and reading
//! "returned" off one's own confirm marks unroutable events done (lost) and
//! routed ones failed.
//!
//! The ledger attributes by identity instead. Every publish is stamped with a
//! sequence number ([`SEQ_HEADER`]), taken before it is sent. One harvester
//! task per channel owns every pending confirm, so none is dropped with its
//! return when an attempt is cut off by its timeout. It records each
//! returned message under the sequence number the message carries, whichever
//! confirm brought it. A publish is decided only when every publish
//! registered before its own confirm was seen has been harvested: RabbitMQ
//! sends a publish's `basic.return` before the `basic.ack` that confirms it,
//! and lapin completes all confirms of one ack frame before it reads the
//! next frame, so by then its return, if any, has been recorded.

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::message::BasicReturnMessage;
use lapin::types::AMQPValue;
use lapin::{Confirmation, PublisherConfirm};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{mpsc, oneshot};

/// The header carrying a publish's sequence number on its channel. It comes
/// back in a `basic.return` and names the publish that was returned.
pub(crate) const SEQ_HEADER: &str = "mailroom-publish-seq";

/// The broker's verdict on one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Acked and not returned: routed to at least one queue.
    Confirmed,
    /// Returned as unroutable (`mandatory` found no queue).
    Returned,
    /// Nacked by the broker.
    Nacked,
    /// No verdict: the channel closed, or confirms are off.
    Failed(String),
}

/// One channel's ledger and the sender to its harvester. Cheap to clone;
/// the harvester ends once every clone is dropped and its confirms resolved.
#[derive(Debug, Clone)]
pub(crate) struct Confirms {
    ledger: Arc<Mutex<Ledger>>,
    harvester: mpsc::UnboundedSender<Sent>,
}

impl Confirms {
    /// A ledger for a fresh channel in confirm mode, with its harvester task.
    pub(crate) fn spawn() -> Self {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(harvest(ledger.clone(), rx));
        Self {
            ledger,
            harvester: tx,
        }
    }

    /// Takes the next sequence number; register before publishing, so that
    /// a publish the broker may already have answered is never missed.
    pub(crate) fn register(&self) -> Ticket {
        let mut ledger = self.lock();
        ledger.next += 1;
        let seq = ledger.next;
        ledger.open.insert(seq);
        Ticket {
            seq,
            confirms: Some(self.clone()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A registered publish. Dropped without [`sent`](Self::sent) (the publish
/// failed or was cut off), it leaves the ledger so that it holds up no one.
#[derive(Debug)]
pub(crate) struct Ticket {
    seq: u64,
    confirms: Option<Confirms>,
}

impl Ticket {
    /// The sequence number to stamp in [`SEQ_HEADER`].
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Hands the publish's confirm to the harvester; the receiver gets the
    /// publish's verdict once it is decided.
    pub(crate) fn sent(mut self, confirm: PublisherConfirm) -> oneshot::Receiver<Verdict> {
        let (tx, rx) = oneshot::channel();
        if let Some(confirms) = self.confirms.take() {
            let sent = Sent {
                seq: self.seq,
                confirm,
                verdict: tx,
            };
            if let Err(mpsc::error::SendError(sent)) = confirms.harvester.send(sent) {
                // The harvester only ends when no sender is left; keep the
                // ledger consistent all the same.
                confirms.lock().abandon(sent.seq);
            }
        }
        rx
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(confirms) = self.confirms.take() {
            confirms.lock().abandon(self.seq);
        }
    }
}

/// A sent publish, its confirm, and where its verdict goes.
struct Sent {
    seq: u64,
    confirm: PublisherConfirm,
    verdict: oneshot::Sender<Verdict>,
}

/// A harvested publish waiting for the publishes registered before it was
/// harvested.
#[derive(Debug)]
struct Waiting {
    verdict: Verdict,
    tx: oneshot::Sender<Verdict>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// The last sequence number given.
    next: u64,
    /// Registered and not yet harvested (nor abandoned).
    open: BTreeSet<u64>,
    /// Harvested, by (last sequence registered when harvested, own sequence).
    decidable_after: BTreeSet<(u64, u64)>,
    /// Harvested publishes' provisional verdicts, by sequence.
    waiting: HashMap<u64, Waiting>,
    /// Sequences seen in returned messages, not yet decided.
    returned: HashSet<u64>,
}

impl Ledger {
    /// Records a resolved confirm: the returned message it carries (whoever
    /// it belongs to) and the confirm's own provisional verdict.
    fn harvest(
        &mut self,
        seq: u64,
        tx: oneshot::Sender<Verdict>,
        result: lapin::Result<Confirmation>,
    ) {
        let verdict = match result {
            Ok(Confirmation::Ack(returned)) => {
                self.note_return(returned);
                Verdict::Confirmed
            }
            Ok(Confirmation::Nack(returned)) => {
                self.note_return(returned);
                Verdict::Nacked
            }
            Ok(Confirmation::NotRequested) => {
                Verdict::Failed("publisher confirms are off on this channel".into())
            }
            Err(e) => Verdict::Failed(format!("no confirm: {e}")),
        };
        self.open.remove(&seq);
        self.decidable_after.insert((self.next, seq));
        self.waiting.insert(seq, Waiting { verdict, tx });
        self.decide();
    }

    fn note_return(&mut self, returned: Option<BasicReturnMessage>) {
        let Some(message) = returned else { return };
        let seq = message
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(SEQ_HEADER))
            .and_then(|v| match v {
                AMQPValue::LongLongInt(n) => u64::try_from(*n).ok(),
                _ => None,
            });
        match seq {
            Some(seq) if self.open.contains(&seq) || self.waiting.contains_key(&seq) => {
                self.returned.insert(seq);
            }
            _ => tracing::warn!(
                seq,
                routing_key = message.delivery.routing_key.as_str(),
                "a returned message matches no publish awaiting its verdict"
            ),
        }
    }

    /// The publish gave up before (or without) a confirm.
    fn abandon(&mut self, seq: u64) {
        self.open.remove(&seq);
        self.returned.remove(&seq);
        self.decide();
    }

    /// Sends the verdict of every harvested publish whose predecessors are
    /// all harvested too.
    fn decide(&mut self) {
        let low = self.open.first().copied().unwrap_or(u64::MAX);
        while let Some(&(after, seq)) = self.decidable_after.first() {
            if after >= low {
                break;
            }
            self.decidable_after.pop_first();
            if let Some(w) = self.waiting.remove(&seq) {
                let verdict = match self.returned.remove(&seq) {
                    true => Verdict::Returned,
                    false => w.verdict,
                };
                // The attempt may have been cut off by its timeout: nobody listens.
                let _ = w.tx.send(verdict);
            }
        }
    }
}

/// The harvester: awaits every sent publish's confirm and records it in the
/// ledger; ends when no sender is left and every confirm has resolved.
async fn harvest(ledger: Arc<Mutex<Ledger>>, mut sent: mpsc::UnboundedReceiver<Sent>) {
    let mut pending = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            Some((seq, tx, result)) = pending.next() => {
                ledger.lock().unwrap_or_else(|p| p.into_inner()).harvest(seq, tx, result);
            }
            next = sent.recv(), if open => match next {
                Some(s) => pending.push(async move { (s.seq, s.verdict, s.confirm.await) }),
                None => open = false,
            },
            else => break,
        }
    }
}
