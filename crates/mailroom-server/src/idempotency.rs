//! `POST /v1/events`, with the semantics of the IETF
//! draft "The Idempotency-Key HTTP Header Field"
//! (draft-ietf-httpapi-idempotency-key-header):
//!
//! - the first request with a key stores the event and answers 201 with the
//!   event object;
//! - a repeat with the same body answers the stored answer again (201, same
//!   body) with `Idempotent-Replayed: true`;
//! - a repeat with a different body answers 422;
//! - a repeat while the first is still being committed answers 409;
//! - no key answers 400.
//!
//! Keys are scoped per API token: the event's `source` is
//! `api:<first 16 hex digits of sha256(token)>` (`api` when no token is
//! configured) and its `dedup_key` is the key, so the store's unique
//! (source, dedup key) constraint is what makes a key stick. Nothing besides
//! the event is stored: "the same body" means the same topic, type, key,
//! correlation and causation ids and payload as the stored event.
//!
//! Only declared topics are accepted (unknown topic: 400): an API event for a
//! topic that has no runtime would sit pending forever, and unlike a webhook
//! source an API caller can be told so.

use crate::AppState;
use crate::formats;
use crate::problem::Problem;
use crate::shedding::read_body;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use mailroom::accept::MAX_FIELD_LEN;
use mailroom::answer::EventObject;
use mailroom::hooks::NewEvent;
use mailroom::{Delivery, Draft, Event, Status};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::sync::Mutex;

/// The header that says an answer is a replay of a stored one.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Body of `POST /v1/events`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateEvent {
    /// A declared topic.
    topic: String,
    /// Event type.
    #[serde(rename = "type")]
    #[schema(
        min_length = 1,
        max_length = 512,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    event_type: Option<String>,
    /// Ordering key (required in sequential topics without a key pointer).
    #[schema(
        min_length = 1,
        max_length = 512,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    key: Option<String>,
    /// Any JSON value but null.
    #[serde(default)]
    #[schema(schema_with = payload_schema, required = true)]
    payload: Option<Value>,
    /// Correlation id.
    #[schema(
        min_length = 1,
        max_length = 512,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    correlation_id: Option<String>,
    /// Causation id.
    #[schema(
        min_length = 1,
        max_length = 512,
        pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
    )]
    causation_id: Option<String>,
    /// Not run before this instant (RFC 3339); the event is stored and
    /// acknowledged at once. Not with `delay`.
    #[schema(value_type = Option<String>, format = DateTime)]
    deliver_at: Option<String>,
    /// Not run before this long after it is stored, on the store's clock
    /// (e.g. `"90s"`, `"3d"`). Not with `deliver_at`.
    #[schema(schema_with = delay_schema)]
    delay: Option<String>,
    /// Claim order within the topic: higher first (default 0). In a
    /// sequential topic per-key order wins over it.
    #[serde(default, deserialize_with = "crate::formats::optional_integer")]
    priority: Option<i32>,
}

/// `payload` in the document: any JSON value but null.
fn payload_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([
            Type::Object,
            Type::Array,
            Type::String,
            Type::Number,
            Type::Boolean,
        ]))
        .description(Some("Any JSON value but null."))
        .build()
}

/// `delay` in the document: [`formats::DELAY`], or null.
fn delay_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(formats::DELAY.pattern()))
                .description(Some(formats::DELAY.describe())),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "Not run before this long after it is stored, on the store's clock (e.g. `\"90s\"`, `\"3d\"`). Not with `deliver_at`.",
        ))
        .into()
}

/// (scope, key) pairs whose first request is being committed by this
/// instance. Each entry belongs to one request in flight, so the set is
/// bounded by the concurrent request limit.
///
/// This is a per-instance courtesy that lets a client tell "still working"
/// (409) from "done" (201): across instances the store's unique (source,
/// dedup key) constraint still guarantees exactly one event, and a duplicate
/// that races past this set is answered from the stored event.
#[derive(Debug, Default)]
pub(crate) struct InFlight(Mutex<HashSet<(String, String)>>);

