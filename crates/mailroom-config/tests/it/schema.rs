//! The JSON Schema of `mailroom.toml` (`mailroom config schema`) accepts
//! what the loader accepts and refuses what it refuses: the configuration
//! files the repository ships, one valid file per value format, and a set
//! of wrong files, each also put to the loader itself.

use mailroom_config::{Config, Specs};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft202012::new(&mailroom_config::schema::schema()).expect("the schema compiles")
}

/// The file as the JSON a schema validator (or an editor) sees.
fn json_of(text: &str) -> Value {
    let table: toml::Table = toml::from_str(text).expect("TOML");
    serde_json::to_value(table).expect("JSON")
}

/// The schema's verdict: the errors, each with where it is.
fn schema_errors(validator: &jsonschema::Validator, text: &str) -> Vec<String> {
    validator
        .iter_errors(&json_of(text))
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The loader's verdict: the file read, then turned into the topology (as
/// `mailroom config check` does), with every variable set.
fn loads(text: &str) -> Result<(), String> {
    let env = |name: &str| {
        Some(match name {
            "MODE" => "sequential".to_owned(),
            "TIMEOUT" => "5s".to_owned(),
            "KIND" => "fanout".to_owned(),
            _ => format!("value-of-{name}"),
        })
    };
    let config = Config::from_toml("mailroom.toml", text, &env).map_err(|e| e.to_string())?;
    Specs::from_config(&config).map_err(|e| e.to_string())?;
    Ok(())
}

/// Every configuration file the repository ships validates: the annotated
/// example, the examples directory, the fuzzer's seed corpus.
#[test]
fn the_shipped_configurations_validate() {
    let validator = validator();
    let mut files = vec![repo().join("mailroom.example.toml")];
    for dir in ["examples", "fuzz/corpus/config"] {
        files.extend(toml_files(&repo().join(dir)));
    }
    assert!(
        files.len() >= 4,
        "the shipped files were not found: {files:?}"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        let errors = schema_errors(&validator, &text);
        assert!(errors.is_empty(), "{}: {errors:#?}", file.display());
    }
}

fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a directory").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(toml_files(&path));
        } else if path.extension().is_some_and(|e| e == "toml") {
            found.push(path);
        }
    }
    found
}

