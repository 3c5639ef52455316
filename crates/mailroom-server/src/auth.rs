//! `Authorization: Bearer <api_token>` on `/v1/*`, compared in constant time
//! (the dashboard's login compares with the same [`token_matches`]).

use crate::AppState;
use crate::problem::Problem;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use subtle::ConstantTimeEq;

pub(crate) async fn require_token(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let tokens = &s.options.api_tokens;
    if tokens.is_empty() {
        return next.run(req).await;
    }
    let ok = bearer(req.headers()).is_some_and(|p| token_matches(tokens, p));
    if ok {
        next.run(req).await
    } else {
        let mut resp = Problem::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "missing or wrong bearer token",
        )
        .into_response();
        resp.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
        resp
    }
}

/// The token of an `Authorization: Bearer` header, if any.
pub(crate) fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Whether `presented` is one of `tokens`. Every token is compared (no
/// early exit), so timing says nothing about which matched.
pub(crate) fn token_matches(tokens: &[String], presented: &str) -> bool {
    tokens
        .iter()
        .fold(subtle::Choice::from(0), |acc, t| {
            acc | t.as_bytes().ct_eq(presented.as_bytes())
        })
        .into()
}
