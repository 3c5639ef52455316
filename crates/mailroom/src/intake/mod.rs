//! Intake: turning a webhook request into a [`NewEvent`], before the store.
//!
//! Order matters, and users rely on it: **verification comes first** (a
//! request that fails it learns nothing, not even whether its dedup key is
//! known), then the dedup key, type and ordering key are read from headers or
//! the JSON body. Then the event meets its topic's rules
//! ([`crate::accept`]), as events from every other door do, and only then
//! does the engine insert and acknowledge.

pub(crate) mod verify;

use crate::spec::{Field, SourceSpec, TopicSpec};
use bytes::Bytes;
use http::HeaderMap;
use mailroom_core::event::VERSION_HEADER;
use mailroom_core::{Delivery, EventId, NewEvent};
use sha2::{Digest, Sha256};

use crate::accept::MAX_FIELD_LEN;

/// Why a request was refused before it reached the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntakeError {
    /// No such source (or an undeclared one where those are not taken).
    #[error("unknown source {0:?}")]
    UnknownSource(String),
    /// Signature verification failed.
    #[error("{0}")]
    Unauthorized(mailroom_signatures::VerifyError),
    /// The body is larger than the source's `max_body`.
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// The source's `max_body`, in bytes.
        limit: u64,
    },
    /// A required value is absent or unusable.
    #[error("{0}")]
    BadRequest(String),
    /// The event breaks its topic's rules ([`crate::accept`]).
    #[error(transparent)]
    Refused(#[from] crate::accept::Refused),
    /// The store failed; nothing was stored.
    #[error(transparent)]
    Store(#[from] mailroom_core::StoreError),
}

/// Reads the request into a [`NewEvent`] for `topic`: the extraction step
/// of [`Hooks::ingest_webhook`](crate::hooks::Hooks::ingest_webhook), which
/// verifies the signature before it and applies the topic's rules
/// ([`accept`](crate::accept)) after it. Public for the fuzz target.
pub fn build_event(
    source: &SourceSpec,
    topic: &TopicSpec,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<NewEvent, IntakeError> {
    let mut json = LazyJson::new(&body);
    let dedup_key = if source.id.is_empty() {
        default_dedup_key(headers, &mut json)?
    } else {
        let mut found = None;
        for field in &source.id {
            if let Some(v) = read(field, headers, &mut json, "dedup key")? {
                found = Some(v);
                break;
            }
        }
        found.ok_or_else(|| {
            let places: Vec<String> = source.id.iter().map(describe).collect();
            IntakeError::BadRequest(format!("missing dedup key: {}", places.join("; ")))
        })?
    };
    let event_type = match &source.event_type {
        Some(field) => read(field, headers, &mut json, "type")?,
        None => None,
    };
    let version = match &source.version {
        Some(field) => read(field, headers, &mut json, "version")?,
        None => None,
    };
    let key = match source.key.as_ref().or(topic.key.as_ref()) {
        Some(field) => read(field, headers, &mut json, "key")?,
        None => None,
    };
    let delivery = match &source.deliver_at {
        Some(field) => match read(field, headers, &mut json, "deliver_at")? {
            Some(text) => Delivery::At(text.parse().map_err(|_| {
                IntakeError::BadRequest(format!(
                    "deliver_at ({}): {text:?} is not an RFC 3339 time",
                    describe(field)
                ))
            })?),
            None => Delivery::Now,
        },
        None => Delivery::Now,
    };
    let priority = match &source.priority {
        Some(field) => match read(field, headers, &mut json, "priority")? {
            Some(text) => text.trim().parse::<i32>().map_err(|_| {
                IntakeError::BadRequest(format!(
                    "priority ({}): {text:?} is not an integer",
                    describe(field)
                ))
            })?,
            None => 0,
        },
        None => 0,
    };
    // Optional headers too long to keep are dropped, not refused: the
    // sender did not choose to send them for mailroom.
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= MAX_FIELD_LEN)
            .map(str::to_owned)
    };
    Ok(NewEvent {
        id: EventId::new(),
        source: source.name.clone(),
        topic: topic.name.clone(),
        dedup_key,
        key,
        event_type,
        // `mailroom-correlation-id` first: what an HTTP handler of another
        // mailroom sends, so a flow keeps its id from one to the next.
        correlation_id: header("mailroom-correlation-id")
            .or_else(|| header("x-correlation-id"))
            .or_else(|| header("x-request-id")),
        causation_id: header("mailroom-causation-id").or_else(|| header("x-causation-id")),
        version: version.or_else(|| header(VERSION_HEADER)),
        // W3C Trace Context: a malformed traceparent is ignored, not refused.
        traceparent: header("traceparent")
            .and_then(|v| mailroom_core::TraceParent::parse(&v))
            .map(|t| t.to_string()),
        content_type: header("content-type"),
        payload: body,
        max_attempts: topic.retry.max_attempts,
        delivery,
        priority,
    })
}

