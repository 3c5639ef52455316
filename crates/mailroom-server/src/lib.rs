//! # mailroom-server
//!
//! The HTTP face of a [`mailroom::Engine`], as an axum [`Router`] a host
//! application can nest, plus [`serve`] to run it with an injected shutdown.
//!
//! - [`webhooks`]: `POST /webhooks/{source}` — verify, dedup, commit, then 200.
//! - [`api`]: `/v1/events` (list, show, replay, skip), `/v1/replay`, `/v1/stats`.
//! - [`pull`]: `/v1/topics/{topic}/claim`, `/v1/events/{id}/ack|nack|extend` for pull workers.
//! - module `dashboard`: the web pages at `GET /` and `/ui/*` (overview,
//!   topics, events, dead letters), with login, sessions and CSRF checks.
//! - [`shedding`]: load shedding — header and body read deadlines, header
//!   limits, caps on connections and requests in flight (503), per-source
//!   rate limits (429).
//! - [`tls`]: HTTPS on the own listener ([`serve_https`]), its certificate
//!   replaced while serving ([`tls::ServerTls::reload`]).
//! - module `rejections`: rejected requests and connections (401, 400,
//!   408, 413, slow or malformed) logged once per class per window, with
//!   their count, so a flood never floods the log.
//! - `POST /v1/events` with `Idempotency-Key` (module `idempotency`).
//! - `GET /openapi.json` (module `openapi`): OpenAPI 3.1, generated from
//!   the handlers' `#[utoipa::path]` attributes that also route them.
//! - `/metrics` (Prometheus text, rendered by the exporter that
//!   [`prometheus::install`] sets up for the binary),
//!   `/healthz`, and `/readyz` (module `ready`: the store and each registered
//!   [`Dependency`], e.g. an AMQP connection).
//!
//! Only this crate knows HTTP routing; the engine knows nothing of axum.

pub mod api;
mod auth;
mod dashboard;
pub mod formats;
mod idempotency;
mod openapi;
pub mod problem;
pub mod prometheus;
pub mod pull;
mod ready;
mod rejections;
pub mod shedding;
pub mod tls;
pub mod webhooks;

use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use http::StatusCode;
use mailroom::Engine;
pub use ready::Dependency;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Renders the Prometheus exposition (installed by the binary, so this crate
/// stays free of a global recorder).
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// What the router needs besides the engine.
#[derive(Clone, Default)]
pub struct ServerOptions {
    /// Bearer tokens for `/v1/*` (none configured: open, loopback only).
    pub api_tokens: Vec<String>,
    /// Serves `/metrics` when set.
    pub metrics: Option<MetricsRenderer>,
    /// Load-shedding limits (see [`shedding::Limits`] for the defaults).
    pub limits: shedding::Limits,
    /// Reported by `/readyz` beside the store; any one down makes it 503.
    pub dependencies: Vec<Dependency>,
    /// Whether clients reach this router over TLS (the listener serves
    /// HTTPS, or a proxy in front does): the dashboard's session cookie is
    /// then `Secure` and named with the `__Host-` prefix, so a browser
    /// never sends it over plain HTTP nor lets another host set it.
    pub tls: bool,
    /// With `api_tokens` set, `/metrics` needs the bearer token too, and
    /// `/readyz` answers others with its status and `{"ready": bool}`
    /// only (the detail may name hosts and errors). `/healthz` stays open.
    pub protect_metrics: bool,
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("api_tokens", &self.api_tokens.len())
            .field("metrics", &self.metrics.is_some())
            .field("limits", &self.limits)
            .field("dependencies", &self.dependencies)
            .field("tls", &self.tls)
            .field("protect_metrics", &self.protect_metrics)
            .finish()
    }
}

/// Shared state of every route.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The engine.
    pub engine: Engine,
    /// Options.
    pub options: Arc<ServerOptions>,
    inflight: Arc<idempotency::InFlight>,
    rate: Arc<shedding::RateLimiter>,
    dashboard: Arc<dashboard::Dashboard>,
    tokens: Arc<auth::Tokens>,
    auth_failures: Arc<auth::Failures>,
}

