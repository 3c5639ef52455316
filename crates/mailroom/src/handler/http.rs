//! The `http` handler: POSTs the original payload bytes with the
//! original content type, signed per Standard Webhooks
//! (<https://www.standardwebhooks.com/>) so receivers verify with any
//! Standard Webhooks library, plus the `mailroom-*` envelope headers.
//!
//! Any 2xx is success; 410 (or a configured status) is permanent; anything
//! else is retried, at the time `Retry-After` asks for if present. A 429
//! with `Retry-After` pauses the whole topic that long (at most
//! [`MAX_PAUSE`]; `dispatch::limits`).

use super::{BatchOutcome, Handler, tail};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use mailroom_core::{Event, Outcome};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The longest pause a `429 Retry-After` can impose on a topic: a receiver
/// asking for days is more likely wrong than right, and the event retries
/// (pausing again) when this ends.
pub const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// Idle keep-alive connections kept per receiver host: above any topic's
/// usual concurrency.
const MAX_IDLE_CONNECTIONS: usize = 1024;

/// Settings of an HTTP handler.
#[derive(Debug, Clone)]
pub struct HttpHandlerSettings {
    /// The receiver's URL, POSTed once per attempt (per batch in batch
    /// topics).
    pub url: reqwest::Url,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Signing key (decoded from `whsec_<base64>`, or the raw string's bytes).
    pub secret: Option<Vec<u8>>,
    /// Headers added to every request (e.g. the receiver's own token).
    pub headers: BTreeMap<String, String>,
    /// Statuses that mean "do not retry".
    pub permanent_statuses: Vec<u16>,
    /// Extra trusted CAs and a client certificate (none by default).
    pub tls: HttpTls,
}

/// TLS of an HTTP handler beyond the system's trusted roots, as PEM text
/// (read from files and checked by [`crate::tls`] first).
#[derive(Clone, Default)]
pub struct HttpTls {
    /// CA certificates trusted **in addition to** the system roots (an
    /// internal CA), as most HTTP clients do with an added CA.
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate chain and its private key, presented to
    /// receivers that ask for one (mutual TLS).
    pub identity_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for HttpTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("HttpTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity_pem.is_some())
            .finish()
    }
}

impl HttpHandlerSettings {
    /// Statuses that mean "do not retry" unless configured: 410 Gone.
    pub const DEFAULT_PERMANENT_STATUSES: &[u16] = &[410];
}

/// POSTs each event to an endpoint.
///
/// What does not change between deliveries is built once: the configured
/// headers, the HMAC keyed with the secret (each signature continues a
/// copy of it), the `mailroom-topic` value of the topic it serves. The
/// client keeps connections to the endpoint alive and pooled.
#[derive(Debug, Clone)]
pub struct HttpHandler {
    settings: HttpHandlerSettings,
    client: reqwest::Client,
    extra: HeaderMap,
    signer: Option<Signer>,
    /// The `mailroom-topic` header of the first topic seen (a handler
    /// serves one topic; another topic's value is built per request).
    topic: Arc<OnceLock<(String, HeaderValue)>>,
}

/// The HMAC-SHA256 state keyed with a signing secret.
#[derive(Clone)]
struct Signer(Hmac<Sha256>);

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("Signer")
    }
}

impl Signer {
    fn new(key: &[u8]) -> Option<Self> {
        // HMAC accepts keys of any length, so this does not fail.
        <Hmac<Sha256> as Mac>::new_from_slice(key).ok().map(Self)
    }

    /// `v1,<base64 HMAC-SHA256 of "{id}.{ts}.{body}">`.
    fn sign(&self, id: &str, ts: &str, body: &[u8]) -> String {
        let mut mac = self.0.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(body);
        let mut out = String::with_capacity(3 + 44);
        out.push_str("v1,");
        base64::engine::general_purpose::STANDARD
            .encode_string(mac.finalize().into_bytes(), &mut out);
        out
    }
}

