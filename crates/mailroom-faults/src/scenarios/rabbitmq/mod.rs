//! (4) RabbitMQ stopped (cleanly, SIGTERM) and held down, then restarted,
//! under consume load (a publisher feeding the AMQP source's queue with
//! confirms) and relay load (`POST /v1/events` into a topic whose `amqp`
//! handler publishes to a queue this scenario consumes and counts).
//!
//! Checks: every message the broker confirmed ends stored once and
//! processed; every relay event acked by the API arrives on the relay's
//! queue (a second publish of one event is the at-least-once allowance,
//! counted in `reruns`); the checker's usual rules on processing; recovery
//! (from the broker's return to the first message consumed from it) and a
//! full drain. The broker is a private node on its own ports: the shared
//! one of the test services is never touched.
//!
//! `amqpfreeze` runs the same loads with mailroom's traffic to the broker
//! dropped for a while (packets swallowed, connections left open, no RST)
//! rather than the broker stopped, and also checks that `/readyz` turns
//! 503 during the freeze (the AMQP heartbeat declared the connection dead)
//! and that consuming, relaying and `/readyz` are back within 10 s of the
//! heal.

mod broker;
pub(super) mod dlq;

use super::pgfreeze::{HEALED_WITHIN, Probes, log_lines, probe_ready, ready_after, show};
use super::{Task, World, recovery};
use crate::backend::Backend;
use crate::check::{self, Expect, Row};
use crate::record::Record;
use crate::record::{Ack, Recorder};
use crate::{Report, store};
use broker::{Node, Received};
use mailroom_testkit::{Freeze, FreezeProxy};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const IN_QUEUE: &str = "faults.in";
const OUT_QUEUE: &str = "faults.out";
/// Each loader's pause between messages (about 100/s each).
const PAUSE: Duration = Duration::from_millis(10);

fn config(amqp: &str, receiver: &str) -> String {
    format!(
        r#"
[amqp]
url = "{amqp}"
[[amqp.exchange]]
name = "faults.x"
kind = "direct"
[[amqp.queue]]
name = "{IN_QUEUE}"
[[amqp.queue]]
name = "{OUT_QUEUE}"
bind = {{ exchange = "faults.x", routing_key = "out" }}

[[source]]
name = "in"
topic = "consumed"
amqp = {{ queue = "{IN_QUEUE}", prefetch = 50 }}

[[topic]]
name = "consumed"
concurrency = 16
retry = {{ max_attempts = 100, base = "100ms", max_delay = "1s" }}
handler = {{ http = {{ url = "{receiver}" }} }}

[[topic]]
name = "relay"
concurrency = 16
retry = {{ max_attempts = 100, base = "100ms", max_delay = "1s" }}
handler = {{ amqp = {{ exchange = "faults.x", routing_key = "out" }} }}
"#
    )
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    run_with(quick, backend, Attack::Restart).await
}

/// `amqpfreeze` runs on SQLite only: what it attacks, the broker
/// connection, works the same over either store (`pghold`/`pgdrop` freeze
/// the PostgreSQL store's own traffic), and the quick matrix keeps its time.
pub fn freeze_applies(b: &Backend) -> bool {
    matches!(b, Backend::Sqlite)
}

/// `amqpfreeze`: the same loads, with the traffic between mailroom and the
/// broker dropped (a `FreezeProxy`: connections left open, no RST, every
/// byte swallowed, the connections open meanwhile dead for good) instead
/// of a restart.
pub async fn run_freeze(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    run_with(quick, backend, Attack::Freeze).await
}

/// What happens to the broker.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Attack {
    /// Stopped (SIGTERM), held down, started again.
    Restart,
    /// Its traffic from mailroom dropped, then healed.
    Freeze,
}

