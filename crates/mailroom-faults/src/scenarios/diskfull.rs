//! (5) Disk full: the SQLite store lives on a small tmpfs (`mount -t tmpfs
//! -o size=...`, so this scenario needs root) that a ballast file fills up
//! under load. Intake must answer 503 (never 200 for an event it could not
//! write), the file must pass `PRAGMA integrity_check`, and once the ballast
//! is removed intake must resume by itself with every acked event intact
//! and processed.

use super::{World, recovery};
use crate::Report;
use crate::backend::Backend;
use crate::check::Expect;
use crate::child::Serve;
use crate::load::{Load, Running, targets};
use crate::record::Record;
use crate::store;
use anyhow::{Context, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Size of the filesystem the store lives on.
const FS_SIZE: &str = "64m";
/// Room the ballast leaves: the load fills it within a second or two.
const HEADROOM: u64 = 6 << 20;

/// Root, as `mount` needs.
pub fn applies(b: &Backend) -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    matches!(b, Backend::Sqlite) && root
}

fn config(receiver: &str) -> String {
    format!(
        "[[source]]\nname = \"fill\"\ntopic = \"fill\"\nid = {{ json = \"/id\" }}\n\n[[topic]]\nname = \"fill\"\nconcurrency = 16\ntimeout = \"2s\"\nretry = {{ max_attempts = 50, base = \"100ms\", max_delay = \"1s\" }}\nhandler = {{ http = {{ url = \"{receiver}\" }} }}\n"
    )
}

/// A tmpfs mounted for the scenario; unmounted on drop.
struct Mount(PathBuf);

