//! Connections that heal: one supervisor loop per
//! broker URL connects, declares the topology, attaches the handlers'
//! channels and starts the sources' consumers; when the connection is lost
//! it does all of that again after a capped, jittered, growing delay.
//!
//! lapin's own recovery (`enable_auto_recover`) is not used: it gives up
//! after a fixed number of TCP attempts, and its open issue amqp-rs/lapin#450
//! reports a connection that never recovers after a broker restart. A fresh
//! connection per outage is simple to reason about: publishes in flight fail
//! (the attempt is retried later), unacknowledged deliveries return to their
//! queue (and are deduplicated when redelivered).

use crate::broker::Broker;
use crate::declare::{Declared, Topology, declare};
use crate::error::{AmqpError, Result};
use crate::publish::AmqpHandler;
use crate::source::AmqpSource;
use futures::StreamExt;
use lapin::{Connection, ConnectionProperties};
use mailroom::redact::url as redact;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// First and longest delay between reconnection attempts.
const RECONNECT: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(30));

/// How long closing a connection waits for the broker's close-ok: a
/// broker that does not answer must not hold a shutdown.
pub const CLOSE_GRACE: Duration = Duration::from_secs(3);

/// The AMQP heartbeat asked for when the URL names none (`?heartbeat=`):
/// 5 s, so a connection whose broker went silent (a frozen network: no
/// RST, no error) is declared dead by lapin after two intervals, 10 s,
/// and reconnected; the broker's default, 60 s, would leave it for 2
/// minutes. RabbitMQ advises against less than 5 s (false alarms on a
/// busy host).
pub const HEARTBEAT_SECS: u16 = 5;

/// How long connecting (TCP, TLS and the AMQP handshake) may take: a
/// broker that accepts TCP but never answers (a frozen path) must not
/// hold a reconnection; the next attempt follows the backoff.
pub const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// How long setting a connection up (declaring the topology, opening the
/// handlers' and sources' channels) may take before it is given up and
/// tried again.
pub const SET_UP_LIMIT: Duration = Duration::from_secs(10);

/// `url` with `heartbeat=`[`HEARTBEAT_SECS`] added to its query, unless it
/// names a heartbeat itself.
pub fn with_heartbeat(url: &str) -> String {
    let query = url.split_once('?').map(|(_, q)| q);
    if query.is_some_and(|q| q.split('&').any(|kv| kv.starts_with("heartbeat="))) {
        return url.to_owned();
    }
    let sep = if query.is_some() { '&' } else { '?' };
    format!("{url}{sep}heartbeat={HEARTBEAT_SECS}")
}

/// Connects to `url` (`amqp://` or `amqps://`, see [`Broker::parse`]),
/// declares `topology` once and closes the connection: `mailroom amqp
/// declare`, and `serve`'s check before it starts (a conflicting queue is
/// [`AmqpError::Inequivalent`]).
pub async fn declare_at(url: &str, topology: &Topology) -> Result<Declared> {
    let broker = Broker::parse(url)?;
    let conn = broker
        .connect(ConnectionProperties::default())
        .await
        .map_err(|e| AmqpError::broker(format!("connecting to {}", broker.name()), e))?;
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| AmqpError::broker("opening a channel", e))?;
    let declared = declare(&channel, topology).await;
    let _ = conn.close(200, "OK".into()).await;
    declared
}

/// Whether a supervised connection is up (for `/readyz`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct AmqpStatus {
    name: Arc<str>,
    up: Arc<AtomicBool>,
}

impl AmqpStatus {
    /// The connection's name: its URL without credentials.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connected, topology declared, handlers and consumers running.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    fn set(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
        metrics::gauge!(mailroom::metrics::AMQP_CONNECTED, "connection" => self.name.to_string())
            .set(if up { 1.0 } else { 0.0 });
    }
}

/// One broker connection and everything that runs on it.
#[derive(Debug)]
pub struct AmqpConnection {
    broker: Broker,
    topology: Topology,
    sources: Vec<AmqpSource>,
    handlers: Vec<AmqpHandler>,
    status: AmqpStatus,
    intake: CancellationToken,
}

