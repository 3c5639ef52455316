//! The private broker (`scripts/rabbit-node.sh`, as the testkit's
//! `PrivateRabbit` drives it, never the shared node), a publisher that
//! records every confirmed message, and a consumer that counts what the
//! relay published, both reconnecting across the outage.

use anyhow::{Context, bail};
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A RabbitMQ node of this scenario's own; deleted on drop.
pub struct Node {
    dir: PathBuf,
    pub url: String,
}

/// How long one broker operation (connect, open a channel, publish, a
/// confirm, an ack, close) may take before the client gives up on the
/// connection: lapin's futures have no limit of their own, and a broker
/// going away mid-operation must not hold a load forever.
const BROKER_OP: Duration = Duration::from_secs(10);

/// `fut`, or `None` once it has taken `BROKER_OP`.
async fn within<T>(fut: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(BROKER_OP, fut).await.ok()
}

/// The most `rabbit-node.sh` may take: a start waits up to 60 s for the
/// AMQP handshake (`MR_START_TIMEOUT`), a restart tries up to 3 launches.
const SCRIPT_LIMIT: Duration = Duration::from_secs(150);

async fn node(verb: &'static str, dir: PathBuf) -> anyhow::Result<String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/rabbit-node.sh");
    let run = tokio::process::Command::new("bash")
        .arg(&script)
        .arg(verb)
        .arg(&dir)
        .env("MR_START_TIMEOUT", "60")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(SCRIPT_LIMIT, run)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "rabbit-node.sh {verb} did not finish within {} s",
                SCRIPT_LIMIT.as_secs()
            )
        })?
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "rabbit-node.sh {verb}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Node {
    /// A new node on free ports (its state under /tmp, reachable by the
    /// `rabbitmq` user when we are root).
    pub async fn start() -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!(
            "/tmp/mailroom-faults-rabbit-{}",
            std::process::id()
        ));
        match node("start", dir.clone()).await {
            Ok(url) => Ok(Self { dir, url }),
            Err(e) => {
                let _ = node("down", dir).await;
                Err(e.context("starting a private RabbitMQ node"))
            }
        }
    }

    /// A clean stop (SIGTERM); durable queues and persistent messages stay.
    pub async fn stop(&self) -> anyhow::Result<()> {
        node("stop", self.dir.clone()).await.map(drop)
    }

    /// The same node again, same port and data.
    pub async fn start_again(&self) -> anyhow::Result<()> {
        let url = node("start", self.dir.clone()).await?;
        anyhow::ensure!(url == self.url, "the node came back on another port: {url}");
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/rabbit-node.sh");
        let _ = std::process::Command::new("bash")
            .arg(script)
            .arg("down")
            .arg(&self.dir)
            .stdin(std::process::Stdio::null())
            .output();
    }
}

async fn connect(url: &str, stop: &AtomicBool) -> Option<Connection> {
    while !stop.load(Ordering::SeqCst) {
        let connecting = Connection::connect(url, ConnectionProperties::default());
        if let Some(Ok(c)) = within(connecting).await {
            return Some(c);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Publishes `p-0`, `p-1`, ... (persistent, `message_id` = the id) to
/// `queue` through the default exchange, one confirm at a time; a message
/// whose confirm did not come is published again after reconnecting.
/// Returns the ids the broker confirmed and how many publishes were sent.
pub async fn publish(
    url: String,
    queue: &'static str,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> (Vec<String>, u64) {
    let (mut confirmed, mut sent, mut i) = (Vec::new(), 0u64, 0u64);
    'connect: while let Some(conn) = connect(&url, &stop).await {
        let Some(Ok(ch)) = within(conn.create_channel()).await else {
            continue;
        };
        let confirming = ch.confirm_select(ConfirmSelectOptions::default());
        if !matches!(within(confirming).await, Some(Ok(()))) {
            continue;
        }
        while !stop.load(Ordering::SeqCst) {
            let id = format!("p-{i}");
            let body = serde_json::json!({ "id": id }).to_string();
            let props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(id.as_str().into())
                .with_content_type("application/json".into());
            sent += 1;
            let options = BasicPublishOptions {
                mandatory: true,
                immediate: false,
            };
            let publishing =
                ch.basic_publish("".into(), queue.into(), options, body.as_bytes(), props);
            let Some(Ok(confirm)) = within(publishing).await else {
                continue 'connect;
            };
            match within(confirm).await {
                Some(Ok(Confirmation::Ack(None))) => {
                    confirmed.push(id);
                    i += 1;
                }
                // Nacked, returned or unanswered: sent again (same id) on a
                // new connection.
                _ => continue 'connect,
            }
            tokio::time::sleep(pause).await;
        }
        let _ = within(conn.close(200, "OK".into())).await;
        break;
    }
    (confirmed, sent)
}

/// What the relay's queue received: message_id -> (first deliveries,
/// redeliveries), and when each delivery arrived. A redelivery is the
/// broker handing this consumer a message again whose ack it lost in the
/// outage: not a second publish, so not counted as a duplicate.
#[derive(Debug, Default, Clone)]
pub struct Received {
    pub by_id: HashMap<String, (u32, u32)>,
    pub at: Vec<Instant>,
}

/// Consumes `queue` (acking each delivery after counting it) until `stop`,
/// reconnecting across outages.
pub async fn count(
    url: String,
    queue: &'static str,
    got: Arc<Mutex<Received>>,
    stop: Arc<AtomicBool>,
) {
    while let Some(conn) = connect(&url, &stop).await {
        let Some(Ok(ch)) = within(conn.create_channel()).await else {
            continue;
        };
        let consuming = ch.basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            Default::default(),
        );
        let Some(Ok(mut consumer)) = within(consuming).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while !stop.load(Ordering::SeqCst) {
            let next = tokio::time::timeout(Duration::from_millis(200), consumer.next()).await;
            let delivery = match next {
                Err(_) => continue,
                Ok(Some(Ok(d))) => d,
                Ok(_) => break,
            };
            let id = delivery
                .properties
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            {
                let mut g = got.lock().unwrap_or_else(|e| e.into_inner());
                let e = g.by_id.entry(id).or_default();
                if delivery.redelivered {
                    e.1 += 1;
                } else {
                    e.0 += 1;
                }
                g.at.push(Instant::now());
            }
            if !matches!(
                within(delivery.ack(BasicAckOptions::default())).await,
                Some(Ok(_))
            ) {
                break;
            }
        }
        let _ = within(conn.close(200, "OK".into())).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

/// `(ready messages, consumers)` of `queue` (a passive declare).
pub async fn depth(url: &str, queue: &str) -> anyhow::Result<(u32, u32)> {
    within(depth_unbounded(url, queue))
        .await
        .context("no answer from the broker")?
}

async fn depth_unbounded(url: &str, queue: &str) -> anyhow::Result<(u32, u32)> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let options = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(queue.into(), options, Default::default())
        .await?;
    let _ = conn.close(200, "OK".into()).await;
    Ok((q.message_count(), q.consumer_count()))
}
