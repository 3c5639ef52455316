//! `[[source]]` → [`SourceSpec`]: where the dedup key, type and ordering key
//! live, and the `preset` / `verify` settings turned into a verifier.

use crate::error::ConfigError;
use crate::file::{Config, FieldConfig, SourceConfig, VerifyConfig};
use mailroom::topology::DEFAULT_MAX_BODY;
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
