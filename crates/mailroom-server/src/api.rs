//! `/v1`: read and operate on stored events.

use crate::AppState;
use crate::formats;
use crate::problem::Problem;
use axum::Json;
use axum::extract::{Path, Query, State};
use mailroom::answer::{CancelReport, EventList, EventObject, StatsAnswer};
use mailroom::operate::KeyCursor;
use mailroom::operate::{ListFilter, ReplayReport};
use mailroom::{Status, StoreError};
use serde::Deserialize;
use serde_json::{Value, json};
use std::borrow::Cow;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AllOfBuilder, AnyOfBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::{PartialSchema, ToSchema};
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
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[param(value_type = Option<uuid::Uuid>)]
    cursor: Option<String>,
}

/// The largest page.
const MAX_LIMIT: u32 = 1000;

fn filter_from(q: ListQuery) -> Result<ListFilter, Problem> {
    Ok(ListFilter {
        topic: q.topic,
        status: q
            .status
            .map(|s| s.parse::<Status>().map_err(Problem::bad_request))
            .transpose()?,
        key: q.key,
        limit: match q.limit.unwrap_or(100) {
            n @ 1..=MAX_LIMIT => n,
            _ => {
                return Err(Problem::bad_request(format!(
                    "limit must be between 1 and {MAX_LIMIT}"
                )));
            }
        },
        cursor: q
            .cursor
            .map(|c| {
                formats::event_id(&c).map(KeyCursor).map_err(|_| {
                    Problem::bad_request("invalid cursor: a next_cursor is an event id")
                })
            })
            .transpose()?,
    })
}

/// Lists events, newest first, one page at a time.
#[utoipa::path(get, path = "/events", tag = "events", params(ListQuery),
    responses((status = 200, description = "One page of events", body = EventList),
        (status = 400, description = "A parameter outside its format or range", body = crate::problem::ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "The cursor names no stored event (purged since, or never one)", body = crate::problem::ProblemBody, content_type = "application/problem+json")))]
async fn list(
    State(s): State<AppState>,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, Problem> {
    let Query(q) = q.map_err(|e| Problem::bad_request(e.body_text()))?;
    let filter = filter_from(q)?;
    let page = match s.engine.operator().list(&filter).await {
        // A cursor is an event id: one that names no stored event (never
        // stored, or purged since) is a resource that is not there.
        Err(StoreError::Invalid(m)) if filter.cursor.is_some() => {
            return Err(Problem::not_found(m));
        }
        other => other?,
    };
    Ok(Json(json!(EventList::new(&page))))
}

/// One event with its attempt history.
#[utoipa::path(get, path = "/events/{id}", tag = "events", params(("id" = uuid::Uuid, Path, description = "Event id")),
    responses((status = 200, description = "The event with `history`", body = EventObject)))]
async fn show(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s
        .engine
        .operator()
        .get(formats::event_id(&id)?)
        .await?
        .ok_or_else(|| Problem::not_found("no such event"))?;
    Ok(Json(json!(EventObject::full(&event))))
}

/// Sends an event back to `pending` with a fresh attempt budget.
#[utoipa::path(post, path = "/events/{id}/replay", tag = "operator", params(("id" = uuid::Uuid, Path, description = "Event id")),
    responses((status = 200, description = "The replayed event", body = EventObject)))]
async fn replay(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.operator().replay(formats::event_id(&id)?).await?;
    Ok(Json(json!(EventObject::summary(&event))))
}

/// Marks a dead head `skipped`, so its key unblocks.
#[utoipa::path(post, path = "/events/{id}/skip", tag = "operator", params(("id" = uuid::Uuid, Path, description = "Event id")),
    responses((status = 200, description = "The skipped event", body = EventObject)))]
async fn skip(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.operator().skip(formats::event_id(&id)?).await?;
    Ok(Json(json!(EventObject::summary(&event))))
}

/// Withdraws a pending event: it becomes `cancelled` and is not run unless
/// replayed. A running event, or one already finished, is a 409.
#[utoipa::path(post, path = "/events/{id}/cancel", tag = "operator", params(("id" = uuid::Uuid, Path, description = "Event id")),
    responses((status = 200, description = "The cancelled event", body = EventObject)))]
async fn cancel(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.operator().cancel(formats::event_id(&id)?).await?;
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

/// A bulk body as the document states it: `base` (its fields) with a
/// `topic`, a `key` or `"all": true` required, as [`require_filter`] checks.
fn requiring_a_filter(base: RefOr<Schema>, description: &str) -> RefOr<Schema> {
    let string = |name: &str| {
        ObjectBuilder::new()
            .property(name, ObjectBuilder::new().schema_type(Type::String))
            .required(name)
    };
    let all = ObjectBuilder::new()
        .property(
            "all",
            ObjectBuilder::new()
                .schema_type(Type::Boolean)
                .enum_values(Some([true])),
        )
        .required("all");
    AllOfBuilder::new()
        .item(base)
        .item(
            AnyOfBuilder::new()
                .item(string("topic"))
                .item(string("key"))
                .item(all),
        )
        .description(Some(description))
        .into()
}

/// `POST /v1/cancel`'s body in the document: [`CancelBody`] with a filter.
#[derive(Debug)]
pub struct CancelRequest;

impl PartialSchema for CancelRequest {
    fn schema() -> RefOr<Schema> {
        requiring_a_filter(
            CancelBody::schema(),
            "Which pending events to cancel: a `topic` and/or a `key`, or `\"all\": true`.",
        )
    }
}

impl ToSchema for CancelRequest {
    fn name() -> Cow<'static, str> {
        "CancelBody".into()
    }
}

/// `POST /v1/replay`'s body in the document: [`ReplayBody`] with a filter.
#[derive(Debug)]
pub struct ReplayRequest;

impl PartialSchema for ReplayRequest {
    fn schema() -> RefOr<Schema> {
        requiring_a_filter(
            ReplayBody::schema(),
            "Which events to replay (default: the dead ones): a `topic` and/or a `key`, or `\"all\": true`.",
        )
    }
}

impl ToSchema for ReplayRequest {
    fn name() -> Cow<'static, str> {
        "ReplayBody".into()
    }
}

/// The statuses a bulk replay may select: every one but `running`.
fn replayable_status() -> RefOr<Schema> {
    let names = Status::ALL
        .iter()
        .filter(|s| **s != Status::Running)
        .map(|s| s.as_str());
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(names)),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(
            "Events in this status (default `dead`; never `running`).",
        ))
        .into()
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
#[utoipa::path(post, path = "/cancel", tag = "operator", request_body(content = CancelRequest),
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
    Ok(Json(
        s.engine
            .operator()
            .cancel_matching(&filter, b.dry_run)
            .await?,
    ))
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
    #[schema(schema_with = replayable_status)]
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
#[utoipa::path(post, path = "/replay", tag = "operator", request_body(content = ReplayRequest),
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
    Ok(Json(s.engine.operator().replay_matching(&filter).await?))
}

/// Per topic: counts by status, oldest pending age, blocked keys, rates;
/// and the alerts firing.
#[utoipa::path(get, path = "/stats", tag = "operator",
    responses((status = 200, description = "Numbers per topic and the alerts firing", body = StatsAnswer)))]
async fn stats(State(s): State<AppState>) -> Result<Json<StatsAnswer>, Problem> {
    Ok(Json(
        s.engine
            .operator()
            .stats_answer(jiff::Timestamp::now())
            .await?,
    ))
}
