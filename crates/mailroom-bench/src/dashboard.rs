//! `dashboard`: the dashboard's pages on a big store (the target: the
//! overview and a topic page under 100 ms with 1,000,000 events), and what
//! a browser-like poller of the overview (once a second) costs intake.
//!
//! One process: a fresh store preloaded with `--events` pending events over
//! `--topics` pull topics (nothing drains them), the real router on
//! `127.0.0.1:0`, and sequential GETs over one keep-alive connection, timed
//! from request to the whole body. Intake is `Engine::enqueue` from
//! `--concurrency` tasks for `--intake` windows, without and with the
//! poller in alternating order over `--rounds` (alone then polled, polled
//! then alone, ...), so a drift of the machine's load or of the store's
//! size over the run weighs on both sides alike; the verdict is the median
//! of the rounds' polled/alone ratios.

use crate::backend::Backend;
use crate::cli::{parse_duration, print_json};
use crate::stats::{Latencies, fmt_ms};
use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use mailroom::{Draft, Engine, StoreError, TopicSpec};
use serde::Serialize;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What a run does.
#[derive(Debug, Clone)]
pub struct Settings {
    pub events: u64,
    pub topics: u32,
    pub requests: u32,
    pub intake: Duration,
    pub concurrency: usize,
    pub rounds: u32,
}

/// One round's intake windows, events per second.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct IntakeRound {
    pub alone_per_s: f64,
    pub polled_per_s: f64,
    /// Whether the polled window ran first in this round.
    pub polled_first: bool,
}

impl IntakeRound {
    /// Polled over alone: 1.0 means the poller cost nothing.
    pub fn ratio(&self) -> f64 {
        self.polled_per_s / self.alone_per_s
    }
}

/// One page's answer times.
#[derive(Debug, Serialize)]
pub struct PageTimes {
    pub path: String,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// What a run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    pub store: &'static str,
    pub events: u64,
    pub preload_s: f64,
    pub pages: Vec<PageTimes>,
    pub intake: Vec<IntakeRound>,
    /// Median of the rounds' polled/alone ratios.
    pub polled_over_alone: f64,
}

fn topic(i: u64, topics: u32) -> String {
    format!("t{}", i % u64::from(topics.max(1)))
}

/// Runs the benchmark on a fresh store of `backend`.
pub async fn measure_on(s: &Settings, backend: &Backend) -> anyhow::Result<Report> {
    let fresh = backend.fresh().await?;
    let opened = fresh.open(true).await?;
    let store = opened.store();
    store.migrate().await.context("migrating")?;
    let mut builder = Engine::builder(store);
    for t in 0..s.topics.max(1) {
        builder = builder.topic(TopicSpec::new(format!("t{t}")));
    }
    let engine = builder.build().context("building the engine")?;
    let started = Instant::now();
    enqueue(&engine, s, Some(s.events), None).await?;
    let preload = started.elapsed();

    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = mailroom_server::router(engine.clone(), mailroom_server::ServerOptions::default());
    let server = tokio::spawn(mailroom_server::serve(listener, router, shutdown.clone()));
    let result = measure(s, &engine, addr).await;
    shutdown.cancel();
    let _ = server.await;
    opened.close().await;
    fresh.cleanup().await?;
    let (pages, intake) = result?;
    let ratios: Vec<f64> = intake.iter().map(IntakeRound::ratio).collect();
    Ok(Report {
        store: backend.name(),
        events: s.events,
        preload_s: preload.as_secs_f64(),
        pages,
        intake,
        polled_over_alone: crate::drain::median(ratios).unwrap_or(f64::NAN),
    })
}

async fn measure(
    s: &Settings,
    engine: &Engine,
    addr: SocketAddr,
) -> anyhow::Result<(Vec<PageTimes>, Vec<IntakeRound>)> {
    let mut pages = Vec::new();
    for path in ["/", "/ui/topics/t0", "/ui/dead"] {
        pages.push(time_page(addr, path, s.requests).await?);
    }
    let mut rounds = Vec::new();
    for r in 0..s.rounds.max(1) {
        let polled_first = r % 2 == 1;
        let (alone_per_s, polled_per_s) = if polled_first {
            let polled = intake_rate(engine, s, Some(addr)).await?;
            (intake_rate(engine, s, None).await?, polled)
        } else {
            let alone = intake_rate(engine, s, None).await?;
            (alone, intake_rate(engine, s, Some(addr)).await?)
        };
        rounds.push(IntakeRound {
            alone_per_s,
            polled_per_s,
            polled_first,
        });
    }
    Ok((pages, rounds))
}

