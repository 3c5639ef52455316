//! The book's Reference pages (`docs/src/reference/`) are generated from
//! the code: the configuration page from the JSON Schema of
//! `mailroom config schema`, the HTTP API page from the OpenAPI document the
//! server serves, the command-line page from clap's definition, the metrics
//! page from `mailroom::metrics::ALL`. Each test renders its page and
//! compares it with the checked-in file, so a changed doc comment, flag,
//! route or metric fails here until the page is regenerated:
//!
//! ```text
//! MAILROOM_BLESS=1 cargo nextest run -p mailroom-cli --test it reference::
//! ```

mod cli;
mod config;
mod http_api;
mod markdown;
mod metrics;

use std::path::PathBuf;

/// The command that rewrites the pages.
const REGENERATE: &str = "MAILROOM_BLESS=1 cargo nextest run -p mailroom-cli --test it reference::";

/// `docs/src/reference/<page>`.
fn page_path(page: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/src/reference")
        .join(page)
}

/// The first line of every generated page.
fn generated_note(source: &str) -> String {
    format!("<!-- Generated from {source}; do not edit. Regenerate with `{REGENERATE}`. -->\n")
}

/// Compares `rendered` with the checked-in page, or writes it when
/// `MAILROOM_BLESS` is set.
fn check(page: &str, rendered: &str) {
    let path = page_path(page);
    if std::env::var_os("MAILROOM_BLESS").is_some_and(|v| !v.is_empty()) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("create the directory");
        std::fs::write(&path, rendered).expect("write the page");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != rendered {
        let line = current
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| current.lines().count().min(rendered.lines().count()));
        panic!(
            "docs/src/reference/{page} is stale (first difference at line {}): \
             the code it is generated from changed. Regenerate it with `{REGENERATE}` \
             and commit the page.\n  checked in: {:?}\n  generated:  {:?}",
            line + 1,
            current.lines().nth(line).unwrap_or("(end of file)"),
            rendered.lines().nth(line).unwrap_or("(end of file)"),
        );
    }
}

/// `reference/configuration.md` matches the configuration schema.
#[test]
fn configuration_page_is_current() {
    check("configuration.md", &config::render());
}

/// `reference/http-api.md` matches the served OpenAPI document.
#[tokio::test]
async fn http_api_page_is_current() {
    check("http-api.md", &http_api::render().await);
}

/// `reference/cli.md` matches the command line's definition.
#[test]
fn cli_page_is_current() {
    check("cli.md", &cli::render());
}

/// `reference/metrics.md` matches the metrics table.
#[test]
fn metrics_page_is_current() {
    check("metrics.md", &metrics::render());
}

/// The staleness check itself: a page that differs from what the code
/// renders fails, naming the page and the command that regenerates it.
#[test]
fn a_stale_page_fails_naming_the_page_and_the_fix() {
    if std::env::var_os("MAILROOM_BLESS").is_some() {
        return;
    }
    let rendered = format!("{}One more line.\n", metrics::render());
    let failure = std::panic::catch_unwind(|| check("metrics.md", &rendered))
        .expect_err("a page that differs must fail");
    let message = failure
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("docs/src/reference/metrics.md is stale"),
        "{message}"
    );
    assert!(message.contains(REGENERATE), "{message}");
}

/// `mailroom config schema` prints the JSON Schema the configuration page
/// is generated from, and reads no configuration to do so (a missing
/// `--config` file is no error).
#[test]
fn config_schema_prints_the_schema_without_a_configuration() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .args(["--config", "/nonexistent/mailroom.toml", "config", "schema"])
        .output()
        .expect("mailroom runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the output is JSON");
    assert_eq!(printed, mailroom_config::schema::schema());
    assert_eq!(
        printed["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
}
