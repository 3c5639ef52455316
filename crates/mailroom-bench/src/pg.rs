//! `pg`: intake (group commit on) and drain on three targets in one run —
//! SQLite, PostgreSQL with one mailroom instance, PostgreSQL with two — each
//! on a fresh store, then a summary with the two-instance scaling ratios.
//! With `--ceiling N`, each drain round also runs N instances: where the
//! store and machine stop giving more, so x2 / x1 can be read against the
//! highest ratio reachable here (xN / x1).

use crate::backend::{self, Backend};
use crate::cli::{durability_code, parse_duration, print_json};
use crate::drain::DrainMode;
use crate::drain::{self, DrainResult};
use crate::ingest::{self, ModeResult};
use crate::stats::fmt_times;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The PostgreSQL server (superuser or CREATEDB): fresh databases are
    /// created there for each run and dropped afterwards.
    #[arg(long, value_parser = Backend::parse)]
    store: Backend,
    /// Concurrent intake requests (one keep-alive connection each).
    #[arg(long, default_value_t = 64)]
    ingest_concurrency: usize,
    /// Measured intake window per target.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Intake load before the window, not measured.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Topic mode of the drain.
    #[arg(long, default_value = "single", value_parser = DrainMode::parse)]
    mode: DrainMode,
    /// Skip intake (drain only).
    #[arg(long)]
    no_ingest: bool,
    /// Skip drain (intake only).
    #[arg(long)]
    no_drain: bool,
    /// Skip the SQLite target (PostgreSQL x1, x2 and the ceiling only).
    #[arg(long)]
    no_sqlite: bool,
    /// Drain rounds (each: SQLite, PostgreSQL x1, x2); the summary gives
    /// the medians, and the x2/x1 ratio as the median of each round's.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Also drain with this many instances in each round (3 or more): the
    /// most this store and machine give. xN / x1 is then the highest
    /// x2 / x1 any instance could show here.
    #[arg(long, value_parser = clap::value_parser!(u8).range(3..=16))]
    ceiling: Option<u8>,
    #[command(flatten)]
    drain: drain::SettingsArgs,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Runs `pg`: intake and drains on each target, then the summary.
pub async fn run(a: Args) -> anyhow::Result<ExitCode> {
    let Backend::Postgres { admin_url } = &a.store else {
        anyhow::bail!("pg needs --store postgres://...");
    };
    let version = backend::ping(admin_url).await?;
    let mut targets = vec![
        (Backend::Sqlite, 1),
        (a.store.clone(), 1),
        (a.store.clone(), 2),
    ];
    if a.no_sqlite {
        targets.remove(0);
    }
    if !a.json {
        println!(
            "pg: PostgreSQL {version} at {}; each target on a fresh store",
            mailroom::redact::url(admin_url)
        );
    }
    let (ingests, durable) = if a.no_ingest {
        (Vec::new(), true)
    } else {
        ingest_targets(&a, &targets).await?
    };
    let settings = a.drain.settings();
    let rounds = if a.no_drain {
        Vec::new()
    } else {
        drain_rounds(&a, &settings, &targets).await?
    };
    let summary = Summary {
        ingests,
        rounds,
        ceiling: a.ceiling.map(usize::from),
    };
    if a.json {
        print_json(&summary.json(&version))?;
    } else {
        summary.print(&a, &settings);
    }
    Ok(durability_code(durable))
}

/// Intake on each target, printed as it goes unless `--json`; whether every
/// acknowledged event was stored.
async fn ingest_targets(
    a: &Args,
    targets: &[(Backend, usize)],
) -> anyhow::Result<(Vec<ModeResult>, bool)> {
    let mut ingests = Vec::new();
    let mut durable = true;
    for (b, n) in targets {
        let s = ingest::Settings {
            concurrency: a.ingest_concurrency.max(1),
            duration: a.duration,
            warmup: a.warmup,
            body_size: a.drain.body_size,
            direct: false,
            no_metrics: false,
            backend: b.clone(),
            instances: *n,
        };
        let r = ingest::measure(&s, Some(true)).await?;
        if !a.json {
            ingest::print_table(&s, &r);
            println!();
        }
        durable &= r.iter().all(ModeResult::durable);
        ingests.extend(r);
    }
    Ok((ingests, durable))
}

