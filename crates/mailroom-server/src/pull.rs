//! Pull workers: external workers in any language claim events of
//! a topic without a built-in handler, then `ack`, `nack` or `extend` with
//! the claim's fencing token. A stale token (the lease expired and the event
//! was rescued or handed to someone else) is refused with 409.

use crate::AppState;
use crate::formats;
use crate::problem::Problem;
use axum::Json;
use axum::extract::{Path, State};
use jiff::Timestamp;
use mailroom::answer::ClaimObject;
use mailroom::pull::FencingToken;
use mailroom::{EventId, Outcome};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Most events one claim may return.
pub const MAX_CLAIM: u32 = 1000;
/// Longest lease a worker may ask for.
pub const MAX_LEASE: Duration = Duration::from_secs(3600);
/// Longest worker name, in characters.
const MAX_WORKER_CHARS: usize = 128;

/// The pull routes under `/v1` (auth is layered by the caller).
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(claim))
        .routes(routes!(ack))
        .routes(routes!(nack))
        .routes(routes!(extend))
}

/// A lease or retry delay given as seconds (`30`, `0.5`) or as text
/// (`"30s"`, `"500ms"`): [`formats::LEASE`], 1ms to 1h.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum LeaseArg {
    /// Seconds.
    Secs(f64),
    /// A duration in [`formats::LEASE`]'s format.
    Text(String),
}

impl utoipa::PartialSchema for LeaseArg {
    fn schema() -> RefOr<Schema> {
        let (min, max) = (MIN_LEASE.as_secs_f64(), MAX_LEASE.as_secs_f64());
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .minimum(Some(min))
                    .maximum(Some(max))
                    .description(Some(format!("Seconds, from {min} (1ms) to {max} (1h)."))),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(formats::LEASE.pattern()))
                    .description(Some(formats::LEASE.describe())),
            )
            .description(Some(
                "A duration from 1ms to 1h: seconds as a number (`30`, `0.5`), or text (`\"30s\"`, `\"500ms\"`).",
            ))
            .into()
    }
}

impl ToSchema for LeaseArg {}

/// The answer to a claim.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimAnswer<'a> {
    /// The events claimed, each with its fencing token (possibly none).
    pub events: Vec<ClaimObject<'a>>,
}

/// The answer to an ack or a nack.
#[derive(Debug, Serialize, ToSchema)]
pub struct FinishAnswer {
    /// The event.
    #[schema(value_type = uuid::Uuid)]
    pub id: String,
    /// Where it went: `done`, `pending` (retried later) or `dead`.
    pub status: &'static str,
}

/// The answer to an extend.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExtendAnswer {
    /// The event.
    #[schema(value_type = uuid::Uuid)]
    pub id: String,
    /// The lease's new end (store clock).
    pub lease_until: Timestamp,
}

/// The shortest lease or retry delay a worker may ask for.
const MIN_LEASE: Duration = Duration::from_millis(1);

impl LeaseArg {
    /// The duration `field` (`lease`, `retry_in`) asks for, 1ms to 1h; any
    /// other number or text is a 400 naming the field and the range.
    fn parse(&self, field: &str) -> Result<Duration, Problem> {
        match self {
            // Checked as a float first: `Duration` cannot hold 1e308 seconds.
            // The conversion may round 0.001 a nanosecond below 1ms.
            LeaseArg::Secs(s)
                if (MIN_LEASE.as_secs_f64()..=MAX_LEASE.as_secs_f64()).contains(s) =>
            {
                Ok(Duration::from_secs_f64(*s).clamp(MIN_LEASE, MAX_LEASE))
            }
            LeaseArg::Secs(_) => Err(Problem::bad_request(format!(
                "{field} must be between 1ms and 1h"
            ))),
            LeaseArg::Text(t) => formats::LEASE
                .parse(t)
                .map_err(|e| Problem::bad_request(format!("{field}: {e}"))),
        }
    }
}

/// Body of a claim.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
struct ClaimBody {
    /// Most events to claim, 1 to 1000 (default 1).
    #[serde(default, deserialize_with = "formats::optional_integer")]
    #[schema(minimum = 1, maximum = 1000)]
    max: Option<u32>,
    /// Lease length, 1ms to 1h (default: the topic's lease).
    lease: Option<LeaseArg>,
    /// Worker name shown in the history, 1 to 128 characters (default
    /// `pull`).
    #[schema(min_length = 1, max_length = 128)]
    worker: Option<String>,
}

/// Claims up to `max` due events of a pull topic under a lease.
#[utoipa::path(post, path = "/topics/{topic}/claim", tag = "pull",
    params(("topic" = String, Path, description = "A pull topic")),
    request_body(content = Option<ClaimBody>),
    responses((status = 200, description = "The events claimed", body = ClaimAnswer)))]
