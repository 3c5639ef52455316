//! The printed drain reports: one run's table with details, and rounds
//! with their medians.

use super::{DrainResult, Settings, medians, ratio_vs_single};
use crate::pgwork::DbWork;
use crate::stats::{fmt_cpu, fmt_times};

/// Headers of the database-work columns (PostgreSQL): PostgreSQL
/// CPU-seconds and WAL MiB per 1,000 drained events, WAL records and
/// full-page images per event (images follow a checkpoint in the window).
const DB_HEADER: &str = "  pg s/1k WAL MiB/1k  rec/ev  fpi/ev";

/// The database-work columns of a result (blank on SQLite).
fn db_columns(db: Option<&DbWork>) -> String {
    let Some(db) = db else {
        return String::new();
    };
    format!(
        "{:>8.3} {:>10.2} {:>7} {:>7}",
        db.cpu_secs_per_1k,
        db.wal_mib_per_1k(),
        db.wal_records_per_event
            .map_or_else(|| "-".into(), |r| format!("{r:.1}")),
        db.wal_fpi_per_event
            .map_or_else(|| "-".into(), |r| format!("{r:.2}")),
    )
}

/// The database's work for a drain, in totals and per event.
fn print_db_work(tag: &str, db: &DbWork) {
    println!(
        "  {tag}: database work: PostgreSQL {:.2} CPU-s ({:.2} in this run's backends), {:.1} MiB WAL, {} records, {} full-page images; per 1,000 events {:.3} CPU-s and {:.2} MiB WAL; {:.0} events per PostgreSQL CPU-second (server-wide counters: other work on the server inflates them)",
        db.cpu_secs,
        db.backend_cpu_secs,
        db.wal_bytes as f64 / (1024.0 * 1024.0),
        db.wal_records.map_or_else(|| "-".into(), |n| n.to_string()),
        db.wal_fpi.map_or_else(|| "-".into(), |n| n.to_string()),
        db.cpu_secs_per_1k,
        db.wal_mib_per_1k(),
        db.events_per_cpu_sec,
    );
}

/// `store xN`: where a result was measured.
fn label(r: &DrainResult) -> String {
    format!("{} x{}", r.store, r.instances)
}

/// The settings line shared by every drain printout (after the counts).
fn describe(s: &Settings) -> String {
    format!(
        "body {} B, no-op handlers; single/sequential concurrency {}, sequential over {} keys, batch max_size {} max_wait {} concurrency {}",
        s.body_size,
        s.concurrency,
        s.keys,
        s.batch_size,
        mailroom::duration::format(s.batch_wait),
        s.batch_concurrency,
    )
}

pub fn print_table(s: &Settings, results: &[DrainResult]) {
    println!("drain: {} events, {}", s.events, describe(s));
    println!(
        "{:<11} {:<12} {:>9} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {DB_HEADER}",
        "mode",
        "store",
        "preload/s",
        "drain s",
        "events/s",
        "vs single",
        "claims",
        "ev/claim",
        "empty",
        "next_due",
        "commits",
        "mr cpu",
        "pg cpu",
    );
    for r in results {
        println!(
            "{:<11} {:<12} {:>9.0} {:>9.2} {:>9.0} {:>8} {:>7} {:>8.1} {:>8} {:>8} {:>9} {:>7.0}% {:>8} {}",
            r.mode.name(),
            label(r),
            r.preload_inserts_per_sec,
            r.drain_secs,
            r.events_per_sec,
            fmt_times(ratio_vs_single(results, r)),
            r.calls.claims,
            r.calls.claim_size(),
            r.calls.empty_claims,
            r.calls.next_due,
            r.drain_commits,
            r.cpu.values().sum::<f64>() * 100.0,
            if r.pg_cpu.is_empty() {
                "-".to_string()
            } else {
                format!("{:.0}%", r.pg_cpu.values().sum::<f64>() * 100.0)
            },
            db_columns(r.db.as_ref()),
        );
    }
    for r in results {
        print_details(r);
    }
}

/// A result's commits, claim times, CPU and memory, a line each.
fn print_details(r: &DrainResult) {
    let tag = format!("{} {}", r.mode.name(), label(r));
    println!(
        "  {tag}: preload {:.2} s ({} insert commits, {:.1}/commit); drain {} commits ({:.1} events/commit), {:.1} KiB/commit to disk here",
        r.preload_secs,
        r.preload_commits,
        r.events as f64 / r.preload_commits.max(1) as f64,
        r.drain_commits,
        r.events as f64 / r.drain_commits.max(1) as f64,
        r.drain_write_bytes as f64 / 1024.0 / r.drain_commits.max(1) as f64,
    );
    println!(
        "  {tag}: claims {:.2} ms each on average (longest {:.1} ms), in claim calls {:.0}% of the drain per instance",
        r.calls.claim_ms(),
        r.calls.claim_max_micros as f64 / 1000.0,
        r.calls.claim_micros as f64 / 1e6 / r.drain_secs / r.instances.max(1) as f64 * 100.0,
    );
    println!("  {tag}: cpu mailroom {}", fmt_cpu(&r.cpu));
    if !r.pg_cpu.is_empty() {
        println!("  {tag}: cpu postgres {}", fmt_cpu(&r.pg_cpu));
    }
    if let Some(db) = &r.db {
        print_db_work(&tag, db);
    }
    println!(
        "  {tag}: RSS peak {:.1} MiB, VmHWM {:.1} MiB; done {} / handled {} {:?}; completions {} ({} complete_many calls), store errors {}",
        r.drain_peak_rss_mib,
        r.hwm_mib,
        r.done,
        r.handled,
        r.handled_per_instance,
        r.calls.completes,
        r.calls.complete_many,
        r.calls.errors,
    );
}

/// Each round's figures on a line per mode, then the medians.
pub fn print_rounds(s: &Settings, rounds: &[Vec<DrainResult>]) {
    println!(
        "drain: {} rounds of {} events each, {}",
        rounds.len(),
        s.events,
        describe(s)
    );
    println!(
        "{:<6} {:<11} {:<12} {:>9} {:>9} {:>9} {:>8} {DB_HEADER}",
        "round", "mode", "store", "drain s", "events/s", "vs single", "mr cpu"
    );
    for (i, round) in rounds.iter().enumerate() {
        for r in round {
            println!(
                "{:<6} {:<11} {:<12} {:>9.2} {:>9.0} {:>9} {:>7.0}% {}",
                i + 1,
                r.mode.name(),
                label(r),
                r.drain_secs,
                r.events_per_sec,
                fmt_times(ratio_vs_single(round, r)),
                r.cpu.values().sum::<f64>() * 100.0,
                db_columns(r.db.as_ref()),
            );
        }
    }
    println!("median over {} rounds:", rounds.len());
    for m in medians(rounds) {
        let db = m.cpu_secs_per_1k.map_or_else(String::new, |cpu| {
            format!(
                "; per 1,000 events {cpu:.3} PostgreSQL CPU-s, {:.2} MiB WAL",
                m.wal_mib_per_1k.unwrap_or(f64::NAN)
            )
        });
        println!(
            "  {:<11} {:>9.0} events/s  {}{db}",
            m.mode.name(),
            m.events_per_sec,
            m.ratio_vs_single
                .map(|x| format!("{x:.2}x single (median of the rounds' ratios)"))
                .unwrap_or_default(),
        );
    }
}
