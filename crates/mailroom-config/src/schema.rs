//! The JSON Schema (draft 2020-12) of `mailroom.toml`, printed by
//! `mailroom config schema` for editors (taplo's `#:schema` directive) and
//! checks. It is derived from the [`file`](crate::file) types, so every key,
//! type, default and description comes from the code that reads the file;
//! the value formats the types read by hand (durations, byte sizes, rates,
//! and names checked after parsing) are written here, each accepting what
//! the loader accepts.
//!
//! Every string may hold `${VAR}` or `${file:PATH}`, replaced before the
//! value is read: a string with `${` in it is therefore accepted wherever
//! a formatted string is expected (what it becomes is only known at load).
//! Numbers and booleans are never interpolated.

use crate::file::{ByteSize, Config};
use crate::interpolated::INTERPOLATED;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde_json::Value;
use std::borrow::Cow;

/// The dialect of [`schema`]: JSON Schema draft 2020-12.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// The JSON Schema of the configuration file, as a JSON value.
pub fn schema() -> Value {
    let generator = SchemaSettings::draft2020_12().into_generator();
    let mut root = generator.into_root_schema_for::<Config>();
    root.insert("title".into(), "mailroom.toml".into());
    let mut value = root.to_value();
    drop_nulls(&mut value);
    value
}

/// TOML has no null: the `null` alternatives schemars adds to optional
/// keys, and their `null` defaults, are left out.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("default") == Some(&Value::Null) {
                map.remove("default");
            }
            if let Some(Value::Array(types)) = map.get_mut("type") {
                types.retain(|t| t != "null");
                if types.len() == 1 {
                    let only = types.remove(0);
                    map.insert("type".into(), only);
                }
            }
            for key in ["anyOf", "oneOf"] {
                let Some(Value::Array(options)) = map.get_mut(key) else {
                    continue;
                };
                options.retain(|o| o.get("type").is_none_or(|t| t != "null"));
                if options.len() == 1 {
                    let Some(Value::Object(only)) = options.pop() else {
                        continue;
                    };
                    map.remove(key);
                    for (k, v) in only {
                        map.entry(k).or_insert(v);
                    }
                }
            }
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// A string matching `pattern`, or one that interpolation fills in.
fn formatted(pattern: &str, description: &str) -> Schema {
    json_schema!({
        "type": "string",
        "pattern": format!("^(?:{pattern})$|{INTERPOLATED}"),
        "description": description,
    })
}

/// One of `names`, or a string that interpolation fills in.
fn one_of(names: &[&str], description: &str) -> Schema {
    json_schema!({
        "description": description,
        "anyOf": [
            { "enum": names },
            { "type": "string", "pattern": INTERPOLATED },
        ],
    })
}

/// A duration: a number and a unit (`ms`, `s`, `m`, `h`, `d`), as
/// `mailroom::duration::parse` reads it.
#[derive(Debug)]
pub(crate) struct DurationText;

impl JsonSchema for DurationText {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        formatted(
            r"\s*(?:[0-9]+\.?[0-9]*|\.[0-9]+)\s*(?:ms|s|m|h|d)\s*",
            "A duration: a number and a unit, `ms`, `s`, `m`, `h` or `d` (`\"500ms\"`, `\"30s\"`, `\"1.5h\"`, `\"7d\"`); at most 100 years.",
        )
    }
}

impl JsonSchema for ByteSize {
    fn schema_name() -> Cow<'static, str> {
        "ByteSize".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A size in bytes: an integer, or a number with a unit, `B`, `KB` (1000), `KiB` or `K` (1024), `MB` (1000²), `MiB` or `M` (1024²), in any case (`\"512KiB\"`, `\"1MiB\"`).",
            "anyOf": [
                { "type": "integer", "minimum": 0 },
                {
                    "type": "string",
                    "pattern": format!(r"^\s*[0-9]+\s*(?:[bB]|[kK](?:[iI]?[bB])?|[mM](?:[iI]?[bB])?)?\s*$|{INTERPOLATED}"),
                },
            ],
        })
    }
}

