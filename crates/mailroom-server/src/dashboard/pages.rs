//! The overview, a topic's events, one event, and its replay and skip.

use super::chart::{self, Series};
use super::view::{self, Frame, PageError, Session, encode, span, when};
use crate::AppState;
use askama::Template;
use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use jiff::Timestamp;
use mailroom::answer::{EventObject, TopicAnswer};
use mailroom::operate::KeyCursor;
use mailroom::operate::ListFilter;
use mailroom::{Event, EventId, Mode, OnDead, Status};
use serde::Deserialize;
use std::time::Duration;

/// Events on one page of a listing.
pub(crate) const PAGE_SIZE: u32 = 50;

/// One topic's line on the overview.
pub(crate) struct TopicRow {
    name: String,
    mode: &'static str,
    handler: &'static str,
    counts: Vec<(&'static str, u64)>,
    oldest_pending: String,
    blocked_keys: u64,
    done_per_second: f64,
    failed_per_second: f64,
    /// The traffic chart (SVG of numbers only, embedded unescaped).
    chart: String,
    chart_totals: (u64, u64, u64),
}

impl TopicRow {
    fn new(t: &TopicAnswer, series: &Series) -> Self {
        Self {
            name: t.topic.clone(),
            mode: t.mode,
            handler: t.handler,
            counts: Status::ALL
                .iter()
                .map(|s| (s.as_str(), t.count(*s)))
                .collect(),
            oldest_pending: t
                .oldest_pending_age_seconds
                .map_or_else(|| "—".to_owned(), |s| span(Duration::from_secs_f64(s))),
            blocked_keys: t.blocked_keys,
            done_per_second: t.rates.done_per_second,
            failed_per_second: t.rates.failed_per_second,
            chart: series.svg(),
            chart_totals: series.totals(),
        }
    }
}

/// A dependency (an AMQP connection) and whether it is up.
struct DependencyRow {
    kind: &'static str,
    name: String,
    up: bool,
}

#[derive(Template)]
#[template(path = "dashboard/overview.html")]
struct OverviewPage {
    frame: Frame,
    statuses: Vec<&'static str>,
    topics: Vec<TopicRow>,
    alerts: Vec<mailroom::operate::Alert>,
    dependencies: Vec<DependencyRow>,
    updated: String,
}

/// `GET /`: every topic's numbers, the alerts firing, the connections.
#[utoipa::path(get, path = "/", tag = "dashboard",
    responses(
        (status = 200, description = "The dashboard's overview (HTML)", body = String, content_type = "text/html"),
        (status = 303, description = "To the login form, without a session (when `api_token` is set)")))]
pub(crate) async fn overview(
    State(s): State<AppState>,
    Extension(session): Extension<Session>,
) -> Result<Response, PageError> {
    let now = Timestamp::now();
    let stats = s.engine.operator().stats_answer(now).await?;
    let traffic = s
        .engine
        .operator()
        .throughput(Duration::from_secs(60 * chart::MINUTES as u64))
        .await?;
    let rows = stats.topics.iter().map(|t| {
        let series = Series::of(&t.topic, &traffic, now);
        TopicRow::new(t, &series)
    });
    let page = OverviewPage {
        frame: Frame::new("Overview", session),
        statuses: Status::ALL.iter().map(|s| s.as_str()).collect(),
        topics: rows.collect(),
        alerts: stats.alerts,
        dependencies: s
            .options
            .dependencies
            .iter()
            .map(|d| DependencyRow {
                kind: d.kind,
                name: d.name.clone(),
                up: (d.up)(),
            })
            .collect(),
        updated: when(now),
    };
    Ok(view::render(StatusCode::OK, &page))
}

/// An event's line in a listing.
pub(crate) struct EventRow {
    pub(crate) id: String,
    pub(crate) topic: String,
    pub(crate) key: String,
    pub(crate) event_type: String,
    pub(crate) status: &'static str,
    pub(crate) attempts: String,
    pub(crate) received: String,
    pub(crate) error: String,
}

impl EventRow {
    pub(crate) fn new(e: &Event) -> Self {
        // A done event's last error is history (its event page shows it).
        let error = match e.status {
            Status::Done => "",
            _ => e.last_error.as_deref().unwrap_or(""),
        };
        Self {
            id: e.id.to_string(),
            topic: e.topic.clone(),
            key: e.key.clone().unwrap_or_default(),
            event_type: e.event_type.clone().unwrap_or_default(),
            status: e.status.as_str(),
            attempts: format!("{}/{}", e.attempts, e.max_attempts),
            received: when(e.received_at),
            error: error.chars().take(120).collect(),
        }
    }
}

/// A key held back by its dead head.
struct BlockedKey {
    key: String,
    head: EventRow,
}