async fn run_with(quick: bool, backend: Backend, attack: Attack) -> anyhow::Result<Report> {
    let secs = |s: [u64; 3]| s.map(Duration::from_secs);
    let [before, down, after] = match (attack, quick) {
        (Attack::Restart, true) => secs([4, 3, 4]),
        (Attack::Restart, false) => secs([15, 10, 15]),
        // Longer than the heartbeat's verdict (10 s), so the connection is
        // declared dead and reconnections are tried during the freeze.
        (Attack::Freeze, true) => secs([4, 15, 12]),
        (Attack::Freeze, false) => secs([15, 30, 15]),
    };
    let node = Node::start().await?;
    let proxy = match attack {
        Attack::Freeze => Some(FreezeProxy::start(&host_port(&node.url)?).await?),
        Attack::Restart => None,
    };
    let mailroom_url = proxy
        .as_ref()
        .map_or_else(|| node.url.clone(), |p| p.url_for(&node.url));
    let world = World::new(&backend, Duration::ZERO, |r| config(&mailroom_url, r)).await?;
    let mut serve = world.serve().await?;
    let loads = Loads::start(&node.url, &serve.base, &world.rec);
    let (probes, prober) = probe_ready(serve.base.clone(), world.rec.clone());
    tokio::time::sleep(before).await;
    let stopped_at = world.rec.now();
    match &proxy {
        Some(p) => p.set(Freeze::Drop),
        None => node.stop().await?,
    }
    tokio::time::sleep(down).await;
    match &proxy {
        Some(p) => p.heal(),
        None => node.start_again().await?,
    }
    let back = (world.rec.now(), Instant::now());
    world.rec.disrupted_between(stopped_at, back.0);
    let consumed_again =
        first_new_row(&world.fresh.url, "consumed", Duration::from_secs(60)).await?;
    tokio::time::sleep(after.saturating_sub(consumed_again.unwrap_or_default())).await;
    drop(prober);
    let done = loads.finish(&world).await?;
    serve.signal_term()?;
    serve.exit_within(Duration::from_secs(30)).await?;
    let rows = store::rows(&world.fresh.url).await?;
    let record = world.rec.snapshot();
    let verdict = consumed_verdict(&record, &rows);
    let name = match attack {
        Attack::Restart => "rabbitmq",
        Attack::Freeze => "amqpfreeze",
    };
    let mut report = Report::new(name, backend.name(), &record, verdict);
    judge_relay(&mut report, &record, &rows);
    judge(&mut report, &rows, &done);
    let relayed_again = done
        .received
        .at
        .iter()
        .find(|t| **t > back.1)
        .map(|t| *t - back.1);
    let acked_again = recovery(&record, &[back.0]);
    let ready_again = ready_after(&probes, back.0).map(|t| t - back.0);
    let ready = match attack {
        Attack::Freeze => ready_again,
        Attack::Restart => None,
    };
    report.recovery = [consumed_again, relayed_again, acked_again, ready]
        .into_iter()
        .flatten()
        .max();
    let outage = match attack {
        Attack::Restart => "broker down",
        Attack::Freeze => "traffic to the broker dropped",
    };
    report.notes.push(format!(
        "{outage} {:.1}s{}; after it: first message consumed in {}, first relayed in {}, first API ack in {}, /readyz green in {}",
        (back.0 - stopped_at).as_secs_f64(),
        match attack {
            Attack::Restart => " (stop, hold, start)".to_owned(),
            Attack::Freeze => format!(", /readyz 503 after {}", show(not_ready_after(&probes, stopped_at))),
        },
        show(consumed_again),
        show(relayed_again),
        show(acked_again),
        show(ready_again)
    ));
    if attack == Attack::Freeze {
        judge_freeze(
            &mut report,
            &probes,
            stopped_at,
            back.0,
            [consumed_again, relayed_again, ready_again],
        );
        report.notes.push(log_lines(&serve));
    }
    if done.drained.is_none() {
        let mut depths = Vec::new();
        for q in [IN_QUEUE, OUT_QUEUE] {
            depths.push(format!("{q}: {:?}", broker::depth(&node.url, q).await));
        }
        report.failures.push(format!(
            "not drained 90 s after the load stopped; (ready, consumers) {}",
            depths.join(", ")
        ));
    }
    world.cleanup().await?;
    Ok(report)
}

/// `host:port` of an AMQP URL.
fn host_port(url: &str) -> anyhow::Result<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', '?'])
        .next()
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no host:port in the AMQP URL"))
}

/// From `t` to the first `/readyz` 503 to a probe sent after it.
fn not_ready_after(probes: &Probes, t: Duration) -> Option<Duration> {
    let probes = probes.lock().unwrap_or_else(|e| e.into_inner());
    probes
        .iter()
        .filter(|(sent, _, status)| *sent >= t && *status == 503)
        .map(|(_, at, _)| *at - t)
        .min()
}