/// `--rounds` drain rounds over every target (and the ceiling's N
/// instances), each printed as it ends unless `--json`.
async fn drain_rounds(
    a: &Args,
    settings: &drain::Settings,
    targets: &[(Backend, usize)],
) -> anyhow::Result<Vec<Vec<DrainResult>>> {
    let mut rounds = Vec::new();
    for round in 0..a.rounds.max(1) {
        let mut drains = Vec::new();
        for (b, n) in targets {
            drains.push(drain::measure(settings, a.mode, b, *n).await?);
        }
        if let Some(n) = a.ceiling {
            drains.push(drain::measure(settings, a.mode, &a.store, n.into()).await?);
        }
        if !a.json {
            if a.rounds > 1 {
                println!("round {} of {}:", round + 1, a.rounds);
            }
            drain::print_table(settings, &drains);
            println!();
        }
        rounds.push(drains);
    }
    Ok(rounds)
}

/// Events per second of `store` with `n` instances in one drain round.
fn of_round(round: &[DrainResult], store: &str, n: usize) -> Option<f64> {
    result_of(round, store, n).map(|r| r.events_per_sec)
}

fn result_of<'a>(round: &'a [DrainResult], store: &str, n: usize) -> Option<&'a DrainResult> {
    round.iter().find(|r| r.store == store && r.instances == n)
}

fn ratio(x: Option<f64>, y: Option<f64>) -> Option<f64> {
    match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    }
}

