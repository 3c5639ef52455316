//! The `command` handler, configured from TOML: stdin, environment, exit codes.

use crate::support::{Db, outcomes, start_with};
use mailroom_config::{Config, Specs};
use mailroom_server::ServerOptions;
use serde_json::json;
use std::time::Duration;

/// Reads the payload from stdin, records it with the envelope from the
/// environment, then exits by what the payload asks: `ok` → 0, `bad` → 65
/// (after some stderr), `flaky` → 1 on the first attempt, 0 after.
const SCRIPT: &str = r#"payload=$(cat)
printf '%s|%s|%s|%s|%s\n' "$MAILROOM_TOPIC" "$MAILROOM_SOURCE" "$MAILROOM_DEDUP_KEY" "$MAILROOM_ATTEMPT" "$payload" >> "$0.$MAILROOM_EVENT_ID"
case "$payload" in
  *ok*) exit 0 ;;
  *bad*) echo "reading order..." >&2; echo "cannot parse order 42" >&2; exit 65 ;;
  *) if [ "$MAILROOM_ATTEMPT" -ge 2 ]; then exit 0; fi; echo "database is down" >&2; exit 1 ;;
esac
"#;

/// Exit 0 is `done`, exit 65 is `dead` at once with the stderr tail as
/// `last_error`, any other exit is retried; the program gets the payload on
/// stdin and the envelope in `MAILROOM_*` variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_handler_maps_exit_codes_to_outcomes() {
    let db = Db::fresh().await;
    // `sh -c SCRIPT PREFIX`: the script sees PREFIX as $0 and writes beside it.
    let prefix = db.dir.path().join("seen");
    let config_text = format!(
        r#"
[[source]]
name = "jobs"
topic = "jobs"

[[topic]]
name = "jobs"
retry = {{ max_attempts = 5, schedule = ["50ms"] }}
handler = {{ command = ["sh", "-c", {script}, {prefix}] }}
"#,
        // `$$` is the config's escape for a literal `$`.
        script = toml_string(&SCRIPT.replace('$', "$$")),
        prefix = toml_string(&prefix.display().to_string()),
    );
    let config = Config::from_toml("mailroom.toml", &config_text, &|_| None).expect("config");
    let server = start_with(db, "127.0.0.1:0", ServerOptions::default(), |store| {
        Specs::from_config(&config)
            .expect("specs from config")
            .into_builder(store)
            .poll_interval(Duration::from_millis(200))
    })
    .await;
    let seen = |id: &str| {
        std::fs::read_to_string(format!("{}.{id}", prefix.display())).unwrap_or_default()
    };

    let ok = server.accept("jobs", "job-ok", &json!({"do": "ok"})).await;
    let done = server.event_with_status(&ok, "done").await;
    assert_eq!(outcomes(&done), ["done"]);
    assert_eq!(
        seen(&ok),
        "jobs|jobs|job-ok|1|{\"do\":\"ok\"}\n",
        "payload on stdin, envelope in the environment"
    );

    let bad = server
        .accept("jobs", "job-bad", &json!({"do": "bad"}))
        .await;
    let dead = server.event_with_status(&bad, "dead").await;
    assert_eq!(dead["attempts"], 1, "exit 65 is never retried");
    assert_eq!(outcomes(&dead), ["dead"]);
    let error = dead["last_error"].as_str().expect("last_error");
    assert!(error.contains("65"), "{error}");
    assert!(
        error.contains("cannot parse order 42"),
        "stderr tail: {error}"
    );

    let flaky = server
        .accept("jobs", "job-flaky", &json!({"do": "later"}))
        .await;
    let done = server.event_with_status(&flaky, "done").await;
    assert_eq!(outcomes(&done), ["retry", "done"]);
    let first = done["history"][0]["error"].as_str().expect("error");
    assert!(first.contains("exit code 1"), "{first}");
    assert!(first.contains("database is down"), "{first}");
    assert_eq!(
        seen(&flaky),
        "jobs|jobs|job-flaky|1|{\"do\":\"later\"}\njobs|jobs|job-flaky|2|{\"do\":\"later\"}\n"
    );
    server.stop().await;
}

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