impl HttpHandler {
    /// Builds the handler; fails on invalid extra header names or values.
    pub fn new(settings: HttpHandlerSettings) -> Result<Self, String> {
        let mut extra = HeaderMap::new();
        for (k, v) in &settings.headers {
            let name = HeaderName::try_from(k.as_str())
                .map_err(|_| format!("headers: {k:?} is not a valid header name"))?;
            let value = HeaderValue::try_from(v.as_str())
                .map_err(|_| format!("headers.{k}: not a valid header value"))?;
            extra.insert(name, value);
        }
        let mut client = reqwest::Client::builder();
        if let Some(pem) = &settings.tls.ca_pem {
            let cas = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("ca_file: {}", error_chain(&e)))?;
            client = client.tls_certs_merge(cas);
        }
        if let Some(pem) = &settings.tls.identity_pem {
            let identity = reqwest::Identity::from_pem(pem)
                .map_err(|e| format!("client_cert: {}", error_chain(&e)))?;
            client = client.identity(identity);
        }
        let client = client
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout.min(Duration::from_secs(10)))
            // Keep-alive for every attempt in flight: with fewer idle
            // connections kept than attempts, the surplus is closed after
            // each burst of answers and reopened by the next claim
            // (`mailroom-bench http-floor`: 23,404 connections for 50,000
            // deliveries at concurrency 256 with 64 kept, 23 % of the
            // floor's rate). Idle ones still close after 90 s.
            .pool_max_idle_per_host(MAX_IDLE_CONNECTIONS)
            .user_agent(concat!("mailroom/", env!("CARGO_PKG_VERSION")))
            // A redirect would carry the payload, the signature and the
            // configured headers to wherever the receiver points: a 3xx is
            // a failed attempt instead (see `judge`).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build HTTP client: {}", error_chain(&e)))?;
        let signer = settings.secret.as_deref().and_then(Signer::new);
        Ok(Self {
            settings,
            client,
            extra,
            signer,
            topic: Arc::default(),
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
pub(crate) fn standard_webhooks_signature(key: &[u8], id: &str, ts: i64, body: &[u8]) -> String {
    Signer::new(key)
        .map(|s| s.sign(id, &ts.to_string(), body))
        .unwrap_or_default()
}

/// `mailroom-*` envelope headers of one delivery, as values.
type Envelope = Vec<(HeaderName, HeaderValue)>;

/// A header value from an event's field, or the retry its invalid text is.
fn value(name: &'static str, text: &str) -> Result<(HeaderName, HeaderValue), Outcome> {
    match HeaderValue::from_str(text) {
        Ok(v) => Ok((HeaderName::from_static(name), v)),
        Err(_) => Err(Outcome::retry(format!(
            "header {name}: not a valid header value"
        ))),
    }
}

/// How an HTTP answer is judged.
enum Answer {
    Success(bytes::Bytes),
    Failure(Outcome),
}

impl HttpHandler {
    /// POSTs `body` signed with `webhook_id`, plus the `envelope` headers;
    /// judges the answer: any 2xx is success, `permanent_statuses` are
    /// permanent, else a retry at `Retry-After` if given.
    async fn post(
        &self,
        webhook_id: String,
        content_type: HeaderValue,
        body: bytes::Bytes,
        envelope: Envelope,
    ) -> Answer {
        let req = match self.request(webhook_id, content_type, body, envelope) {
            Ok(req) => req,
            Err(e) => return Answer::Failure(Outcome::retry(e)),
        };
        match self.client.execute(req).await {
            Ok(resp) => self.judge(resp).await,
            // Stored, shown and logged: the URL without its secrets, and
            // reqwest's own text without the URL it would repeat verbatim.
            Err(e) => Answer::Failure(Outcome::retry(format!(
                "request to {} failed: {}",
                mailroom_core::redact::url(self.settings.url.as_str()),
                error_chain(&e.without_url())
            ))),
        }
    }

    /// The signed POST (Standard Webhooks headers) with the configured and
    /// the `envelope` headers, or why it cannot be sent.
    fn request(
        &self,
        webhook_id: String,
        content_type: HeaderValue,
        body: bytes::Bytes,
        envelope: Envelope,
    ) -> Result<reqwest::Request, String> {
        let invalid = |name: &str| {
            format!(
                "request to {} failed: header {name}: not a valid header value",
                mailroom_core::redact::url(self.settings.url.as_str())
            )
        };
        let ts = jiff::Timestamp::now().as_second().to_string();
        let mut headers = HeaderMap::with_capacity(self.extra.len() + envelope.len() + 4);
        for (name, value) in &self.extra {
            headers.append(name, value.clone());
        }
        if let Some(signer) = &self.signer {
            let sig = signer.sign(&webhook_id, &ts, &body);
            let sig = HeaderValue::try_from(sig).map_err(|_| invalid("webhook-signature"))?;
            headers.append(HeaderName::from_static("webhook-signature"), sig);
        }
        let id = HeaderValue::try_from(webhook_id).map_err(|_| invalid("webhook-id"))?;
        headers.append(HeaderName::from_static("webhook-id"), id);
        let ts = HeaderValue::try_from(ts).map_err(|_| invalid("webhook-timestamp"))?;
        headers.append(HeaderName::from_static("webhook-timestamp"), ts);
        headers.append(reqwest::header::CONTENT_TYPE, content_type);
        for (name, value) in envelope {
            headers.append(name, value);
        }
        let mut req = reqwest::Request::new(reqwest::Method::POST, self.settings.url.clone());
        *req.headers_mut() = headers;
        *req.body_mut() = Some(body.into());
        Ok(req)
    }

    /// The `mailroom-topic` header of `topic`, built once for the topic
    /// this handler serves.
    fn topic_header(&self, topic: &str) -> Result<HeaderValue, Outcome> {
        if let Some((name, value)) = self.topic.get()
            && name == topic
        {
            return Ok(value.clone());
        }
        let (_, value) = value("mailroom-topic", topic)?;
        let _ = self.topic.set((topic.to_string(), value.clone()));
        Ok(value)
    }

    /// Any 2xx is success; `permanent_statuses` are permanent; anything else
    /// (a 3xx too: redirects are never followed) is retried, at
    /// `Retry-After` if the answer gives one.
    async fn judge(&self, resp: reqwest::Response) -> Answer {
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let location = resp.headers().get(reqwest::header::LOCATION).map(|v| {
            tail(
                &mailroom_core::redact::url(&String::from_utf8_lossy(v.as_bytes())),
                512,
            )
        });
        // Bounded read of the answer: it only feeds error text and batch verdicts.
        let text = read_limited(resp, 64 * 1024).await;
        if status.is_success() {
            return Answer::Success(text);
        }
        let error = match location {
            Some(to) if status.is_redirection() => format!(
                "HTTP {}: redirect to {to} not followed (point the handler's url there if it is meant)",
                status.as_u16()
            ),
            _ => format!(
                "HTTP {}: {}",
                status.as_u16(),
                tail(&String::from_utf8_lossy(&text), 512)
            ),
        };
        Answer::Failure(
            if self.settings.permanent_statuses.contains(&status.as_u16()) {
                Outcome::Permanent { error }
            } else if let (StatusCode::TOO_MANY_REQUESTS, Some(after)) = (status, retry_after) {
                // The receiver speaks for the topic, not this event: the
                // whole topic pauses.
                Outcome::Throttled {
                    error,
                    after: after.min(MAX_PAUSE),
                }
            } else {
                Outcome::Retry {
                    error,
                    after: retry_after,
                }
            },
        )
    }
}

async fn read_limited(mut resp: reqwest::Response, max: usize) -> bytes::Bytes {
    let mut buf = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = max.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if buf.len() >= max {
            break;
        }
    }
    buf.into()
}

impl HttpHandler {
    /// The `mailroom-*` headers (and `traceparent`) of one event.
    fn envelope(&self, event: &Event) -> Result<Envelope, Outcome> {
        let mut headers = Vec::with_capacity(8);
        headers.push((
            HeaderName::from_static("mailroom-topic"),
            self.topic_header(&event.topic)?,
        ));
        headers.push((
            HeaderName::from_static("mailroom-attempt"),
            HeaderValue::from(event.attempts),
        ));
        headers.push(value("mailroom-source", &event.source)?);
        headers.push(value("mailroom-dedup-key", &event.dedup_key)?);
        for (name, field) in [
            ("mailroom-key", &event.key),
            ("mailroom-correlation-id", &event.correlation_id),
            ("mailroom-type", &event.event_type),
        ] {
            if let Some(v) = field {
                headers.push(value(name, v)?);
            }
        }
        if let Some(t) = super::outgoing_traceparent(event) {
            headers.push(value("traceparent", &t)?);
        }
        Ok(headers)
    }
}

/// The content type of an event's payload as sent.
fn content_type(event: &Event) -> Result<HeaderValue, Outcome> {
    match event.content_type.as_deref() {
        None => Ok(HeaderValue::from_static("application/octet-stream")),
        Some("application/json") => Ok(HeaderValue::from_static("application/json")),
        Some(other) => value("content-type", other).map(|(_, v)| v),
    }
}

#[async_trait::async_trait]
impl Handler for HttpHandler {
    async fn handle(&self, event: &Event) -> Outcome {
        let (envelope, content_type) = match (self.envelope(event), content_type(event)) {
            (Ok(e), Ok(c)) => (e, c),
            (Err(o), _) | (_, Err(o)) => return o,
        };
        let body = event.payload.clone().unwrap_or_default();
        match self
            .post(event.id.to_string(), content_type, body, envelope)
            .await
        {
            Answer::Success(_) => Outcome::Success,
            Answer::Failure(o) => o,
        }
    }

    /// Batch topics: POST a JSON array of event objects. A 2xx
    /// answer `{"failed": ["<event id>", ...]}` fails only those events.
    async fn handle_batch(&self, events: &[Event]) -> BatchOutcome {
        let array: Vec<_> = events
            .iter()
            .map(crate::answer::EventObject::summary)
            .collect();
        let body = serde_json::to_vec(&array).unwrap_or_default();
        let Some(first) = events.first() else {
            return BatchOutcome::All(Outcome::Success);
        };
        let topic = match self.topic_header(&first.topic) {
            Ok(t) => t,
            Err(o) => return BatchOutcome::All(o),
        };
        let envelope = vec![
            (HeaderName::from_static("mailroom-topic"), topic),
            (
                HeaderName::from_static("mailroom-batch-size"),
                HeaderValue::from(events.len()),
            ),
        ];
        // One delivery id per batch, so receivers can deduplicate deliveries.
        let delivery = mailroom_core::EventId::new().to_string();
        let json = HeaderValue::from_static("application/json");
        match self.post(delivery, json, body.into(), envelope).await {
            Answer::Failure(o) => BatchOutcome::All(o),
            Answer::Success(answer) => {
                let failed: Vec<String> = serde_json::from_slice::<serde_json::Value>(&answer)
                    .ok()
                    .and_then(|v| v.get("failed").cloned())
                    .and_then(|f| serde_json::from_value(f).ok())
                    .unwrap_or_default();
                BatchOutcome::Each(
                    events
                        .iter()
                        .filter(|e| failed.contains(&e.id.to_string()))
                        .map(|e| (e.id, Outcome::retry("reported failed by the batch handler")))
                        .collect(),
                )
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

    fn event() -> Event {
        Event {
            id: mailroom_core::EventId::new(),
            source: "shop".into(),
            topic: "orders".into(),
            dedup_key: "msg_1".into(),
            key: Some("customer-7".into()),
            event_type: Some("order.paid".into()),
            priority: 0,
            status: mailroom_core::Status::Running,
            attempts: 3,
            max_attempts: 15,
            next_attempt_at: None,
            received_at: jiff::Timestamp::now(),
            correlation_id: Some("corr-9".into()),
            causation_id: None,
            version: None,
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
            content_type: Some("application/json".into()),
            payload: Some(bytes::Bytes::from_static(br#"{"total":12}"#)),
            last_error: None,
            lease_until: None,
            history: Vec::new(),
        }
    }

    /// A delivery's request carries every header a receiver relies on: the
    /// configured ones, the Standard Webhooks id (the event id), timestamp
    /// and a signature that verifies with the secret, the payload's content
    /// type, and each `mailroom-*` envelope header with its event's value,
    /// for one event and again for the next (values built once are reused
    /// only where they are the same).
    #[test]
    fn a_request_carries_every_header_and_a_verifiable_signature() {
        let secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
        let handler = HttpHandler::new(HttpHandlerSettings {
            url: reqwest::Url::parse("http://127.0.0.1:9/hook").unwrap(),
            timeout: Duration::from_secs(5),
            secret: Some(HttpHandler::decode_secret(secret).unwrap()),
            headers: BTreeMap::from([("x-api-key".to_string(), "k-123".to_string())]),
            permanent_statuses: vec![410],
            tls: HttpTls::default(),
        })
        .unwrap();
        let verifier = mailroom_signatures::Verifier::new(
            mailroom_signatures::Scheme::StandardWebhooks,
            [secret],
            mailroom_signatures::DEFAULT_TOLERANCE,
        )
        .unwrap();
        for n in 0..2 {
            let mut e = event();
            e.source = format!("shop-{n}");
            let envelope = handler.envelope(&e).unwrap();
            let body = e.payload.clone().unwrap();
            let req = handler
                .request(
                    e.id.to_string(),
                    content_type(&e).unwrap(),
                    body.clone(),
                    envelope,
                )
                .unwrap();
            assert_eq!(req.method(), reqwest::Method::POST);
            assert_eq!(req.url().as_str(), "http://127.0.0.1:9/hook");
            let h = req.headers();
            let one = |name: &str| {
                let all: Vec<_> = h.get_all(name).iter().collect();
                assert_eq!(all.len(), 1, "{name} once in {h:?}");
                all[0].to_str().unwrap().to_string()
            };
            assert_eq!(one("x-api-key"), "k-123");
            assert_eq!(one("webhook-id"), e.id.to_string());
            let ts: i64 = one("webhook-timestamp").parse().unwrap();
            assert!((ts - jiff::Timestamp::now().as_second()).abs() < 60);
            assert_eq!(one("content-type"), "application/json");
            assert_eq!(one("mailroom-topic"), "orders");
            assert_eq!(one("mailroom-attempt"), "3");
            assert_eq!(one("mailroom-source"), format!("shop-{n}"));
            assert_eq!(one("mailroom-dedup-key"), "msg_1");
            assert_eq!(one("mailroom-key"), "customer-7");
            assert_eq!(one("mailroom-correlation-id"), "corr-9");
            assert_eq!(one("mailroom-type"), "order.paid");
            let parent = one("traceparent");
            assert!(
                parent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
                "{parent}"
            );
            assert!(parent.ends_with("-01") && !parent.contains("00f067aa0ba902b7"));
            assert!(one("webhook-signature").starts_with("v1,"));
            let sent = req.body().and_then(|b| b.as_bytes()).unwrap();
            assert_eq!(sent, &body[..]);
            verifier
                .verify(h, sent, jiff::Timestamp::now().as_second())
                .expect("the signature verifies with the secret");
        }
        // Another topic's events through the same handler name their own.
        let mut other = event();
        other.topic = "refunds".into();
        let envelope = handler.envelope(&other).unwrap();
        assert!(
            envelope
                .iter()
                .any(|(n, v)| n == "mailroom-topic" && v == "refunds")
        );
        // No content type stored: sent as octet-stream.
        other.content_type = None;
        assert_eq!(content_type(&other).unwrap(), "application/octet-stream");
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
