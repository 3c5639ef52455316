//! Feeds arbitrary text to `mailroom_config::Config::from_toml` (TOML
//! syntax, `${VAR}` interpolation, `MAILROOM_*` overrides, typed
//! deserialization) and every accepted configuration to
//! `Specs::from_config` (the validation and handler building `serve` and
//! `config check` do).
//!
//! Invariants checked: it never panics; every refusal is a typed
//! `ConfigError` that names its file and has a message. (Messages may echo
//! a value, interpolated or not, so no secret check here: the `verify`
//! target checks the signature errors, which meet secrets.)
//!
//! Input: the bytes as TOML text (not UTF-8: skipped, as `read_to_string`
//! refuses it before the parser).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mailroom_config::Config;
use mailroom_config::Specs;

fn env(name: &str) -> Option<String> {
    match name {
        "SECRET" => Some("fuzz-secret".to_owned()),
        "EMPTY" => Some(String::new()),
        "PORT" => Some("8080".to_owned()),
        "MAILROOM_STORE_URL" => Some("sqlite://fuzz.db".to_owned()),
        _ => None,
    }
}

fn refused(err: &mailroom_config::ConfigError) {
    let text = err.to_string();
    assert!(text.contains("fuzz.toml"), "error does not name the file: {text}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let config = match Config::from_toml("fuzz.toml", text, &env) {
        Ok(c) => c,
        Err(e) => return refused(&e),
    };
    if let Err(e) = config.listen_addr() {
        refused(&e);
    }
    if let Err(e) = Specs::from_config(&config) {
        refused(&e);
    }
});
