//! Durability of acknowledged events across a `kill -9` of `mailroom serve`
//! on SQLite, judged by the fault matrix's checker
//! (`mailroom_testkit::harness::check`) as `cluster` is.

use crate::support::{self, Serve, write_config};
use mailroom_testkit::harness::check::{self, Expect};
use mailroom_testkit::harness::{Ack, Recorder, store};
use std::path::Path;
use std::time::{Duration, Instant};

/// The topic's lease, in seconds.
const LEASE_SECS: u64 = 3;

/// A source into a topic delivered to the recording receiver at `url`.
fn config(url: &str) -> String {
    format!(
        r#"
[[source]]
name = "load"
topic = "load"
id = {{ json = "/id" }}

[[topic]]
name = "load"
concurrency = 16
timeout = "2s"
lease = "{LEASE_SECS}s"
retry = {{ max_attempts = 50, base = "100ms", max_delay = "1s" }}
handler = {{ http = {{ url = "{url}" }} }}
"#
    )
}

/// `mailroom serve` with `config` on the SQLite file in `dir`.
async fn start(config: &Path, dir: &Path) -> Serve {
    let store = format!("sqlite://{}", dir.join("mailroom.db").display());
    let config = config.to_owned();
    tokio::task::spawn_blocking(move || support::serve(&config, &store))
        .await
        .expect("start")
}

/// One sender: events `w<worker>-<i>` until the server stops answering;
/// each 200 is recorded as an acknowledgement.
async fn sender(worker: usize, client: reqwest::Client, base: String, rec: Recorder) {
    let stop_at = Instant::now() + Duration::from_secs(30);
    for i in 0u64.. {
        if Instant::now() > stop_at {
            break;
        }
        let id = format!("w{worker}-{i}");
        let sent_at = rec.now();
        let resp = client
            .post(format!("{base}/webhooks/load"))
            .header("content-type", "application/json")
            .body(format!(r#"{{"id":"{id}","n":{i}}}"#))
            .send()
            .await;
        let answer: serde_json::Value = match resp {
            Ok(r) if r.status() == 200 => match r.json().await {
                Ok(v) => v,
                // Cut off mid-answer by the kill: not acknowledged.
                Err(_) => break,
            },
            // The server is gone: stop this worker.
            _ => break,
        };
        let at = rec.now();
        rec.lock().acks.push(Ack {
            dedup_key: id,
            event_id: answer["id"].as_str().expect("id").to_owned(),
            duplicate: answer["duplicate"].as_bool().expect("duplicate"),
            key: None,
            seq: i,
            sent_at,
            at,
        });
    }
}

/// Every event answered 200 before a `kill -9` is in the store after restart
/// (the answer is sent only after the group commit is durable) and is then
/// delivered; an event runs again only where the kill may have lost its
/// completion or its lease expired, never twice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (receiver, rec) = support::receiver(Duration::from_millis(2)).await;
    let config = write_config(dir.path(), &config(&receiver.url));
    let mut serve = start(&config, dir.path()).await;
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..32)
        .map(|worker| {
            let (client, base, rec) = (client.clone(), serve.base.clone(), rec.clone());
            tokio::spawn(sender(worker, client, base, rec))
        })
        .collect();
    // Let the load run, then kill the server in the middle of it; the kill
    // lasts until the process is reaped.
    let deadline = Instant::now() + Duration::from_secs(20);
    while rec.lock().acks.len() < 2000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let from = rec.now();
    serve.kill9();
    rec.disrupted_between(from, rec.now());
    for t in tasks {
        t.await.expect("load task");
    }
    let acked = rec.lock().acks.len();
    assert!(acked >= 1000, "too little load before the kill: {acked}");

    // Restart; everything stored is delivered.
    let serve = start(&config, dir.path()).await;
    let url = format!("sqlite://{}", dir.path().join("mailroom.db").display());
    let drained = store::settle(&url, store::all_final, Duration::from_secs(120))
        .await
        .expect("rows");
    assert!(
        drained.is_some(),
        "events still open 120 s after the restart"
    );
    // Deliveries in flight at the last check have ended by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(serve);
    let rows = store::rows(&url).await.expect("rows");
    let expect = Expect {
        lease: Some(Duration::from_secs(LEASE_SECS)),
        ..Expect::default()
    };
    let verdict = check::check(&rec.snapshot(), &rows, &expect);
    assert!(
        verdict.lost == 0 && verdict.duplicates == 0 && verdict.order == 0,
        "{verdict:#?}"
    );
    eprintln!(
        "acknowledged {}, stored {} (the difference was in flight at the kill), \
         run again {}",
        verdict.acked,
        rows.len(),
        verdict.excused
    );
}