/// The default chain: `webhook-id`, then `Idempotency-Key`, then the
/// body's `/id`, else a SHA-256 of the body (so byte-identical resends dedup).
fn default_dedup_key(headers: &HeaderMap, json: &mut LazyJson<'_>) -> Result<String, IntakeError> {
    for name in ["webhook-id", "svix-id", "idempotency-key"] {
        if let Some(v) = read(&Field::Header(name.into()), headers, json, "dedup key")? {
            return Ok(v);
        }
    }
    if let Some(Ok(doc)) = json.get() {
        if let Some(v) = doc.pointer("/id").and_then(scalar) {
            return Ok(v);
        }
    }
    read(&Field::BodySha256, headers, json, "dedup key").map(|v| v.unwrap_or_default())
}

fn read(
    field: &Field,
    headers: &HeaderMap,
    json: &mut LazyJson<'_>,
    what: &str,
) -> Result<Option<String>, IntakeError> {
    match field {
        Field::BodySha256 => Ok(Some(format!(
            "sha256:{}",
            hex::encode(Sha256::digest(json.body))
        ))),
        Field::Header(name) => match headers.get(name.as_str()) {
            None => Ok(None),
            Some(v) => {
                let v = v.to_str().map_err(|_| {
                    IntakeError::BadRequest(format!("header {name} ({what}) is not visible ASCII"))
                })?;
                let v = v.trim();
                if v.is_empty() {
                    Ok(None)
                } else {
                    Ok(Some(v.to_string()))
                }
            }
        },
        Field::Json(pointer) => {
            let doc = match json.get() {
                Some(Ok(doc)) => doc,
                Some(Err(e)) => {
                    return Err(IntakeError::BadRequest(format!(
                        "body is not valid JSON ({e}), but the {what} is read from {pointer}"
                    )));
                }
                None => return Ok(None),
            };
            match doc.pointer(pointer) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => match scalar(v) {
                    Some(s) => Ok(Some(s)),
                    None => Err(IntakeError::BadRequest(format!(
                        "{what} at {pointer} must be a string or a number"
                    ))),
                },
            }
        }
    }
}

fn scalar(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Where a missing field was looked for, for error messages.
pub(crate) fn describe(f: &Field) -> String {
    match f {
        Field::Header(h) => format!("header {h} is missing"),
        Field::Json(p) => format!("{p} is missing from the body"),
        Field::BodySha256 => "the body is empty".to_string(),
    }
}

/// Parses the body as JSON at most once, and only if some field needs it.
struct LazyJson<'a> {
    body: &'a [u8],
    parsed: Option<Result<serde_json::Value, String>>,
}

impl<'a> LazyJson<'a> {
    fn new(body: &'a [u8]) -> Self {
        Self { body, parsed: None }
    }

