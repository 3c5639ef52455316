//! Operator verbs on a SQLite store, run as the real binary.

use mailroom::{Draft, Engine, Outcome, TopicSpec};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `mailroom --config <dir>/mailroom.toml <args>`; (success, stdout, stderr).
fn mailroom(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .arg("--config")
        .arg(dir.join("mailroom.toml"))
        .args(args)
        .env_remove("MAILROOM_CONFIG")
        .env_remove("MAILROOM_STORE_URL")
        .env_remove("RUST_LOG")
        .output()
        .expect("run mailroom");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A store at `dir/m.db` and a config naming it, with the pull topic
/// `orders`; the engine over it.
async fn setup(dir: &Path) -> Engine {
    let url = format!("sqlite://{}", dir.join("m.db").display());
    std::fs::write(
        dir.join("mailroom.toml"),
        format!("[store]\nurl = \"{url}\"\n\n[[topic]]\nname = \"orders\"\n"),
    )
    .expect("config");
    let store = mailroom::open_store(&url, false).await.expect("open");
    store.migrate().await.expect("migrate");
    Engine::builder(store)
        .topic(TopicSpec::new("orders"))
        .build()
        .expect("engine")
}

/// An event done by a pull worker, whose payload a purge then drops.
async fn purged_event(engine: &Engine) -> String {
    let id = engine
        .enqueue(Draft::json("orders", &serde_json::json!({"n": 1})))
        .await
        .expect("enqueue")
        .id;
    let claimed = engine.claim("orders", 1, None, "w").await.expect("claim");
    engine
        .finish_claim(id, claimed[0].token, Outcome::Success)
        .await
        .expect("ack");
    let report = engine.purge(Duration::ZERO).await.expect("purge");
    assert_eq!(report.payloads_dropped, 1);
    id.to_string()
}

/// `mailroom replay ID` of an event whose payload retention purged fails
/// and says why; a bulk replay leaves it and reports it skipped (table and
/// `--json`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_refuses_a_purged_event_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = setup(dir.path()).await;
    let id = purged_event(&engine).await;
    let (ok, _, err) = mailroom(dir.path(), &["replay", &id]);
    assert!(!ok, "the replay must fail");
    assert!(err.contains("purged by retention"), "{err}");
    let (ok, out, err) = mailroom(dir.path(), &["replay", "--status", "done"]);
    assert!(ok, "{err}");
    assert!(out.contains("0 events are pending again"), "{out}");
    assert!(out.contains("1 skipped: their payload was purged"), "{out}");
    let (ok, out, err) = mailroom(dir.path(), &["replay", "--status", "done", "--json"]);
    assert!(ok, "{err}");
    let answer: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        answer,
        serde_json::json!({"replayed": 0, "skipped_purged": 1})
    );
    let event = engine.get(id.parse().expect("id")).await.expect("get");
    assert_eq!(event.expect("kept").status, mailroom::Status::Done);
}
