//! `POST /webhooks/{source}`: the source's rate limit is checked,
//! the body is read up to the source's `max_body` within the body deadline,
//! verified, deduplicated and committed; only then is the sender answered
//! `200 {"id", "duplicate"}`.

use crate::AppState;
use crate::problem::Problem;
use crate::shedding::{read_body, too_many_requests};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use mailroom::intake::IntakeError;
use serde::Serialize;

/// The answer to a stored webhook.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WebhookAnswer {
    /// The stored event (the first one's, for a duplicate).
    #[schema(value_type = uuid::Uuid)]
    pub id: String,
    /// Whether this (source, dedup key) was already stored.
    pub duplicate: bool,
}

/// Receives one webhook: verified, deduplicated and committed before the
/// answer. The body is stored as sent, with its content type.
#[utoipa::path(post, path = "/webhooks/{source}", tag = "intake",
    params(
        ("source" = String, Path, description = "A declared source (or, on loopback, any name)"),
        ("traceparent" = Option<String>, Header, description = "W3C Trace Context: stored with the event and forwarded (as a child) to every handler call; a malformed one is ignored"),
    ),
    request_body(content = serde_json::Value, content_type = "*/*", description = "The provider's payload, as sent: any bytes, in any content type (stored with it). A source that reads its dedup key, type, key, deliver_at or priority from a JSON pointer needs a JSON body that has it (else 400)."),
    responses(
        (status = 200, description = "Stored (or already stored)", body = WebhookAnswer),
        (status = 401, description = "The signature or token does not verify", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 400, description = "The source reads a field from a JSON pointer and the body is not JSON or lacks it, or a field breaks the accept rules", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such source (undeclared sources are accepted only in the quick start)", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body exceeds the source's max_body", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 429, description = "The source's rate limit; see Retry-After", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
    ))]
pub async fn receive(
    State(s): State<AppState>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<WebhookAnswer>, Problem> {
    // Before the body is read, so an over-limit sender costs almost nothing.
    // Every request counts, signed or not: the limit protects the store.
    if let Some(limit) = s.engine.source(&source).and_then(|spec| spec.rate_limit) {
        if let Err(wait) = s.rate.take(&source, limit) {
            metrics::counter!(mailroom::metrics::RATE_LIMITED, "source" => source.clone())
                .increment(1);
            return Err(too_many_requests(&source, wait));
        }
    }
    let limit = s.engine.hooks().max_body(&source);
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > limit) {
        // Let the sender finish uploading (within bounds) so it reads the 413.
        if n <= crate::shedding::DRAIN_MAX {
            crate::shedding::drain(body, n).await;
        }
        s.engine.hooks().count_oversized_webhook(&source);
        return Err(IntakeError::TooLarge { limit }.into());
    }
    let bytes = read_body(body, limit, s.options.limits.body_read_timeout, || {
        s.engine.hooks().count_oversized_webhook(&source);
        IntakeError::TooLarge { limit }.into()
    })
    .await?;
    let inserted = s.engine.hooks().ingest_webhook(&source, &headers, bytes).await.map_err(|e| {
        if let IntakeError::Unauthorized(v) = &e {
            metrics::counter!(mailroom::metrics::VERIFICATION_FAILURES, "source" => source.clone(), "reason" => v.reason())
                .increment(1);
        }
        Problem::from(e)
    })?;
    Ok(Json(WebhookAnswer {
        id: inserted.id.to_string(),
        duplicate: inserted.duplicate,
    }))
}
