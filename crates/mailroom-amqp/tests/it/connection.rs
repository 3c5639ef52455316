use crate::{connect, consumers, delete, ready, sqlite_store, unique};
use mailroom::operate::ListFilter;
use mailroom::{Backoff, Draft, Engine, RetryPolicy, Status, TopicSpec};
use mailroom_amqp::connection::CLOSE_GRACE;
use mailroom_amqp::source::STOP_GRACE;
use mailroom_amqp::{
    AmqpConnection, AmqpHandler, AmqpHandlerSpec, AmqpSource, AmqpSourceSpec, ExchangeSpec,
    ExchangeType, QueueSpec, Topology,
};
use mailroom_testkit::harness::eventually;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

/// A TCP proxy in front of the broker that can cut every connection and
/// refuse new ones: the network view of a broker going down and back up. It
/// can also freeze: connections stay open and nothing more passes, the view
/// of a broker that stopped answering (a partition, a blocked connection).
struct Proxy {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    frozen: CancellationToken,
    pipes: Arc<Mutex<Vec<AbortHandle>>>,
}

impl Proxy {
    async fn start(broker: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = Proxy {
            addr: listener.local_addr().expect("addr"),
            open: Arc::new(AtomicBool::new(true)),
            frozen: CancellationToken::new(),
            pipes: Arc::new(Mutex::new(vec![])),
        };
        let (open, frozen, pipes) = (
            proxy.open.clone(),
            proxy.frozen.clone(),
            proxy.pipes.clone(),
        );
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !open.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused, in effect
                }
                let (frozen, broker) = (frozen.clone(), broker.clone());
                let pipe = tokio::spawn(async move {
                    if frozen.is_cancelled() {
                        // Accepted, and never a byte back.
                        return std::future::pending::<()>().await;
                    }
                    let Ok(mut server) = TcpStream::connect(&broker).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        // Both sockets stay open; nothing passes any more.
                        () = frozen.cancelled() => std::future::pending::<()>().await,
                    }
                });
                pipes.lock().expect("lock").push(pipe.abort_handle());
            }
        });
        proxy
    }

    /// The test broker's URL, through the proxy.
    fn url(&self) -> String {
        let real = mailroom_testkit::amqp_url();
        let (head, rest) = real.split_once('@').expect("credentials in the test URL");
        let vhost = rest.split_once('/').map(|(_, v)| v).unwrap_or("%2f");
        format!("{head}@{}/{vhost}", self.addr)
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for p in self.pipes.lock().expect("lock").drain(..) {
            p.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// From now on nothing passes either way, on open connections as on
    /// new ones, and no connection is closed.
    fn freeze(&self) {
        self.frozen.cancel();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        for p in self.pipes.lock().expect("lock").drain(..) {
            p.abort();
        }
    }
}

fn broker_addr() -> String {
    let url = mailroom_testkit::amqp_url();
    let rest = url.split_once('@').map(|(_, r)| r).unwrap_or(&url);
    rest.split('/').next().expect("host:port").to_string()
}

async fn count(engine: &Engine, topic: &str, status: Status) -> usize {
    let filter = ListFilter {
        topic: Some(topic.into()),
        status: Some(status),
        limit: 1000,
        ..Default::default()
    };
    engine
        .operator()
        .list(&filter)
        .await
        .expect("list")
        .events
        .len()
}

/// A relay (topic `outbox` publishing to an exchange) and a consumer of the
/// bound queue (into topic `inbound`) share one supervised connection. The
/// network to the broker is cut for a second while events flow: the status
/// goes down and comes back by itself, every outbox event is published and
/// every one is stored inbound exactly once, and the queue ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_and_consumer_heal_after_the_connection_is_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = unique("heal");
    let (exchange, queue) = (format!("{base}.events"), format!("{base}.in"));
    let topology = Topology {
        exchanges: vec![ExchangeSpec::new(&exchange, ExchangeType::Topic)],
        queues: vec![QueueSpec::new(&queue).bind(&exchange, "e.#")],
    };
    let handler = AmqpHandler::new(AmqpHandlerSpec::new(&exchange, "e.{type}"));
    let retry = RetryPolicy {
        max_attempts: 1000,
        backoff: Backoff::Schedule(vec![Duration::from_millis(50)]),
    };
    let engine = Engine::builder(sqlite_store(&dir).await)
        .poll_interval(Duration::from_millis(50))
        .topic(
            TopicSpec::new("outbox")
                .retry(retry)
                .timeout(Duration::from_secs(2)),
        )
        .handler("outbox", Arc::new(handler.clone()))
        .topic(TopicSpec::new("inbound"))
        .build()
        .expect("engine");
    let source = AmqpSource::new(
        engine.clone(),
        AmqpSourceSpec::new("rabbit", "inbound", &queue),
    )
    .expect("source");
    let proxy = Proxy::start(broker_addr()).await;
    let connection = AmqpConnection::new(&proxy.url())
        .expect("broker URL")
        .topology(topology)
        .source(source)
        .handler(handler);
    let status = connection.status();
    let stop = CancellationToken::new();
    tokio::spawn(connection.run(stop.clone()));
    let (e, s) = (engine.clone(), stop.clone());
    tokio::spawn(async move { e.run(s).await });
    eventually(Duration::from_secs(10), "the connection is up", || async {
        status.is_up()
    })
    .await;

    for i in 0..300 {
        let draft = Draft::json("outbox", &serde_json::json!({"i": i}))
            .event_type("made")
            .dedup_key(format!("ev-{i}"));
        engine.enqueue(draft).await.expect("enqueue");
        if i == 100 {
            proxy.cut();
            eventually(
                Duration::from_secs(5),
                "the status shows the loss",
                || async { !status.is_up() },
            )
            .await;
        }
        if i == 200 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            proxy.restore();
        }
    }
    eventually(
        Duration::from_secs(30),
        "the connection is back",
        || async { status.is_up() },
    )
    .await;
    eventually(Duration::from_secs(60), "all 300 are published", || async {
        count(&engine, "outbox", Status::Done).await == 300
    })
    .await;
    eventually(
        Duration::from_secs(60),
        "all 300 are stored inbound",
        || async { count(&engine, "inbound", Status::Pending).await == 300 },
    )
    .await;
    let conn = connect().await;
    eventually(Duration::from_secs(10), "the queue is empty", || async {
        ready(&conn, &queue).await == 0
    })
    .await;
    stop.cancel();
    delete(&conn, &[queue], &[exchange]).await;
}