struct InFlightGuard<'a> {
    set: &'a InFlight,
    entry: (String, String),
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        // A poisoned set is still a valid set of keys.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn enter(&self, scope: &str, key: &str) -> Option<InFlightGuard<'_>> {
        let entry = (scope.to_string(), key.to_string());
        let fresh = self.lock().insert(entry.clone());
        // Only the request that inserted the entry may remove it (on drop);
        // `then_some` would build and drop a guard while the lock is held.
        if fresh {
            Some(InFlightGuard { set: self, entry })
        } else {
            None
        }
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.entry);
    }
}

/// The key of a request: the draft makes it an sf-string (`"abc"`); the bare
/// form that most clients send (`abc`) is accepted too.
fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let raw = headers
        .get("idempotency-key")
        .ok_or_else(|| Problem::bad_request("the Idempotency-Key header is required"))?
        .to_str()
        .ok()
        .filter(|k| formats::is_idempotency_key(k))
        .ok_or_else(|| {
            Problem::bad_request(format!(
                "Idempotency-Key must be 1 to {MAX_FIELD_LEN} visible ASCII characters (spaces only inside)"
            ))
        })?;
    // `"abc"` is the key abc; `""` alone is a two-character key.
    let key = raw
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .filter(|k| !k.is_empty())
        .unwrap_or(raw);
    Ok(key.to_string())
}

/// `api:<16 hex of sha256(token)>` for the bearer token the auth layer
/// accepted, `api` when no tokens are configured.
fn scope(s: &AppState, headers: &HeaderMap) -> String {
    if s.options.api_tokens.is_empty() {
        return "api".into();
    }
    let token = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or_default();
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    format!("api:{}", &digest[..16])
}

/// The event object as it was committed: both the first answer
/// and every replay are built by this one function from the stored row, so
/// a replay answers exactly the original status and body even after the
/// event was processed.
fn as_committed(mut event: Event, max_attempts: u32, delivery: Delivery) -> Value {
    event.status = Status::Pending;
    event.attempts = 0;
    event.max_attempts = max_attempts;
    // The first due time, as the store set it from the same clock reading
    // as `received_at`.
    event.next_attempt_at = Some(match delivery {
        Delivery::Now => event.received_at,
        Delivery::At(at) => at,
        Delivery::After(d) => event.received_at + d,
    });
    event.last_error = None;
    event.lease_until = None;
    event.history.clear();
    serde_json::json!(EventObject::summary(&event))
}

fn created(body: Value, replayed: bool) -> Response {
    let mut resp = (StatusCode::CREATED, axum::Json(body)).into_response();
    if replayed {
        resp.headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    resp
}

/// Stores an event once per `Idempotency-Key`.
#[utoipa::path(post, path = "/events", tag = "events", request_body = CreateEvent,
    params(
        ("Idempotency-Key" = String, Header, pattern = "^[!-~](?:[ -~]{0,510}[!-~])?$",
            description = "Makes a retry safe: a repeat with the same body gets the first answer. 1 to 512 visible ASCII characters, spaces only inside; the draft's quoted form `\"abc\"` is the key `abc`"),
        ("traceparent" = Option<String>, Header, description = "W3C Trace Context: stored with the event and forwarded (as a child) to every handler call; a malformed one is ignored"),
    ),
    responses((status = 201, description = "The event as committed", body = mailroom::answer::EventObject,
        headers(("idempotent-replayed" = String, description = "`true` on a repeat"))),
        (status = 400, description = "No or a malformed Idempotency-Key, a body that is not this schema, or a field the topic's rules refuse", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "A request with this Idempotency-Key is still being processed; see Retry-After", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body exceeds `[limits] api_max_body`", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "This Idempotency-Key was already used with a different request body", body = crate::problem::ProblemBody, content_type = "application/problem+json")))]
pub(crate) async fn create(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let key = idempotency_key(&headers)?;
    let req = read_request(&s, body).await?;
    let scope = scope(&s, &headers);
    // The topic's rules (mailroom::accept) refuse with 400 before anything
    // is stored or marked in flight.
    let mut draft = req.draft(key.clone(), scope.clone())?;
    if let Some(t) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        draft = draft.traceparent(t);
    }
    let accepted = s.engine.hooks().accept(draft)?;
    let Some(guard) = s.inflight.enter(&scope, &key) else {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "Conflict",
            "a request with this Idempotency-Key is still being processed; retry shortly",
        )
        .retry_after(1));
    };
    let inserted = s.engine.hooks().insert(accepted.clone()).await?;
    drop(guard);
    let stored =
        s.engine.operator().get(inserted.id).await?.ok_or_else(|| {
            Problem::unavailable("the event was stored but could not be read back")
        })?;
    if inserted.duplicate && !same_request(&stored, accepted.event()) {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Unprocessable Content",
            "this Idempotency-Key was already used with a different request body",
        ));
    }
    let max_attempts = accepted.event().max_attempts;
    Ok(created(
        as_committed(stored, max_attempts, accepted.event().delivery),
        inserted.duplicate,
    ))
}