async fn claim(
    State(s): State<AppState>,
    Path(topic): Path<String>,
    body: Option<Json<Option<ClaimBody>>>,
) -> Result<axum::response::Response, Problem> {
    // No body, or `null`: every default.
    let b = body.and_then(|Json(b)| b).unwrap_or_default();
    let lease = b.lease.as_ref().map(|l| l.parse("lease")).transpose()?;
    let worker = match b.worker {
        None => "pull".to_string(),
        Some(w) if (1..=MAX_WORKER_CHARS).contains(&w.chars().count()) => w,
        Some(_) => {
            return Err(Problem::bad_request(format!(
                "worker must be 1 to {MAX_WORKER_CHARS} characters"
            )));
        }
    };
    let max = b.max.unwrap_or(1);
    if !(1..=MAX_CLAIM).contains(&max) {
        return Err(Problem::bad_request(format!(
            "max must be between 1 and {MAX_CLAIM}"
        )));
    }
    let claimed = s.engine.pull().claim(&topic, max, lease, &worker).await?;
    let events = claimed.iter().map(ClaimObject::new).collect();
    Ok(axum::response::IntoResponse::into_response(Json(
        ClaimAnswer { events },
    )))
}

/// Body of an ack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct AckBody {
    /// The claim's fencing token.
    #[serde(deserialize_with = "formats::integer")]
    #[schema(format = Int64, minimum = 0, maximum = 4294967295_u32)]
    token: u32,
}

/// Finishes a claim: the event is done.
#[utoipa::path(post, path = "/events/{id}/ack", tag = "pull",
    params(("id" = uuid::Uuid, Path, description = "Event id")), request_body = AckBody,
    responses((status = 200, description = "The event is done", body = FinishAnswer)))]
async fn ack(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(b): Json<AckBody>,
) -> Result<Json<FinishAnswer>, Problem> {
    let id: EventId = formats::event_id(&id)?;
    s.engine
        .pull()
        .finish(id, FencingToken(b.token), Outcome::Success)
        .await?;
    Ok(Json(FinishAnswer {
        id: id.to_string(),
        status: "done",
    }))
}

/// Body of a nack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NackBody {
    /// The claim's fencing token.
    #[serde(deserialize_with = "formats::integer")]
    #[schema(format = Int64, minimum = 0, maximum = 4294967295_u32)]
    token: u32,
    /// Error text for the history (at most 4096 characters are kept).
    error: Option<String>,
    /// Retry after this long instead of the topic's backoff.
    retry_in: Option<LeaseArg>,
    /// Dead at once, no retry.
    #[serde(default)]
    permanent: bool,
}

/// Finishes a claim with a failure: retried later, or dead.
#[utoipa::path(post, path = "/events/{id}/nack", tag = "pull",
    params(("id" = uuid::Uuid, Path, description = "Event id")), request_body = NackBody,
    responses((status = 200, description = "`pending` (retried later) or `dead`", body = FinishAnswer)))]
async fn nack(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(b): Json<NackBody>,
) -> Result<Json<FinishAnswer>, Problem> {
    let id: EventId = formats::event_id(&id)?;
    let error = b.error.unwrap_or_else(|| "nacked by worker".into());
    let error: String = error.chars().take(4096).collect();
    let after = b
        .retry_in
        .as_ref()
        .map(|r| r.parse("retry_in"))
        .transpose()?;
    let outcome = if b.permanent {
        Outcome::Permanent { error }
    } else {
        Outcome::Retry { error, after }
    };
    let status = match s
        .engine
        .pull()
        .finish(id, FencingToken(b.token), outcome)
        .await?
    {
        mailroom::pull::Completion::Dead { .. } => "dead",
        _ => "pending",
    };
    Ok(Json(FinishAnswer {
        id: id.to_string(),
        status,
    }))
}

/// Body of an extend.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ExtendBody {
    /// The claim's fencing token.
    #[serde(deserialize_with = "formats::integer")]
    #[schema(format = Int64, minimum = 0, maximum = 4294967295_u32)]
    token: u32,
    /// New lease length from now (default: the topic's lease).
    lease: Option<LeaseArg>,
}

/// Extends a claim's lease.
#[utoipa::path(post, path = "/events/{id}/extend", tag = "pull",
    params(("id" = uuid::Uuid, Path, description = "Event id")), request_body = ExtendBody,
    responses((status = 200, description = "The lease's new end", body = ExtendAnswer)))]
async fn extend(
    State(s): State<AppState>,
    Path(id): Path<String>,
    Json(b): Json<ExtendBody>,
) -> Result<Json<ExtendAnswer>, Problem> {
    let id: EventId = formats::event_id(&id)?;
    let lease = b.lease.as_ref().map(|l| l.parse("lease")).transpose()?;
    let until = s
        .engine
        .pull()
        .extend(id, FencingToken(b.token), lease)
        .await?;
    Ok(Json(ExtendAnswer {
        id: id.to_string(),
        lease_until: until,
    }))
}