#[derive(Template)]
#[template(path = "dashboard/topic.html")]
struct TopicPage {
    frame: Frame,
    topic: String,
    statuses: Vec<&'static str>,
    status: String,
    key: String,
    events: Vec<EventRow>,
    next: Option<String>,
    blocking: bool,
    blocked: Vec<BlockedKey>,
    /// Its scheduling limits and their use, in one line.
    limits: Option<String>,
}

/// Query of a topic's page.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct TopicQuery {
    #[serde(default)]
    status: String,
    #[serde(default)]
    key: String,
    cursor: Option<String>,
}

/// `?cursor=` as a listing cursor.
pub(crate) fn cursor(text: Option<&str>) -> Result<Option<KeyCursor>, PageError> {
    text.filter(|c| !c.is_empty())
        .map(|c| {
            c.parse::<EventId>()
                .map(KeyCursor)
                .map_err(|_| PageError::BadRequest("invalid cursor".to_owned()))
        })
        .transpose()
}

/// `GET /ui/topics/{topic}`: its events newest first, filtered by status
/// and key, a page at a time; and, where dead heads block keys, each
/// blocked key with the event that blocks it.
pub(crate) async fn topic(
    State(s): State<AppState>,
    Extension(session): Extension<Session>,
    Path(topic): Path<String>,
    Query(q): Query<TopicQuery>,
) -> Result<Response, PageError> {
    let status = match q.status.as_str() {
        "" => None,
        st => Some(st.parse::<Status>().map_err(PageError::BadRequest)?),
    };
    let filter = ListFilter {
        topic: Some(topic.clone()),
        status,
        key: Some(q.key.clone()).filter(|k| !k.is_empty()),
        limit: PAGE_SIZE,
        cursor: cursor(q.cursor.as_deref())?,
    };
    let page = s.engine.operator().list(&filter).await?;
    let next = page.next_cursor.map(|c| {
        format!(
            "?status={}&key={}&cursor={}",
            encode(&q.status),
            encode(&q.key),
            c.0
        )
    });
    let blocking = s.engine.topic(&topic).is_some_and(|t| {
        matches!(
            t.mode,
            Mode::Sequential {
                on_dead: OnDead::Block
            }
        )
    });
    let blocked = if blocking {
        blocked_keys(&s, &topic).await?
    } else {
        Vec::new()
    };
    let limits = topic_limits(&s, &topic).await?;
    let page = TopicPage {
        limits,
        frame: Frame::new(format!("Topic {topic}"), session),
        statuses: Status::ALL.iter().map(|s| s.as_str()).collect(),
        status: q.status,
        key: q.key,
        events: page.events.iter().map(EventRow::new).collect(),
        next,
        blocking,
        blocked,
        topic,
    };
    Ok(view::render(StatusCode::OK, &page))
}

/// A topic's limits and their use, read only for a topic that has limits
/// or a handler (which a 429 may pause).
async fn topic_limits(s: &AppState, topic: &str) -> Result<Option<String>, PageError> {
    let limited = s.engine.topic(topic).is_some_and(|t| t.is_limited());
    if !limited && !s.engine.has_handler(topic) {
        return Ok(None);
    }
    let running = if limited {
        let search = mailroom::operate::EventSearch {
            filter: ListFilter {
                topic: Some(topic.to_owned()),
                status: Some(Status::Running),
                ..ListFilter::default()
            },
            ..mailroom::operate::EventSearch::default()
        };
        s.engine.operator().count(&search).await?
    } else {
        0
    };
    let limits = s
        .engine
        .operator()
        .limits_answer(topic, running, None)
        .await?;
    Ok(limits.map(|l| l.summary()))
}

/// The most blocked keys shown on a topic's page.
const BLOCKED_SHOWN: u32 = 200;

/// Each key whose dead head blocks it, with that head: the earliest dead
/// event of the key (later ones of a blocked key wait as pending).
async fn blocked_keys(s: &AppState, topic: &str) -> Result<Vec<BlockedKey>, PageError> {
    let dead = s
        .engine
        .operator()
        .list(&ListFilter {
            topic: Some(topic.to_owned()),
            status: Some(Status::Dead),
            limit: BLOCKED_SHOWN,
            ..ListFilter::default()
        })
        .await?;
    let mut heads: Vec<BlockedKey> = Vec::new();
    // Newest first: a later-listed event of a key is an earlier one.
    for e in &dead.events {
        let Some(key) = &e.key else { continue };
        let row = EventRow::new(e);
        match heads.iter_mut().find(|b| &b.key == key) {
            Some(b) => b.head = row,
            None => heads.push(BlockedKey {
                key: key.clone(),
                head: row,
            }),
        }
    }
    Ok(heads)
}

/// One attempt as the event page shows it.
struct AttemptRow {
    attempt: u32,
    started: String,
    duration: String,
    outcome: &'static str,
    error: String,
    worker: String,
}