/// A topic's `rate`: `<n>/s`, `<n>/m` or `<n>/h`.
#[derive(Debug)]
pub(crate) struct TopicRate;

impl JsonSchema for TopicRate {
    fn schema_name() -> Cow<'static, str> {
        "Rate".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        formatted(
            r"\s*\+?[0-9]*[1-9][0-9]*\s*/\s*[smh]\s*",
            "Attempts started per second, minute or hour: `\"<n>/s\"`, `\"<n>/m\"` or `\"<n>/h\"`, n at least 1.",
        )
    }
}

/// A source's `rate_limit`: `<n>/s`, `<n>/m` or `<n>/h` (or the unit
/// spelled `sec`, `second`, `min`, `minute`, `hour`).
#[derive(Debug)]
pub(crate) struct RequestRate;

impl JsonSchema for RequestRate {
    fn schema_name() -> Cow<'static, str> {
        "RequestRate".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        formatted(
            r"\s*\+?[0-9]*[1-9][0-9]*\s*/\s*(?:s|sec|second|m|min|minute|h|hour)\s*",
            "Requests accepted per second, minute or hour: `\"<n>/s\"`, `\"<n>/m\"` or `\"<n>/h\"` (also `sec`, `second`, `min`, `minute`, `hour`), n at least 1.",
        )
    }
}

/// The signature schemes `verify.scheme` names.
pub(crate) const SCHEMES: [&str; 7] = [
    "standard-webhooks",
    "stripe",
    "github",
    "shopify",
    "slack",
    "token",
    "hmac",
];

/// `verify.scheme`.
#[derive(Debug)]
pub(crate) struct SchemeName;

impl JsonSchema for SchemeName {
    fn schema_name() -> Cow<'static, str> {
        "Scheme".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        one_of(
            &SCHEMES,
            "A signature scheme; `token` and `hmac` also need `header`.",
        )
    }
}

/// `preset`: the provider presets of `mailroom-signatures`.
#[derive(Debug)]
pub(crate) struct PresetName;

impl JsonSchema for PresetName {
    fn schema_name() -> Cow<'static, str> {
        "Preset".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let names: Vec<&str> = mailroom_signatures::Preset::ALL
            .into_iter()
            .map(mailroom_signatures::Preset::name)
            .collect();
        one_of(
            &names,
            "A webhook provider whose signature scheme, dedup key and event type are known.",
        )
    }
}

/// `verify.encoding` of the `hmac` scheme.
#[derive(Debug)]
pub(crate) struct EncodingName;

impl JsonSchema for EncodingName {
    fn schema_name() -> Cow<'static, str> {
        "Encoding".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        one_of(&["hex", "base64"], "How an `hmac` signature is written.")
    }
}

/// `[[amqp.exchange]] kind`.
#[derive(Debug)]
pub(crate) struct ExchangeKind;

/// The exchange kinds `[[amqp.exchange]] kind` names.
pub(crate) const EXCHANGE_KINDS: [&str; 4] = ["topic", "direct", "fanout", "headers"];

impl JsonSchema for ExchangeKind {
    fn schema_name() -> Cow<'static, str> {
        "ExchangeKind".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        one_of(&EXCHANGE_KINDS, "A RabbitMQ exchange type.")
    }
}

/// `[[amqp.queue]] type`.
#[derive(Debug)]
pub(crate) struct QueueTypeName;

impl JsonSchema for QueueTypeName {
    fn schema_name() -> Cow<'static, str> {
        "QueueTypeName".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        one_of(&["classic", "quorum", "stream"], "A RabbitMQ queue type.")
    }
}

/// `[[amqp.queue]] overflow`.
#[derive(Debug)]
pub(crate) struct OverflowName;

impl JsonSchema for OverflowName {
    fn schema_name() -> Cow<'static, str> {
        "OverflowName".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        one_of(
            &["drop-head", "reject-publish", "reject-publish-dlx"],
            "What a full RabbitMQ queue does with a new message.",
        )
    }
}