impl AmqpConnection {
    /// A connection to `url` (`amqp://user:pass@host:port/vhost`, or
    /// `amqps://` with RabbitMQ's TLS parameters: [`Broker::parse`]).
    ///
    /// # Errors
    /// A URL [`Broker::parse`] refuses (a TLS file that cannot be read...).
    pub fn new(url: &str) -> Result<Self> {
        // Its sessions ask for mailroom's heartbeat; it is named as configured.
        let broker = Broker::parse(&with_heartbeat(url))?;
        let status = AmqpStatus {
            name: redact(url).into(),
            up: Arc::new(AtomicBool::new(false)),
        };
        Ok(Self {
            broker,
            topology: Topology::default(),
            sources: vec![],
            handlers: vec![],
            status,
            intake: CancellationToken::new(),
        })
    }

    /// Stops the sources' consumers when `intake` is cancelled, while the
    /// handlers keep publishing until [`AmqpConnection::run`]'s own
    /// shutdown: `serve` stops taking messages at SIGTERM (the unconsumed
    /// ones stay in their queues for another instance) and still publishes
    /// for the attempts that finish during the drain.
    pub fn intake_until(mut self, intake: CancellationToken) -> Self {
        self.intake = intake;
        self
    }

    /// The topology declared on every (re)connection.
    pub fn topology(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Adds a source consumed on its own channel.
    pub fn source(mut self, source: AmqpSource) -> Self {
        self.sources.push(source);
        self
    }

    /// Adds a handler publishing on its own channel.
    pub fn handler(mut self, handler: AmqpHandler) -> Self {
        self.handlers.push(handler);
        self
    }

    /// The connection's status handle.
    pub fn status(&self) -> AmqpStatus {
        self.status.clone()
    }

    /// Keeps the connection up until `shutdown`: connects, and after every
    /// loss reconnects with capped exponential backoff and jitter. Logs each
    /// transition once, not each failed attempt.
    pub async fn run(self, shutdown: CancellationToken) {
        let name = self.status.name().to_string();
        let mut failures: u32 = 0;
        let mut last_error: Option<String> = None;
        self.status.set(false);
        self.broker.warn_if_unverified();
        while !shutdown.is_cancelled() {
            let ended = self.session(&shutdown, &mut failures).await;
            self.status.set(false);
            for h in &self.handlers {
                h.detach();
            }
            let Err(e) = ended else { break };
            let text = e.to_string();
            if last_error.as_deref() != Some(text.as_str()) {
                tracing::warn!(connection = %name, error = %text, "AMQP connection down; reconnecting");
                last_error = Some(text);
            }
            let delay = backoff(failures);
            failures = failures.saturating_add(1);
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shutdown.cancelled() => break,
            }
        }
    }

