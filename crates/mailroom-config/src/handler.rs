//! Builds a topic's built-in handler from `handler = {...}`.

use crate::amqp::{AmqpHandlerPlan, AmqpPlan};
use crate::error::ConfigError;
use crate::file::{Config, HandlerConfig, HttpHandlerConfig};
use mailroom::TopicSpec;
use mailroom::handler::SharedHandler;
use mailroom::handler::command::CommandHandler;
use mailroom::handler::http::{HttpHandler, HttpHandlerSettings, HttpTls};
use std::sync::Arc;

/// The built-in handler of `topic[idx]`; `Ok(None)` for pull topics. An
/// AMQP handler is also recorded in `amqp`, to be attached to its connection.
pub(crate) fn handler(
    h: &HandlerConfig,
    topic: &TopicSpec,
    idx: usize,
    cfg: &Config,
    amqp: &mut AmqpPlan,
) -> Result<Option<SharedHandler>, ConfigError> {
    let at = |k: &str| format!("topic[{idx}].handler{k}");
    let given = [
        h.http.is_some(),
        h.command.is_some(),
        h.amqp.is_some(),
        h.pull.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if given != 1 {
        return Err(cfg.invalid(
            at(""),
            "give exactly one of http = {...}, command = [...], amqp = {...}, pull = true",
        ));
    }
    if let Some(http) = &h.http {
        return Ok(Some(Arc::new(http_handler(http, topic, &at, cfg)?)));
    }
    if let Some(command) = &h.command {
        let handler = CommandHandler::new(command.argv().to_vec())
            .map_err(|m| cfg.invalid(at(".command"), m))?
            .pass_env(command.env())
            .map_err(|m| cfg.invalid(at(".command.env"), m))?;
        return Ok(Some(Arc::new(handler)));
    }
    if let Some(a) = &h.amqp {
        let (url, handler) = crate::amqp::handler(a, idx, cfg)?;
        amqp.handlers.push(AmqpHandlerPlan {
            url,
            topic: topic.name.clone(),
            handler: handler.clone(),
        });
        return Ok(Some(Arc::new(handler)));
    }
    match h.pull {
        Some(true) => Ok(None),
        _ => Err(cfg.invalid(at(".pull"), "only `pull = true` makes sense")),
    }
}

/// `handler = { http = {...} }`: an http(s) URL, a decodable secret, and a
/// timeout no longer than the topic's.
fn http_handler(
    http: &HttpHandlerConfig,
    topic: &TopicSpec,
    at: &dyn Fn(&str) -> String,
    cfg: &Config,
) -> Result<HttpHandler, ConfigError> {
    let url = reqwest::Url::parse(&http.url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| {
            cfg.invalid(
                at(".http.url"),
                format!(
                    "{:?} is not an http(s) URL",
                    mailroom::redact::url(&http.url)
                ),
            )
        })?;
    let secret = http
        .secret
        .as_deref()
        .map(HttpHandler::decode_secret)
        .transpose()
        .map_err(|m| cfg.invalid(at(".http.secret"), m))?;
    let timeout = http.timeout.unwrap_or(topic.timeout).min(topic.timeout);
    let tls = http_tls(http, at, cfg)?;
    HttpHandler::new(HttpHandlerSettings {
        url,
        timeout,
        secret,
        headers: http.headers.clone(),
        permanent_statuses: http
            .permanent_statuses
            .clone()
            .unwrap_or_else(|| HttpHandlerSettings::DEFAULT_PERMANENT_STATUSES.to_vec()),
        tls,
    })
    .map_err(|m| cfg.invalid(at(".http"), m))
}

/// `ca_file`, `client_cert` and `client_key`, read and checked now (at
/// start), so a missing or mismatched file stops `serve` naming its key.
fn http_tls(
    http: &HttpHandlerConfig,
    at: &dyn Fn(&str) -> String,
    cfg: &Config,
) -> Result<HttpTls, ConfigError> {
    use mailroom::tls;
    let mut out = HttpTls::default();
    if let Some(path) = &http.ca_file {
        let key = at(".http.ca_file");
        let (pem, certs) = tls::read_certs(path).map_err(|e| cfg.invalid(&key, e.to_string()))?;
        tls::check_ca(path, &certs).map_err(|e| cfg.invalid(&key, e.to_string()))?;
        out.ca_pem = Some(pem);
    }
    match (&http.client_cert, &http.client_key) {
        (None, None) => {}
        (Some(_), None) => {
            return Err(cfg.invalid(
                at(".http.client_key"),
                "client_cert needs client_key (the PEM private key of the certificate)",
            ));
        }
        (None, Some(_)) => {
            return Err(cfg.invalid(
                at(".http.client_cert"),
                "client_key needs client_cert (the PEM certificate it belongs to)",
            ));
        }
        (Some(cert_file), Some(key_file)) => {
            let (mut pem, certs) = tls::read_certs(cert_file)
                .map_err(|e| cfg.invalid(at(".http.client_cert"), e.to_string()))?;
            let (key_pem, key) = tls::read_key(key_file)
                .map_err(|e| cfg.invalid(at(".http.client_key"), e.to_string()))?;
            tls::certified_key(cert_file, certs, key_file, key)
                .map_err(|e| cfg.invalid(at(".http.client_key"), e.to_string()))?;
            // reqwest takes the chain and the key as one PEM text.
            if !pem.ends_with(b"\n") {
                pem.push(b'\n');
            }
            pem.extend_from_slice(&key_pem);
            out.identity_pem = Some(pem);
        }
    }
    Ok(out)
}
