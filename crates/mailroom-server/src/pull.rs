//! Pull workers (SPEC §7): external workers in any language claim events of
//! a topic without a built-in handler, then `ack`, `nack` or `extend` with
//! the claim's fencing token. A stale token (the lease expired and the event
//! was rescued or handed to someone else) is refused with 409.

use crate::AppState;
use crate::problem::Problem;
use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Json, Router};
use mailroom::answer::ClaimObject;
use mailroom::{EventId, FencingToken, Outcome, duration};
use serde::Deserialize;
use serde_json::{Value, json};
use std::time::Duration;

/// Most events one claim may return.
pub const MAX_CLAIM: u32 = 1000;
/// Longest lease a worker may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(3600);

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/topics/{topic}/claim", post(claim))
        .route("/events/{id}/ack", post(ack))
        .route("/events/{id}/nack", post(nack))
        .route("/events/{id}/extend", post(extend))
}

/// A lease given as `"30s"` or as seconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LeaseArg {
    Secs(f64),
    Text(String),
}

impl LeaseArg {
    fn parse(&self) -> Result<Duration, Problem> {
        let d = match self {
            LeaseArg::Secs(s) if s.is_finite() && *s > 0.0 => Duration::from_secs_f64(*s),
            LeaseArg::Secs(_) => {
                return Err(Problem::bad_request(
                    "lease must be a positive number of seconds",
                ));
            }
            LeaseArg::Text(t) => {
                duration::parse(t).map_err(|e| Problem::bad_request(e.to_string()))?
            }
        };
        if d.is_zero() || d > MAX_LEASE {
            return Err(Problem::bad_request("lease must be between 1ms and 1h"));
        }
        Ok(d)
    }
}

/// Body of a claim.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    max: Option<u32>,
    lease: Option<LeaseArg>,
    worker: Option<String>,
}

async fn claim(
    State(s): State<AppState>,
    Path(topic): Path<String>,
    body: Option<Json<ClaimBody>>,
) -> Result<Json<Value>, Problem> {
    let b = body.map(|Json(b)| b).unwrap_or_default();
    let lease = b.lease.as_ref().map(LeaseArg::parse).transpose()?;
    let worker = b
        .worker
        .filter(|w| !w.is_empty() && w.len() <= 128)
        .unwrap_or_else(|| "pull".into());
    let max = b.max.unwrap_or(1).clamp(1, MAX_CLAIM);
    let claimed = s.engine.claim(&topic, max, lease, &worker).await?;
    let events: Vec<ClaimObject> = claimed.iter().map(ClaimObject::new).collect();
    Ok(Json(json!({ "events": events })))
}

/// Body of an ack.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBody {
    token: u32,
}

async fn ack(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(b): Json<AckBody>,
) -> Result<Json<Value>, Problem> {
    let id: EventId = id.parse()?;
    s.engine
        .finish_claim(id, FencingToken(b.token), Outcome::Success)
        .await?;
    Ok(Json(json!({ "id": id.to_string(), "status": "done" })))
}

/// Body of a nack.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NackBody {
    token: u32,
    error: Option<String>,
    retry_in: Option<LeaseArg>,
    #[serde(default)]
    permanent: bool,
}

async fn nack(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(b): Json<NackBody>,
) -> Result<Json<Value>, Problem> {
    let id: EventId = id.parse()?;
    let error = b.error.unwrap_or_else(|| "nacked by worker".into());
    let error: String = error.chars().take(4096).collect();
    let after = b.retry_in.as_ref().map(LeaseArg::parse).transpose()?;
    let outcome = if b.permanent {
        Outcome::Permanent { error }
    } else {
        Outcome::Retry { error, after }
    };
    let status = match s
        .engine
        .finish_claim(id, FencingToken(b.token), outcome)
        .await?
    {
        mailroom::Completion::Dead { .. } => "dead",
        _ => "pending",
    };
    Ok(Json(json!({ "id": id.to_string(), "status": status })))
}

/// Body of an extend.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    token: u32,
    lease: Option<LeaseArg>,
}

async fn extend(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(b): Json<ExtendBody>,
) -> Result<Json<Value>, Problem> {
    let id: EventId = id.parse()?;
    let lease = b.lease.as_ref().map(LeaseArg::parse).transpose()?;
    let until = s.engine.extend(id, FencingToken(b.token), lease).await?;
    Ok(Json(
        json!({ "id": id.to_string(), "lease_until": until.to_string() }),
    ))
}
