//! The well-behaved side of `hostile`: a client sending signed webhooks
//! throughout the attack, and the server's own view of its writes.
//!
//! The judged client runs on a thread and a runtime of its own. On the
//! attackers' runtime its requests would queue behind thousands of attack
//! tasks before being sent and after being answered, and its latency would
//! be this process's scheduling, not the server's answer: a real client is
//! another process. A second one, on the attackers' runtime as the only
//! client was before, is reported beside it to show that difference.

use super::attacks::{SECRET, github_signature};
use crate::record::{Ack, Recorder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// (when sent, how long it took, status or 0 for no answer).
pub type Calls = Vec<(Duration, Duration, u16)>;

/// `clients` loops sending signed webhooks, each answer's latency kept;
/// every 200 is recorded as an ack for the checker.
pub struct WellBehaved {
    stop: Arc<AtomicBool>,
    runs: Runs,
    calls: Arc<Mutex<Calls>>,
}

/// Where the loops run.
enum Runs {
    Thread(Option<std::thread::JoinHandle<()>>),
    Shared(Option<tokio::task::JoinHandle<()>>),
}

impl WellBehaved {
    /// On a thread and a runtime of its own; its event ids are `good-*`.
    pub fn start(base: &str, rec: &Recorder, clients: usize) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, calls) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let run = clients_loop(base, "good", clients, rec, &stop, &calls);
        let thread = std::thread::Builder::new()
            .name("well-behaved".into())
            .spawn(move || runtime.block_on(run))?;
        let runs = Runs::Thread(Some(thread));
        Ok(Self { stop, runs, calls })
    }

    /// On this (the attackers') runtime; its event ids are `shared-*`.
    pub fn start_shared(base: &str, rec: &Recorder, clients: usize) -> Self {
        let (stop, calls) = (Arc::new(AtomicBool::new(false)), Arc::default());
        let run = clients_loop(base, "shared", clients, rec, &stop, &calls);
        let runs = Runs::Shared(Some(tokio::spawn(run)));
        Self { stop, runs, calls }
    }

    /// Stops the loops (each ends after its request in flight) and returns
    /// every call.
    pub async fn stop(mut self) -> Calls {
        self.stop.store(true, Ordering::SeqCst);
        match &mut self.runs {
            Runs::Thread(t) => {
                if let Some(t) = t.take() {
                    let _ = tokio::task::spawn_blocking(move || t.join()).await;
                }
            }
            Runs::Shared(t) => {
                if let Some(t) = t.take() {
                    let _ = t.await;
                }
            }
        }
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for WellBehaved {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The client loops, with their own connection pool, posting events
/// `{prefix}-{client}-{i}`.
fn clients_loop(
    base: &str,
    prefix: &'static str,
    clients: usize,
    rec: &Recorder,
    stop: &Arc<AtomicBool>,
    calls: &Arc<Mutex<Calls>>,
) -> impl Future<Output = ()> + Send + 'static {
    let (url, rec, stop, calls) = (
        format!("{base}/webhooks/signed"),
        rec.clone(),
        stop.clone(),
        calls.clone(),
    );
    async move { run_clients(url, prefix, clients, rec, stop, calls).await }
}

async fn run_clients(
    url: String,
    prefix: &'static str,
    clients: usize,
    rec: Recorder,
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Calls>>,
) {
    let http = crate::load::http();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (stop, calls, rec, http, url) = (
            stop.clone(),
            calls.clone(),
            rec.clone(),
            http.clone(),
            url.clone(),
        );
        tasks.spawn(async move {
            for i in 0u64.. {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let call = signed_call(&http, &url, &format!("{prefix}-{c}-{i}"), &rec).await;
                calls.lock().unwrap_or_else(|e| e.into_inner()).push(call);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// One signed webhook: (sent at, latency, status); a 200 becomes an ack.
async fn signed_call(
    http: &reqwest::Client,
    url: &str,
    id: &str,
    rec: &Recorder,
) -> (Duration, Duration, u16) {
    let body = format!("{{\"id\":\"{id}\",\"pad\":\"{}\"}}", "x".repeat(200));
    let Ok(signature) = github_signature(SECRET, body.as_bytes()) else {
        return (rec.now(), Duration::ZERO, 0);
    };
    let at = rec.now();
    let started = Instant::now();
    rec.lock().sent += 1;
    let answer = http
        .post(url)
        .header("x-hub-signature-256", signature)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let Ok(answer) = answer else {
        return (at, started.elapsed(), 0);
    };
    let status = answer.status().as_u16();
    let bytes = answer.bytes().await.unwrap_or_default();
    let took = started.elapsed();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if let (200, Some(event_id), Some(duplicate)) =
        (status, v["id"].as_str(), v["duplicate"].as_bool())
    {
        rec.lock().acks.push(Ack {
            dedup_key: id.to_owned(),
            event_id: event_id.to_owned(),
            duplicate,
            key: None,
            seq: 0,
            sent_at: at,
            at: rec.now(),
        });
    }
    (at, took, status)
}

/// The cumulative buckets `(le, count)` of the server's
/// `mailroom_ingest_duration_seconds` for `source` (the store insert of
/// each accepted webhook), read from its `/metrics`.
pub async fn ingest_buckets(base: &str, source: &str) -> Option<Vec<(f64, u64)>> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(parse_buckets(&text, source))
}

fn parse_buckets(text: &str, source: &str) -> Vec<(f64, u64)> {
    let label = format!("source=\"{source}\"");
    text.lines()
        .filter(|l| l.starts_with("mailroom_ingest_duration_seconds_bucket{") && l.contains(&label))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect()
}

/// The bucket bound holding the p99 of what was recorded between two
/// readings of the same buckets, and how many were.
pub fn p99_between(before: &[(f64, u64)], after: &[(f64, u64)]) -> Option<(f64, u64)> {
    let delta: Vec<(f64, u64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before.iter().find(|(b, _)| b == le).map_or(0, |(_, n)| *n);
            (*le, n.saturating_sub(was))
        })
        .collect();
    let total = delta.iter().map(|(_, n)| *n).max()?;
    let needed = (total * 99).div_ceil(100);
    let mut sorted = delta;
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    sorted
        .into_iter()
        .find(|(_, n)| *n >= needed && total > 0)
        .map(|(le, _)| (le, total))
}

/// Where the host's time went during the attack: the server's CPU, this
/// process's (the load generator's: the attackers, this client and the
/// handler endpoint), the server's own store-insert p99 for the
/// well-behaved source, and the load average.
pub struct Usage {
    server: Option<Duration>,
    own: Option<Duration>,
    ingest: Option<Vec<(f64, u64)>>,
    load: String,
    started: Instant,
}

impl Usage {
    pub async fn begin(pid: &str, base: &str) -> Self {
        Self {
            server: crate::procfs::process_cpu(pid),
            own: crate::procfs::process_cpu("self"),
            ingest: ingest_buckets(base, "signed").await,
            load: load_average(),
            started: Instant::now(),
        }
    }

    /// The notes on the attack's span, from `begin` to now.
    pub async fn end(self, pid: &str, base: &str) -> Vec<String> {
        let took = self.started.elapsed().as_secs_f64();
        let used = |before: Option<Duration>, after: Option<Duration>| {
            after.zip(before).map_or_else(
                || "-".to_owned(),
                |(a, b)| {
                    let s = a.saturating_sub(b).as_secs_f64();
                    format!("{s:.1} s ({:.2} cores)", s / took)
                },
            )
        };
        let server = used(self.server, crate::procfs::process_cpu(pid));
        let own = used(self.own, crate::procfs::process_cpu("self"));
        let ingest = ingest_buckets(base, "signed").await;
        let p99 = self
            .ingest
            .zip(ingest)
            .and_then(|(b, a)| p99_between(&b, &a))
            .map_or_else(
                || "-".to_owned(),
                |(le, n)| format!("<= {:.1}ms over {n} inserts", le * 1e3),
            );
        vec![
            format!(
                "CPU over the attack's {took:.1} s: server {server}, load generator (this process) {own}; load average {} -> {}",
                self.load,
                load_average()
            ),
            format!("server-side store insert of the well-behaved webhooks: p99 {p99}"),
        ]
    }
}

/// The 1-minute load average.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "-".into())
}

#[cfg(test)]
mod tests {
    use super::{p99_between, parse_buckets};

    const BEFORE: &str = r#"# TYPE mailroom_ingest_duration_seconds histogram
mailroom_ingest_duration_seconds_bucket{source="signed",le="0.005"} 10
mailroom_ingest_duration_seconds_bucket{source="signed",le="0.01"} 10
mailroom_ingest_duration_seconds_bucket{source="signed",le="0.1"} 10
mailroom_ingest_duration_seconds_bucket{source="signed",le="+Inf"} 10
mailroom_ingest_duration_seconds_bucket{source="other",le="0.005"} 99
"#;

    #[test]
    fn the_p99_bucket_of_what_was_recorded_between_two_readings() {
        // 200 more: 190 under 5 ms, 8 under 10 ms, 2 under 100 ms.
        let after = BEFORE
            .replace("le=\"0.005\"} 10", "le=\"0.005\"} 200")
            .replace("le=\"0.01\"} 10", "le=\"0.01\"} 208")
            .replace("le=\"0.1\"} 10", "le=\"0.1\"} 210")
            .replace("le=\"+Inf\"} 10", "le=\"+Inf\"} 210");
        let (before, after) = (
            parse_buckets(BEFORE, "signed"),
            parse_buckets(&after, "signed"),
        );
        assert_eq!(before.len(), 4);
        assert_eq!(p99_between(&before, &after), Some((0.01, 200)));
        assert_eq!(p99_between(&before, &before), None);
    }
}
