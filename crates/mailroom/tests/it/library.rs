//! The engine as a library: no global state.

use mailroom::handler::handler_fn;
use mailroom::{Draft, Engine, Event, Outcome, Status, TopicSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Two engines in one process, each with its own store, topics and handlers,
/// process their own events and never each other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_in_one_process_stay_independent() {
    let mut engines = Vec::new();
    let mut dirs = Vec::new();
    for name in ["a", "b"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = mailroom::open_store(
            &format!("sqlite://{}", dir.path().join("m.db").display()),
            true,
        )
        .await
        .expect("open");
        store.migrate().await.expect("migrate");
        let seen = Arc::new(AtomicU64::new(0));
        let engine = Engine::builder(store.clone())
            .topic(TopicSpec::new("jobs"))
            .handler("jobs", {
                let seen = seen.clone();
                handler_fn(move |e: Event| {
                    let seen = seen.clone();
                    async move {
                        assert_eq!(
                            e.source,
                            format!("from-{name}"),
                            "an engine got another's event"
                        );
                        seen.fetch_add(1, Ordering::SeqCst);
                        Outcome::Success
                    }
                })
            })
            .build()
            .expect("engine");
        engines.push((engine, store, seen, name));
        dirs.push(dir);
    }
    let shutdown = CancellationToken::new();
    for (engine, _, _, name) in &engines {
        for i in 0..20 {
            engine
                .enqueue(
                    Draft::json("jobs", &serde_json::json!({ "i": i }))
                        .source(format!("from-{name}")),
                )
                .await
                .expect("enqueue");
        }
        tokio::spawn({
            let (engine, shutdown) = (engine.clone(), shutdown.clone());
            async move { engine.run(shutdown).await }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (_, store, seen, _) in &engines {
        while store
            .stats()
            .await
            .expect("stats")
            .iter()
            .map(|s| s.count(Status::Done))
            .sum::<u64>()
            < 20
        {
            assert!(Instant::now() < deadline, "engine did not finish");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen.load(Ordering::SeqCst), 20);
    }
    shutdown.cancel();
}

/// A hand-built topic is checked as strictly as a config file: a lease not
/// longer than the timeout, a batch schedule that is no cron expression, a
/// `group_by` or ordering key that cannot be read, and a zero timeout are all
/// refused by `build()` with a typed error naming the key.
#[tokio::test]
async fn the_builder_refuses_inconsistent_hand_built_topics() {
    use mailroom::{BatchSettings, BuildError, Field, Mode, SpecError};
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    let batch = |b: BatchSettings| TopicSpec::new("t").mode(Mode::Batch(b));
    let cases = [
        (TopicSpec::new("t").lease(Duration::from_secs(30)), "lease"),
        (
            batch(BatchSettings {
                schedule: Some("every night".into()),
                ..BatchSettings::default()
            }),
            "batch.schedule",
        ),
        (
            batch(BatchSettings {
                group_by: Some("shop".into()),
                ..BatchSettings::default()
            }),
            "batch.group_by",
        ),
        (
            TopicSpec::new("t").key(Field::Header("bad header".into())),
            "key",
        ),
        (TopicSpec::new("t").timeout(Duration::ZERO), "timeout"),
    ];
    for (spec, expected) in cases {
        let err = Engine::builder(store.clone())
            .topic(spec)
            .build()
            .map(|_| ())
            .expect_err(expected);
        let BuildError::Topic { topic, key, error } = err else {
            panic!("{expected}: not a topic error: {err}");
        };
        assert_eq!((topic.as_str(), key.as_str()), ("t", expected), "{error}");
        if expected == "lease" {
            assert!(matches!(error, SpecError::LeaseTooShort { .. }), "{error}");
        }
    }
    let ok = batch(BatchSettings {
        schedule: Some("0 0 * * *".into()),
        group_by: Some("/shop".into()),
        ..BatchSettings::default()
    });
    assert!(Engine::builder(store).topic(ok).build().is_ok());
}

/// Hand-built alert thresholds are checked like an `[alerts]` table: a
/// failure rate that is no share of attempts and a zero processing time are
/// refused by `build()` with a typed error naming the key.
#[tokio::test]
async fn the_builder_refuses_alert_thresholds_that_cannot_work() {
    use mailroom::{AlertRules, AlertRulesError, BuildError};
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    let build = |rules: AlertRules| Engine::builder(store.clone()).alerts(rules).build();
    let err = build(AlertRules {
        failure_rate: Some(5.0),
        ..AlertRules::default()
    })
    .map(|_| ())
    .expect_err("a failure rate of 500%");
    assert!(
        matches!(
            err,
            BuildError::Alerts {
                key: "failure_rate",
                error: AlertRulesError::FailureRate(_)
            }
        ),
        "{err}"
    );
    let err = build(AlertRules {
        processing_time: Some(Duration::ZERO),
        ..AlertRules::default()
    })
    .map(|_| ())
    .expect_err("a zero processing time");
    assert_eq!(
        err.to_string(),
        "alerts.processing_time: must be more than 0"
    );
    let ok = AlertRules {
        dead_letter_depth: Some(0),
        failure_rate: Some(0.05),
        processing_time: Some(Duration::from_secs(5)),
        ..AlertRules::default()
    };
    assert!(build(ok).is_ok());
}

/// A hand-built source is checked like a `[[source]]` table: a name that is
/// no URL segment is refused by `build()` with a typed error naming the key.
#[tokio::test]
async fn the_builder_refuses_a_source_that_is_no_url_segment() {
    use mailroom::{BuildError, SourceSpec, SourceSpecError};
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let store = mailroom::open_store(&url, true).await.expect("open");
    let err = Engine::builder(store.clone())
        .source(SourceSpec::new("git/hub", "pushes"))
        .build()
        .map(|_| ())
        .expect_err("a slash in a source name");
    assert!(
        matches!(
            err,
            BuildError::Source {
                key: "name",
                error: SourceSpecError::Name,
                ..
            }
        ),
        "{err}"
    );
    let ok = Engine::builder(store).source(SourceSpec::new("github", "pushes"));
    assert!(ok.build().is_ok());
}
