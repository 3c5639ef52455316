//! `heads-floor --store postgres://…`: how far the per-key rule of a
//! `sequential` topic puts its drain below `single`, on mailroom's schema,
//! for any engine and for this one.
//!
//! Each round drains the same events four times, each on a fresh
//! database: the engine's `single` and `sequential` topics, then the raw
//! floors of both ([`super::postgres`]): keyless events claimed
//! `--concurrency` at a time, and events spread round-robin over `--keys`
//! keys claimed as many heads at a time. The floors' ratio is the cost of
//! the per-key rule itself (two index probes per candidate: `queue_keys`
//! for an earlier event that does not run, `queue_running` for one that
//! does); the engine's ratio beside it is what this engine pays.

use super::FloorResult;
use crate::backend::Backend;
use crate::cli::print_json;
use crate::drain::{DrainMode, DrainResult, Settings, median};
use crate::pgwork::DbWork;
use std::process::ExitCode;

/// One round's four drains.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Round {
    pub single: DrainResult,
    pub sequential: DrainResult,
    pub floor: FloorResult,
    pub heads_floor: FloorResult,
}

impl Round {
    fn engine_ratio(&self) -> f64 {
        self.sequential.events_per_sec / self.single.events_per_sec
    }
    fn floor_ratio(&self) -> f64 {
        self.heads_floor.events_per_sec / self.floor.events_per_sec
    }
}

/// Runs one round on `store` (PostgreSQL).
pub async fn round(s: &Settings, store: &Backend) -> anyhow::Result<Round> {
    anyhow::ensure!(
        !matches!(store, Backend::Sqlite),
        "heads-floor needs --store postgres://…"
    );
    let single = crate::drain::measure(s, DrainMode::Single, store, 1).await?;
    let sequential = crate::drain::measure(s, DrainMode::Sequential, store, 1).await?;
    let floor = super::postgres::run(store, s.events, s.concurrency, s.body_size).await?;
    let heads_floor =
        super::postgres::run_heads(store, s.events, s.concurrency, s.keys, s.body_size).await?;
    Ok(Round {
        single,
        sequential,
        floor,
        heads_floor,
    })
}

/// Medians over the rounds.
#[derive(Debug, serde::Serialize)]
pub struct Medians {
    /// Engine: sequential events/s over single's, per round.
    pub engine_sequential_vs_single: f64,
    /// Floors: the sequential floor over the single floor, per round.
    pub floor_sequential_vs_single: f64,
    /// How much of its floor each engine drain reaches.
    pub single_vs_floor: f64,
    pub sequential_vs_floor: f64,
}

pub fn medians(rounds: &[Round]) -> Medians {
    let m = |f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(f).collect()).unwrap_or(0.0);
    Medians {
        engine_sequential_vs_single: m(&|r| r.engine_ratio()),
        floor_sequential_vs_single: m(&|r| r.floor_ratio()),
        single_vs_floor: m(&|r| r.single.events_per_sec / r.floor.events_per_sec),
        sequential_vs_floor: m(&|r| r.sequential.events_per_sec / r.heads_floor.events_per_sec),
    }
}

pub fn print(s: &Settings, store: &Backend, rounds: &[Round]) {
    println!(
        "heads-floor: {} rounds of {} events on {}, body {} B; engine single and sequential (concurrency {}, {} keys) through no-op handlers, then raw SQL floors claiming {} keyless events / {} heads of keys at a time",
        rounds.len(),
        s.events,
        store.name(),
        s.body_size,
        s.concurrency,
        s.keys,
        s.concurrency,
        s.concurrency,
    );
    println!(
        "{:<6} {:>10} {:>10} {:>9} {:>10} {:>10} {:>9}   {:>22} {:>22} {:>22} {:>22}",
        "round",
        "single",
        "seq",
        "seq/sgl",
        "floor",
        "seq floor",
        "seq/sgl",
        "single CPU-s, WAL/1k",
        "seq",
        "floor",
        "seq floor",
    );
    let work = |db: Option<&DbWork>| {
        db.map_or_else(
            || "-".to_string(),
            |w| format!("{:.3} s {:.2} MiB", w.cpu_secs_per_1k, w.wal_mib_per_1k()),
        )
    };
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "{:<6} {:>10.0} {:>10.0} {:>8.2}x {:>10.0} {:>10.0} {:>8.2}x   {:>22} {:>22} {:>22} {:>22}",
            i + 1,
            r.single.events_per_sec,
            r.sequential.events_per_sec,
            r.engine_ratio(),
            r.floor.events_per_sec,
            r.heads_floor.events_per_sec,
            r.floor_ratio(),
            work(r.single.db.as_ref()),
            work(r.sequential.db.as_ref()),
            work(r.floor.db.as_ref()),
            work(r.heads_floor.db.as_ref()),
        );
    }
    let m = medians(rounds);
    println!(
        "median: sequential {:.2}x single in the engine, {:.2}x in the floors; the engine reaches {:.0}% of the floor in single, {:.0}% in sequential",
        m.engine_sequential_vs_single,
        m.floor_sequential_vs_single,
        m.single_vs_floor * 100.0,
        m.sequential_vs_floor * 100.0,
    );
}

/// Runs `heads-floor`: `--rounds` rounds of the engine's drains and the raw floors, then the table or JSON.
pub async fn run(a: super::Args) -> anyhow::Result<ExitCode> {
    let settings = a.drain.settings();
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        rounds.push(round(&settings, &a.store).await?);
    }
    if a.json {
        print_json(&serde_json::json!({
            "bench": "heads-floor",
            "rounds": rounds,
            "median": medians(&rounds),
        }))?;
    } else {
        print(&settings, &a.store, &rounds);
    }
    Ok(ExitCode::SUCCESS)
}
