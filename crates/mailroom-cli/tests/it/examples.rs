//! The shipped examples stay true: `mailroom config check` accepts
//! `mailroom.example.toml` and `examples/rabbitmq/mailroom.toml` and sees
//! the RabbitMQ parts they document, and the programs under `examples/` do
//! what the book says when run against a real mailroom.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// `mailroom --config <file> config check --json` with the variables the
/// examples reference set; the parsed answer.
fn check(file: &str) -> serde_json::Value {
    serde_json::from_str(&check_output(file, &["--json"])).expect("JSON answer")
}

/// `mailroom --config <file> config check [extra]`'s standard output.
fn check_output(file: &str, extra: &[&str]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .arg("--config")
        .arg(root.join(file))
        .args(["config", "check"])
        .args(extra)
        .env_remove("MAILROOM_CONFIG")
        .env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
        .env("AMQP_PASSWORD", "pw")
        .env("ASAAS_TOKEN", "t")
        .env("HANDLER_SECRET", "s")
        .output()
        .expect("run mailroom config check");
    assert!(
        out.status.success(),
        "{file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `examples/rabbitmq`: one topic exchange, three queues bound by routing
/// key, each with a TTL and a dead-letter queue; one AMQP source consuming
/// one of them and a relay topic publishing to the exchange.
#[test]
fn the_rabbitmq_example_declares_a_full_topology() {
    let c = check("examples/rabbitmq/mailroom.toml");
    let amqp = &c["amqp"];
    assert_eq!(
        amqp["url"], "amqp://127.0.0.1:5672/%2f",
        "no password shown"
    );
    let exchanges = amqp["exchanges"].as_array().expect("exchanges");
    assert_eq!(exchanges.len(), 1);
    assert_eq!(exchanges[0]["kind"], "topic");
    let queues = amqp["queues"].as_array().expect("queues");
    assert_eq!(queues.len(), 3);
    for q in queues {
        assert!(q["ttl"].is_string(), "{q}");
        assert_eq!(
            q["dead_letter_queue"],
            format!("{}.dlq", q["name"].as_str().unwrap())
        );
        assert_eq!(q["bindings"][0]["exchange"], exchanges[0]["name"], "{q}");
    }
    let sources = amqp["sources"].as_array().expect("sources");
    assert_eq!(sources.len(), 1);
    assert!(queues.iter().any(|q| q["name"] == sources[0]["queue"]));
    let handlers = amqp["handlers"].as_array().expect("handlers");
    assert_eq!(handlers.len(), 1);
    assert_eq!(handlers[0]["exchange"], exchanges[0]["name"]);
}

/// `mailroom.example.toml` documents the AMQP parts too: `[amqp]`, an AMQP
/// source and an AMQP handler.
#[test]
fn the_annotated_example_has_the_amqp_parts() {
    let c = check("mailroom.example.toml");
    let amqp = &c["amqp"];
    assert_eq!(amqp["url"], "amqp://127.0.0.1:5672/%2f");
    assert_eq!(
        amqp["queues"][0]["dead_letter_queue"],
        "simulacoes.created.dlq"
    );
    assert_eq!(amqp["sources"][0]["queue"], "simulacoes.created");
    assert_eq!(amqp["handlers"][0]["routing_key"], "{type}");
}

/// The text answer lists the topology and what `serve` will run on RabbitMQ,
/// and never the broker password.
#[test]
fn config_check_shows_the_amqp_sources_and_handlers_it_will_run() {
    let text = check_output("examples/rabbitmq/mailroom.toml", &[]);
    for line in [
        "amqp    amqp://127.0.0.1:5672/%2f",
        "exchange shop.events (topic, durable)",
        "queue shop.payments (durable, ttl 7d, dead letters -> shop.events.dlx -> shop.payments.dlq",
        "source  amqp amqp://127.0.0.1:5672/%2f queue shop.orders -> orders (prefetch 50, ack after commit)",
        "handler outbox -> amqp amqp://127.0.0.1:5672/%2f exchange \"shop.events\" routing key \"{type}\"",
        "topic   outbox (single, concurrency 32, 10 attempts, timeout 30s, handler: amqp)",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert!(!text.contains("guest"), "{text}");
    assert!(
        !text.contains("POST /webhooks/orders"),
        "an AMQP source is not a webhook: {text}"
    );
}

/// Each topic line says where its events go: the HTTP endpoint (without
/// credentials or query, which may hold secrets) or the program.
#[test]
fn config_check_names_each_topics_handler() {
    let text = check_output("mailroom.example.toml", &[]);
    for part in [
        "handler: http POST http://127.0.0.1:3000/payments)",
        "handler: command ./scripts/handle-report.sh)",
    ] {
        assert!(text.contains(part), "missing {part:?} in:\n{text}");
    }
    assert!(!text.contains("built-in"), "{text}");
}

/// Secrets in configured URLs are never printed: `config check` shows the
/// store, handler and alert URLs without user info and with query values
/// masked, and `status` names the store it cannot open the same way.
#[test]
fn config_check_and_status_never_print_url_secrets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("mailroom.toml");
    std::fs::write(
        &config,
        r#"
[store]
url = "postgres://mailroom:PGPASSWORD123@127.0.0.1:1/mailroom?password=PGQUERY"

[[topic]]
name = "hooks"
handler = { http = { url = "http://admin:DBPASS42@127.0.0.1:1/x?token=QS2", headers = { "x-api-key" = "HDRSECRET" } } }

[alerts]
backlog = 10
notify = { http = { url = "http://ops:NOTIFYPW@127.0.0.1:1/alerts?key=NOTIFYQS" } }
"#,
    )
    .expect("write config");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg("--config")
            .arg(&config)
            .args(args)
            .env_remove("MAILROOM_CONFIG")
            .env_remove("MAILROOM_STORE_URL")
            .output()
            .expect("run mailroom")
    };
    let secrets = [
        "PGPASSWORD123",
        "PGQUERY",
        "DBPASS42",
        "QS2",
        "HDRSECRET",
        "NOTIFYPW",
        "NOTIFYQS",
        "admin",
        "ops:",
    ];
    let check = run(&["config", "check"]);
    let text = String::from_utf8_lossy(&check.stdout).into_owned()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{text}");
    for line in [
        "store   postgres://127.0.0.1:1/mailroom?password=***",
        "handler: http POST http://127.0.0.1:1/x?token=***)",
        "notify  POST http://127.0.0.1:1/alerts?key=***",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    let status = run(&["status"]);
    let err = String::from_utf8_lossy(&status.stdout).into_owned()
        + &String::from_utf8_lossy(&status.stderr);
    assert!(!status.status.success(), "{err}");
    assert!(
        err.contains("cannot open the store postgres://127.0.0.1:1/mailroom?password=***"),
        "{err}"
    );
    for secret in secrets {
        assert!(!text.contains(secret), "{secret} in:\n{text}");
        assert!(!err.contains(secret), "{secret} in:\n{err}");
    }
}

/// `mailroom <args>` with the store at `url` and no configuration file,
/// from an empty directory; its standard output, or a panic with stderr.
fn mailroom_on(url: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .current_dir(dir.path())
        .args(args)
        .env_remove("MAILROOM_CONFIG")
        .env("MAILROOM_STORE_URL", url)
        .output()
        .expect("run mailroom");
    assert!(
        out.status.success(),
        "mailroom {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `examples/outbox-python/outbox.py`, as the outbox guide runs it: after
/// `mailroom migrate`, the program debits an account and enqueues its event
/// in one transaction (both are there), and a rolled-back transaction
/// leaves no event.
#[tokio::test]
async fn the_python_outbox_example_enqueues_with_the_business_write() {
    let url = mailroom_testkit::fresh_postgres_db().await;
    mailroom_on(&url, &["migrate"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("/usr/bin/python3")
        .arg(root.join("examples/outbox-python/outbox.py"))
        .env("DATABASE_URL", &url)
        .output()
        .expect("run python3 (scripts/lib/services.sh installs python3-psycopg)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("enqueued "))
        .unwrap_or_else(|| panic!("no event id printed: {stdout}"));
    assert!(
        stdout.contains("rolled back: insufficient funds"),
        "{stdout}"
    );

    let list: serde_json::Value =
        serde_json::from_str(&mailroom_on(&url, &["--json", "events", "list"])).expect("JSON");
    let events = list["events"].as_array().expect("events");
    assert_eq!(
        events.len(),
        1,
        "the rolled-back event is not there: {list}"
    );
    let e = &events[0];
    assert_eq!(e["id"], printed_id);
    assert_eq!(e["source"], "outbox");
    assert_eq!(e["topic"], "payments");
    assert_eq!(e["type"], "payment.debited");
    assert_eq!(e["key"], "account-7");
    assert_eq!(e["dedup_key"], "debit-7-0042");
    assert_eq!(e["status"], "pending");
    assert_eq!(
        e["payload"],
        serde_json::json!({"account": 7, "amount": 10})
    );

    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let balance: i32 = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 7")
        .fetch_one(&pool)
        .await
        .expect("the example's table");
    assert_eq!(balance, 90, "the debit committed with its event");
}

/// `examples/pull-worker-python/worker.py`, as the pull-workers guide runs
/// it: against a quick-start `mailroom serve`, it claims the events of the
/// handler-less topic `thumbnails`, prints each and acks it with its
/// fencing token, so every event ends `done` after one attempt.
#[tokio::test]
async fn the_python_pull_worker_example_finishes_every_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("sqlite://{}", dir.path().join("mailroom.db").display());
    let serve = support::serve_quick(dir.path(), &store);
    let http = reqwest::Client::new();
    for n in 1..=3 {
        let resp = http
            .post(format!("{}/webhooks/thumbnails", serve.base))
            .header("content-type", "application/json")
            .header("webhook-id", format!("up-{n}"))
            .body(format!(r#"{{"image": "img-{n}.png"}}"#))
            .send()
            .await
            .expect("webhook");
        assert_eq!(resp.status(), 200);
    }

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut worker = std::process::Command::new("/usr/bin/python3")
        .arg("-u")
        .arg(root.join("examples/pull-worker-python/worker.py"))
        .env("MAILROOM_URL", &serve.base)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");

    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let page: serde_json::Value = http
            .get(format!(
                "{}/v1/events?topic=thumbnails&status=done",
                serve.base
            ))
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("JSON");
        let done = page["events"].as_array().expect("events").clone();
        if done.len() == 3 || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = worker.kill();
    let out = worker.wait_with_output().expect("worker output");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        done.len(),
        3,
        "done: {done:?}; the worker printed:\n{printed}"
    );
    for e in &done {
        assert_eq!(e["attempts"], 1, "{e}");
        let id = e["id"].as_str().expect("id");
        assert!(
            printed.contains(&format!("processing {id} ")),
            "{id} not in:\n{printed}"
        );
    }
}