impl Mount {
    fn new(at: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(at)?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={FS_SIZE}"), "tmpfs"])
            .arg(at)
            .status()
            .context("running mount")?;
        if !ok.success() {
            bail!("mount -t tmpfs failed ({ok}): this scenario needs root");
        }
        Ok(Self(at.to_owned()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Writes zeros into `path` until the filesystem is full, then gives back
/// `HEADROOM`; the ballast's size.
fn fill(path: &Path) -> anyhow::Result<u64> {
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0u8; 64 * 1024];
    let mut n = 0;
    while f.write_all(&chunk).is_ok() {
        n += chunk.len() as u64;
    }
    let size = n.saturating_sub(HEADROOM);
    f.set_len(size)?;
    Ok(size)
}

pub async fn run(quick: bool, backend: Backend) -> anyhow::Result<Report> {
    let full_for = if quick {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(5)
    };
    let mut world = World::new(&backend, Duration::from_millis(2), config).await?;
    let mnt = world.dir.path().join("mnt");
    let mount = Mount::new(&mnt)?;
    world.fresh.url = format!("sqlite://{}", mnt.join("mailroom.db").display());
    let ballast = mnt.join("ballast");
    let filled = fill(&ballast).context("writing the ballast")?;
    let mut serve = world.serve().await?;
    let targets = targets(vec![serve.base.clone()]);
    let load = Load {
        source: "fill",
        clients: 16,
        keys_per_client: 1,
        per_client: None,
        poison: None,
        pad: 2000,
        pause: Duration::ZERO,
    };
    let running = load.start(&targets, &world.rec);
    let full_at = first_503(&world).await?;
    tokio::time::sleep(full_for).await;
    let freed_at = free(&world, &ballast, running).await?;
    // Completions that failed on the full disk are run again after their
    // lease: the at-least-once allowance, from the first failed write
    // (100 ms before its log line arrived) until the space came back.
    if let Some(first) = serve.first_problem("disk is full") {
        let from = world
            .rec
            .at(first)
            .saturating_sub(Duration::from_millis(100));
        world.rec.disrupted_between(from, freed_at);
    }
    let drained =
        store::settle(&world.fresh.url, store::all_final, Duration::from_secs(60)).await?;
    serve.signal_term()?;
    let exit = serve.exit_within(Duration::from_secs(30)).await?;
    let integrity = store::sqlite_integrity(&world.fresh.url)?;
    let (record, verdict) = world.check(&Expect::default()).await?;
    let mut report = Report::new("diskfull", backend.name(), &record, verdict);
    let span = Full {
        at: full_at,
        freed: freed_at,
    };
    report.failures.extend(judge(&record, &span, &integrity));
    if !exit.success() {
        report.failures.push(format!("exit after SIGTERM: {exit}"));
    }
    if drained.is_none() {
        report
            .failures
            .push("events still open 60 s after space was freed".into());
    }
    report.recovery = recovery(&record, &[freed_at]);
    report
        .notes
        .push(describe(&record, &span, filled, &integrity));
    if !report.passed() {
        report.notes.extend(post_mortem(&world, &serve).await?);
    }
    drop(mount);
    world.cleanup().await?;
    Ok(report)
}

/// When the disk was full: from the first 503 until the ballast was removed.
struct Full {
    at: Duration,
    freed: Duration,
}

/// Waits (up to 30 s into the scenario) for the first 503: the disk is full.
async fn first_503(world: &World) -> anyhow::Result<Duration> {
    loop {
        if let Some((_, at)) = world.rec.lock().refusals.iter().find(|(s, _)| *s == 503) {
            return Ok(*at);
        }
        if world.rec.now() > Duration::from_secs(30) {
            bail!(
                "no 503 within 30 s: the load did not fill {} MiB",
                HEADROOM >> 20
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Removes the ballast, waits for intake to resume (up to 30 s), then
/// stops the load soon after: it writes megabytes a second and would fill
/// the freed space again before the backlog drains. When space was freed.
async fn free(world: &World, ballast: &Path, running: Running) -> anyhow::Result<Duration> {
    std::fs::remove_file(ballast).context("removing the ballast")?;
    let freed_at = world.rec.now();
    let limit = freed_at + Duration::from_secs(30);
    while world.rec.now() < limit && !world.rec.lock().acks.iter().any(|a| a.at > freed_at) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    Ok(freed_at)
}

/// 503s while full and only 200/503 answers, an intact file, intake back
/// after space was freed.
fn judge(record: &Record, full: &Full, integrity: &str) -> Vec<String> {
    let mut failures = Vec::new();
    if refused_while_full(record, full) == 0 {
        failures.push("no 503 while the disk was full: the attack did not bite".into());
    }
    let other = record.refusals.iter().filter(|(s, _)| *s != 503).count();
    if other > 0 {
        failures.push(format!("{other} answers other than 200/503"));
    }
    if integrity != "ok" {
        failures.push(format!("integrity_check: {integrity}"));
    }
    if recovery(record, &[full.freed]).is_none() {
        failures.push("intake did not resume after space was freed".into());
    }
    failures
}

fn refused_while_full(record: &Record, full: &Full) -> usize {
    record
        .refusals
        .iter()
        .filter(|(s, at)| *s == 503 && *at >= full.at && *at < full.freed)
        .count()
}

fn describe(record: &Record, full: &Full, filled: u64, integrity: &str) -> String {
    let acks_full = record
        .acks
        .iter()
        .filter(|a| a.at > full.at + Duration::from_millis(500) && a.at < full.freed)
        .count();
    format!(
        "tmpfs {FS_SIZE}, ballast {} MiB leaving {} MiB: full after {:.1}s; {} answers 503 while full ({acks_full} acks then), integrity_check {integrity}",
        filled >> 20,
        HEADROOM >> 20,
        full.at.as_secs_f64(),
        refused_while_full(record, full)
    )
}

/// The statuses at the end and mailroom's WARN/ERROR lines.
async fn post_mortem(world: &World, serve: &Serve) -> anyhow::Result<Vec<String>> {
    let rows = store::rows(&world.fresh.url).await?;
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in &rows {
        *by.entry(r.status.as_str()).or_default() += 1;
    }
    let mut notes = vec![format!("statuses at the end: {by:?}")];
    notes.extend(serve.problem_summary().into_iter().take(20));
    Ok(notes)
}