    /// One connection's life: set up, run until it is lost or `shutdown`.
    /// Every wait for the broker ends at `shutdown` or within a bound: a
    /// broker that accepts TCP but never answers must not hold a SIGTERM.
    async fn session(&self, shutdown: &CancellationToken, failures: &mut u32) -> Result<()> {
        let connecting = self.broker.connect(ConnectionProperties::default());
        let conn = tokio::select! {
            conn = tokio::time::timeout(CONNECT_LIMIT, connecting) => match conn {
                Ok(conn) => conn.map_err(|e| AmqpError::broker("connecting", e))?,
                Err(_) => return Err(no_answer("connecting", CONNECT_LIMIT)),
            },
            () = shutdown.cancelled() => return Ok(()),
        };
        // Shared with the depth task, which opens its own channels.
        let conn = Arc::new(conn);
        let mut events = conn.events_listener();
        let stop = shutdown.child_token();
        let sources_stop = linked(&stop, &self.intake);
        let mut consumers = JoinSet::new();
        let setting_up = self.set_up(&conn, &sources_stop, &mut consumers);
        let set_up = tokio::select! {
            set_up = tokio::time::timeout(SET_UP_LIMIT, setting_up) => Some(
                set_up.unwrap_or_else(|_| Err(no_answer("setting the connection up", SET_UP_LIMIT)))
            ),
            () = stop.cancelled() => None,
        };
        let ended = match set_up {
            Some(Ok(())) => {
                self.status.set(true);
                *failures = 0;
                tokio::spawn(depths(
                    Arc::clone(&conn),
                    self.status.name().to_string(),
                    self.watched_queues(),
                    stop.clone(),
                ));
                tracing::info!(connection = %self.status.name(), sources = self.sources.len(), handlers = self.handlers.len(), "AMQP connection up");
                watch(&stop, &sources_stop, &mut consumers, &mut events).await
            }
            Some(Err(e)) => Err(e),
            None => Ok(()),
        };
        // Down from the moment the loss is known, not after the wind-down
        // below, which may wait for its bounds (`STOP_GRACE`, `CLOSE_GRACE`).
        self.status.set(false);
        stop.cancel();
        // Each consumer stops within its own bound (`source::STOP_GRACE`).
        while consumers.join_next().await.is_some() {}
        // After a loss this fails at once; after shutdown it closes cleanly,
        // unless the broker does not answer.
        let _ = tokio::time::timeout(CLOSE_GRACE, conn.close(200, "OK".into())).await;
        ended
    }

    /// Declares the topology, attaches the handlers and starts the sources'
    /// consumers (into `consumers`, until `sources_stop`; none once intake
    /// has stopped).
    async fn set_up(
        &self,
        conn: &Connection,
        sources_stop: &CancellationToken,
        consumers: &mut JoinSet<Result<()>>,
    ) -> Result<()> {
        let channel = open_channel(conn).await?;
        declare(&channel, &self.topology).await?;
        for h in &self.handlers {
            h.attach(open_channel(conn).await?).await?;
        }
        if sources_stop.is_cancelled() {
            return Ok(());
        }
        for s in &self.sources {
            let (source, ch, stop) = (s.clone(), open_channel(conn).await?, sources_stop.clone());
            consumers.spawn(async move { source.consume(&ch, &stop).await });
        }
        Ok(())
    }
}

impl AmqpConnection {
    /// The queues whose depth is reported: each source's queue, and its
    /// dead-letter queue (the topology's, else `<queue>.dlq` if the broker
    /// has one).
    fn watched_queues(&self) -> Vec<String> {
        let mut queues: Vec<String> = vec![];
        for s in &self.sources {
            let queue = &s.spec().queue;
            let dlq = match self.topology.queues.iter().find(|q| &q.name == queue) {
                Some(q) if q.dead_letter => Some(q.dead_letter_queue()),
                Some(_) => None,
                None => Some(format!("{queue}.dlq")),
            };
            for q in std::iter::once(queue.clone()).chain(dlq) {
                if !queues.contains(&q) {
                    queues.push(q);
                }
            }
        }
        queues
    }
}

/// How often the watched queues' depths are asked for.
pub const DEPTH_EVERY: Duration = Duration::from_secs(10);

/// Sets `mailroom_broker_queue_depth{connection,queue}` for each of
/// `queues` every [`DEPTH_EVERY`] until `stop`, by passive declares on a
/// channel of its own (a queue that does not exist closes that channel; it
/// is reopened at the next round, and the queue reported nowhere).
async fn depths(conn: Arc<Connection>, name: String, queues: Vec<String>, stop: CancellationToken) {
    if queues.is_empty() {
        return;
    }
    let mut channel: Option<lapin::Channel> = None;
    let mut every = tokio::time::interval(DEPTH_EVERY);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        for queue in &queues {
            let ch = match channel.take().filter(|c| c.status().connected()) {
                Some(ch) => ch,
                None => match tokio::time::timeout(SET_UP_LIMIT, conn.create_channel()).await {
                    Ok(Ok(ch)) => ch,
                    _ => break,
                },
            };
            let Ok(short) = lapin::types::ShortString::try_new(queue.as_str()) else {
                continue;
            };
            let options = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let asked = ch.queue_declare(short, options, lapin::types::FieldTable::default());
            if let Ok(Ok(q)) = tokio::time::timeout(SET_UP_LIMIT, asked).await {
                metrics::gauge!(mailroom::metrics::BROKER_QUEUE_DEPTH, "connection" => name.clone(), "queue" => queue.clone())
                    .set(f64::from(q.message_count()));
                channel = Some(ch);
            }
        }
    }
}