/// A connection consuming a queue; the broker then stops answering (the
/// proxy freezes: TCP stays open, no frame passes) and the connection is
/// stopped. It stops within its bounds (the consumer's cancel and channel
/// close give up after `STOP_GRACE`, the connection's close after
/// `CLOSE_GRACE`), not after lapin's heartbeat timeout (2 min) or never:
/// `serve` must exit after a SIGTERM whatever the broker does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_answering_does_not_hold_the_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let queue = unique("silent");
    let engine = Engine::builder(sqlite_store(&dir).await)
        .topic(TopicSpec::new("inbound"))
        .build()
        .expect("engine");
    let source = AmqpSource::new(
        engine.clone(),
        AmqpSourceSpec::new("rabbit", "inbound", &queue),
    )
    .expect("source");
    let proxy = Proxy::start(broker_addr()).await;
    let topology = Topology {
        exchanges: vec![],
        queues: vec![QueueSpec::new(&queue)],
    };
    let connection = AmqpConnection::new(&proxy.url())
        .expect("broker URL")
        .topology(topology)
        .source(source);
    let status = connection.status();
    let stop = CancellationToken::new();
    let running = tokio::spawn(connection.run(stop.clone()));
    eventually(Duration::from_secs(10), "the connection is up", || async {
        status.is_up()
    })
    .await;
    // Frozen once the consumer runs, so its stop has a cancel to send.
    let conn = connect().await;
    eventually(
        Duration::from_secs(10),
        "the queue has its consumer",
        || async { consumers(&conn, &queue).await == 1 },
    )
    .await;

    proxy.freeze();
    let started = std::time::Instant::now();
    stop.cancel();
    let bound = STOP_GRACE + CLOSE_GRACE + Duration::from_secs(3);
    let stopped = tokio::time::timeout(bound, running).await;
    assert!(
        stopped.is_ok(),
        "still running {:?} after the stop (bound {bound:?})",
        started.elapsed()
    );
    drop(proxy);
    delete(&conn, &[queue], &[]).await;
}

/// A broker that accepts TCP and never speaks: the connection, still
/// connecting, stops at once when asked.
#[tokio::test]
async fn a_connection_still_connecting_stops_at_once() {
    let proxy = Proxy::start(broker_addr()).await;
    proxy.freeze();
    let stop = CancellationToken::new();
    let running = tokio::spawn(
        AmqpConnection::new(&proxy.url())
            .expect("broker URL")
            .run(stop.clone()),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!running.is_finished(), "the handshake cannot have ended");
    stop.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(2), running).await;
    assert!(stopped.is_ok(), "still connecting 2 s after the stop");
}

