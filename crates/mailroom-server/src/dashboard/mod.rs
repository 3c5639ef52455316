//! The dashboard (`GET /`): HTML rendered here from askama
//! templates compiled into the binary (`templates/dashboard/`), one small
//! stylesheet and one small script served from memory; nothing is fetched
//! from elsewhere, at build or at run time.
//!
//! - [`pages`]: the overview (`/`), a topic (`/ui/topics/{topic}`), an
//!   event (`/ui/events/{id}`) and its replay, skip and cancel buttons.
//! - [`dead`]: dead letters across topics (`/ui/dead`) and bulk replay run
//!   as a job whose progress a page shows (`/ui/jobs/{id}`).
//! - [`session`]: login with the API token, server-side sessions in an
//!   HttpOnly, SameSite=Strict cookie, and the Origin and CSRF checks every
//!   state-changing request passes.
//! - [`chart`]: the overview's inline SVG of each topic's traffic.
//! - [`view`]: what pages share: the page frame, errors, time formatting.
//!
//! Like `/v1`, every page reads and writes through the [`mailroom::Engine`]
//! and its typed answers ([`mailroom::answer`]).

mod chart;
mod dead;
mod pages;
mod session;
mod view;

use crate::AppState;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get, post};

/// The dashboard in `/openapi.json`: its entry page, `GET /`.
/// The pages under `/ui/` are the dashboard's own links, not API.
#[derive(utoipa::OpenApi)]
#[openapi(paths(pages::overview))]
pub(crate) struct Doc;

/// The dashboard's own state: sessions and bulk-replay jobs.
#[derive(Debug, Default)]
pub(crate) struct Dashboard {
    sessions: session::Sessions,
    jobs: dead::Jobs,
}

/// Every dashboard route: the pages behind [`session::guard`], the login
/// form and the static files outside it.
pub(crate) fn routes(state: AppState) -> Router<AppState> {
    // Per method router, so a method a path does not serve still gets 405.
    let guard = |m: MethodRouter<AppState>| {
        m.route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            session::guard,
        ))
    };
    Router::new()
        .route("/", guard(get(pages::overview)))
        .route("/ui/topics/{topic}", guard(get(pages::topic)))
        .route("/ui/events/{id}", guard(get(pages::event)))
        .route("/ui/events/{id}/replay", guard(post(pages::replay)))
        .route("/ui/events/{id}/skip", guard(post(pages::skip)))
        .route("/ui/events/{id}/cancel", guard(post(pages::cancel)))
        .route("/ui/dead", guard(get(dead::page)))
        .route("/ui/dead/replay", guard(post(dead::start)))
        .route("/ui/jobs/{id}", guard(get(dead::job)))
        .route("/ui/logout", guard(post(session::logout)))
        .route("/ui/login", get(session::login_form).post(session::login))
        .route("/ui/static/app.css", get(css))
        .route("/ui/static/app.js", get(js))
        .layer(axum::middleware::from_fn(view::security_headers))
}

async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("../../templates/dashboard/app.css"),
    )
}

async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("../../templates/dashboard/app.js"),
    )
}
