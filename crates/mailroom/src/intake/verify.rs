//! Signature verification of webhook sources, delegated to
//! `mailroom-signatures` (every scheme of SPEC §6, constant-time, several
//! secrets for rotation), and the `preset = "..."` shortcut that fills in
//! scheme, dedup key and event type for known providers.

use super::IntakeError;
use crate::config::{Config, ConfigError, SourceConfig};
use crate::topology::{Field, SourceSpec};
use http::HeaderMap;
use mailroom_signatures::{Encoding, Preset, Scheme, Verifier};

/// Verification comes first (SPEC §12): a request that fails gets 401 and
/// learns nothing about stored events.
pub fn check(source: &SourceSpec, headers: &HeaderMap, body: &[u8]) -> Result<(), IntakeError> {
    match &source.verifier {
        None => Ok(()),
        Some(v) => v
            .verify(headers, body, jiff::Timestamp::now().as_second())
            .map_err(IntakeError::Unauthorized),
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
pub(crate) fn configure(
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
    v: &crate::config::VerifyConfig,
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
