//! `floor`: what SQLite alone costs a batch drain, as a bound for the
//! engine's `batch` figure.
//!
//! On a fresh store (mailroom's own schema and pragmas: WAL, `synchronous =
//! FULL`), N pending events are inserted, then drained by this thread with
//! nothing but the writes every drained event needs, set-based:
//!
//! 1. claim `max_size` events: one `UPDATE … RETURNING` of the full rows,
//!    read into owned values as a dispatcher must (the statement of the
//!    SQLite store's claim), committed;
//! 2. record them done: their attempt-history rows (one `INSERT … SELECT`)
//!    and their status (one `UPDATE`), both by `seq` range, committed.
//!
//! No engine, no async runtime, no handler, no JSON, no lookups by id: no
//! real dispatcher can do less per event. The engine's `single` drain runs
//! in the same round, so the ratio says how far above `single` any batch
//! implementation on this store could get on this machine.
//!
//! [`postgres`] is the same bound on PostgreSQL (`--store postgres://…`),
//! and [`heads`] the bound of a sequential topic's drain there.

pub mod heads;
pub mod postgres;

use crate::backend::Backend;
use crate::cli::print_json;
use crate::drain::{self, DrainMode};
use crate::pgwork::DbWork;
use anyhow::Context;
use rusqlite::Connection;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// One round's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FloorResult {
    pub events: u64,
    pub max_size: u32,
    pub secs: f64,
    pub events_per_sec: f64,
    /// Write transactions while draining.
    pub commits: u64,
    /// The database's work while draining (PostgreSQL only).
    pub db: Option<DbWork>,
}

/// The claim of the SQLite store (`CLAIM_ANY` in mailroom-sqlite), with
/// the topic fixed.
const CLAIM: &str = "UPDATE events
     SET status = 'running', attempts = attempts + 1, lease_until = ?1,
         started_at = ?2, worker = 'floor', next_attempt_at = NULL
     WHERE seq IN (
         SELECT e.seq FROM events e INDEXED BY events_pending
         WHERE e.topic = 'floor' AND e.status = 'pending' AND e.next_attempt_at <= ?2
         ORDER BY e.seq LIMIT ?3)
     RETURNING seq, id, source, topic, dedup_key, key, type, status, attempts,
         max_attempts, next_attempt_at, received_at, lease_until, started_at, worker,
         correlation_id, causation_id, content_type, payload, last_error";

/// A claimed row, owned, as a dispatcher would hold it.
#[allow(dead_code)] // read only to be paid for
struct Row {
    seq: i64,
    texts: [Option<String>; 12],
    numbers: [Option<i64>; 6],
    payload: Option<Vec<u8>>,
}

/// Runs one round on a fresh SQLite file.
pub async fn measure_sqlite(
    events: u64,
    max_size: u32,
    body_size: usize,
) -> anyhow::Result<FloorResult> {
    let fresh = Backend::Sqlite.fresh().await?;
    // The store creates the schema; then it is closed and this thread is
    // the only writer.
    let opened = fresh.open(true).await?;
    opened.store().migrate().await.context("migrating")?;
    opened.close().await;
    let path = fresh
        .url
        .strip_prefix("sqlite://")
        .context("a SQLite URL")?
        .to_string();
    let body = crate::ingest::body(body_size);
    let result = tokio::task::spawn_blocking(move || drain(&path, events, max_size, &body))
        .await
        .context("the floor thread")??;
    fresh.cleanup().await?;
    Ok(result)
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(i64::MAX)
}

fn drain(path: &str, events: u64, max_size: u32, body: &[u8]) -> anyhow::Result<FloorResult> {
    let conn = open(path)?;
    preload(&conn, events, body)?;
    let started = Instant::now();
    let (mut drained, mut commits) = (0u64, 0u64);
    loop {
        let now = now_ms();
        let rows = claim(&conn, now, max_size)?;
        commits += 1;
        if rows.is_empty() {
            break;
        }
        let done = complete(&conn, &rows)?;
        commits += 1;
        anyhow::ensure!(
            done == rows.len(),
            "completed {done} of {} claimed",
            rows.len()
        );
        drained += done as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    anyhow::ensure!(drained == events, "drained {drained} of {events}");
    Ok(FloorResult {
        events,
        max_size,
        secs,
        events_per_sec: events as f64 / secs,
        commits,
        db: None,
    })
}

/// The store's file with the store's pragmas (WAL, `synchronous = FULL`).
fn open(path: &str) -> anyhow::Result<Connection> {
    let conn = Connection::open(path).context("opening the SQLite file")?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "WAL refused: {mode}");
    conn.execute_batch(
        "PRAGMA synchronous = FULL; PRAGMA temp_store = MEMORY; PRAGMA cache_size = -16000;",
    )?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(conn)
}