/// The freeze's own checks: `/readyz` says the broker is down during the
/// freeze (the heartbeat declared the connection dead) and answers within
/// its bound; after the heal the connection consumes, relays and is ready
/// again within [`HEALED_WITHIN`].
fn judge_freeze(
    report: &mut Report,
    probes: &Probes,
    from: Duration,
    to: Duration,
    back: [Option<Duration>; 3],
) {
    if not_ready_after(probes, from).is_none_or(|t| t > to - from) {
        report
            .failures
            .push("/readyz never said not ready during the freeze".into());
    }
    let slowest = {
        let probes = probes.lock().unwrap_or_else(|e| e.into_inner());
        probes.iter().map(|(s, at, _)| *at - *s).max()
    };
    if let Some(s) = slowest.filter(|s| *s > Duration::from_secs(10)) {
        report
            .failures
            .push(format!("a /readyz probe waited {:.1}s", s.as_secs_f64()));
    }
    for (what, t) in ["a message consumed", "a message relayed", "/readyz green"]
        .into_iter()
        .zip(back)
    {
        match t {
            Some(t) if t <= HEALED_WITHIN => {}
            Some(t) => report.failures.push(format!(
                "{what} only {:.1}s after the heal (bound {} s)",
                t.as_secs_f64(),
                HEALED_WITHIN.as_secs()
            )),
            None => report.failures.push(format!("no {what} after the heal")),
        }
    }
}

/// The three loads: the publisher into the source's queue, the relay's
/// API client, and the consumer counting what the relay published.
struct Loads {
    stop: Arc<AtomicBool>,
    /// The counting consumer runs on after the load, through the drain.
    stop_counting: Arc<AtomicBool>,
    received: Arc<Mutex<Received>>,
    publisher: Task<(Vec<String>, u64)>,
    relay: Task<u64>,
    counter: Task<()>,
}

/// What the loads did, after the drain.
struct Done {
    /// Message ids the broker confirmed to the publisher.
    confirmed: Vec<String>,
    /// Publishes and API requests sent.
    sent: u64,
    /// Idempotency keys of relay events the API acked.
    acked: HashSet<String>,
    received: Received,
    drained: Option<Duration>,
}

impl Loads {
    fn start(amqp: &str, base: &str, rec: &Recorder) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_counting = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Mutex::new(Received::default()));
        let url = amqp.to_owned();
        Self {
            publisher: Task::spawn(broker::publish(url.clone(), IN_QUEUE, PAUSE, stop.clone())),
            counter: Task::spawn(broker::count(
                url,
                OUT_QUEUE,
                received.clone(),
                stop_counting.clone(),
            )),
            relay: Task::spawn(relay_load(base.to_owned(), rec.clone(), stop.clone())),
            stop,
            stop_counting,
            received,
        }
    }

    /// Stops the loads, waits for the drain, then stops counting. Each
    /// load ends within a broker operation's or an HTTP request's time
    /// limit of being told to stop; one that does not is an error.
    async fn finish(self, world: &World) -> anyhow::Result<Done> {
        self.stop.store(true, Ordering::SeqCst);
        let limit = Duration::from_secs(45);
        let (confirmed, published) = self.publisher.join(limit, "the AMQP publisher").await?;
        let relay_sent = self.relay.join(limit, "the relay's API client").await?;
        let acked: HashSet<String> = world
            .rec
            .lock()
            .acks
            .iter()
            .map(|a| a.dedup_key.clone())
            .collect();
        let drained = drain(world, &confirmed, &acked, &self.received).await?;
        self.stop_counting.store(true, Ordering::SeqCst);
        let counter = self.counter.join(limit, "the relay queue's consumer");
        counter.await?;
        let received = self
            .received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ok(Done {
            confirmed,
            sent: published + relay_sent,
            acked,
            received,
            drained,
        })
    }
}