    /// `None` for an empty body.
    fn get(&mut self) -> Option<Result<&serde_json::Value, &str>> {
        if self.body.is_empty() {
            return None;
        }
        let body = self.body;
        let parsed = self
            .parsed
            .get_or_insert_with(|| serde_json::from_slice(body).map_err(|e| e.to_string()));
        Some(parsed.as_ref().map_err(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn build(source: &SourceSpec, h: &[(&str, &str)], body: &str) -> Result<NewEvent, IntakeError> {
        build_event(
            source,
            &TopicSpec::new("t"),
            &headers(h),
            Bytes::from(body.to_owned()),
        )
    }

    #[test]
    fn default_chain_prefers_webhook_id_then_idempotency_key_then_body_id() {
        let s = SourceSpec::new("s", "t");
        let body = r#"{"id":"evt_1"}"#;
        assert_eq!(
            build(&s, &[("webhook-id", "w1"), ("idempotency-key", "i1")], body)
                .unwrap()
                .dedup_key,
            "w1"
        );
        assert_eq!(
            build(&s, &[("idempotency-key", "i1")], body)
                .unwrap()
                .dedup_key,
            "i1"
        );
        assert_eq!(build(&s, &[], body).unwrap().dedup_key, "evt_1");
        assert_eq!(build(&s, &[], r#"{"id":42}"#).unwrap().dedup_key, "42");
    }

    #[test]
    fn without_any_id_identical_bodies_share_a_hash_key() {
        let s = SourceSpec::new("s", "t");
        let a = build(&s, &[], "not json").unwrap().dedup_key;
        let b = build(&s, &[], "not json").unwrap().dedup_key;
        let c = build(&s, &[], "not json!").unwrap().dedup_key;
        assert!(a.starts_with("sha256:"));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn a_configured_pointer_needs_json_and_the_value() {
        let mut s = SourceSpec::new("s", "t");
        s.id = vec![Field::Json("/payment/id".into())];
        let err = build(&s, &[], "{oops").unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
        let err = build(&s, &[], r#"{"payment":{}}"#).unwrap_err().to_string();
        assert!(err.contains("/payment/id"), "{err}");
        let err = build(&s, &[], r#"{"payment":{"id":[1]}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("string or a number"), "{err}");
        assert_eq!(
            build(&s, &[], r#"{"payment":{"id":"p1"}}"#)
                .unwrap()
                .dedup_key,
            "p1"
        );
    }

    #[test]
    fn type_key_and_correlation_are_read() {
        let mut s = SourceSpec::new("s", "t");
        s.event_type = Some(Field::Json("/event".into()));
        s.key = Some(Field::Header("x-customer".into()));
        let e = build(
            &s,
            &[
                ("x-customer", "c9"),
                ("x-correlation-id", "corr"),
                ("content-type", "application/json"),
            ],
            r#"{"id":"1","event":"PAYMENT_RECEIVED"}"#,
        )
        .unwrap();
        assert_eq!(e.event_type.as_deref(), Some("PAYMENT_RECEIVED"));
        assert_eq!(e.key.as_deref(), Some("c9"));
        assert_eq!(e.correlation_id.as_deref(), Some("corr"));
        assert_eq!(e.content_type.as_deref(), Some("application/json"));
    }

    /// The correlation id an HTTP handler sends (`mailroom-correlation-id`)
    /// wins over the generic headers, so a flow keeps its id across two
    /// mailroom instances; `mailroom-causation-id` is read too.
    #[test]
    fn mailroom_correlation_headers_win_over_generic_ones() {
        let s = SourceSpec::new("s", "t");
        let e = build(
            &s,
            &[
                ("x-correlation-id", "generic"),
                ("x-request-id", "request"),
                ("mailroom-correlation-id", "flow-7"),
                ("mailroom-causation-id", "cause-3"),
            ],
            r#"{"id":"1"}"#,
        )
        .unwrap();
        assert_eq!(e.correlation_id.as_deref(), Some("flow-7"));
        assert_eq!(e.causation_id.as_deref(), Some("cause-3"));
    }

    /// An event's version comes from the source's `version` extractor
    /// (a number read as text), else the `mailroom-version` header, else
    /// none (published as "1").
    #[test]
    fn the_version_comes_from_the_extractor_else_the_header() {
        let mut s = SourceSpec::new("s", "t");
        let body = r#"{"id":"1","schema":{"v":4}}"#;
        let version =
            |s: &SourceSpec, headers: &[(&str, &str)]| build(s, headers, body).unwrap().version;
        assert_eq!(version(&s, &[]), None);
        assert_eq!(
            version(&s, &[("mailroom-version", "2")]).as_deref(),
            Some("2")
        );
        s.version = Some(Field::Json("/schema/v".into()));
        assert_eq!(
            version(&s, &[("mailroom-version", "2")]).as_deref(),
            Some("4")
        );
    }
}
