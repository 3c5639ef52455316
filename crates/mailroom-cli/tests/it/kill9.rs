//! Durability of acknowledged events across a `kill -9` of `mailroom serve`.

use crate::support::{self, Serve};
use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The quick start in `dir` on its SQLite file.
fn start(dir: &Path) -> Serve {
    let store = format!("sqlite://{}", dir.join("mailroom.db").display());
    support::serve_quick(dir, &store)
}

/// Every event answered 200 before a `kill -9` is in the store after restart:
/// the answer is sent only after the group commit is durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut serve = start(dir.path());
    let base = serve.base.clone();
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
    serve.kill9();
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
    let serve = start(dir.path());
    let base = serve.base.clone();
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
    drop(serve);
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
