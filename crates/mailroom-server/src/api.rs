//! `/v1`: read and operate on stored events.

use crate::AppState;
use crate::problem::Problem;
use axum::Json;
use axum::extract::{Path, Query, State};
use mailroom::answer::{CancelReport, EventList, EventObject, StatsAnswer};
use mailroom::{KeyCursor, ListFilter, ReplayReport, Status};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The routes under `/v1` (auth is layered by the caller), documented by
/// each handler's `#[utoipa::path]`.
pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, crate::idempotency::create))
        .routes(routes!(show))
        .routes(routes!(replay))
        .routes(routes!(skip))
        .routes(routes!(cancel))
        .routes(routes!(replay_matching))
        .routes(routes!(cancel_matching))
        .routes(routes!(stats))
}

/// Query of `GET /v1/events`.
#[derive(Debug, Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this topic's events.
    topic: Option<String>,
    /// Only events in this status.
    #[param(value_type = Option<Status>)]
    status: Option<String>,
    /// Only this key's events.
    key: Option<String>,
    /// Page size, 1..=1000 (default 100).
    limit: Option<u32>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

fn filter_from(q: ListQuery) -> Result<ListFilter, Problem> {
    Ok(ListFilter {
        topic: q.topic,
        status: q
            .status
            .map(|s| s.parse::<Status>().map_err(Problem::bad_request))
            .transpose()?,
        key: q.key,
        limit: q.limit.unwrap_or(100).clamp(1, 1000),
        cursor: q
            .cursor
            .map(|c| {
                c.parse()
                    .map(KeyCursor)
                    .map_err(|_| Problem::bad_request("invalid cursor"))
            })
            .transpose()?,
    })
}

/// Lists events, newest first, one page at a time.
#[utoipa::path(get, path = "/events", tag = "events", params(ListQuery),
    responses((status = 200, description = "One page of events", body = EventList)))]
async fn list(
    State(s): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, Problem> {
    let page = s.engine.list(&filter_from(q)?).await?;
    Ok(Json(json!(EventList::new(&page))))
}

/// One event with its attempt history.
#[utoipa::path(get, path = "/events/{id}", tag = "events", params(("id" = String, Path, description = "Event id")),
    responses((status = 200, description = "The event with `history`", body = EventObject)))]
async fn show(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s
        .engine
        .get(id.parse()?)
        .await?
        .ok_or_else(|| Problem::not_found("no such event"))?;
    Ok(Json(json!(EventObject::full(&event))))
}

/// Sends an event back to `pending` with a fresh attempt budget.
#[utoipa::path(post, path = "/events/{id}/replay", tag = "operator", params(("id" = String, Path, description = "Event id")),
    responses((status = 200, description = "The replayed event", body = EventObject)))]
async fn replay(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.replay(id.parse()?).await?;
    Ok(Json(json!(EventObject::summary(&event))))
}

/// Marks a dead head `skipped`, so its key unblocks.
#[utoipa::path(post, path = "/events/{id}/skip", tag = "operator", params(("id" = String, Path, description = "Event id")),
    responses((status = 200, description = "The skipped event", body = EventObject)))]
async fn skip(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.skip(id.parse()?).await?;
    Ok(Json(json!(EventObject::summary(&event))))
}

/// Withdraws a pending event: it becomes `cancelled` and is not run unless
/// replayed. A running event, or one already finished, is a 409.
#[utoipa::path(post, path = "/events/{id}/cancel", tag = "operator", params(("id" = String, Path, description = "Event id")),
    responses((status = 200, description = "The cancelled event", body = EventObject)))]
async fn cancel(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.cancel(id.parse()?).await?;
    Ok(Json(json!(EventObject::summary(&event))))
}

/// Body of `POST /v1/cancel`: which pending events to cancel. A `topic`
/// or `key` is required, or `"all": true` to cancel every pending event.
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Only this topic's events.
    topic: Option<String>,
    /// Only this key's events.
    key: Option<String>,
    /// Every pending event: required when neither `topic` nor `key` is
    /// given, so that an empty or missing body changes nothing.
    #[serde(default)]
    all: bool,
    /// Only count the matching pending events (the preview).
    #[serde(default)]
    dry_run: bool,
}

