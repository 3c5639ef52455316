//! `pg`: intake (group commit on) and drain on three targets in one run —
//! SQLite, PostgreSQL with one mailroom instance, PostgreSQL with two — each
//! on a fresh store, then a summary with the two-instance scaling ratios.

use crate::backend::{self, Backend};
use crate::{PgArgs, drain, ingest};
use anyhow::Context;
use std::process::ExitCode;

pub async fn run(a: PgArgs) -> anyhow::Result<ExitCode> {
    let Backend::Postgres { admin_url } = &a.store else {
        anyhow::bail!("pg needs --store postgres://...");
    };
    let version = backend::ping(admin_url).await?;
    let targets = [
        (Backend::Sqlite, 1),
        (a.store.clone(), 1),
        (a.store.clone(), 2),
    ];
    if !a.json {
        println!(
            "pg: PostgreSQL {version} at {}; each target on a fresh store",
            backend::redact(admin_url)
        );
    }

    let mut ingests = Vec::new();
    let mut durable = true;
    if !a.no_ingest {
        for (b, n) in &targets {
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
            let r = ingest::run(&s, Some(true)).await?;
            if !a.json {
                ingest::print_table(&s, &r);
                println!();
            }
            durable &= r.iter().all(ingest::ModeResult::durable);
            ingests.extend(r);
        }
    }

    let settings = a.drain.settings();
    let mut drains = Vec::new();
    if !a.no_drain {
        for (b, n) in &targets {
            drains.push(drain::run(&settings, a.mode, b, *n).await?);
        }
        if !a.json {
            drain::print_table(&settings, &drains);
            println!();
        }
    }

    let ingest_of = |store: &str, n: usize| {
        ingests
            .iter()
            .find(|r| r.store == store && r.instances == n)
            .map(|r| r.acks_per_sec)
    };
    let drain_of = |store: &str, n: usize| {
        drains
            .iter()
            .find(|r| r.store == store && r.instances == n)
            .map(|r| r.events_per_sec)
    };
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    };
    let rows = [("sqlite", 1), ("postgres", 1), ("postgres", 2)];
    let scale_ingest = ratio(ingest_of("postgres", 2), ingest_of("postgres", 1));
    let scale_drain = ratio(drain_of("postgres", 2), drain_of("postgres", 1));
    if a.json {
        let out = serde_json::json!({
            "bench": "pg",
            "server_version": version,
            "ingest": ingests,
            "drain": drains,
            "ratio_postgres_x2_over_x1": {"ingest": scale_ingest, "drain": scale_drain},
        });
        println!("{}", serde_json::to_string(&out).context("encoding JSON")?);
    } else {
        let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.0}"));
        let x = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}x"));
        println!(
            "summary: intake concurrency {} (group commit), drain {} events ({} topic)",
            a.ingest_concurrency,
            settings.events,
            a.mode.name()
        );
        println!(
            "{:<14} {:>14} {:>16}",
            "target", "intake acks/s", "drain events/s"
        );
        for (store, n) in rows {
            println!(
                "{:<14} {:>14} {:>16}",
                format!("{store} x{n}"),
                f(ingest_of(store, n)),
                f(drain_of(store, n)),
            );
        }
        println!(
            "{:<14} {:>14} {:>16}",
            "postgres x2/x1",
            x(scale_ingest),
            x(scale_drain)
        );
        println!(
            "{:<14} {:>14} {:>16}",
            "postgres/sqlite",
            x(ratio(ingest_of("postgres", 1), ingest_of("sqlite", 1))),
            x(ratio(drain_of("postgres", 1), drain_of("sqlite", 1))),
        );
    }
    if durable {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("mailroom-bench: stored events do not match the acknowledged ones");
        Ok(ExitCode::from(2))
    }
}