/// `requests` GETs of `path` after a few unmeasured ones.
async fn time_page(addr: SocketAddr, path: &str, requests: u32) -> anyhow::Result<PageTimes> {
    let mut conn = connect(addr).await?;
    let mut lat = Latencies::default();
    for i in 0..requests + 3 {
        let t = Instant::now();
        get(&mut conn, addr, path).await?;
        if i >= 3 {
            lat.record(t.elapsed());
        }
    }
    lat.sort();
    Ok(PageTimes {
        path: path.to_owned(),
        p50_ms: lat.quantile_ms(0.5),
        p99_ms: lat.quantile_ms(0.99),
        max_ms: lat.quantile_ms(1.0),
    })
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// One GET that must answer 200; reads the whole body.
async fn get(s: &mut Sender, addr: SocketAddr, path: &str) -> anyhow::Result<()> {
    let req = http::Request::get(path)
        .header(http::header::HOST, addr.to_string())
        .body(Empty::new())?;
    s.ready().await?;
    let resp = s.send_request(req).await?;
    let status = resp.status();
    resp.into_body().collect().await?;
    if status != http::StatusCode::OK {
        bail!("GET {path}: HTTP {}", status.as_u16());
    }
    Ok(())
}

/// Events per second that `enqueue` commits over `s.intake`, with a poller
/// of the overview (GET / once a second) when `poll` names the server.
async fn intake_rate(
    engine: &Engine,
    s: &Settings,
    poll: Option<SocketAddr>,
) -> anyhow::Result<f64> {
    let stop = CancellationToken::new();
    let poller = poll.map(|addr| {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut conn = connect(addr).await?;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            while !stop.is_cancelled() {
                tokio::select! {
                    _ = tick.tick() => get(&mut conn, addr, "/").await?,
                    () = stop.cancelled() => break,
                }
            }
            anyhow::Ok(())
        })
    });
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    enqueue(engine, s, None, Some((started + s.intake, done.clone()))).await?;
    let rate = done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    if let Some(p) = poller {
        p.await??;
    }
    Ok(rate)
}

/// `s.concurrency` tasks enqueueing round-robin over the topics: `total`
/// events in all, or until the deadline (counting into its counter).
async fn enqueue(
    engine: &Engine,
    s: &Settings,
    total: Option<u64>,
    until: Option<(Instant, Arc<AtomicU64>)>,
) -> anyhow::Result<()> {
    let payload = crate::ingest::body(256);
    let workers = s.concurrency.max(1) as u64;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let share = total.map(|n| n / workers + u64::from(w < n % workers));
        let (engine, payload, until, topics) =
            (engine.clone(), payload.clone(), until.clone(), s.topics);
        tasks.spawn(async move {
            let mut j = 0u64;
            loop {
                if share.is_some_and(|n| j >= n)
                    || until.as_ref().is_some_and(|(t, _)| Instant::now() >= *t)
                {
                    return anyhow::Ok(());
                }
                let draft = Draft::bytes(topic(w + j * workers, topics), payload.clone())
                    .content_type("application/json");
                match engine.enqueue(draft).await {
                    Ok(_) => j += 1,
                    Err(mailroom::EnqueueError::Store(StoreError::Overloaded)) => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
                if let Some((_, n)) = &until {
                    n.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(())
}

/// The report as a table.
pub fn print(r: &Report) {
    println!(
        "dashboard on {} with {} events (preloaded in {:.1} s)",
        r.store, r.events, r.preload_s
    );
    println!("{:<16} {:>10} {:>10} {:>10}", "page", "p50", "p99", "max");
    for p in &r.pages {
        println!(
            "{:<16} {:>10} {:>10} {:>10}",
            p.path,
            fmt_ms(p.p50_ms),
            fmt_ms(p.p99_ms),
            fmt_ms(p.max_ms)
        );
    }
    println!("intake, alone and with the overview polled once a second:");
    for (i, round) in r.intake.iter().enumerate() {
        println!(
            "  round {}: {:.0}/s alone, {:.0}/s polled ({}), polled/alone {:.3}",
            i + 1,
            round.alone_per_s,
            round.polled_per_s,
            if round.polled_first {
                "polled first"
            } else {
                "alone first"
            },
            round.ratio()
        );
    }
    println!(
        "  median polled/alone {:.3} ({:+.1} %)",
        r.polled_over_alone,
        (r.polled_over_alone - 1.0) * 100.0
    );
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// `sqlite`, or a PostgreSQL server (a fresh database is created and dropped).
    #[arg(long, default_value = "sqlite", value_parser = Backend::parse)]
    store: Backend,
    /// Events preloaded (pending, over the topics).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Topics the events are spread over.
    #[arg(long, default_value_t = 4)]
    topics: u32,
    /// Timed requests per page.
    #[arg(long, default_value_t = 100)]
    requests: u32,
    /// Each intake window (one without and one with the poller per round).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    intake: Duration,
    /// Intake rounds, alternating which window runs first.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Concurrent enqueues (preload and intake).
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `dashboard`: the pages timed and the intake windows, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let s = Settings {
        events: a.events,
        topics: a.topics.max(1),
        requests: a.requests.max(1),
        intake: a.intake,
        concurrency: a.concurrency.max(1),
        rounds: a.rounds.max(1),
    };
    let r = measure_on(&s, &a.store).await?;
    if a.json {
        print_json(&serde_json::json!({ "bench": "dashboard", "result": r }))?;
    } else {
        print(&r);
    }
    Ok(ExitCode::SUCCESS)
}
