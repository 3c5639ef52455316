//! The `http` handler (SPEC §5): POSTs the original payload bytes with the
//! original content type, signed per Standard Webhooks
//! (<https://www.standardwebhooks.com/>) so receivers verify with any
//! Standard Webhooks library, plus the `mailroom-*` envelope headers.
//!
//! Any 2xx is success; 410 (or a configured status) is permanent; anything
//! else is retried, at the time `Retry-After` asks for if present.

use super::{Handler, tail};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use mailroom_core::{Event, Outcome};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::time::Duration;

/// Settings of an HTTP handler.
#[derive(Debug, Clone)]
pub struct HttpHandlerSettings {
    /// Endpoint.
    pub url: reqwest::Url,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Signing key (decoded from `whsec_<base64>`, or the raw string's bytes).
    pub secret: Option<Vec<u8>>,
    /// Extra headers.
    pub headers: BTreeMap<String, String>,
    /// Statuses that mean "do not retry".
    pub permanent_statuses: Vec<u16>,
}

/// POSTs each event to an endpoint.
#[derive(Debug, Clone)]
pub struct HttpHandler {
    settings: HttpHandlerSettings,
    client: reqwest::Client,
    extra: reqwest::header::HeaderMap,
}

impl HttpHandler {
    /// Builds the handler; fails on invalid extra header names or values.
    pub fn new(settings: HttpHandlerSettings) -> Result<Self, String> {
        let mut extra = reqwest::header::HeaderMap::new();
        for (k, v) in &settings.headers {
            let name = reqwest::header::HeaderName::try_from(k.as_str())
                .map_err(|_| format!("headers: {k:?} is not a valid header name"))?;
            let value = reqwest::header::HeaderValue::try_from(v.as_str())
                .map_err(|_| format!("headers.{k}: not a valid header value"))?;
            extra.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout.min(Duration::from_secs(10)))
            .pool_max_idle_per_host(64)
            .user_agent(concat!("mailroom/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        Ok(Self {
            settings,
            client,
            extra,
        })
    }

    /// Decodes a signing secret: `whsec_<base64>` per Standard Webhooks, else
    /// the string's own bytes.
    pub fn decode_secret(secret: &str) -> Result<Vec<u8>, String> {
        match secret.strip_prefix("whsec_") {
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| "secret: the part after whsec_ is not valid base64".to_string()),
            None if secret.is_empty() => Err("secret: must not be empty".into()),
            None => Ok(secret.as_bytes().to_vec()),
        }
    }
}

/// `v1,<base64 HMAC-SHA256 of "{id}.{ts}.{body}">`.
pub fn standard_webhooks_signature(key: &[u8], id: &str, ts: i64, body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match <Hmac<Sha256> as Mac>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let sig = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(sig)
    )
}

#[async_trait::async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, event: &Event) -> Outcome {
        let body = event.payload.clone().unwrap_or_default();
        let id = event.id.to_string();
        let ts = jiff::Timestamp::now().as_second();
        let mut req = self
            .client
            .post(self.settings.url.clone())
            .headers(self.extra.clone())
            .header("webhook-id", &id)
            .header("webhook-timestamp", ts.to_string())
            .header("mailroom-topic", &event.topic)
            .header("mailroom-attempt", event.attempts.to_string())
            .header("mailroom-source", &event.source)
            .header("mailroom-dedup-key", &event.dedup_key)
            .header(
                "content-type",
                event
                    .content_type
                    .as_deref()
                    .unwrap_or("application/octet-stream"),
            );
        if let Some(key) = &self.settings.secret {
            req = req.header(
                "webhook-signature",
                standard_webhooks_signature(key, &id, ts, &body),
            );
        }
        if let Some(k) = &event.key {
            req = req.header("mailroom-key", k);
        }
        if let Some(c) = &event.correlation_id {
            req = req.header("mailroom-correlation-id", c);
        }
        if let Some(t) = &event.event_type {
            req = req.header("mailroom-type", t);
        }
        let resp = match req.body(body).send().await {
            Ok(r) => r,
            Err(e) => {
                return Outcome::retry(format!(
                    "request to {} failed: {}",
                    self.settings.url,
                    error_chain(&e)
                ));
            }
        };
        let status = resp.status();
        if status.is_success() {
            return Outcome::Success;
        }
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let text = resp.text().await.unwrap_or_default();
        let error = format!("HTTP {}: {}", status.as_u16(), tail(&text, 512));
        if self.settings.permanent_statuses.contains(&status.as_u16()) {
            Outcome::Permanent { error }
        } else {
            Outcome::Retry {
                error,
                after: retry_after,
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

/// `Retry-After` as delta-seconds or an HTTP date (RFC 9110 §10.2.3).
fn parse_retry_after(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs.min(86400 * 7)));
    }
    let when = jiff::fmt::rfc2822::parse(v).ok()?.timestamp();
    let now = jiff::Timestamp::now();
    let secs = (when.as_second() - now.as_second()).max(0);
    Some(Duration::from_secs(
        u64::try_from(secs).unwrap_or(0).min(86400 * 7),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The signature matches the Standard Webhooks reference vector.
    #[test]
    fn signs_like_the_reference_library() {
        let key = HttpHandler::decode_secret("whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD").unwrap();
        let sig = standard_webhooks_signature(
            &key,
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1649367553,
            br#"{"email":"test@example.com","username":"test_user"}"#,
        );
        assert_eq!(sig, "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=");
    }

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
    }
}
