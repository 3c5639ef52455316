//! The human-readable report of an ingest run.

use super::{ModeResult, Settings, ratio};
use crate::procfs;
use crate::stats::{fmt_cpu, fmt_ms};

/// The human-readable report.
pub fn print_table(s: &Settings, results: &[ModeResult]) {
    println!(
        "ingest: store {} x{}, {} over {}, concurrency {}, body {} B, window {:.0} s after {:.0} s warm-up",
        s.backend.name(),
        s.instances.max(1),
        if s.direct {
            "engine.ingest_webhook in-process (no HTTP)"
        } else {
            "POST /webhooks/bench, HTTP/1.1 keep-alive"
        },
        if s.no_metrics {
            "no metrics recorder"
        } else {
            "Prometheus recorder on"
        },
        s.concurrency,
        s.body_size,
        s.duration.as_secs_f64(),
        s.warmup.as_secs_f64(),
    );
    println!(
        "{:<19} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>6} {:>9}",
        "mode",
        "acked",
        "acks/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "peak RSS",
        "HWM MiB",
        "commits",
        "acks/c",
        "stored"
    );
    for r in results {
        println!(
            "{:<19} {:>9} {:>9.0} {:>8} {:>8} {:>8} {:>9.1} {:>8.1} {:>8} {:>6.1} {:>9}",
            r.mode,
            r.acked,
            r.acks_per_sec,
            fmt_ms(r.p50_ms),
            fmt_ms(r.p99_ms),
            fmt_ms(r.max_ms),
            r.peak_rss_mib,
            r.hwm_mib,
            r.commits,
            r.acked_total as f64 / r.commits.max(1) as f64,
            r.stored,
        );
    }
    for r in results {
        print_cpu(s, r);
        print_details(r);
    }
    if let Some(ratio) = ratio(results) {
        println!("ratio group-commit / commit-per-request: {ratio:.2}x");
    }
}

/// Where a mode's CPU went: mailroom (the whole process with `--direct`),
/// the load generator, PostgreSQL.
pub(super) fn print_cpu(s: &Settings, r: &ModeResult) {
    if s.direct {
        println!(
            "  cpu {:<19} whole process {}",
            r.mode,
            fmt_cpu(&r.mailroom_cpu)
        );
    } else {
        println!(
            "  cpu {:<19} mailroom {}; load generator {:.0}%",
            r.mode,
            fmt_cpu(&r.mailroom_cpu),
            r.loadgen_cpu * 100.0
        );
    }
    if !r.pg_cpu.is_empty() {
        println!("  cpu {:<19} postgres {}", r.mode, fmt_cpu(&r.pg_cpu));
    }
}

/// A mode's commits, errors, disk writes and durability, a line each.
pub(super) fn print_details(r: &ModeResult) {
    if let Some(c) = r.server_commits {
        println!(
            "  {}: postgres committed {c} transactions in the run ({:.1} acks each; insert commits of mailroom's writers {})",
            r.mode,
            r.acked_total as f64 / c.max(1) as f64,
            r.commits,
        );
    }
    if r.duplicates > 0 || !r.errors.is_empty() {
        println!(
            "  {}: duplicates {}, errors {:?}",
            r.mode, r.duplicates, r.errors
        );
    }
    println!(
        "  {}: {:.1} KiB written to disk per commit ({:.1} MiB in all; {:.1} MiB passed to write calls)",
        r.mode,
        r.write_bytes as f64 / 1024.0 / r.commits.max(1) as f64,
        procfs::mib(r.write_bytes),
        procfs::mib(r.wchar),
    );
    println!(
        "  {}: durability {} ({} acked in total, {} stored)",
        r.mode,
        if r.durable() { "OK" } else { "MISMATCH" },
        r.acked_total,
        r.stored
    );
}