/// The whole HTTP surface.
pub fn router(engine: Engine, options: ServerOptions) -> Router {
    let state = AppState {
        engine,
        tokens: Arc::new(auth::Tokens::new(&options.api_tokens)),
        options: Arc::new(options),
        inflight: Arc::default(),
        rate: Arc::default(),
        dashboard: Arc::default(),
        auth_failures: Arc::default(),
    };
    let max_in_flight = state.options.limits.max_concurrent_requests.max(1);
    let rejected = Arc::new(rejections::RejectionLog::new(
        state.options.limits.rejection_log_every,
    ));
    let (routes, api) = documented_routes(state.clone()).split_for_parts();
    let mut api = openapi::finish(
        api.merge_from(dashboard::Doc::openapi()),
        !state.options.api_tokens.is_empty(),
    );
    let topics: Vec<(String, bool)> = state
        .engine
        .topics()
        .map(|t| {
            let sequential = matches!(t.mode, mailroom::Mode::Sequential { .. });
            let needs_key = sequential && t.default_key.is_none() && t.key.is_none();
            (t.name.clone(), needs_key)
        })
        .collect();
    openapi::constrain_create_event(&mut api, &topics);
    let routes = routes
        .merge(dashboard::routes(state.clone()))
        .layer(Extension(openapi::Document::new(&api)))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::local_only,
        ))
        .with_state(state);
    shedding::shed_beyond(routes, max_in_flight)
        .layer(axum::middleware::from_fn(problem::errors_as_problems))
        .layer(axum::middleware::from_fn_with_state(
            rejected,
            rejections::note_answers,
        ))
}

/// Every route, each documented by its handler's `#[utoipa::path]`; the
/// `/v1` ones behind the bearer token.
fn documented_routes(state: AppState) -> OpenApiRouter<AppState> {
    let (v1, rest) = routes_parts();
    rest.nest(
        "/v1",
        v1.route_layer(axum::middleware::from_fn_with_state(
            state,
            auth::require_token,
        )),
    )
}

/// (`/v1` routes, the others).
fn routes_parts() -> (OpenApiRouter<AppState>, OpenApiRouter<AppState>) {
    let v1 = api::routes().merge(pull::routes());
    // Each source has its own max_body; the webhook route enforces it.
    let (schemas, paths, webhook) = routes!(webhooks::receive);
    let rest = OpenApiRouter::new()
        .routes((schemas, paths, webhook.layer(DefaultBodyLimit::disable())))
        .routes(routes!(metrics))
        .routes(routes!(healthz))
        .routes(routes!(ready::ready))
        .routes(routes!(openapi::openapi_json));
    (v1, rest)
}

/// Prometheus text format (with `protect_metrics`, behind the bearer token).
#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain; version=0.0.4"),
        (status = 401, description = "`protect_metrics` is on and the bearer token is missing or wrong", body = problem::ProblemBody, content_type = "application/problem+json")))]
async fn metrics(State(s): State<AppState>, req: axum::extract::Request) -> Response {
    if let Some(refused) = auth::refuse_protected_read(&s, &req) {
        return refused;
    }
    match &s.options.metrics {
        Some(render) => (
            StatusCode::OK,
            [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render(),
        )
            .into_response(),
        None => problem::Problem::not_found("metrics are not enabled").into_response(),
    }
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "`ok`", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Serves `router` on `listener` until `shutdown` with the default
/// [`shedding::Limits`]; see [`serve_with`].
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(listener, router, shutdown, &shedding::Limits::default()).await
}

/// Serves `router` on `listener` until `shutdown`; then stops accepting and
/// finishes requests in flight (so nothing half-committed is answered),
/// for at most `limits.shutdown_grace`, then closes what is left.
///
/// Connections are served by hyper directly (not `axum::serve`) for the
/// limits a public listener needs: `limits.header_read_timeout`,
/// `max_headers`, `max_header_bytes` and `max_connections`.
pub async fn serve_with(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    limits: &shedding::Limits,
) -> std::io::Result<()> {
    shedding::serve_connections(listener, router, shutdown, limits, None).await
}

/// [`serve_with`] over HTTPS: each connection first completes a TLS
/// handshake (within `limits.tls_handshake_timeout`, holding one of the
/// `max_connections` slots) with the certificate `tls` holds at that
/// moment; [`tls::ServerTls::reload`] changes it for later handshakes.
pub async fn serve_https(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
    limits: &shedding::Limits,
    tls: &tls::ServerTls,
) -> std::io::Result<()> {
    shedding::serve_connections(listener, router, shutdown, limits, Some(tls.acceptor())).await
}