/// A token cancelled with `stop` (its parent) or as soon as `intake` is.
fn linked(stop: &CancellationToken, intake: &CancellationToken) -> CancellationToken {
    let linked = stop.child_token();
    let (intake, l) = (intake.clone(), linked.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = intake.cancelled() => l.cancel(),
            () = l.cancelled() => {}
        }
    });
    linked
}

/// Runs until `stop`, an unexpected end of a consumer, or the connection's
/// loss. Consumers that end because intake stopped (`sources_stop`) are
/// not a failure: the handlers go on until `stop`.
async fn watch(
    stop: &CancellationToken,
    sources_stop: &CancellationToken,
    consumers: &mut JoinSet<Result<()>>,
    events: &mut (impl futures::Stream<Item = lapin::Event> + Unpin),
) -> Result<()> {
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            Some(done) = consumers.join_next() => match done {
                Ok(Ok(())) if sources_stop.is_cancelled() => {}
                Ok(Err(e)) => return Err(e),
                Ok(Ok(())) => return Err(AmqpError::Invalid("a consumer stopped".into())),
                Err(e) => return Err(AmqpError::Invalid(format!("a consumer failed: {e}"))),
            },
            event = events.next() => match event {
                Some(lapin::Event::Error(e)) => return Err(AmqpError::broker("connection lost", e)),
                Some(_) => {}
                None => return Err(AmqpError::Invalid("the connection closed".into())),
            },
        }
    }
}

/// The error of a broker that did not answer `action` within `limit`.
fn no_answer(action: &str, limit: Duration) -> AmqpError {
    AmqpError::NoAnswer {
        action: action.into(),
        limit,
    }
}

async fn open_channel(conn: &Connection) -> Result<lapin::Channel> {
    conn.create_channel()
        .await
        .map_err(|e| AmqpError::broker("opening a channel", e))
}

/// `min(200 ms × 2^failures, 30 s)`, scaled by a random factor in [0.5, 1]
/// so that many instances do not reconnect in step.
fn backoff(failures: u32) -> Duration {
    let exp = RECONNECT.0.saturating_mul(1u32 << failures.min(16));
    exp.min(RECONNECT.1)
        .mul_f64(0.5 + rand::random::<f64>() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL without a heartbeat gets mailroom's; one that names its own
    /// keeps it.
    #[test]
    fn a_heartbeat_is_asked_for_unless_the_url_names_one() {
        assert_eq!(
            with_heartbeat("amqp://h:5672/%2f"),
            "amqp://h:5672/%2f?heartbeat=5"
        );
        assert_eq!(
            with_heartbeat("amqps://h/v?frame_max=8192"),
            "amqps://h/v?frame_max=8192&heartbeat=5"
        );
        assert_eq!(
            with_heartbeat("amqp://h/v?heartbeat=30"),
            "amqp://h/v?heartbeat=30"
        );
    }

    /// Reconnection delays grow, never exceed 30 s, and are spread.
    #[test]
    fn reconnect_delays_grow_up_to_the_cap() {
        assert!(backoff(0) <= Duration::from_millis(200));
        assert!(backoff(0) >= Duration::from_millis(100));
        assert!(backoff(3) >= Duration::from_millis(800));
        for n in [10, 20, 1000] {
            let d = backoff(n);
            assert!(
                d >= Duration::from_secs(15) && d <= Duration::from_secs(30),
                "{d:?}"
            );
        }
    }
}
