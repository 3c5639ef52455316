//! mailroom's side: the AMQP source into a fresh SQLite store, and the
//! relay (a topic with an AMQP handler) out of one.

use super::{Ctx, Meter, Phase, Route, wait_until};
use crate::backend::{Backend, Opened};
use crate::counting::CountingStore;
use anyhow::Context;
use mailroom::handler::{BatchOutcome, Handler};
use mailroom::{
    BatchSettings, Draft, Engine, Event, Mode, Outcome, Status, Store, StoreError, TopicSpec,
};
use mailroom_amqp::{AmqpConnection, AmqpHandler, AmqpHandlerSpec, AmqpSource, AmqpSourceSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const INBOUND: &str = "inbound";
const RELAY: &str = "relay";

/// Events of `topic` in `status` (a store query: used sparingly).
async fn count(engine: &Engine, topic: &str, status: Status) -> anyhow::Result<u64> {
    let stats = engine.operator().stats().await?;
    Ok(stats
        .iter()
        .filter(|t| t.topic == topic)
        .map(|t| t.count(status))
        .sum())
}

/// A fresh SQLite store as `serve` opens it (group commit), migrated and
/// wrapped in a call counter; the `Opened` handle gives its commit count.
async fn fresh_store() -> anyhow::Result<(crate::backend::Fresh, Opened, CountingStore)> {
    let fresh = Backend::Sqlite.fresh().await?;
    let opened = fresh.open(true).await?;
    let counting = CountingStore::new(opened.store());
    counting.migrate().await.context("migrating")?;
    Ok((fresh, opened, counting))
}

/// The N messages waiting in `queue` stored by an [`AmqpSource`] with
/// `prefetch`, each acked after its commit. Timed from the consumer's start
/// until every event is committed and the source has settled every
/// delivery it took.
pub async fn inbound(ctx: &Ctx, queue: &str, prefetch: u16) -> anyhow::Result<Phase> {
    let n = ctx.settings.messages;
    let (fresh, opened, counting) = fresh_store().await?;
    let calls = counting.calls.clone();
    let engine = Engine::builder(Arc::new(counting))
        .topic(TopicSpec::new(INBOUND))
        .build()?;
    let mut spec = AmqpSourceSpec::new("bench", INBOUND, queue);
    spec.prefetch = prefetch;
    let source = AmqpSource::new(engine.clone(), spec)?;
    let ch = ctx.channel().await?;
    let stop = CancellationToken::new();
    let commits = opened.commits();
    let meter = Meter::start(ctx.broker_pid.as_deref());
    let consumer = {
        let (ch, stop) = (ch.clone(), stop.clone());
        tokio::spawn(async move { source.consume(&ch, &stop).await })
    };
    let timeout = ctx.settings.timeout;
    // A counter first (free), then the store (a query) for the last few.
    let inserts = || calls.inserts.load(Ordering::Relaxed) >= n;
    wait_until(
        "every delivery is being stored",
        timeout,
        Duration::from_millis(5),
        async || Ok(inserts() || consumer.is_finished()),
    )
    .await?;
    wait_until(
        "every delivery is stored",
        timeout,
        Duration::from_millis(5),
        async || Ok(count(&engine, INBOUND, Status::Pending).await? >= n || consumer.is_finished()),
    )
    .await?;
    stop.cancel();
    consumer.await?.context("the AMQP source failed")?;
    let phase = meter.finish(
        format!("mailroom inbound, prefetch {prefetch}"),
        n,
        Some(opened.commits() - commits),
    );
    let _ = ch.close(200, "OK".into()).await;
    let stored = count(&engine, INBOUND, Status::Pending).await?;
    anyhow::ensure!(stored == n, "stored {stored} of {n}");
    anyhow::ensure!(
        ctx.ready(queue).await? == 0,
        "{queue} is not empty: not every delivery was acked"
    );
    opened.close().await;
    fresh.cleanup().await?;
    Ok(phase)
}

/// Counts the handler's successes, so the bench waits on a counter rather
/// than on store queries.
#[derive(Debug)]
struct Counted {
    inner: AmqpHandler,
    done: Arc<AtomicU64>,
}

#[async_trait::async_trait]
impl Handler for Counted {
    async fn handle(&self, event: &Event) -> Outcome {
        let outcome = self.inner.handle(event).await;
        if outcome == Outcome::Success {
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    async fn handle_batch(&self, events: &[Event]) -> BatchOutcome {
        let outcome = self.inner.handle_batch(events).await;
        let ok = events
            .iter()
            .filter(|e| outcome.for_event(e.id) == Outcome::Success)
            .count();
        self.done.fetch_add(ok as u64, Ordering::Relaxed);
        outcome
    }
}

/// Enqueues N outbox events (1 KB JSON, a type, a dedup key) concurrently:
/// the application's commits, before the relay runs.
async fn preload(engine: &Engine, n: u64, body_size: usize) -> anyhow::Result<()> {
    let body = crate::ingest::body(body_size);
    let workers = 256u64;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (engine, body) = (engine.clone(), body.clone());
        tasks.spawn(async move {
            let mut i = w;
            while i < n {
                let draft = Draft::bytes(RELAY, body.clone())
                    .content_type("application/json")
                    .event_type("created")
                    .dedup_key(format!("r-{i}"));
                match engine.enqueue(draft).await {
                    Ok(_) => i += workers,
                    Err(mailroom::EnqueueError::Store(StoreError::Overloaded)) => {
                        tokio::time::sleep(Duration::from_millis(1)).await
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// The relay topic's shape.
#[derive(Debug, Clone, Copy)]
pub enum RelayTopic {
    /// A `single` topic: one event per attempt, `concurrency` in flight.
    Single { concurrency: u32 },
    /// A `batch` topic: up to `max_size` events per delivery, published
    /// together and confirmed together; `concurrency` deliveries in flight.
    Batch { max_size: u32, concurrency: u32 },
}

impl RelayTopic {
    fn spec(self) -> TopicSpec {
        match self {
            Self::Single { concurrency } => TopicSpec::new(RELAY).concurrency(concurrency),
            Self::Batch {
                max_size,
                concurrency,
            } => TopicSpec::new(RELAY)
                .mode(Mode::Batch(BatchSettings {
                    max_size,
                    max_wait: Duration::from_millis(50),
                    schedule: None,
                    group_by: None,
                }))
                .concurrency(concurrency),
        }
    }

    fn name(self) -> String {
        match self {
            Self::Single { concurrency } => {
                format!("mailroom relay: single, concurrency {concurrency}")
            }
            Self::Batch {
                max_size,
                concurrency,
            } => format!("mailroom relay: batch {max_size}, concurrency {concurrency}"),
        }
    }
}

/// N committed outbox events published by a topic with an AMQP handler on
/// a supervised connection. Timed from the dispatcher's start until every
/// event is `done` (confirmed by the broker and recorded).
pub async fn relay(ctx: &Ctx, route: &Route, shape: RelayTopic) -> anyhow::Result<Phase> {
    let n = ctx.settings.messages;
    let (fresh, opened, counting) = fresh_store().await?;
    let handler = AmqpHandler::new(AmqpHandlerSpec::new(&route.exchange, &route.routing_key));
    let done = Arc::new(AtomicU64::new(0));
    let counted = Counted {
        inner: handler.clone(),
        done: done.clone(),
    };
    let engine = Engine::builder(Arc::new(counting))
        .topic(shape.spec())
        .handler(RELAY, Arc::new(counted))
        .build()?;
    preload(&engine, n, ctx.settings.body_size).await?;
    let connection = AmqpConnection::new(&ctx.settings.url)?.handler(handler);
    let status = connection.status();
    let stop = CancellationToken::new();
    let supervisor = tokio::spawn(connection.run(stop.clone()));
    let timeout = ctx.settings.timeout;
    let every = Duration::from_millis(5);
    wait_until("the AMQP connection is up", timeout, every, async || {
        Ok(status.is_up())
    })
    .await?;
    let commits = opened.commits();
    let meter = Meter::start(ctx.broker_pid.as_deref());
    let dispatcher = {
        let (engine, stop) = (engine.clone(), stop.clone());
        tokio::spawn(async move { engine.run(stop).await })
    };
    wait_until("every event is published", timeout, every, async || {
        Ok(done.load(Ordering::Relaxed) >= n)
    })
    .await?;
    wait_until("every event is done", timeout, every, async || {
        Ok(count(&engine, RELAY, Status::Done).await? >= n)
    })
    .await?;
    let phase = meter.finish(shape.name(), n, Some(opened.commits() - commits));
    stop.cancel();
    dispatcher.await?;
    supervisor.await?;
    ctx.expect_queued(&route.queue, n, "published events")
        .await?;
    opened.close().await;
    fresh.cleanup().await?;
    Ok(phase)
}
