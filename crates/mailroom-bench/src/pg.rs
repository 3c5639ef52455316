//! `pg`: intake (group commit on) and drain on three targets in one run —
//! SQLite, PostgreSQL with one mailroom instance, PostgreSQL with two — each
//! on a fresh store, then a summary with the two-instance scaling ratios.
//! With `--ceiling N`, each drain round also runs N instances: where the
//! store and machine stop giving more, so x2 / x1 can be read against the
//! highest ratio reachable here (xN / x1).

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
    let ceiling = a.ceiling.map(usize::from);
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
    let mut rounds: Vec<Vec<drain::DrainResult>> = Vec::new();
    if !a.no_drain {
        for round in 0..a.rounds.max(1) {
            let mut drains = Vec::new();
            for (b, n) in &targets {
                drains.push(drain::run(&settings, a.mode, b, *n).await?);
            }
            if let Some(n) = ceiling {
                drains.push(drain::run(&settings, a.mode, &a.store, n).await?);
            }
            if !a.json {
                if a.rounds > 1 {
                    println!("round {} of {}:", round + 1, a.rounds);
                }
                drain::print_table(&settings, &drains);
                println!();
            }
            rounds.push(drains);
        }
    }
    // Per target, the median over rounds; x2/x1 is the median of each
    // round's own ratio (both measured within minutes of each other).
    let of_round = |round: &[drain::DrainResult], store: &str, n: usize| {
        round
            .iter()
            .find(|r| r.store == store && r.instances == n)
            .map(|r| r.events_per_sec)
    };
    let median_of = |f: &dyn Fn(&[drain::DrainResult]) -> Option<f64>| {
        drain::median(rounds.iter().filter_map(|r| f(r)).collect())
    };

    let ingest_of = |store: &str, n: usize| {
        ingests
            .iter()
            .find(|r| r.store == store && r.instances == n)
            .map(|r| r.acks_per_sec)
    };
    let drain_of = |store: &str, n: usize| median_of(&|r| of_round(r, store, n));
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    };
    let mut rows = vec![("sqlite", 1), ("postgres", 1), ("postgres", 2)];
    rows.extend(ceiling.map(|n| ("postgres", n)));
    let scale_ingest = ratio(ingest_of("postgres", 2), ingest_of("postgres", 1));
    let round_scales: Vec<f64> = rounds
        .iter()
        .filter_map(|r| ratio(of_round(r, "postgres", 2), of_round(r, "postgres", 1)))
        .collect();
    let scale_drain = drain::median(round_scales.clone());
    let ceiling_scales: Vec<f64> = ceiling
        .map(|n| {
            rounds
                .iter()
                .filter_map(|r| ratio(of_round(r, "postgres", n), of_round(r, "postgres", 1)))
                .collect()
        })
        .unwrap_or_default();
    let scale_ceiling = drain::median(ceiling_scales.clone());
    if a.json {
        let out = serde_json::json!({
            "bench": "pg",
            "server_version": version,
            "ingest": ingests,
            "drain": rounds,
            "drain_x2_over_x1_per_round": round_scales,
            "ratio_postgres_x2_over_x1": {"ingest": scale_ingest, "drain": scale_drain},
            "ceiling_instances": ceiling,
            "drain_xn_over_x1_per_round": ceiling_scales,
            "ratio_postgres_xn_over_x1": scale_ceiling,
        });
        println!("{}", serde_json::to_string(&out).context("encoding JSON")?);
    } else {
        let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.0}"));
        let x = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}x"));
        println!(
            "summary: intake concurrency {} (group commit), drain {} events ({} topic){}",
            a.ingest_concurrency,
            settings.events,
            a.mode.name(),
            if rounds.len() > 1 {
                format!(
                    "; drain figures are medians of {} rounds, x2/x1 per round: {}",
                    rounds.len(),
                    round_scales
                        .iter()
                        .map(|x| format!("{x:.2}x"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            } else {
                String::new()
            }
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
        if let Some(n) = ceiling {
            println!(
                "{:<14} {:>14} {:>16}",
                format!("postgres x{n}/x1"),
                "-",
                x(scale_ceiling)
            );
        }
        println!(
            "{:<14} {:>14} {:>16}",
            "postgres/sqlite",
            x(ratio(ingest_of("postgres", 1), ingest_of("sqlite", 1))),
            x(ratio(drain_of("postgres", 1), drain_of("sqlite", 1))),
        );
        if let Some(n) = ceiling {
            println!(
                "ceiling: x{n}/x1 per round {}; one instance already drains {} of what {n} do. \
                 If {n} saturate this store and machine (a larger --ceiling adds nothing), \
                 x2/x1 cannot exceed x{n}/x1 here",
                ceiling_scales
                    .iter()
                    .map(|x| format!("{x:.2}x"))
                    .collect::<Vec<_>>()
                    .join(" "),
                scale_ceiling.map_or_else(|| "-".into(), |c| format!("{:.0}%", 100.0 / c)),
            );
        }
    }
    if durable {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("mailroom-bench: stored events do not match the acknowledged ones");
        Ok(ExitCode::from(2))
    }
}
