//! Dead letters: every dead event across topics, filtered; replay of one
//! (on its event page) or of every match, as a job whose progress a page
//! shows while it runs.

use super::pages::{EventRow, PAGE_SIZE, cursor};
use super::view::{self, Frame, PageError, Session, encode};
use crate::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use jiff::Timestamp;
use mailroom::operate::KeyCursor;
use mailroom::operate::{EventSearch, ListFilter};
use mailroom::{Engine, Status, StoreError};
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What the dead letters page and a bulk replay filter on, as typed in
/// the form (times as `datetime-local` values, UTC, or RFC 3339).
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct DeadFilter {
    #[serde(default)]
    topic: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    until: String,
}

/// A form's time: `2026-11-25T14:03` (UTC, what `datetime-local` sends),
/// with seconds, or RFC 3339 with an offset.
fn parse_time(field: &str, text: &str) -> Result<Option<Timestamp>, PageError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let parsed = text.parse::<Timestamp>().ok().or_else(|| {
        text.parse::<jiff::civil::DateTime>()
            .ok()
            .and_then(|dt| dt.to_zoned(jiff::tz::TimeZone::UTC).ok())
            .map(|z| z.timestamp())
    });
    parsed.map(Some).ok_or_else(|| {
        PageError::BadRequest(format!(
            "{field}: {text:?} is not a time (e.g. 2026-11-25T14:03, UTC)"
        ))
    })
}

impl DeadFilter {
    fn search(&self, limit: u32, cursor: Option<KeyCursor>) -> Result<EventSearch, PageError> {
        let some = |s: &str| Some(s.trim().to_owned()).filter(|s| !s.is_empty());
        Ok(EventSearch {
            filter: ListFilter {
                topic: some(&self.topic),
                status: Some(Status::Dead),
                key: some(&self.key),
                limit,
                cursor,
            },
            error_contains: some(&self.error),
            received_from: parse_time("from", &self.from)?,
            received_until: parse_time("until", &self.until)?,
        })
    }

    fn query(&self) -> String {
        format!(
            "topic={}&key={}&error={}&from={}&until={}",
            encode(&self.topic),
            encode(&self.key),
            encode(&self.error),
            encode(&self.from),
            encode(&self.until)
        )
    }

    /// Whether no field narrows the search (every dead event matches).
    fn is_empty(&self) -> bool {
        [&self.topic, &self.key, &self.error, &self.from, &self.until]
            .iter()
            .all(|v| v.trim().is_empty())
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = [
            ("topic", &self.topic),
            ("key", &self.key),
            ("error containing", &self.error),
            ("received from", &self.from),
            ("received until", &self.until),
        ]
        .iter()
        .filter(|(_, v)| !v.trim().is_empty())
        .map(|(k, v)| format!("{k} {}", v.trim()))
        .collect();
        if parts.is_empty() {
            "every dead event".to_owned()
        } else {
            format!("dead events with {}", parts.join(", "))
        }
    }
}

#[derive(Template)]
#[template(path = "dashboard/dead.html")]
struct DeadPage {
    frame: Frame,
    filter: DeadFilter,
    topics: Vec<String>,
    matching: u64,
    events: Vec<EventRow>,
    next: Option<String>,
}

/// Query of the dead letters page: the filter and the page's cursor.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct DeadQuery {
    #[serde(flatten)]
    filter: DeadFilter,
    cursor: Option<String>,
}

/// `GET /ui/dead`: the matching dead events newest first, how many match
/// in all (what "replay all" would take), a page at a time.
pub(crate) async fn page(
    State(s): State<AppState>,
    Extension(session): Extension<Session>,
    Query(q): Query<DeadQuery>,
) -> Result<Response, PageError> {
    let filter = q.filter;
    let listed = s
        .engine
        .operator()
        .search(&filter.search(PAGE_SIZE, cursor(q.cursor.as_deref())?)?)
        .await?;
    let matching = s.engine.operator().count(&filter.search(0, None)?).await?;
    let next = listed
        .next_cursor
        .map(|c| format!("?{}&cursor={}", filter.query(), c.0));
    let page = DeadPage {
        frame: Frame::new("Dead letters", session),
        topics: s.engine.topics().map(|t| t.name.clone()).collect(),
        matching,
        events: listed.events.iter().map(EventRow::new).collect(),
        next,
        filter,
    };
    Ok(view::render(StatusCode::OK, &page))
}

