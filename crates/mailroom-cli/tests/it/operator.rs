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
    let claimed = engine
        .pull()
        .claim("orders", 1, None, "w")
        .await
        .expect("claim");
    engine
        .pull()
        .finish(id, claimed[0].token, Outcome::Success)
        .await
        .expect("ack");
    let report = engine
        .operator()
        .purge(Duration::ZERO)
        .await
        .expect("purge");
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
    let event = engine
        .operator()
        .get(id.parse().expect("id"))
        .await
        .expect("get");
    assert_eq!(event.expect("kept").status, mailroom::Status::Done);
}

/// `status --json`, `events list --json` and `events show --json` print the
/// API's typed answers: every declared topic with its mode,
/// handler kind, all five counts, oldest pending age and blocked keys; a
/// list page with `next_cursor`; an event object with its history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_output_has_the_api_shapes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = setup(dir.path()).await;
    let done = purged_event(&engine).await;
    engine
        .enqueue(Draft::json("orders", &serde_json::json!({"n": 2})))
        .await
        .expect("enqueue");
    let (ok, out, err) = mailroom(dir.path(), &["status", "--json"]);
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let topic = &status["topics"][0];
    let mut keys: Vec<&str> = topic
        .as_object()
        .expect("topic")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "blocked_keys",
            "counts",
            "handler",
            "limits",
            "mode",
            "oldest_pending_age_seconds",
            "rates",
            "topic"
        ]
    );
    assert_eq!(
        (&topic["topic"], &topic["mode"], &topic["handler"]),
        (&"orders".into(), &"single".into(), &"pull".into())
    );
    assert_eq!(
        topic["counts"],
        serde_json::json!({"pending": 1, "running": 0, "done": 1, "dead": 0, "skipped": 0, "cancelled": 0, "expired": 0})
    );
    assert!(
        topic["oldest_pending_age_seconds"]
            .as_f64()
            .is_some_and(|a| a >= 0.0)
    );
    assert_eq!(topic["rates"]["done_per_second"], 1.0 / 60.0, "{topic}");
    assert!(status["alerts"].is_array());

    let (ok, out, err) = mailroom(dir.path(), &["events", "list", "--limit", "1", "--json"]);
    assert!(ok, "{err}");
    let page: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(page["events"].as_array().expect("events").len(), 1);
    assert!(page["events"][0].get("history").is_none());
    assert!(page["next_cursor"].is_string(), "{page}");
    let (ok, out, err) = mailroom(dir.path(), &["events", "show", &done, "--json"]);
    assert!(ok, "{err}");
    let event: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(event["id"], done.as_str());
    assert_eq!(event["history"][0]["outcome"], "done");
    let (ok, _, err) = mailroom(dir.path(), &["events", "show", "not-an-id"]);
    assert!(!ok);
    assert!(err.contains("is not an event id"), "{err}");
}

/// `mailroom cancel`: one pending event by id; a running one is refused and
/// stays running; by filter, the preview counts without changing anything,
/// in a pipe it refuses without `--yes`, and with it cancels exactly the
/// pending events of that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_id_and_by_filter_with_a_preview() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = setup(dir.path()).await;
    let enqueue = |key: &str, n: u32| {
        engine.enqueue(Draft::json("orders", &serde_json::json!({"n": n})).key(key))
    };
    let running = enqueue("a", 0).await.expect("enqueue").id;
    let claimed = engine
        .pull()
        .claim("orders", 1, None, "w")
        .await
        .expect("claim");
    assert_eq!(claimed[0].event.id, running);
    let one = enqueue("b", 1).await.expect("enqueue").id.to_string();
    for n in 2..5 {
        enqueue("a", n).await.expect("enqueue");
    }

    let (ok, out, err) = mailroom(dir.path(), &["cancel", &one]);
    assert!(ok, "{err}");
    assert!(out.contains("cancelled"), "{out}");
    let (ok, _, err) = mailroom(dir.path(), &["cancel", &running.to_string()]);
    assert!(!ok, "a running event cannot be cancelled");
    assert!(err.contains("running"), "{err}");

    let (ok, out, err) = mailroom(dir.path(), &["--json", "cancel", "--key", "a", "--dry-run"]);
    assert!(ok, "{err}");
    let preview: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(preview["matching"], 3, "{out}");
    assert_eq!(preview["cancelled"], 0, "{out}");
    let (ok, _, err) = mailroom(dir.path(), &["cancel", "--key", "a"]);
    assert!(!ok, "no --yes in a pipe");
    assert!(err.contains("--yes"), "{err}");
    let (ok, out, err) = mailroom(dir.path(), &["--json", "cancel", "--key", "a", "--yes"]);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(report["cancelled"], 3, "{out}");

    // `mailroom status` names a column for every status, in the order of
    // the row's values.
    let (ok, out, err) = mailroom(dir.path(), &["status"]);
    assert!(ok, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .take(2)
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    let (header, row) = (&lines[0], &lines[1]);
    assert_eq!(header.len(), row.len(), "{out}");
    let column = header
        .iter()
        .position(|h| *h == "CANCELLED")
        .expect("a CANCELLED column");
    assert_eq!(row[column], "4", "{out}");

    let stats = engine.operator().stats().await.expect("stats");
    let orders = stats.iter().find(|t| t.topic == "orders").expect("orders");
    assert_eq!(orders.count(mailroom::Status::Cancelled), 4);
    assert_eq!(orders.count(mailroom::Status::Pending), 0);
    assert_eq!(orders.count(mailroom::Status::Running), 1);
}

