//! Database work per drained event on PostgreSQL: the server's CPU time
//! (from `/proc`, sampled while the window runs so that processes which
//! exit inside it — autovacuum workers, closed connections — still count)
//! and the WAL it wrote (`pg_current_wal_lsn()`, plus `pg_stat_wal`'s
//! records and full-page images where the server has that view,
//! PostgreSQL 14+). Apart from this benchmark's own backends these are
//! server-wide counters: whatever else runs on the server meanwhile
//! inflates them.

use crate::backend::{Fresh, postgres_processes};
use sqlx::{Connection, PgConnection};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How often [`CpuSampler`] reads `/proc` (a process that exits between two
/// readings loses at most this much of its CPU time).
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// The kind [`postgres_processes`] gives this benchmark's client backends.
const BACKENDS: &str = "pg backends";

/// CPU time per PostgreSQL process between [`CpuSampler::start`] and
/// [`CpuSampler::finish`].
pub struct CpuSampler {
    stop: CancellationToken,
    task: JoinHandle<Tracker>,
}

/// Per process: its kind when last seen (a new backend gets its title,
/// and so its database, a moment after it starts), its CPU time when first
/// seen in the window (zero for processes started inside it) and when last
/// seen.
#[derive(Default)]
struct Tracker {
    seen: HashMap<u32, (Option<String>, Duration, Duration)>,
}

impl Tracker {
    fn scan(&mut self, first: bool) {
        for p in postgres_processes() {
            let start = if first { p.cpu } else { Duration::ZERO };
            let entry = self.seen.entry(p.pid).or_insert((None, start, p.cpu));
            entry.0 = p.kind;
            entry.2 = p.cpu;
        }
    }

    fn used_by_kind(&self) -> BTreeMap<String, Duration> {
        let mut out = BTreeMap::new();
        for (kind, first, last) in self.seen.values() {
            if let Some(kind) = kind {
                *out.entry(kind.clone()).or_insert(Duration::ZERO) += last.saturating_sub(*first);
            }
        }
        out
    }
}

impl CpuSampler {
    /// Reads every PostgreSQL process now, then every [`SAMPLE_EVERY`].
    pub fn start() -> Self {
        let mut tracker = Tracker::default();
        tracker.scan(true);
        let stop = CancellationToken::new();
        let cancelled = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => tracker.scan(false),
                    () = cancelled.cancelled() => return tracker,
                }
            }
        });
        Self { stop, task }
    }

    /// Reads every process a last time; CPU time used in the window by kind.
    pub async fn finish(self) -> BTreeMap<String, Duration> {
        self.stop.cancel();
        match self.task.await {
            Ok(mut tracker) => {
                tracker.scan(false);
                tracker.used_by_kind()
            }
            Err(_) => BTreeMap::new(),
        }
    }
}

/// The server's WAL position and statistics at one moment.
#[derive(Debug, Clone, Copy)]
pub struct WalReading {
    /// `pg_current_wal_lsn()` as a byte offset.
    lsn: u64,
    /// `pg_stat_wal` (records, full-page images), where the server has it.
    stat: Option<(u64, u64)>,
}

/// Reads the WAL counters through a short-lived connection to `fresh`'s
/// database (`None` on SQLite or when the server cannot be read).
pub async fn read_wal(fresh: &Fresh) -> Option<WalReading> {
    if !fresh.is_postgres() {
        return None;
    }
    let mut c = PgConnection::connect(&fresh.url).await.ok()?;
    let lsn: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
        .fetch_one(&mut c)
        .await
        .ok()?;
    let stat: Option<(i64, i64)> = sqlx::query_as("SELECT wal_records, wal_fpi FROM pg_stat_wal")
        .fetch_one(&mut c)
        .await
        .ok();
    let _ = c.close().await;
    Some(WalReading {
        lsn: u64::try_from(lsn).unwrap_or(0),
        stat: stat.map(|(r, f)| (u64::try_from(r).unwrap_or(0), u64::try_from(f).unwrap_or(0))),
    })
}