#[derive(Template)]
#[template(path = "dashboard/event.html")]
struct EventPage {
    frame: Frame,
    id: String,
    envelope: Vec<(&'static str, String)>,
    topic: String,
    status: &'static str,
    last_error: String,
    payload: String,
    payload_kind: &'static str,
    history: Vec<AttemptRow>,
    can_replay: bool,
    can_skip: bool,
    can_cancel: bool,
    flash: String,
}

/// Query of the event page (`done` names the action just taken).
#[derive(Debug, Deserialize, Default)]
pub(crate) struct EventQuery {
    #[serde(default)]
    done: String,
}

/// `GET /ui/events/{id}`: the envelope, the payload (pretty JSON, else
/// base64), the attempt history, and the replay, skip and cancel buttons.
pub(crate) async fn event(
    State(s): State<AppState>,
    Extension(session): Extension<Session>,
    Path(id): Path<String>,
    Query(q): Query<EventQuery>,
) -> Result<Response, PageError> {
    let id: EventId = id
        .parse()
        .map_err(|_| PageError::NotFound("no such event"))?;
    let e = s
        .engine
        .operator()
        .get(id)
        .await?
        .ok_or(PageError::NotFound("no such event"))?;
    let obj = EventObject::full(&e);
    let (payload, payload_kind) = match (&e.payload, &obj.payload_base64) {
        (None, _) => (String::new(), "purged"),
        (Some(_), Some(b64)) => (b64.clone(), "base64"),
        (Some(_), None) => (
            serde_json::to_string_pretty(&obj.payload).unwrap_or_default(),
            "json",
        ),
    };
    let page = EventPage {
        frame: Frame::new(format!("Event {id}"), session),
        id: id.to_string(),
        envelope: envelope(&e),
        topic: e.topic.clone(),
        status: e.status.as_str(),
        last_error: e.last_error.clone().unwrap_or_default(),
        payload,
        payload_kind,
        history: e.history.iter().rev().map(attempt_row).collect(),
        can_replay: e.status != Status::Running && e.payload.is_some(),
        can_skip: e.status == Status::Dead,
        can_cancel: e.status == Status::Pending,
        flash: match q.done.as_str() {
            "replay" => "Replayed: the event is pending again.".to_owned(),
            "skip" => "Skipped: its key is unblocked.".to_owned(),
            "cancel" => "Cancelled: it will not run unless replayed.".to_owned(),
            _ => String::new(),
        },
    };
    Ok(view::render(StatusCode::OK, &page))
}

fn attempt_row(a: &mailroom::Attempt) -> AttemptRow {
    let duration = a.finished_at.map_or_else(
        || "—".to_owned(),
        |f| {
            let ms = (f.as_millisecond() - a.started_at.as_millisecond()).max(0);
            span(Duration::from_millis(ms.unsigned_abs()))
        },
    );
    AttemptRow {
        attempt: a.attempt,
        started: when(a.started_at),
        duration,
        outcome: a.outcome.as_str(),
        error: a.error.clone().unwrap_or_default(),
        worker: a.worker.clone().unwrap_or_default(),
    }
}

/// The envelope's fields, in the order of the event object's.
fn envelope(e: &Event) -> Vec<(&'static str, String)> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".to_owned());
    vec![
        ("id", e.id.to_string()),
        ("source", e.source.clone()),
        ("topic", e.topic.clone()),
        ("dedup key", e.dedup_key.clone()),
        ("key", opt(&e.key)),
        ("type", opt(&e.event_type)),
        ("priority", e.priority.to_string()),
        ("status", e.status.as_str().to_owned()),
        ("attempts", format!("{} of {}", e.attempts, e.max_attempts)),
        (
            "next attempt",
            e.next_attempt_at.map_or_else(|| "—".to_owned(), when),
        ),
        ("received", when(e.received_at)),
        ("correlation id", opt(&e.correlation_id)),
        ("causation id", opt(&e.causation_id)),
        ("content type", opt(&e.content_type)),
    ]
}

/// The event id of an action's path; an unusable one is a 404 page.
fn action_id(id: &str) -> Result<EventId, PageError> {
    id.parse().map_err(|_| PageError::NotFound("no such event"))
}

/// Back to the event's page, which says what was just `done`.
fn done(id: EventId, done: &str) -> Response {
    Redirect::to(&format!("/ui/events/{id}?done={done}")).into_response()
}

/// `POST /ui/events/{id}/replay`: back to pending with a fresh budget.
pub(crate) async fn replay(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let id = action_id(&id)?;
    s.engine.operator().replay(id).await?;
    Ok(done(id, "replay"))
}

/// `POST /ui/events/{id}/skip`: a dead head skipped, its key unblocked.
pub(crate) async fn skip(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let id = action_id(&id)?;
    s.engine.operator().skip(id).await?;
    Ok(done(id, "skip"))
}

/// `POST /ui/events/{id}/cancel`: a pending event withdrawn.
pub(crate) async fn cancel(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let id = action_id(&id)?;
    s.engine.operator().cancel(id).await?;
    Ok(done(id, "cancel"))
}
