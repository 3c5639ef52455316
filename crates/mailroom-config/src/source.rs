//! `[[source]]` → [`SourceSpec`]: where the dedup key, type and ordering key
//! live, and the `preset` / `verify` settings turned into a verifier.

use crate::error::ConfigError;
use crate::file::{Config, FieldConfig, SourceConfig, VerifyConfig};
use mailroom::spec::DEFAULT_MAX_BODY;
use mailroom::{Field, SourceSpec};
use mailroom_signatures::{Encoding, Preset, Scheme, Verifier};

/// The spec of `source[idx]`, validated.
pub(crate) fn source_spec(
    s: &SourceConfig,
    idx: usize,
    cfg: &Config,
) -> Result<SourceSpec, ConfigError> {
    let at = |k: &str| format!("source[{idx}].{k}");
    let field_at =
        |f: &Option<FieldConfig>, k: &str| f.as_ref().map(|f| field(f, &at(k), cfg)).transpose();
    let mut spec = SourceSpec {
        name: s.name.clone(),
        topic: s.topic.clone().unwrap_or_else(|| s.name.clone()),
        id: field_at(&s.id, "id")?.into_iter().collect(),
        event_type: field_at(&s.event_type, "type")?,
        key: field_at(&s.key, "key")?,
        deliver_at: field_at(&s.deliver_at, "deliver_at")?,
        priority: field_at(&s.priority, "priority")?,
        version: field_at(&s.version, "version")?,
        verifier: None,
        max_body: s.max_body.map(|b| b.0).unwrap_or(DEFAULT_MAX_BODY),
        rate_limit: s
            .rate_limit
            .as_deref()
            .map(|r| r.parse().map_err(|m| cfg.invalid(at("rate_limit"), m)))
            .transpose()?,
    };
    spec.validate().map_err(|error| ConfigError::Source {
        file: cfg.origin.clone(),
        key: at(error.key()),
        error,
    })?;
    configure_verify(&mut spec, s, &at, cfg)?;
    Ok(spec)
}

/// `{ header = "..." }` or `{ json = "/pointer" }`, at `key`.
pub(crate) fn field(c: &FieldConfig, key: &str, cfg: &Config) -> Result<Field, ConfigError> {
    match (&c.header, &c.json) {
        (Some(h), None) => {
            let field = Field::Header(h.clone());
            field
                .validate()
                .map_err(|e| cfg.invalid(key, e.to_string()))?;
            Ok(field)
        }
        (None, Some(p)) => Field::json(p).map_err(|e| cfg.invalid(key, e.to_string())),
        _ => Err(cfg.invalid(
            key,
            "give exactly one of `header = \"...\"` or `json = \"/pointer\"`",
        )),
    }
}

fn preset_field(f: mailroom_signatures::Field) -> Option<Field> {
    match f {
        mailroom_signatures::Field::Header(h) => Some(Field::Header(h.to_string())),
        mailroom_signatures::Field::Json(p) => Some(Field::Json(p.to_string())),
        mailroom_signatures::Field::BodySha256 => Some(Field::BodySha256),
        _ => None,
    }
}

/// Applies `preset` and `verify` of a `[[source]]` to its spec.
fn configure_verify(
    spec: &mut SourceSpec,
    s: &SourceConfig,
    at: &dyn Fn(&str) -> String,
    cfg: &Config,
) -> Result<(), ConfigError> {
    let preset = s
        .preset
        .as_deref()
        .map(|p| {
            p.parse::<Preset>()
                .map_err(|e| cfg.invalid(at("preset"), e.to_string()))
        })
        .transpose()?;
    if let Some(p) = preset {
        if spec.id.is_empty() {
            spec.id = p.dedup().iter().copied().filter_map(preset_field).collect();
        }
        if spec.event_type.is_none() {
            spec.event_type = p.event_type().and_then(preset_field);
        }
    }
    let Some(v) = &s.verify else {
        if let Some(p) = preset {
            return Err(cfg.invalid(
                at("verify"),
                format!("preset {p} needs its secret: verify = {{ secret = \"${{...}}\" }}"),
            ));
        }
        return Ok(());
    };
    let scheme = match (v.scheme.as_deref(), preset) {
        (Some(name), _) => scheme_named(name, v, at, cfg)?,
        (None, Some(p)) => p.scheme(),
        (None, None) => {
            return Err(cfg.invalid(
                at("verify.scheme"),
                "missing: one of standard-webhooks, stripe, github, shopify, slack, token, hmac (or set a preset)",
            ));
        }
    };
    let mut secrets = v.secrets.clone().unwrap_or_default();
    secrets.extend(v.secret.clone());
    secrets.retain(|s| !s.is_empty());
    let tolerance = v
        .tolerance
        .unwrap_or(mailroom_signatures::DEFAULT_TOLERANCE);
    let verifier = Verifier::new(scheme, secrets, tolerance)
        .map_err(|e| cfg.invalid(at("verify"), e.to_string()))?;
    spec.verifier = Some(verifier);
    Ok(())
}