/// A broker behind a network path that starts dropping packets (the
/// connection left open, no RST, no error) is declared dead by the AMQP
/// heartbeat mailroom asks for (5 s: dead after 10 s of silence) and shown
/// down; reconnections during the freeze give up within the connect limit;
/// after the heal the connection is up again within 10 s.
#[tokio::test]
async fn a_frozen_broker_is_declared_dead_and_the_connection_heals() {
    use mailroom_testkit::{Freeze, FreezeProxy};
    let proxy = FreezeProxy::start(&broker_addr()).await.expect("proxy");
    let queue = unique("frozen");
    let topology = Topology {
        exchanges: vec![],
        queues: vec![QueueSpec::new(&queue)],
    };
    let connection = AmqpConnection::new(&proxy.url_for(&mailroom_testkit::amqp_url()))
        .expect("broker URL")
        .topology(topology);
    let status = connection.status();
    let stop = CancellationToken::new();
    let running = tokio::spawn(connection.run(stop.clone()));
    eventually(Duration::from_secs(10), "the connection is up", || async {
        status.is_up()
    })
    .await;

    proxy.set(Freeze::Drop);
    let frozen = std::time::Instant::now();
    eventually(
        Duration::from_secs(16),
        "the frozen connection is declared down",
        || async { !status.is_up() },
    )
    .await;
    eprintln!("declared down {:?} into the freeze", frozen.elapsed());
    // A reconnection or two while still frozen: each gives up in time.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(!status.is_up());
    proxy.heal();
    let healed = std::time::Instant::now();
    eventually(
        Duration::from_secs(10),
        "the connection is up again after the heal",
        || async { status.is_up() },
    )
    .await;
    eprintln!("up again {:?} after the heal", healed.elapsed());
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), running).await;
    let conn = connect().await;
    delete(&conn, &[queue], &[]).await;
}

/// While a connection is up, `mailroom_broker_queue_depth{connection,queue}`
/// reports the ready messages of its source's queue and of that queue's
/// dead-letter queue, as the broker counts them.
#[tokio::test]
async fn source_and_dead_letter_queue_depths_are_reported() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    // A current-thread runtime: the connection's tasks record on this thread.
    let _local = metrics::set_default_local_recorder(&recorder);
    let (_dir, engine, conn, queue) = crate::source::setup("depth").await;
    let dlq = format!("{queue}.dlq");
    let ch = conn.create_channel().await.expect("channel");
    let props = lapin::BasicProperties::default;
    crate::source::publish(
        &ch,
        &dlq,
        (0..3).map(|i| (props(), format!("dead {i}").into_bytes())),
    )
    .await;
    let mut spec = QueueSpec::new(&queue);
    spec.dead_letter = true;
    let topology = Topology {
        exchanges: vec![],
        queues: vec![spec],
    };
    // Intake already stopped: the source does not consume, so the queue
    // keeps what is published.
    let url = mailroom_testkit::amqp_url();
    let connection = AmqpConnection::new(&url)
        .expect("broker URL")
        .topology(topology);
    let source = AmqpSource::new(
        engine.clone(),
        AmqpSourceSpec::new("rabbit", "inbound", &queue),
    )
    .expect("source");
    let intake = CancellationToken::new();
    intake.cancel();
    let connection = connection.source(source).intake_until(intake);
    crate::source::publish(
        &ch,
        &queue,
        (0..5).map(|i| (props(), format!("m {i}").into_bytes())),
    )
    .await;
    let stop = CancellationToken::new();
    let status = connection.status();
    tokio::spawn(connection.run(stop.clone()));
    let depth = |q: &str| {
        let line = format!("queue=\"{q}\"");
        metrics
            .render()
            .lines()
            .find(|l| l.starts_with("mailroom_broker_queue_depth") && l.contains(&line))
            .and_then(|l| l.rsplit(' ').next().map(str::to_owned))
    };
    eventually(
        Duration::from_secs(10),
        "both depths are reported",
        || async { depth(&queue).as_deref() == Some("5") && depth(&dlq).as_deref() == Some("3") },
    )
    .await;
    assert!(status.is_up());
    stop.cancel();
    crate::source::cleanup(&conn, &queue).await;
}