fn rate(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn joined(scales: &[f64]) -> String {
    let each: Vec<String> = scales.iter().map(|x| fmt_times(Some(*x))).collect();
    each.join(" ")
}

/// What one `pg` run measured, and the figures the summary derives.
struct Summary {
    ingests: Vec<ModeResult>,
    rounds: Vec<Vec<DrainResult>>,
    ceiling: Option<usize>,
}

impl Summary {
    fn ingest_of(&self, store: &str, n: usize) -> Option<f64> {
        self.ingests
            .iter()
            .find(|r| r.store == store && r.instances == n)
            .map(|r| r.acks_per_sec)
    }

    /// The median over rounds of a target's drain rate.
    fn drain_of(&self, store: &str, n: usize) -> Option<f64> {
        drain::median(
            self.rounds
                .iter()
                .filter_map(|r| of_round(r, store, n))
                .collect(),
        )
    }

    /// The median over rounds of a PostgreSQL target's database work:
    /// events per PostgreSQL CPU-second, and CPU-seconds per 1,000 events.
    fn work_of(&self, n: usize) -> (Option<f64>, Option<f64>) {
        let of = |f: fn(&crate::pgwork::DbWork) -> f64| {
            drain::median(
                self.rounds
                    .iter()
                    .filter_map(|r| result_of(r, "postgres", n)?.db.as_ref().map(f))
                    .collect(),
            )
        };
        (of(|d| d.events_per_cpu_sec), of(|d| d.cpu_secs_per_1k))
    }

    /// Each round's own PostgreSQL xN / x1 drain ratio (both measured
    /// within minutes of each other); the summary gives their median.
    fn round_scales(&self, n: usize) -> Vec<f64> {
        self.rounds
            .iter()
            .filter_map(|r| ratio(of_round(r, "postgres", n), of_round(r, "postgres", 1)))
            .collect()
    }

    fn ceiling_scales(&self) -> Vec<f64> {
        self.ceiling
            .map(|n| self.round_scales(n))
            .unwrap_or_default()
    }

    fn scale_ingest(&self) -> Option<f64> {
        ratio(self.ingest_of("postgres", 2), self.ingest_of("postgres", 1))
    }

    fn json(&self, version: &str) -> serde_json::Value {
        serde_json::json!({
            "bench": "pg",
            "server_version": version,
            "ingest": self.ingests,
            "drain": self.rounds,
            "drain_x2_over_x1_per_round": self.round_scales(2),
            "ratio_postgres_x2_over_x1": {
                "ingest": self.scale_ingest(),
                "drain": drain::median(self.round_scales(2)),
            },
            "ceiling_instances": self.ceiling,
            "drain_xn_over_x1_per_round": self.ceiling_scales(),
            "ratio_postgres_xn_over_x1": drain::median(self.ceiling_scales()),
            "events_per_pg_cpu_sec": self.pg_targets().iter().map(|&n| {
                serde_json::json!({ "instances": n, "median": self.work_of(n).0 })
            }).collect::<Vec<_>>(),
        })
    }

    fn print(&self, a: &Args, settings: &drain::Settings) {
        let medians = if self.rounds.len() > 1 {
            format!(
                "; drain figures are medians of {} rounds, x2/x1 per round: {}",
                self.rounds.len(),
                joined(&self.round_scales(2))
            )
        } else {
            String::new()
        };
        println!(
            "summary: intake concurrency {} (group commit), drain {} events ({} topic){medians}",
            a.ingest_concurrency,
            settings.events,
            a.mode.name(),
        );
        self.print_rows();
        if let Some(n) = self.ceiling {
            let scales = self.ceiling_scales();
            println!(
                "ceiling: x{n}/x1 per round {}; one instance already drains {} of what {n} do. \
                 If {n} saturate this store and machine (a larger --ceiling adds nothing), \
                 x2/x1 cannot exceed x{n}/x1 here",
                joined(&scales),
                drain::median(scales).map_or_else(|| "-".into(), |c| format!("{:.0}%", 100.0 / c)),
            );
        }
    }

    /// The PostgreSQL instance counts drained: 1, 2 and the ceiling's.
    fn pg_targets(&self) -> Vec<usize> {
        let mut out = vec![1, 2];
        out.extend(self.ceiling);
        out
    }

    /// The table: each target's intake and drain rates and, on PostgreSQL,
    /// the database's work per drained event; then the ratios.
    fn print_rows(&self) {
        let work = |n: usize| {
            let (per_cpu, cpu_1k) = self.work_of(n);
            (
                rate(per_cpu),
                cpu_1k.map_or_else(|| "-".into(), |c| format!("{c:.3}")),
            )
        };
        table_row(
            "target",
            "intake acks/s".into(),
            "drain events/s".into(),
            ("events/pg CPU-s".into(), "pg CPU-s/1k".into()),
        );
        // Without the SQLite target (`--no-sqlite`), its rows are left out.
        let sqlite = self.ingest_of("sqlite", 1).or(self.drain_of("sqlite", 1));
        if sqlite.is_some() {
            table_row(
                "sqlite x1",
                rate(self.ingest_of("sqlite", 1)),
                rate(self.drain_of("sqlite", 1)),
                none(),
            );
        }
        for n in self.pg_targets() {
            table_row(
                &format!("postgres x{n}"),
                rate(self.ingest_of("postgres", n)),
                rate(self.drain_of("postgres", n)),
                work(n),
            );
        }
        self.print_ratio_rows(sqlite.is_some());
    }

    /// PostgreSQL xN / x1 (rates, and events per PostgreSQL CPU-second),
    /// and PostgreSQL / SQLite.
    fn print_ratio_rows(&self, sqlite: bool) {
        let efficiency = |n: usize| {
            let ratio = ratio(self.work_of(n).0, self.work_of(1).0);
            (fmt_times(ratio), "-".into())
        };
        table_row(
            "postgres x2/x1",
            fmt_times(self.scale_ingest()),
            fmt_times(drain::median(self.round_scales(2))),
            efficiency(2),
        );
        if let Some(n) = self.ceiling {
            table_row(
                &format!("postgres x{n}/x1"),
                "-".into(),
                fmt_times(drain::median(self.ceiling_scales())),
                efficiency(n),
            );
        }
        if sqlite {
            table_row(
                "postgres/sqlite",
                fmt_times(ratio(
                    self.ingest_of("postgres", 1),
                    self.ingest_of("sqlite", 1),
                )),
                fmt_times(ratio(
                    self.drain_of("postgres", 1),
                    self.drain_of("sqlite", 1),
                )),
                none(),
            );
        }
    }
}

/// One line of the summary table.
fn table_row(target: &str, ingest: String, drain: String, work: (String, String)) {
    println!(
        "{target:<14} {ingest:>14} {drain:>16} {:>15} {:>14}",
        work.0, work.1
    );
}

/// The database-work cells of a target that has none.
fn none() -> (String, String) {
    ("-".to_string(), "-".to_string())
}
