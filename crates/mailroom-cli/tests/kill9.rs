//! Durability of acknowledged events across a `kill -9` of `mailroom serve`.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Starts `mailroom serve` in `dir` on a free loopback port; returns the child
/// and its base URL (read from the JSON start-up log line). The caller kills
/// and reaps the child; if start-up fails the test panics and the process
/// dies with the test harness.
#[allow(clippy::zombie_processes)]
fn start(dir: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
        .current_dir(dir)
        .env_remove("MAILROOM_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mailroom serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "mailroom did not start in time");
        let line = lines.next().expect("log line").expect("read log");
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            if let Some(listen) = v.get("listen").and_then(|l| l.as_str()) {
                // Keep draining stderr so the child never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines.by_ref() {});
                return (child, format!("http://{listen}"));
            }
        }
    }
}

/// Every event answered 200 before a `kill -9` is in the store after restart:
/// the answer is sent only after the group commit is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, base) = start(dir.path());
    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let client = reqwest::Client::new();
    let stop_at = Instant::now() + Duration::from_secs(30);
    let mut tasks = Vec::new();
    for worker in 0..32 {
        let (client, base, acked) = (client.clone(), base.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                if Instant::now() > stop_at {
                    break;
                }
                let id = format!("w{worker}-{i}");
                let resp = client
                    .post(format!("{base}/webhooks/load"))
                    .header("webhook-id", &id)
                    .body(format!("{{\"n\":{i}}}"))
                    .send()
                    .await;
                match resp {
                    Ok(r) if r.status() == 200 => {
                        acked.lock().expect("lock").insert(id);
                    }
                    // The server is gone: stop this worker.
                    _ => break,
                }
            }
        }));
    }
    // Let the load run, then kill the server in the middle of it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.lock().expect("lock").len() < 2000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.kill().expect("kill -9"); // SIGKILL on Unix
    child.wait().expect("reap");
    for t in tasks {
        t.await.expect("load task");
    }
    let acked = acked.lock().expect("lock").clone();
    assert!(
        acked.len() >= 1000,
        "too little load before the kill: {}",
        acked.len()
    );

    // Restart and count: every acknowledged id must be stored.
    let (mut child, base) = start(dir.path());
    let mut stored = HashSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/events?topic=load&limit=1000");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let page: serde_json::Value = client
            .get(url)
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        for e in page["events"].as_array().expect("events") {
            stored.insert(e["dedup_key"].as_str().expect("dedup_key").to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    child.kill().expect("stop");
    let _ = child.wait();
    let lost: Vec<_> = acked.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged events were lost, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    eprintln!(
        "acknowledged {}, stored {} (the difference was in flight at the kill)",
        acked.len(),
        stored.len()
    );
}