/// `count` events of `orders` dead through a pull worker.
async fn dead_events(engine: &Engine, count: usize) {
    for n in 0..count {
        engine
            .enqueue(Draft::json("orders", &serde_json::json!({ "n": n })))
            .await
            .expect("enqueue");
    }
    kill_pending(engine, count).await;
}

/// Claims the `count` pending events of `orders` and fails them for good.
async fn kill_pending(engine: &Engine, count: usize) {
    let claimed = engine
        .pull()
        .claim("orders", 1000, None, "w")
        .await
        .expect("claim");
    assert_eq!(claimed.len(), count);
    for c in claimed {
        let verdict = Outcome::Permanent {
            error: "boom".into(),
        };
        engine
            .pull()
            .finish(c.event.id, c.token, verdict)
            .await
            .expect("nack");
    }
}

/// The long verbs (`replay` by filter, `purge`) draw their progress only
/// on a terminal: piped, and with `--json`, their output is exactly what
/// it was, with no progress drawing on either stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_and_json_output_of_long_verbs_has_no_progress_drawing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = setup(dir.path()).await;
    dead_events(&engine, 450).await;
    let (ok, out, err) = mailroom(dir.path(), &["replay", "--status", "dead"]);
    assert!(ok, "{err}");
    assert_eq!(out, "450 events are pending again\n");
    assert_eq!(err, "replaying dead events…\n");
    let counts = engine.operator().stats().await.expect("stats");
    assert_eq!(counts[0].count(mailroom::Status::Pending), 450);

    kill_pending(&engine, 450).await;
    let (ok, out, err) = mailroom(dir.path(), &["replay", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(out, "{\"replayed\":450,\"skipped_purged\":0}\n");
    assert_eq!(err, "replaying dead events…\n");

    let (ok, out, err) = mailroom(dir.path(), &["purge", "--older-than", "1h"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("payloads dropped: 0, rows deleted"),
        "{out}"
    );
    assert_eq!(err, "purging finished events older than 1h…\n");
    let (ok, out, err) = mailroom(dir.path(), &["purge", "--older-than", "1h", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(out, "{\"payloads_dropped\":0,\"rows_deleted\":0}\n");
    assert_eq!(err, "purging finished events older than 1h…\n");
}

/// What `mailroom <args>` shows on a terminal (a pseudo-terminal from
/// `script`, both streams on it).
fn on_a_terminal(dir: &Path, args: &str) -> String {
    let command = format!(
        "{} --config {} {args}",
        env!("CARGO_BIN_EXE_mailroom"),
        dir.join("mailroom.toml").display()
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("MAILROOM_CONFIG")
        .env_remove("MAILROOM_STORE_URL")
        .env_remove("RUST_LOG")
        .env("TERM", "xterm")
        .output()
        .expect("run script");
    let screen = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{screen}");
    screen
}

/// On a terminal a replay by filter draws its progress bar on stderr,
/// then clears it for the summary; with `--json` it draws none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_by_filter_draws_progress_on_a_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = setup(dir.path()).await;
    dead_events(&engine, 450).await;
    let screen = on_a_terminal(dir.path(), "replay --status dead --json");
    assert!(!screen.contains("replaying ["), "{screen:?}");
    assert!(screen.contains("{\"replayed\":450,"), "{screen:?}");
    kill_pending(&engine, 450).await;
    let screen = on_a_terminal(dir.path(), "replay --status dead");
    assert!(
        screen.contains("replaying ["),
        "no progress bar: {screen:?}"
    );
    assert!(screen.contains("/450"), "no count: {screen:?}");
    assert!(
        screen.contains("450 events are pending again"),
        "{screen:?}"
    );
}