/// `events` pending events, 500 rows per transaction; ids sort in arrival
/// order, as UUIDv7s do.
fn preload(conn: &Connection, events: u64, body: &[u8]) -> anyhow::Result<()> {
    let received = now_ms();
    let mut inserted = 0u64;
    while inserted < events {
        let tx = conn.unchecked_transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO events (id, source, topic, dedup_key, status, max_attempts,
                     next_attempt_at, received_at, content_type, payload)
                 VALUES (?1, 'floor', 'floor', ?1, 'pending', 10, ?2, ?2, 'application/json', ?3)",
            )?;
            for _ in 0..500.min(events - inserted) {
                let id = format!("01900000-0000-7000-8000-{inserted:012}");
                insert.execute((&id, received, body))?;
                inserted += 1;
            }
        }
        tx.commit()?;
    }
    Ok(())
}

/// Step 1: up to `max_size` events claimed and read into owned rows, committed.
fn claim(conn: &Connection, now: i64, max_size: u32) -> anyhow::Result<Vec<Row>> {
    let tx = conn.unchecked_transaction()?;
    let mut rows = Vec::with_capacity(max_size as usize);
    {
        let mut claim = tx.prepare_cached(CLAIM)?;
        let mut cursor = claim.query((now + 30_000, now, i64::from(max_size)))?;
        while let Some(r) = cursor.next()? {
            let text = |i: usize| r.get::<_, Option<String>>(i);
            let num = |i: usize| r.get::<_, Option<i64>>(i);
            rows.push(Row {
                seq: r.get(0)?,
                texts: [
                    text(1)?,
                    text(2)?,
                    text(3)?,
                    text(4)?,
                    text(5)?,
                    text(6)?,
                    text(7)?,
                    text(14)?,
                    text(15)?,
                    text(16)?,
                    text(17)?,
                    text(19)?,
                ],
                numbers: [num(8)?, num(9)?, num(10)?, num(11)?, num(12)?, num(13)?],
                payload: r.get(18)?,
            });
        }
    }
    tx.commit()?;
    Ok(rows)
}

/// Step 2: the claimed rows' history and status by `seq` range, committed;
/// how many were recorded done.
fn complete(conn: &Connection, rows: &[Row]) -> anyhow::Result<usize> {
    let lo = rows.iter().map(|r| r.seq).min().unwrap_or(0);
    let hi = rows.iter().map(|r| r.seq).max().unwrap_or(0);
    let tx = conn.unchecked_transaction()?;
    tx.prepare_cached(
        "INSERT INTO attempts (event_seq, attempt, started_at, finished_at, outcome, worker)
         SELECT seq, attempts, started_at, ?3, 'done', worker FROM events
         WHERE seq BETWEEN ?1 AND ?2 AND status = 'running'",
    )?
    .execute((lo, hi, now_ms()))?;
    let done = tx
        .prepare_cached(
            "UPDATE events SET status = 'done', lease_until = NULL
             WHERE seq BETWEEN ?1 AND ?2 AND status = 'running'",
        )?
        .execute((lo, hi))?;
    tx.commit()?;
    Ok(done)
}

/// One round: the engine's drains and the raw loop, one after the other.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Round {
    pub single: crate::drain::DrainResult,
    pub batch: crate::drain::DrainResult,
    pub raw: FloorResult,
}

impl Round {
    fn batch_ratio(&self) -> f64 {
        self.batch.events_per_sec / self.single.events_per_sec
    }
    fn floor_ratio(&self) -> f64 {
        self.raw.events_per_sec / self.single.events_per_sec
    }
}

/// Medians over the rounds.
#[derive(Debug, serde::Serialize)]
pub struct Medians {
    pub single_events_per_sec: f64,
    pub batch_events_per_sec: f64,
    pub floor_events_per_sec: f64,
    pub batch_vs_single: f64,
    pub floor_vs_single: f64,
    /// How much of the floor the engine's batch drain reaches.
    pub batch_vs_floor: f64,
}