/// A bulk request without a filter is refused unless it says `"all": true`:
/// a body lost on the way, or a cross-site form, must not touch every event.
fn require_filter(
    topic: Option<&String>,
    key: Option<&String>,
    all: bool,
    what: &str,
) -> Result<(), Problem> {
    if topic.is_some() || key.is_some() || all {
        Ok(())
    } else {
        Err(Problem::bad_request(format!(
            "missing filter: give \"topic\" and/or \"key\", or \"all\": true to {what}"
        )))
    }
}

/// Cancels every pending event that matches the filter, or with `dry_run`
/// counts them. Without `topic` or `key`, `"all": true` is required.
#[utoipa::path(post, path = "/cancel", tag = "operator", request_body(content = CancelBody),
    responses((status = 200, description = "How many matched and were cancelled", body = CancelReport),
        (status = 400, description = "No filter and no `\"all\": true`, or a malformed body", body = crate::problem::ProblemBody, content_type = "application/problem+json")))]
async fn cancel_matching(
    State(s): State<AppState>,
    body: Option<Json<CancelBody>>,
) -> Result<Json<CancelReport>, Problem> {
    let b = body.map(|Json(b)| b).unwrap_or_default();
    require_filter(
        b.topic.as_ref(),
        b.key.as_ref(),
        b.all,
        "cancel every pending event",
    )?;
    let filter = ListFilter {
        topic: b.topic,
        key: b.key,
        ..ListFilter::default()
    };
    Ok(Json(s.engine.cancel_matching(&filter, b.dry_run).await?))
}

/// Body of `POST /v1/replay`: which events to replay (default: dead ones).
/// A `topic` or `key` is required, or `"all": true` to replay every event
/// in the status.
#[derive(Debug, Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    /// Only this topic's events.
    topic: Option<String>,
    /// Events in this status (default `dead`; never `running`).
    #[schema(value_type = Option<Status>)]
    status: Option<String>,
    /// Only this key's events.
    key: Option<String>,
    /// Every event in the status, across topics: required when neither
    /// `topic` nor `key` is given, so that an empty or missing body changes
    /// nothing.
    #[serde(default)]
    all: bool,
}

/// Replays every event that matches the filter (default: the dead ones).
/// Without `topic` or `key`, `"all": true` is required.
#[utoipa::path(post, path = "/replay", tag = "operator", request_body(content = ReplayBody),
    responses((status = 200, description = "How many were replayed", body = ReplayReport),
        (status = 400, description = "No filter and no `\"all\": true`, a malformed body, or status `running`", body = crate::problem::ProblemBody, content_type = "application/problem+json")))]
async fn replay_matching(
    State(s): State<AppState>,
    body: Option<Json<ReplayBody>>,
) -> Result<Json<ReplayReport>, Problem> {
    let b = body.map(|Json(b)| b).unwrap_or_default();
    require_filter(
        b.topic.as_ref(),
        b.key.as_ref(),
        b.all,
        "replay every event in the status",
    )?;
    let status = b
        .status
        .as_deref()
        .unwrap_or("dead")
        .parse::<Status>()
        .map_err(Problem::bad_request)?;
    if status == Status::Running {
        return Err(Problem::bad_request("running events cannot be replayed"));
    }
    let filter = ListFilter {
        topic: b.topic,
        status: Some(status),
        key: b.key,
        ..ListFilter::default()
    };
    Ok(Json(s.engine.replay_matching(&filter).await?))
}

/// Per topic: counts by status, oldest pending age, blocked keys, rates;
/// and the alerts firing.
#[utoipa::path(get, path = "/stats", tag = "operator",
    responses((status = 200, description = "Numbers per topic and the alerts firing", body = StatsAnswer)))]
async fn stats(State(s): State<AppState>) -> Result<Json<StatsAnswer>, Problem> {
    Ok(Json(
        StatsAnswer::read(&s.engine, jiff::Timestamp::now()).await?,
    ))
}