fn scheme_named(
    name: &str,
    v: &VerifyConfig,
    at: &dyn Fn(&str) -> String,
    cfg: &Config,
) -> Result<Scheme, ConfigError> {
    let header = || {
        v.header.clone().ok_or_else(|| {
            cfg.invalid(at("verify.header"), format!("scheme {name} needs `header`"))
        })
    };
    Ok(match name {
        "standard-webhooks" => Scheme::StandardWebhooks,
        "stripe" => Scheme::Stripe,
        "github" => Scheme::GitHub,
        "shopify" => Scheme::Shopify,
        "slack" => Scheme::Slack,
        "token" => Scheme::Token { header: header()? },
        "hmac" => Scheme::Hmac {
            header: header()?,
            prefix: v.prefix.clone().filter(|p| !p.is_empty()),
            encoding: match v.encoding.as_deref() {
                None => Encoding::Hex,
                Some(e) => e
                    .parse::<Encoding>()
                    .map_err(|err| cfg.invalid(at("verify.encoding"), err.to_string()))?,
            },
        },
        other => {
            return Err(cfg.invalid(
                at("verify.scheme"),
                format!("unknown scheme {other:?}: expected standard-webhooks, stripe, github, shopify, slack, token or hmac"),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use crate::{Config, Specs};
    use serde_json::Value;

    /// A kind's table: its keys and values.
    type Table = &'static [(&'static str, &'static str)];

    /// The keys that choose a source's kind, each with the table that makes
    /// a minimal source of that kind (`None`: a webhook source).
    const KINDS: &[(&str, Option<Table>)] = &[
        ("webhook", None),
        (
            "amqp",
            Some(&[("url", r#""amqp://a/%2f""#), ("queue", r#""q""#)]),
        ),
    ];

    /// Every other `[[source]]` key with a valid value, and what must be
    /// beside it in both files compared (so the key alone makes the
    /// difference).
    const SAMPLES: &[(&str, &str, &str)] = &[
        ("topic", r#""elsewhere""#, ""),
        (
            "preset",
            r#""github""#,
            r#"verify = { scheme = "github", secret = "s" }"#,
        ),
        ("id", r#"{ json = "/business_id" }"#, ""),
        ("type", r#"{ header = "x-type" }"#, ""),
        ("key", r#"{ json = "/customer" }"#, ""),
        ("deliver_at", r#"{ header = "x-deliver-at" }"#, ""),
        ("priority", r#"{ json = "/priority" }"#, ""),
        ("version", r#"{ header = "x-schema-version" }"#, ""),
        (
            "verify",
            r#"{ scheme = "token", header = "x-token", secret = "s" }"#,
            "",
        ),
        ("max_body", r#""64KiB""#, ""),
        ("rate_limit", r#""10/s""#, ""),
    ];

    /// The kinds' own keys (`amqp = { ... }`) with a valid value other
    /// than the minimal source's.
    const KIND_SAMPLES: &[(&str, &str, &str)] = &[
        ("amqp", "url", r#""amqp://b/%2f""#),
        ("amqp", "queue", r#""other""#),
        ("amqp", "prefetch", "50"),
    ];

    /// The object `value` is, or the one its `$ref` names.
    fn resolve<'a>(schema: &'a Value, value: &'a Value) -> &'a Value {
        match value.get("$ref").and_then(Value::as_str) {
            Some(r) => schema
                .pointer(r.trim_start_matches('#'))
                .unwrap_or_else(|| panic!("{r} resolves")),
            None => value,
        }
    }

    fn keys(schema: &Value, object: &Value) -> Vec<String> {
        let props = resolve(schema, object)
            .get("properties")
            .and_then(Value::as_object)
            .expect("an object with properties");
        props.keys().cloned().collect()
    }

    /// The specs built from `toml`, printed, or the load error.
    fn load(toml: &str) -> Result<String, String> {
        let config = Config::from_toml("m.toml", toml, &|_| None).map_err(|e| e.to_string())?;
        Specs::from_config(&config)
            .map(|t| format!("{t:?}"))
            .map_err(|e| e.to_string())
    }

    /// A `[[source]]` named `s` with `lines`, of `kind` with its table
    /// (one key's value replaced by `over`).
    fn source(kind: (&str, Option<Table>), over: Option<(&str, &str)>, lines: &[String]) -> String {
        let mut toml = "[[source]]\nname = \"s\"\n".to_string();
        for l in lines.iter().filter(|l| !l.is_empty()) {
            toml += l;
            toml += "\n";
        }
        if let (name, Some(table)) = kind {
            let mut pairs: Vec<(&str, &str)> = table
                .iter()
                .copied()
                .filter(|(k, _)| over.is_none_or(|(o, _)| o != *k))
                .collect();
            pairs.extend(over);
            let inner: Vec<String> = pairs.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            toml += &format!("{name} = {{ {} }}\n", inner.join(", "));
        }
        toml
    }

    /// Every key the configuration schema allows on a `[[source]]`, for
    /// every source kind, is either carried into what the runtime is built
    /// from (the built topology differs with it set) or refused at load
    /// naming it: no key is accepted and ignored. A key the schema gains
    /// fails this test until it is classified here.
    #[test]
    fn every_source_key_is_honoured_or_refused_for_every_kind() {
        let schema = crate::schema::schema();
        let source_def = resolve(&schema, &schema["properties"]["source"]["items"]);
        let mut expected: Vec<String> = ["name".to_string()]
            .into_iter()
            .chain(
                KINDS
                    .iter()
                    .filter(|(_, t)| t.is_some())
                    .map(|(k, _)| k.to_string()),
            )
            .chain(SAMPLES.iter().map(|(k, _, _)| k.to_string()))
            .collect();
        expected.sort();
        let mut found = keys(&schema, source_def);
        found.sort();
        assert_eq!(
            found, expected,
            "the schema's [[source]] keys and this test's differ: classify the new key"
        );
        let mut verdicts = vec![];
        for &(kind, table) in KINDS {
            for (key, value, beside) in SAMPLES {
                let base = source((kind, table), None, &[beside.to_string()]);
                let with = source(
                    (kind, table),
                    None,
                    &[beside.to_string(), format!("{key} = {value}")],
                );
                let verdict = match load(&with) {
                    Err(e) => {
                        assert!(
                            e.starts_with(&format!("m.toml: source[0].{key}")),
                            "{kind}: `{key}` is refused, but not at its key:\n{with}\n=> {e}"
                        );
                        "refused"
                    }
                    Ok(built) => {
                        let without = load(&base).unwrap_or_else(|e| panic!("{base}\n=> {e}"));
                        assert_ne!(
                            built, without,
                            "{kind}: `{key}` is accepted and changes nothing:\n{with}"
                        );
                        "honoured"
                    }
                };
                verdicts.push(format!("{kind}.{key}: {verdict}"));
            }
            if table.is_none() {
                continue;
            }
            let kind_def = resolve(&schema, &source_def["properties"][kind]);
            let mut nested = keys(&schema, kind_def);
            nested.sort();
            let mut sampled: Vec<String> = KIND_SAMPLES
                .iter()
                .filter(|(k, _, _)| *k == kind)
                .map(|(_, key, _)| key.to_string())
                .collect();
            sampled.sort();
            assert_eq!(
                nested, sampled,
                "the schema's `{kind}` keys and this test's differ"
            );
            let minimal = source((kind, table), None, &[]);
            let without = load(&minimal).unwrap_or_else(|e| panic!("{minimal}\n=> {e}"));
            for (_, key, value) in KIND_SAMPLES.iter().filter(|(k, _, _)| *k == kind) {
                let with = source((kind, table), Some((key, value)), &[]);
                let built = load(&with).unwrap_or_else(|e| panic!("{with}\n=> {e}"));
                assert_ne!(
                    built, without,
                    "{kind}.{key} is accepted and changes nothing"
                );
            }
        }
        // The classification users read in the book, checked here.
        for must in [
            "amqp.id: honoured",
            "amqp.type: honoured",
            "amqp.deliver_at: honoured",
            "amqp.priority: honoured",
            "amqp.verify: refused",
            "webhook.deliver_at: honoured",
            "webhook.priority: honoured",
            "amqp.version: honoured",
            "webhook.version: honoured",
        ] {
            assert!(verdicts.iter().any(|v| v == must), "{must}: {verdicts:?}");
        }
    }
}
