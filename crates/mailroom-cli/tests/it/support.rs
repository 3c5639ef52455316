//! The `mailroom` binary under test, through `mailroom-testkit`'s harness:
//! these start this build's binary and fail the test when the harness
//! cannot do what it was asked.

#![allow(dead_code)] // each test module uses its own part of this module

use mailroom_testkit::harness;
pub use mailroom_testkit::harness::{Receiver, Recorder, Serve};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use mailroom_testkit::harness::{rand_below, wait_all_done};

/// This build's `mailroom`.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_mailroom"))
}

/// `mailroom --config <config> serve` on `store_url`, listening.
pub fn serve(config: &Path, store_url: &str) -> Serve {
    Serve::start(bin(), config, store_url).expect("mailroom serve")
}

/// The quick start: `mailroom serve` with no config file, run in `dir`.
pub fn serve_quick(dir: &Path, store_url: &str) -> Serve {
    Serve::start_quick(bin(), dir, store_url).expect("mailroom serve")
}

/// Runs `mailroom --config <config> <args...>` to completion (at most
/// `limit`), with `MAILROOM_STORE_URL=store_url`; (success, stdout, stderr).
pub fn run_mailroom(
    config: &Path,
    store_url: &str,
    args: &[&str],
    limit: Duration,
) -> (bool, String, String) {
    let ran = harness::run(bin(), config, store_url, args, limit).expect("mailroom");
    (ran.success, ran.stdout, ran.stderr)
}

/// A handler endpoint that answers every call 200 after up to `max_delay`
/// (zero: at once), recording each call in the returned [`Recorder`].
pub async fn receiver(max_delay: Duration) -> (Receiver, Recorder) {
    let rec = Recorder::new();
    let receiver = Receiver::start_jittered(rec.clone(), max_delay)
        .await
        .expect("receiver");
    (receiver, rec)
}

/// Writes `mailroom.toml` into `dir` and returns its path. A configuration
/// the loader accepts must also validate against the file's JSON Schema
/// (`mailroom config schema`), so every test's configuration checks it.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    schema_accepts_what_loads(text);
    harness::write_config(dir, text).expect("write config")
}

/// Panics when the loader accepts `text` (every `${VAR}` set) and the
/// schema refuses it. Files the loader refuses (the error-path tests) are
/// left to the loader's own messages.
fn schema_accepts_what_loads(text: &str) {
    let any = |_: &str| Some("x".to_owned());
    if mailroom_config::Config::from_toml("mailroom.toml", text, &any).is_err() {
        return;
    }
    let schema = mailroom_config::schema::schema();
    let validator = jsonschema::draft202012::new(&schema).expect("the schema compiles");
    let table: toml::Table = toml::from_str(text).expect("TOML the loader read");
    let instance = serde_json::to_value(table).expect("JSON");
    let errors: Vec<String> = validator
        .iter_errors(&instance)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "the configuration schema refuses a file the loader accepts: {errors:#?}\n{text}"
    );
}
