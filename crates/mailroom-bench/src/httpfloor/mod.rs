//! `http-floor`: HTTP delivery beside its floor, in one run, against one
//! local receiver ([`receiver`], a hyper server on threads of its own):
//!
//! - the receiver alone (raw hyper connections, no signing): what it takes,
//!   so it is known not to be the bound;
//! - the floor ([`raw`]): mailroom's HTTP client (reqwest) doing only what a
//!   delivery must, at the same concurrency;
//! - mailroom: a `single` topic whose http handler posts the events
//!   preloaded into a fresh SQLite store, with the Prometheus recorder
//!   installed as `mailroom serve` has it;
//! - a hand-written deliverer in Python (`scripts/http_deliverer.py`:
//!   `http.client` keep-alive, a SQLite outbox table polled).
//!
//! Each deliverer's CPU comes from its process's own accounting: this
//! process's `/proc/self/stat` less the receiver's threads for the floor
//! and mailroom, `getrusage` for the Python script.

pub mod raw;
pub mod receiver;

use crate::backend::Backend;
use crate::cli::{parse_duration, print_json};
use crate::procfs;
use anyhow::{Context, bail};
use bytes::Bytes;
use mailroom::handler::http::{HttpHandler, HttpHandlerSettings};
use mailroom::{Draft, Engine, Status, StoreError, TopicSpec};
use receiver::Receiver;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "hooks";
/// The signing secret of every phase (`whsec_` + base64 of 24 bytes).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[derive(Debug, Clone)]
pub struct Settings {
    /// Events each floor and mailroom phase delivers.
    pub events: u64,
    /// Concurrencies to run; the first is reported as the default.
    pub concurrency: Vec<u32>,
    /// Events the Python deliverer delivers (it is slow: fewer do).
    pub python_events: u64,
    /// Worker threads of the Python deliverer.
    pub python_concurrency: u32,
    pub body_size: usize,
    /// Threads of the receiver's runtime.
    pub receiver_threads: usize,
    /// How long the receiver-alone phase posts.
    pub receiver_alone: Duration,
    pub timeout: Duration,
}

/// One phase's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub concurrency: u32,
    pub delivered: u64,
    pub failed: u64,
    pub secs: f64,
    pub per_sec: f64,
    /// The deliverer's CPU per delivery, µs (its own process accounting).
    pub cpu_us: f64,
    /// The receiver's CPU per request, µs.
    pub receiver_cpu_us: f64,
    /// The deliverer's CPU per thread name, as shares of one core.
    pub cpu_threads: BTreeMap<String, f64>,
    /// Connections the receiver accepted during the phase.
    pub connections: u64,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub receiver_alone: Phase,
    pub floor: Vec<Phase>,
    pub mailroom: Vec<Phase>,
    pub python: Option<Phase>,
    /// Requests the receiver got without a signature (must be 0).
    pub unsigned: u64,
    pub load_before: String,
    pub load_after: String,
}

/// CPU readings of this process at a phase's edges.
struct Cpu {
    connections: u64,
    process: Duration,
    threads: BTreeMap<String, Duration>,
    at: Instant,
}

impl Cpu {
    fn now(receiver: &Receiver) -> Self {
        Self {
            connections: receiver.counts.connections.load(Ordering::Relaxed),
            process: procfs::process_cpu("self").unwrap_or_default(),
            threads: procfs::threads_cpu("self"),
            at: Instant::now(),
        }
    }

