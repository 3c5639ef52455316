//! `POST /webhooks/{source}` (SPEC §6): the body is read up to the source's
//! `max_body`, verified, deduplicated and committed; only then is the sender
//! answered `200 {"id", "duplicate"}`.

use crate::AppState;
use crate::problem::Problem;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use http_body_util::{BodyExt, Limited};
use mailroom::intake::IntakeError;

/// Receives one webhook.
pub async fn receive(
    State(s): State<AppState>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<serde_json::Value>, Problem> {
    let limit = s.engine.max_body(&source);
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(IntakeError::TooLarge { limit }.into());
    }
    let bytes = match Limited::new(body, usize::try_from(limit).unwrap_or(usize::MAX))
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(IntakeError::TooLarge { limit }.into());
        }
        Err(e) => {
            return Err(Problem::bad_request(format!(
                "could not read the body: {e}"
            )));
        }
    };
    let inserted = s.engine.ingest_webhook(&source, &headers, bytes).await.map_err(|e| {
        if let IntakeError::Unauthorized(v) = &e {
            metrics::counter!("mailroom_verification_failures_total", "source" => source.clone(), "reason" => v.reason())
                .increment(1);
        }
        Problem::from(e)
    })?;
    Ok(Json(serde_json::json!({
        "id": inserted.id.to_string(),
        "duplicate": inserted.duplicate,
    })))
}