/// A bulk replay under way or finished.
#[derive(Debug)]
pub(crate) struct Job {
    id: u64,
    what: String,
    total: u64,
    replayed: AtomicU64,
    purged: AtomicU64,
    changed: AtomicU64,
    finished: AtomicBool,
    error: Mutex<Option<String>>,
}

/// The latest bulk replays, for their progress pages.
#[derive(Debug, Default)]
pub(crate) struct Jobs {
    next_id: AtomicU64,
    recent: Mutex<VecDeque<Arc<Job>>>,
}

/// Jobs kept for their progress pages.
const JOBS_KEPT: usize = 32;
/// Replays in flight at once within a job.
const JOB_CHUNK: u32 = 100;

impl Jobs {
    fn add(&self, what: String, total: u64) -> Arc<Job> {
        let job = Arc::new(Job {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            what,
            total,
            replayed: AtomicU64::new(0),
            purged: AtomicU64::new(0),
            changed: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        if recent.len() >= JOBS_KEPT {
            recent.pop_front();
        }
        recent.push_back(job.clone());
        job
    }

    fn get(&self, id: u64) -> Option<Arc<Job>> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.iter().find(|j| j.id == id).cloned()
    }
}

/// Form of `POST /ui/dead/replay`.
#[derive(Debug, Deserialize)]
pub(crate) struct StartForm {
    #[serde(flatten)]
    filter: DeadFilter,
    /// `true` to replay every dead event: required when the filter is
    /// empty (the page's form says it then), so that a form without
    /// fields replays nothing.
    #[serde(default)]
    all: String,
}

/// `POST /ui/dead/replay`: replays every dead event matching the filter in
/// the background, and shows the job's progress page.
pub(crate) async fn start(
    State(s): State<AppState>,
    Form(form): Form<StartForm>,
) -> Result<Response, PageError> {
    let filter = form.filter;
    if filter.is_empty() && form.all != "true" {
        return Err(PageError::BadRequest(
            "missing filter: give a topic, key, error or time, or all=true to replay every dead event"
                .to_owned(),
        ));
    }
    let search = filter.search(JOB_CHUNK, None)?;
    let total = s.engine.operator().count(&search).await?;
    let job = s.dashboard.jobs.add(filter.describe(), total);
    tokio::spawn(run(s.engine.clone(), search, job.clone()));
    Ok(Redirect::to(&format!("/ui/jobs/{}", job.id)).into_response())
}

/// Replays the matching events a page at a time
/// ([`Engine::replay_each`]), publishing the counts after each page.
async fn run(engine: Engine, search: EventSearch, job: Arc<Job>) {
    let outcome = engine
        .operator()
        .replay_each(search, |p| {
            job.replayed.store(p.replayed, Ordering::Relaxed);
            job.purged.store(p.purged, Ordering::Relaxed);
            job.changed.store(p.changed, Ordering::Relaxed);
        })
        .await;
    match outcome {
        Ok(_) => job.finished.store(true, Ordering::Release),
        Err(e) => job.fail(&e),
    }
}

impl Job {
    fn fail(&self, e: &StoreError) {
        tracing::error!(error = %e, job = self.id, "dashboard bulk replay stopped");
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) =
            Some("the store failed; see the server's log".to_owned());
        self.finished.store(true, Ordering::Release);
    }
}

#[derive(Template)]
#[template(path = "dashboard/job.html")]
struct JobPage {
    frame: Frame,
    what: String,
    total: u64,
    handled: u64,
    replayed: u64,
    purged: u64,
    changed: u64,
    finished: bool,
    error: String,
}

/// `GET /ui/jobs/{id}`: a bulk replay's progress (the page refreshes
/// itself until the job ends).
pub(crate) async fn job(
    State(s): State<AppState>,
    Extension(session): Extension<Session>,
    Path(id): Path<u64>,
) -> Result<Response, PageError> {
    let job = s
        .dashboard
        .jobs
        .get(id)
        .ok_or(PageError::NotFound("no such job"))?;
    let (replayed, purged, changed) = (
        job.replayed.load(Ordering::Relaxed),
        job.purged.load(Ordering::Relaxed),
        job.changed.load(Ordering::Relaxed),
    );
    let page = JobPage {
        frame: Frame::new(format!("Replay {}", job.id), session),
        what: job.what.clone(),
        total: job.total,
        handled: replayed + purged + changed,
        replayed,
        purged,
        changed,
        finished: job.finished.load(Ordering::Acquire),
        error: job
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default(),
    };
    Ok(view::render(StatusCode::OK, &page))
}
