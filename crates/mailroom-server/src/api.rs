//! `/v1`: read and operate on stored events (SPEC §7).

use crate::AppState;
use crate::problem::Problem;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use mailroom::{EventId, KeyCursor, ListFilter, Status};
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

fn parse_id(id: &str) -> Result<EventId, Problem> {
    id.parse()
        .map_err(|_| Problem::not_found(format!("{id:?} is not an event id")))
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
    Ok(Json(json!({
        "events": page.events.iter().map(|e| e.to_json(false)).collect::<Vec<_>>(),
        "next_cursor": page.next_cursor.map(|c| c.0.to_string()),
    })))
}

async fn show(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    let event = s
        .engine
        .get(parse_id(&id)?)
        .await?
        .ok_or_else(|| Problem::not_found("no such event"))?;
    Ok(Json(event.to_json(true)))
}

async fn replay(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    Ok(Json(s.engine.replay(parse_id(&id)?).await?.to_json(false)))
}

async fn skip(State(s): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, Problem> {
    Ok(Json(s.engine.skip(parse_id(&id)?).await?.to_json(false)))
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

async fn stats(State(s): State<AppState>) -> Result<Json<Value>, Problem> {
    let stats = s.engine.stats().await?;
    let now = jiff::Timestamp::now();
    let mut topics = Vec::new();
    let mut names: Vec<String> = s.engine.topics().map(|t| t.name.clone()).collect();
    for st in &stats {
        if !names.contains(&st.topic) {
            names.push(st.topic.clone());
        }
    }
    names.sort();
    for name in names {
        let st = stats
            .iter()
            .find(|x| x.topic == name)
            .cloned()
            .unwrap_or_else(|| mailroom::TopicStats {
                topic: name.clone(),
                ..Default::default()
            });
        let counts: serde_json::Map<String, Value> = Status::ALL
            .iter()
            .map(|status| (status.as_str().to_string(), json!(st.count(*status))))
            .collect();
        let spec = s.engine.topic(&name);
        topics.push(json!({
            "topic": name,
            "mode": spec.map_or("single", |t| t.mode.name()),
            "handler": if s.engine.has_handler(&name) { "built-in" } else { "pull" },
            "counts": counts,
            "oldest_pending_age_seconds": st.oldest_pending.map(|t| (now.as_millisecond() - t.as_millisecond()).max(0) as f64 / 1000.0),
            "blocked_keys": st.blocked_keys,
        }));
    }
    let alerts: Vec<Value> = s
        .engine
        .alerts_from(&stats)
        .await?
        .iter()
        .map(mailroom::Alert::to_json)
        .collect();
    Ok(Json(json!({ "topics": topics, "alerts": alerts })))
}
