//! What the built-in handlers let out: an HTTP handler's failure text
//! without the URL's secrets, a command's environment without mailroom's.

use mailroom::handler::SharedHandler;
use mailroom::handler::command::CommandHandler;
use mailroom::handler::http::{HttpHandler, HttpHandlerSettings};
use mailroom::{Backoff, Draft, Engine, Event, RetryPolicy, Status, TopicSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

async fn store(dir: &tempfile::TempDir) -> Arc<dyn mailroom::Store> {
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    store.migrate().await.expect("migrate");
    store
}

/// Runs one event through `handler` (one attempt) and returns it once it
/// is done or dead.
async fn run_once(handler: SharedHandler) -> Event {
    let dir = tempfile::tempdir().expect("tempdir");
    let topic = TopicSpec::new("t").retry(RetryPolicy {
        max_attempts: 1,
        backoff: Backoff::Schedule(vec![Duration::from_millis(10)]),
    });
    let engine = Engine::builder(store(&dir).await)
        .topic(topic)
        .handler("t", handler)
        .build()
        .expect("engine");
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let (engine, shutdown) = (engine.clone(), shutdown.clone());
        async move { engine.run(shutdown).await }
    });
    let id = engine
        .enqueue(Draft::json("t", &serde_json::json!({"n": 1})).key("k-1"))
        .await
        .expect("enqueue")
        .id;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let event = engine
            .operator()
            .get(id)
            .await
            .expect("get")
            .expect("stored");
        if matches!(event.status, Status::Done | Status::Dead) {
            shutdown.cancel();
            return event;
        }
        assert!(Instant::now() < deadline, "still {:?}", event.status);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A handler URL's password and query token never reach the stored error
/// (returned by the API, shown in the dashboard, logged): the URL is shown
/// without its user info and with its query values masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_is_recorded_without_the_urls_secrets() {
    let handler = HttpHandler::new(HttpHandlerSettings {
        url: "http://admin:DBPASS42@127.0.0.1:1/x?token=QS2"
            .parse()
            .expect("url"),
        timeout: Duration::from_secs(5),
        secret: None,
        headers: BTreeMap::new(),
        permanent_statuses: vec![410],
        tls: Default::default(),
    })
    .expect("handler");
    let event = run_once(Arc::new(handler)).await;
    assert_eq!(event.status, Status::Dead);
    let error = event.last_error.expect("an error");
    assert!(!error.contains("DBPASS42"), "{error}");
    assert!(!error.contains("QS2"), "{error}");
    assert!(
        error.starts_with("request to http://127.0.0.1:1/x?token=*** failed: "),
        "{error}"
    );
}

/// The variables a command got, from the file it wrote them to.
fn env_of(path: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .expect("env file")
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A command gets `PATH`, its `MAILROOM_*` envelope and the variables its
/// topic lists, not the rest of mailroom's environment (where its secrets
/// are): `CARGO_MANIFEST_DIR`, set for this test process by cargo, stands
/// for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_gets_a_clean_environment_and_what_its_topic_lists() {
    let secret = "CARGO_MANIFEST_DIR";
    assert!(std::env::var_os(secret).is_some(), "cargo sets {secret}");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("env");
    let argv = |path: &std::path::Path| {
        vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            "env > \"$0\"".to_owned(),
            path.display().to_string(),
        ]
    };

    let handler = CommandHandler::new(argv(&out)).expect("handler");
    let event = run_once(Arc::new(handler)).await;
    assert_eq!(event.status, Status::Done, "{:?}", event.last_error);
    let env = env_of(&out);
    assert!(!env.contains_key(secret), "{env:?}");
    assert_eq!(env.get("PATH"), std::env::var("PATH").ok().as_ref());
    assert_eq!(env.get("MAILROOM_TOPIC").map(String::as_str), Some("t"));
    assert_eq!(env.get("MAILROOM_KEY").map(String::as_str), Some("k-1"));
    let inherited: Vec<&String> = env
        .keys()
        .filter(|k| {
            !k.starts_with("MAILROOM_")
                && !k.starts_with("LC_")
                && !mailroom::handler::command::BASE_ENV.contains(&k.as_str())
        })
        // What the shell itself sets.
        .filter(|k| !matches!(k.as_str(), "PWD" | "SHLVL" | "_" | "OLDPWD"))
        .collect();
    assert!(inherited.is_empty(), "inherited {inherited:?}");

    let listed = dir.path().join("listed");
    let handler = CommandHandler::new(argv(&listed))
        .expect("handler")
        .pass_env(&[secret.to_owned()])
        .expect("a valid name");
    let event = run_once(Arc::new(handler)).await;
    assert_eq!(event.status, Status::Done, "{:?}", event.last_error);
    assert_eq!(
        env_of(&listed).get(secret),
        std::env::var(secret).ok().as_ref()
    );
    let bad = CommandHandler::new(argv(&listed))
        .expect("handler")
        .pass_env(&["NOT-A-NAME".to_owned()])
        .expect_err("refused");
    assert!(bad.contains("NOT-A-NAME"), "{bad}");
}