    /// The phase's figures: the deliverer is this process less the receiver.
    fn phase(
        self,
        receiver: &Receiver,
        name: &'static str,
        concurrency: u32,
        delivered: u64,
        failed: u64,
        took: Duration,
    ) -> Phase {
        let after = Cpu::now(receiver);
        let recv =
            |c: &BTreeMap<String, Duration>| c.get(receiver::THREAD).copied().unwrap_or_default();
        let recv_used = recv(&after.threads).saturating_sub(recv(&self.threads));
        let all = after.process.saturating_sub(self.process);
        let per = |d: Duration| d.as_secs_f64() * 1e6 / delivered.max(1) as f64;
        let mut cpu_threads = procfs::cpu_share(&self.threads, &after.threads, after.at - self.at);
        cpu_threads.remove(receiver::THREAD);
        Phase {
            name,
            concurrency,
            delivered,
            failed,
            secs: took.as_secs_f64(),
            per_sec: delivered as f64 / took.as_secs_f64(),
            cpu_us: per(all.saturating_sub(recv_used)),
            receiver_cpu_us: per(recv_used),
            cpu_threads,
            connections: after.connections - self.connections,
        }
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub async fn measure(s: &Settings) -> anyhow::Result<Report> {
    let load_before = load();
    let shutdown = CancellationToken::new();
    // As `mailroom serve` runs: the recorder every metric goes to.
    let _metrics = mailroom_server::prometheus::install(shutdown.clone())
        .context("installing the Prometheus recorder")?;
    let receiver = Receiver::start(s.receiver_threads)?;
    let body = crate::ingest::body(s.body_size);
    let key = HttpHandler::decode_secret(SECRET).map_err(anyhow::Error::msg)?;

    let alone_c = s.concurrency.iter().copied().max().unwrap_or(16).min(64);
    let cpu = Cpu::now(&receiver);
    let started = Instant::now();
    let n = receiver::alone(
        receiver.addr,
        alone_c as usize,
        body.clone(),
        s.receiver_alone,
    )
    .await?;
    let receiver_alone = cpu.phase(
        &receiver,
        "receiver alone",
        alone_c,
        n,
        0,
        started.elapsed(),
    );
    // The receiver-alone phase sends no signature; every later request must.
    let unsigned_base = receiver.counts.unsigned.load(Ordering::Relaxed);

    let mut floor = Vec::new();
    let mut engine = Vec::new();
    for &c in &s.concurrency {
        floor.push(floor_phase(s, &receiver, &key, &body, c).await?);
        engine.push(mailroom_phase(s, &receiver, &body, c).await?);
    }
    let python = match s.python_events {
        0 => None,
        n => Some(python_phase(s, &receiver, &body, n).await?),
    };
    shutdown.cancel();
    let unsigned = receiver.counts.unsigned.load(Ordering::Relaxed) - unsigned_base;
    Ok(Report {
        receiver_alone,
        floor,
        mailroom: engine,
        python,
        unsigned,
        load_before,
        load_after: load(),
    })
}

async fn floor_phase(
    s: &Settings,
    receiver: &Receiver,
    key: &[u8],
    body: &Bytes,
    c: u32,
) -> anyhow::Result<Phase> {
    let items: Arc<Vec<raw::Item>> = Arc::new(
        (0..s.events)
            .map(|_| raw::Item {
                id: mailroom::EventId::new().to_string(),
                body: body.clone(),
            })
            .collect(),
    );
    let cpu = Cpu::now(receiver);
    let started = Instant::now();
    let ok = raw::deliver(&receiver.url(), key, TOPIC, items, c as usize).await?;
    Ok(cpu.phase(receiver, "floor", c, ok, s.events - ok, started.elapsed()))
}

async fn mailroom_phase(
    s: &Settings,
    receiver: &Receiver,
    body: &Bytes,
    c: u32,
) -> anyhow::Result<Phase> {
    let fresh = Backend::Sqlite.fresh().await?;
    let opened = fresh.open(true).await?;
    let store = opened.store();
    store.migrate().await.context("migrating")?;
    let handler = HttpHandler::new(HttpHandlerSettings {
        url: reqwest::Url::parse(&receiver.url())?,
        timeout: Duration::from_secs(30),
        secret: Some(HttpHandler::decode_secret(SECRET).map_err(anyhow::Error::msg)?),
        headers: BTreeMap::new(),
        permanent_statuses: HttpHandlerSettings::DEFAULT_PERMANENT_STATUSES.to_vec(),
        tls: Default::default(),
    })
    .map_err(anyhow::Error::msg)?;
    let engine = Engine::builder(store.clone())
        .worker_id("http-floor")
        .topic(TopicSpec::new(TOPIC).concurrency(c))
        .handler(TOPIC, Arc::new(handler))
        .build()?;
    preload(s, &engine, body).await?;

    let base = receiver.requests();
    let shutdown = CancellationToken::new();
    let cpu = Cpu::now(receiver);
    let started = Instant::now();
    let runner = {
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        tokio::spawn(async move { engine.run(shutdown).await })
    };
    let deadline = started + s.timeout;
    while receiver.requests() - base < s.events && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut done = 0;
    while Instant::now() < deadline {
        done = store
            .stats()
            .await?
            .iter()
            .filter(|t| t.topic == TOPIC)
            .map(|t| t.count(Status::Done))
            .sum();
        if done >= s.events {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = started.elapsed();
    let phase = cpu.phase(
        receiver,
        "mailroom",
        c,
        done,
        s.events - done.min(s.events),
        took,
    );
    shutdown.cancel();
    runner.await?;
    drop(engine);
    opened.close().await;
    fresh.cleanup().await?;
    if done < s.events {
        bail!(
            "mailroom timed out after {:?}: {done} of {} done",
            s.timeout,
            s.events
        );
    }
    Ok(phase)
}

/// `s.events` events enqueued from 256 tasks (grouped into commits by the
/// store's writer), before the engine runs.
async fn preload(s: &Settings, engine: &Engine, body: &Bytes) -> anyhow::Result<()> {
    const WORKERS: u64 = 256;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let share = s.events / WORKERS + u64::from(w < s.events % WORKERS);
        let (engine, body) = (engine.clone(), body.clone());
        tasks.spawn(async move {
            for _ in 0..share {
                loop {
                    let draft = Draft::bytes(TOPIC, body.clone()).content_type("application/json");
                    match engine.enqueue(draft).await {
                        Ok(_) => break,
                        Err(mailroom::EnqueueError::Store(StoreError::Overloaded)) => {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        Err(e) => return Err(e),
                    }
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

/// The Python deliverer on its own SQLite outbox of `n` rows.
async fn python_phase(
    s: &Settings,
    receiver: &Receiver,
    body: &Bytes,
    n: u64,
) -> anyhow::Result<Phase> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("outbox.db");
    let script = dir.path().join("http_deliverer.py");
    std::fs::write(&script, include_str!("../../scripts/http_deliverer.py"))?;
    {
        let mut conn = rusqlite::Connection::open(&db)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             CREATE TABLE outbox (id INTEGER PRIMARY KEY, msg_id TEXT NOT NULL,
               topic TEXT NOT NULL, payload BLOB NOT NULL, delivered_at INTEGER);
             CREATE INDEX outbox_pending ON outbox (id) WHERE delivered_at IS NULL;",
        )?;
        let tx = conn.transaction()?;
        {
            let mut insert =
                tx.prepare("INSERT INTO outbox (msg_id, topic, payload) VALUES (?1, ?2, ?3)")?;
            for _ in 0..n {
                insert.execute(rusqlite::params![
                    mailroom::EventId::new().to_string(),
                    TOPIC,
                    &body[..]
                ])?;
            }
        }
        tx.commit()?;
    }
    let secret = SECRET.trim_start_matches("whsec_");
    let base = receiver.requests();
    let recv_before = procfs::threads_cpu("self")
        .get(receiver::THREAD)
        .copied()
        .unwrap_or_default();
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&db)
        .arg(receiver.url())
        .arg(s.python_concurrency.to_string())
        .arg(secret)
        .output()
        .await
        .context("running python3")?;
    if !out.status.success() {
        bail!(
            "the Python deliverer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let recv_used = procfs::threads_cpu("self")
        .get(receiver::THREAD)
        .copied()
        .unwrap_or_default()
        .saturating_sub(recv_before);
    #[derive(serde::Deserialize)]
    struct Out {
        delivered: u64,
        failed: u64,
        seconds: f64,
        cpu_seconds: f64,
    }
    let o: Out = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "reading the Python deliverer's output: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let got = receiver.requests() - base;
    if got < o.delivered {
        bail!(
            "the Python deliverer reports {} delivered, the receiver got {got}",
            o.delivered
        );
    }
    Ok(Phase {
        name: "python",
        concurrency: s.python_concurrency,
        delivered: o.delivered,
        failed: o.failed,
        secs: o.seconds,
        per_sec: o.delivered as f64 / o.seconds,
        cpu_us: o.cpu_seconds * 1e6 / o.delivered.max(1) as f64,
        receiver_cpu_us: recv_used.as_secs_f64() * 1e6 / got.max(1) as f64,
        cpu_threads: BTreeMap::new(),
        connections: 0,
    })
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.0} %", 100.0 * a / b)
    } else {
        "-".into()
    }
}

fn best(phases: &[Phase]) -> Option<&Phase> {
    phases.iter().max_by(|a, b| a.per_sec.total_cmp(&b.per_sec))
}

pub fn print(s: &Settings, r: &Report) {
    println!(
        "http-floor: {} events of {} B per phase, SQLite, receiver on {} thread(s); load {} -> {}",
        s.events, s.body_size, s.receiver_threads, r.load_before, r.load_after
    );
    let a = &r.receiver_alone;
    println!(
        "receiver alone (raw hyper, {} connections): {:.0} req/s, receiver CPU {:.1} us/request",
        a.concurrency, a.per_sec, a.receiver_cpu_us
    );
    println!(
        "{:>11} | {:>10} {:>8} | {:>10} {:>8} | {:>9} | {:>12} | {:>11}",
        "concurrency",
        "floor /s",
        "CPU us",
        "mailroom/s",
        "CPU us",
        "of floor",
        "receiver us",
        "conns"
    );
    for (f, m) in r.floor.iter().zip(&r.mailroom) {
        println!(
            "{:>11} | {:>10.0} {:>8.1} | {:>10.0} {:>8.1} | {:>9} | {:>5.1} / {:>4.1} | {:>5} / {:>3}",
            f.concurrency,
            f.per_sec,
            f.cpu_us,
            m.per_sec,
            m.cpu_us,
            ratio(m.per_sec, f.per_sec),
            f.receiver_cpu_us,
            m.receiver_cpu_us,
            f.connections,
            m.connections
        );
    }
    if let (Some(bf), Some(bm)) = (best(&r.floor), best(&r.mailroom)) {
        println!(
            "best: floor {:.0}/s (c={}), mailroom {:.0}/s (c={}): {} of the floor",
            bf.per_sec,
            bf.concurrency,
            bm.per_sec,
            bm.concurrency,
            ratio(bm.per_sec, bf.per_sec)
        );
    }
    if let Some(m) = r.mailroom.first() {
        println!(
            "mailroom threads at c={}: {}",
            m.concurrency,
            crate::stats::fmt_cpu(&m.cpu_threads)
        );
    }
    if let Some(p) = &r.python {
        println!(
            "python http.client ({} threads): {:.0}/s, CPU {:.1} us/delivery, {} failed",
            p.concurrency, p.per_sec, p.cpu_us, p.failed
        );
        if let Some(m) = r.mailroom.first() {
            println!(
                "mailroom (c={}) / python: {:.1}x the events/s, {:.1}x less CPU per delivery",
                m.concurrency,
                m.per_sec / p.per_sec,
                p.cpu_us / m.cpu_us.max(0.001)
            );
        }
    }
    if r.unsigned > 0 {
        println!("WARNING: {} requests came without a signature", r.unsigned);
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Events each floor and mailroom phase delivers.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Concurrencies (attempts in flight; the floor's loops); the first is
    /// the topic default.
    #[arg(long, value_delimiter = ',', default_value = "16,64,256")]
    concurrency: Vec<u32>,
    /// Events of the Python deliverer (0: skip it).
    #[arg(long, default_value_t = 10_000)]
    python_events: u64,
    /// Worker threads (one keep-alive connection each) of the Python deliverer.
    #[arg(long, default_value_t = 16)]
    python_concurrency: u32,
    /// Payload size in bytes (a JSON object).
    #[arg(long, default_value_t = 256)]
    body_size: usize,
    /// Threads of the receiver.
    #[arg(long, default_value_t = 1)]
    receiver_threads: usize,
    /// How long the receiver-alone phase runs.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    receiver_alone: Duration,
    /// Give up on a phase after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `http-floor`: the floor, mailroom and Python phases, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = Settings {
        events: a.events.max(1),
        concurrency: match a.concurrency.is_empty() {
            true => vec![mailroom::TopicSpec::DEFAULT_CONCURRENCY],
            false => a.concurrency.into_iter().map(|c| c.max(1)).collect(),
        },
        python_events: a.python_events,
        python_concurrency: a.python_concurrency.max(1),
        body_size: a.body_size,
        receiver_threads: a.receiver_threads.max(1),
        receiver_alone: a.receiver_alone,
        timeout: a.timeout,
    };
    let r = measure(&s).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "http-floor", "result": r }))?;
    } else {
        print(&s, &r);
    }
    Ok(ExitCode::SUCCESS)
}