/// Posts relay events (`Idempotency-Key: r-<i>`) one after the other, each
/// retried until answered 201; the answers are the record's acks. Returns
/// the requests sent.
async fn relay_load(base: String, rec: crate::record::Recorder, stop: Arc<AtomicBool>) -> u64 {
    let http = crate::load::http();
    let url = format!("{base}/v1/events");
    let mut sent = 0;
    for i in 0u64.. {
        let key = format!("r-{i}");
        let body = serde_json::json!({"topic": "relay", "payload": {"n": i}}).to_string();
        loop {
            if stop.load(Ordering::SeqCst) {
                return sent;
            }
            sent += 1;
            let sent_at = rec.now();
            let answer = http
                .post(&url)
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            let Ok(answer) = answer else {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            };
            let status = answer.status().as_u16();
            let bytes = answer.bytes().await.unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            if let (201, Some(id)) = (status, v["id"].as_str()) {
                rec.lock().acks.push(Ack {
                    dedup_key: key.clone(),
                    event_id: id.to_owned(),
                    duplicate: false,
                    key: None,
                    seq: 0,
                    sent_at,
                    at: rec.now(),
                });
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(PAUSE).await;
    }
    sent
}

/// How long after now the count of `topic`'s rows first grows.
async fn first_new_row(
    url: &str,
    topic: &str,
    limit: Duration,
) -> anyhow::Result<Option<Duration>> {
    let count = |rows: &[crate::check::Row]| rows.iter().filter(|r| r.topic == topic).count();
    let at_start = count(&store::rows(url).await?);
    Ok(store::settle(url, |rows| count(rows) > at_start, limit).await?)
}

/// Waits until every row is final, every confirmed message is stored and
/// every acked relay event was received.
async fn drain(
    world: &World,
    confirmed: &[String],
    acked: &HashSet<String>,
    received: &Mutex<Received>,
) -> anyhow::Result<Option<Duration>> {
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(90) {
        let rows = store::rows(&world.fresh.url).await?;
        let keys: HashSet<&str> = rows.iter().map(|r| r.dedup_key.as_str()).collect();
        let all_received = {
            let r = received.lock().unwrap_or_else(|e| e.into_inner());
            acked.iter().all(|k| r.by_id.contains_key(k))
        };
        if store::all_final(&rows)
            && confirmed.iter().all(|c| keys.contains(c.as_str()))
            && all_received
        {
            return Ok(Some(started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(None)
}

/// The checker over the consumed topic: its events are processed by the
/// recording HTTP handler (the relay's are not: they are judged by what the
/// relay queue received).
fn consumed_verdict(record: &Record, rows: &[Row]) -> check::Verdict {
    let consumed: Vec<Row> = rows
        .iter()
        .filter(|r| r.topic == "consumed")
        .cloned()
        .collect();
    let record = Record {
        acks: Vec::new(),
        ..record.clone()
    };
    check::check(&record, &consumed, &Expect::default())
}

/// Every relay event the API acked is stored and ended `done` (published
/// with a confirm).
fn judge_relay(report: &mut Report, record: &Record, rows: &[Row]) {
    let by_id: std::collections::HashMap<&str, &Row> =
        rows.iter().map(|r| (r.id.as_str(), r)).collect();
    for a in &record.acks {
        let status = by_id.get(a.event_id.as_str()).map(|r| r.status.as_str());
        if status != Some("done") {
            report.lost += 1;
            report.failures.push(format!(
                "{}: acked by the API, ended {}",
                a.dedup_key,
                status.unwrap_or("not stored")
            ));
        }
    }
}

/// Confirmed but not stored (or stored twice); acked but never relayed;
/// relayed more than once (the allowance).
fn judge(report: &mut Report, rows: &[Row], done: &Done) {
    let stored: HashSet<&str> = rows
        .iter()
        .filter(|r| r.topic == "consumed")
        .map(|r| r.dedup_key.as_str())
        .collect();
    let (confirmed, acked, received) = (&done.confirmed, &done.acked, &done.received);
    report.sent = done.sent;
    report.acked = confirmed.len() + acked.len();
    let lost_in: Vec<&String> = confirmed
        .iter()
        .filter(|c| !stored.contains(c.as_str()))
        .collect();
    let never_relayed: Vec<&String> = acked
        .iter()
        .filter(|k| !received.by_id.contains_key(*k))
        .collect();
    let again: u32 = received
        .by_id
        .values()
        .map(|(first, _)| first.saturating_sub(1))
        .sum();
    let redelivered: u32 = received.by_id.values().map(|(_, r)| *r).sum();
    report.lost += lost_in.len() + never_relayed.len();
    for c in lost_in.iter().take(4) {
        report
            .failures
            .push(format!("{c}: confirmed by the broker, never stored"));
    }
    for k in never_relayed.iter().take(4) {
        report
            .failures
            .push(format!("{k}: acked by the API, never published"));
    }
    report.reruns += again as usize;
    report.notes.push(format!(
        "consume: {} confirmed, all stored: {}; relay: {} acked, {} received, {again} published twice (allowance), {redelivered} redelivered to the counting consumer",
        confirmed.len(),
        lost_in.is_empty(),
        acked.len(),
        received.by_id.len()
    ));
}
