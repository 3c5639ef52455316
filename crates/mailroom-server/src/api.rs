//! `/v1`: read and operate on stored events (SPEC §7).

use crate::AppState;
use crate::problem::Problem;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use mailroom::answer::{EventList, EventObject, StatsAnswer};
use mailroom::{KeyCursor, ListFilter, Status};
use serde::Deserialize;
use serde_json::{Value, json};

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/events", get(list).post(crate::idempotency::create))
        .route("/events/{id}", get(show))
        .route("/events/{id}/replay", post(replay))
        .route("/events/{id}/skip", post(skip))
        .route("/replay", post(replay_matching))
        .route("/stats", get(stats))
}

/// Query of `GET /v1/events`.
#[derive(Debug, Deserialize, Default)]
pub struct ListQuery {
    topic: Option<String>,
    status: Option<String>,
    key: Option<String>,
    limit: Option<u32>,
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

async fn list(
    State(s): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, Problem> {
    let page = s.engine.list(&filter_from(q)?).await?;
    Ok(Json(json!(EventList::new(&page))))
}

async fn show(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s
        .engine
        .get(id.parse()?)
        .await?
        .ok_or_else(|| Problem::not_found("no such event"))?;
    Ok(Json(json!(EventObject::full(&event))))
}

async fn replay(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.replay(id.parse()?).await?;
    Ok(Json(json!(EventObject::summary(&event))))
}

async fn skip(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s.engine.skip(id.parse()?).await?;
    Ok(Json(json!(EventObject::summary(&event))))
}

/// Body of `POST /v1/replay`: which events to replay (default: dead ones).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    topic: Option<String>,
    status: Option<String>,
    key: Option<String>,
}

async fn replay_matching(
    State(s): State<AppState>,
    body: Option<Json<ReplayBody>>,
) -> Result<Json<Value>, Problem> {
    let b = body.map(|Json(b)| b).unwrap_or_default();
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
    Ok(Json(json!(s.engine.replay_matching(&filter).await?)))
}

async fn stats(State(s): State<AppState>) -> Result<Json<StatsAnswer>, Problem> {
    Ok(Json(
        StatsAnswer::read(&s.engine, jiff::Timestamp::now()).await?,
    ))
}