/// Files the loader accepts, one per value format and spelling (durations,
/// sizes, rates, names, interpolated strings, the shapes of `command`,
/// `bind` and `api_token`): the schema accepts each too.
#[test]
fn what_the_loader_accepts_validates() {
    let validator = validator();
    let accepted = [
        "",
        "listen = \"0.0.0.0:8080\"\napi_token = [\"0123456789abcdef0123456789abcdef\", \"${NEXT}\"]\n",
        "[store]\nurl = \"postgres://u@h/db\"\ndirect_url = \"postgres://u@h:5432/db\"\nmigrate = \"never\"\ngroup_commit = false\n",
        "[retention]\ndone = \"1.5h\"\ndead = \" 30d \"\ndedup = \"500ms\"\n",
        "[limits]\nmax_header_bytes = \"16KiB\"\napi_max_body = 1048576\nheader_read_timeout = \"10 s\"\n",
        "[limits]\napi_max_body = \"2 mb\"\nmax_header_bytes = \"8k\"\n",
        "[alerts]\nfailure_rate = 0.5\nprocessing_time = \"${TIMEOUT}\"\nnotify = { http = { url = \"https://h/a\", secret = \"s\", timeout = \"3s\" } }\n",
        "[[topic]]\nname = \"t\"\nmode = \"${MODE}\"\nkey = \"/k\"\ntimeout = \"${TIMEOUT}\"\nrate = \"50/s\"\nmax_running = 2\nexpire_after = \"1d\"\nretry = { schedule = [\"1s\", \"5m\"] }\nhandler = { command = [\"true\"] }\n",
        "[[topic]]\nname = \"t\"\nmode = \"batch\"\nbatch = { max_size = 10, max_wait = \"2s\" }\nhandler = { command = { argv = [\"cat\"], env = [\"HOME\"] } }\n",
        "[[topic]]\nname = \"t\"\nrate = \"3/h\"\nretry = { max_attempts = 3, base = \"1s\", factor = 3.0, max_delay = \"1m\", jitter = 0.1 }\nhandler = { http = { url = \"http://127.0.0.1:9/h\", headers = { x = \"y\" }, permanent_statuses = [404, 410] } }\n",
        "[[source]]\nname = \"s\"\nrate_limit = \"100/minute\"\nmax_body = \"512KiB\"\nid = { header = \"x-id\" }\nverify = { scheme = \"hmac\", header = \"x-sig\", secret = \"k\", encoding = \"base64\", prefix = \"sha256=\", tolerance = \"5m\" }\n",
        "[[source]]\nname = \"stripe\"\npreset = \"stripe\"\nverify = { secret = \"${STRIPE}\" }\n",
        "[amqp]\nurl = \"amqp://h\"\n[[amqp.exchange]]\nname = \"e\"\nkind = \"${KIND}\"\n[[amqp.queue]]\nname = \"q\"\nttl = \"7d\"\ndead_letter = true\nbind = { exchange = \"e\", routing_key = \"a.#\" }\n[[amqp.queue]]\nname = \"r\"\nbind = [{ exchange = \"e\" }, { exchange = \"e\", routing_key = \"b\" }]\n",
    ];
    let mut wrong = Vec::new();
    for text in accepted {
        if let Err(e) = loads(text) {
            wrong.push(format!("the loader refuses {text:?}: {e}"));
        }
        let errors = schema_errors(&validator, text);
        if !errors.is_empty() {
            wrong.push(format!("the schema refuses {text:?}: {errors:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Wrong files (an unknown key, a wrong type, a malformed duration, size or
/// rate, an unknown name) are refused by the loader and by the schema.
#[test]
fn wrong_files_fail_the_schema_as_they_fail_the_loader() {
    let validator = validator();
    let refused = [
        "lisen = \"127.0.0.1:8080\"\n",
        "[store]\ngroup_commit = \"yes\"\n",
        "[[topic]]\nname = [\"t\"]\n",
        "[store]\nmigrate = \"sometimes\"\n",
        "[retention]\ndone = 7\n",
        "[retention]\ndone = \"7 days\"\n",
        "[retention]\ndone = \"1.2.3s\"\n",
        "[limits]\napi_max_body = \"1GB\"\n",
        "[limits]\nmax_headers = -1\n",
        "[[topic]]\nname = \"t\"\nmode = \"parallel\"\n",
        "[[topic]]\nname = \"t\"\nrate = \"0/s\"\n",
        "[[topic]]\nname = \"t\"\nrate = \"5/d\"\n",
        "[[topic]]\nname = \"t\"\nretry = { schedule = [\"1s\", \"soon\"] }\n",
        "[[topic]]\nname = \"t\"\nhandler = { command = \"true\" }\n",
        "[[topic]]\nname = \"t\"\nhandler = { command = { program = \"true\" } }\n",
        "[[topic]]\nname = \"t\"\non_dead = \"retry\"\n",
        "[[topic]]\nkey = \"/k\"\n",
        "[[source]]\nname = \"s\"\nrate_limit = \"100/day\"\n",
        "[[source]]\nname = \"s\"\npreset = \"paypal\"\nverify = { secret = \"k\" }\n",
        "[[source]]\nname = \"s\"\nverify = { scheme = \"md5\", secret = \"k\" }\n",
        "[[source]]\nname = \"s\"\nverify = { scheme = \"hmac\", header = \"h\", secret = \"k\", encoding = \"base32\" }\n",
        "[amqp]\nurl = \"amqp://h\"\n[[amqp.exchange]]\nname = \"e\"\nkind = \"x-delayed-message\"\n",
        "[amqp]\nurl = \"amqp://h\"\n[[amqp.queue]]\nname = \"q\"\nbind = { queue = \"q\" }\n",
    ];
    let mut wrong = Vec::new();
    for text in refused {
        if loads(text).is_ok() {
            wrong.push(format!("the loader accepts {text:?}"));
        }
        if schema_errors(&validator, text).is_empty() {
            wrong.push(format!("the schema accepts {text:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The schema names its dialect and documents every top-level key, with
/// the defaults the loader uses.
#[test]
fn the_schema_names_its_dialect_and_the_defaults() {
    let schema = mailroom_config::schema::schema();
    assert_eq!(schema["$schema"], mailroom_config::schema::DIALECT);
    let props = schema["properties"].as_object().expect("properties");
    for key in [
        "listen",
        "api_token",
        "store",
        "retention",
        "source",
        "topic",
        "amqp",
        "tls",
    ] {
        let description = props[key]["description"].as_str().unwrap_or("");
        assert!(!description.is_empty(), "{key} has no description");
    }
    let defaults = Config::from_toml("m", "", &|_| None).expect("defaults");
    assert_eq!(props["listen"]["default"], defaults.listen.as_str());
    let store = &schema["$defs"]["StoreConfig"]["properties"];
    assert_eq!(store["url"]["default"], defaults.store.url.as_str());
    let retention = &schema["$defs"]["RetentionConfig"]["properties"];
    assert_eq!(retention["done"]["default"], "7d");
}