/// Reads and parses the body, within the API's body limit.
async fn read_request(s: &AppState, body: Body) -> Result<CreateEvent, Problem> {
    let limit = s.options.limits.api_max_body;
    let bytes = read_body(body, limit, s.options.limits.body_read_timeout, || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Payload Too Large",
            format!("the body exceeds {limit} bytes"),
        )
    })
    .await?;
    serde_json::from_slice(&bytes).map_err(|e| Problem::bad_request(format!("invalid body: {e}")))
}

/// "The same body": the stored event has the topic, type, key (after the
/// topic's default), ids and payload of the repeat.
fn same_request(stored: &Event, repeat: &NewEvent) -> bool {
    stored.topic == repeat.topic
        && stored.event_type == repeat.event_type
        && stored.key == repeat.key
        && stored.correlation_id == repeat.correlation_id
        && stored.causation_id == repeat.causation_id
        // Purged by retention: the envelope matched, so it is a repeat.
        && stored.payload.as_deref().is_none_or(|p| p == repeat.payload.as_ref())
}

impl CreateEvent {
    /// The event to enqueue under `scope` with dedup key `key`.
    fn draft(self, key: String, scope: String) -> Result<Draft, Problem> {
        let payload = match self.payload {
            None | Some(Value::Null) => {
                return Err(Problem::bad_request(
                    "payload is required (any JSON but null)",
                ));
            }
            // Stored as serde_json writes the parsed value, so the same JSON
            // re-sent with other whitespace compares equal on a repeat.
            Some(v) => serde_json::to_vec(&v).map_err(|e| Problem::bad_request(e.to_string()))?,
        };
        let mut draft = Draft::bytes(self.topic, payload)
            .content_type("application/json")
            .dedup_key(key)
            .source(scope);
        if let Some(v) = self.event_type {
            draft = draft.event_type(v);
        }
        if let Some(v) = self.key {
            draft = draft.key(v);
        }
        if let Some(v) = self.correlation_id {
            draft = draft.correlation_id(v);
        }
        if let Some(v) = self.causation_id {
            draft = draft.causation_id(v);
        }
        if let Some(v) = self.priority {
            draft = draft.priority(v);
        }
        match (self.deliver_at, self.delay) {
            (Some(_), Some(_)) => {
                return Err(Problem::bad_request("give deliver_at or delay, not both"));
            }
            (Some(at), None) => {
                let at = at.parse::<jiff::Timestamp>().map_err(|e| {
                    Problem::bad_request(format!("deliver_at: not an RFC 3339 time: {e}"))
                })?;
                draft = draft.deliver_at(at);
            }
            (None, Some(d)) => {
                let d = formats::DELAY
                    .parse(&d)
                    .map_err(|e| Problem::bad_request(format!("delay: {e}")))?;
                draft = draft.delay(d);
            }
            (None, None) => {}
        }
        Ok(draft)
    }
}