pub fn medians(rounds: &[Round]) -> Medians {
    let m = |f: &dyn Fn(&Round) -> f64| {
        crate::drain::median(rounds.iter().map(f).collect()).unwrap_or(0.0)
    };
    Medians {
        single_events_per_sec: m(&|r| r.single.events_per_sec),
        batch_events_per_sec: m(&|r| r.batch.events_per_sec),
        floor_events_per_sec: m(&|r| r.raw.events_per_sec),
        batch_vs_single: m(&|r| r.batch_ratio()),
        floor_vs_single: m(&|r| r.floor_ratio()),
        batch_vs_floor: m(&|r| r.batch.events_per_sec / r.raw.events_per_sec),
    }
}

pub fn print(s: &crate::drain::Settings, store: &Backend, rounds: &[Round]) {
    println!(
        "floor: {} rounds of {} events on {}, body {} B; engine drains through no-op handlers (single concurrency {}, batch max_size {}), then a raw SQL loop claiming {} rows at a time and completing them by seq",
        rounds.len(),
        s.events,
        store.name(),
        s.body_size,
        s.concurrency,
        s.batch_size,
        s.batch_size,
    );
    println!(
        "{:<6} {:>14} {:>14} {:>14} {:>10} {:>10}",
        "round", "single ev/s", "batch ev/s", "floor ev/s", "batch/sgl", "floor/sgl"
    );
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "{:<6} {:>14.0} {:>14.0} {:>14.0} {:>9.2}x {:>9.2}x",
            i + 1,
            r.single.events_per_sec,
            r.batch.events_per_sec,
            r.raw.events_per_sec,
            r.batch_ratio(),
            r.floor_ratio(),
        );
    }
    print_db_work(rounds);
    let m = medians(rounds);
    println!(
        "median: single {:.0}/s, batch {:.0}/s ({:.2}x single), floor {:.0}/s ({:.2}x single); the engine's batch drain reaches {:.0}% of the floor, single {:.0}%",
        m.single_events_per_sec,
        m.batch_events_per_sec,
        m.batch_vs_single,
        m.floor_events_per_sec,
        m.floor_vs_single,
        m.batch_vs_floor * 100.0,
        100.0 / m.floor_vs_single.max(f64::MIN_POSITIVE),
    );
}

/// Per round, the database's work per 1,000 events of each drain (when
/// measured: PostgreSQL).
fn print_db_work(rounds: &[Round]) {
    let work = |db: Option<&DbWork>| {
        db.map_or_else(
            || "-".to_string(),
            |w| format!("{:.3} s {:.2} MiB", w.cpu_secs_per_1k, w.wal_mib_per_1k()),
        )
    };
    if rounds.iter().all(|r| r.raw.db.is_none()) {
        return;
    }
    println!(
        "{:<6} {:>24} {:>24} {:>24}   (PostgreSQL CPU-s and WAL per 1,000 events)",
        "round", "single", "batch", "floor"
    );
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "{:<6} {:>24} {:>24} {:>24}",
            i + 1,
            work(r.single.db.as_ref()),
            work(r.batch.db.as_ref()),
            work(r.raw.db.as_ref()),
        );
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rounds (each: engine single, engine batch, raw floor); the summary
    /// gives the medians of each round's ratios to `single`.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// `sqlite` (a temporary file) or `postgres://...` (fresh databases on
    /// that server, dropped afterwards).
    #[arg(long, default_value = "sqlite", value_parser = Backend::parse)]
    store: Backend,
    #[command(flatten)]
    drain: crate::drain::SettingsArgs,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `floor`: `--rounds` rounds of single, batch and the raw floor, then the table or JSON.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let settings = a.drain.settings();
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        let single = drain::measure(&settings, DrainMode::Single, &a.store, 1).await?;
        let batch = drain::measure(&settings, DrainMode::Batch, &a.store, 1).await?;
        let (events, max_size, body) = (settings.events, settings.batch_size, settings.body_size);
        let raw = match &a.store {
            Backend::Sqlite => measure_sqlite(events, max_size, body).await?,
            pg => postgres::run(pg, events, max_size, body).await?,
        };
        rounds.push(Round { single, batch, raw });
    }
    if a.json {
        print_json(&serde_json::json!({
            "bench": "floor",
            "rounds": rounds,
            "median": medians(&rounds),
        }))?;
    } else {
        print(&settings, &a.store, &rounds);
    }
    Ok(ExitCode::SUCCESS)
}