/// What PostgreSQL did for one drain of `events` events, and the same per
/// event.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DbWork {
    pub events: u64,
    /// CPU-seconds of PostgreSQL's processes: this benchmark's backends and
    /// autovacuum workers, and the server's shared processes (WAL writer,
    /// checkpointer, ...).
    pub cpu_secs: f64,
    /// CPU-seconds of this benchmark's client backends alone.
    pub backend_cpu_secs: f64,
    /// WAL written, from the difference of `pg_current_wal_lsn()`.
    pub wal_bytes: u64,
    /// From `pg_stat_wal` (PostgreSQL 14+).
    pub wal_records: Option<u64>,
    pub wal_fpi: Option<u64>,
    pub cpu_secs_per_1k: f64,
    pub wal_bytes_per_1k: f64,
    pub wal_records_per_event: Option<f64>,
    pub wal_fpi_per_event: Option<f64>,
    /// Events drained per PostgreSQL CPU-second: a figure that does not
    /// depend on how many cores the machine has.
    pub events_per_cpu_sec: f64,
}

impl DbWork {
    /// From the CPU used by kind and the WAL readings around the drain.
    pub fn new(
        events: u64,
        cpu: &BTreeMap<String, Duration>,
        before: WalReading,
        after: WalReading,
    ) -> Self {
        let cpu_secs: f64 = cpu.values().map(Duration::as_secs_f64).sum();
        let backend_cpu_secs = cpu.get(BACKENDS).map_or(0.0, Duration::as_secs_f64);
        let wal_bytes = after.lsn.saturating_sub(before.lsn);
        let (wal_records, wal_fpi) = match (before.stat, after.stat) {
            (Some(b), Some(a)) => (Some(a.0.saturating_sub(b.0)), Some(a.1.saturating_sub(b.1))),
            _ => (None, None),
        };
        let n = events.max(1) as f64;
        Self {
            events,
            cpu_secs,
            backend_cpu_secs,
            wal_bytes,
            wal_records,
            wal_fpi,
            cpu_secs_per_1k: cpu_secs * 1000.0 / n,
            wal_bytes_per_1k: wal_bytes as f64 * 1000.0 / n,
            wal_records_per_event: wal_records.map(|r| r as f64 / n),
            wal_fpi_per_event: wal_fpi.map(|f| f as f64 / n),
            events_per_cpu_sec: if cpu_secs > 0.0 { n / cpu_secs } else { 0.0 },
        }
    }

    /// WAL MiB per 1,000 events.
    pub fn wal_mib_per_1k(&self) -> f64 {
        self.wal_bytes_per_1k / (1024.0 * 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-event figures are the window's totals over the events drained,
    /// and a server without `pg_stat_wal` yields no record counts.
    #[test]
    fn per_event_figures() {
        let cpu = BTreeMap::from([
            (BACKENDS.to_string(), Duration::from_secs(3)),
            ("pg walwriter".to_string(), Duration::from_secs(1)),
        ]);
        let before = WalReading {
            lsn: 1_000,
            stat: Some((10, 1)),
        };
        let after = WalReading {
            lsn: 1_000 + 2_000_000,
            stat: Some((10 + 23_000, 1 + 500)),
        };
        let w = DbWork::new(1_000, &cpu, before, after);
        assert_eq!(w.cpu_secs_per_1k, 4.0);
        assert_eq!(w.backend_cpu_secs, 3.0);
        assert_eq!(w.wal_bytes_per_1k, 2_000_000.0);
        assert_eq!(w.wal_records_per_event, Some(23.0));
        assert_eq!(w.wal_fpi_per_event, Some(0.5));
        assert_eq!(w.events_per_cpu_sec, 250.0);
        let no_stat = WalReading { lsn: 5, stat: None };
        assert_eq!(DbWork::new(10, &cpu, no_stat, after).wal_records, None);
    }
}
