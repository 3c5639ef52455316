//! What every page shares: the frame around it (title, navigation, the
//! session's CSRF token for the logout button), rendering, the error page,
//! security headers, and how times and durations read.

use askama::Template;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use jiff::Timestamp;
use mailroom::StoreError;
use std::time::Duration;

/// What a page learns about the request's session.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// The token forms carry back (empty for bearer-authenticated requests).
    pub(crate) csrf: String,
    /// Whether there is a login to end (a token is configured).
    pub(crate) can_logout: bool,
}

/// The frame of every page.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    /// The `<title>` and the page's heading.
    pub(crate) title: String,
    /// The session's CSRF token, carried by every form.
    pub(crate) csrf: String,
    /// Whether to show the logout button.
    pub(crate) can_logout: bool,
}

impl Frame {
    pub(crate) fn new(title: impl Into<String>, session: Session) -> Self {
        Self {
            title: title.into(),
            csrf: session.csrf,
            can_logout: session.can_logout,
        }
    }
}

/// Renders `page` with `status`; a template that fails to render (it
/// cannot on well-formed data) is logged and answered 500.
pub(crate) fn render<T: Template>(status: StatusCode, page: &T) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "dashboard page failed to render");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page failed to render",
            )
        }
    }
}

/// A short plain-text answer (refusals, errors before a page exists).
pub(crate) fn plain(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

#[derive(Template)]
#[template(path = "dashboard/error.html")]
struct ErrorPage {
    frame: Frame,
    message: String,
}

/// Why a page could not be shown; answered as an HTML page with its
/// status, never with internal details (those are logged).
#[derive(Debug)]
pub(crate) enum PageError {
    /// The store refused or failed.
    Store(StoreError),
    /// Nothing there (a bad id, an unknown job).
    NotFound(&'static str),
    /// The request's parameters do not make sense.
    BadRequest(String),
}

impl From<StoreError> for PageError {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

impl PageError {
    fn status_and_message(&self) -> (StatusCode, String) {
        match self {
            Self::NotFound(what) => (StatusCode::NOT_FOUND, (*what).to_owned()),
            Self::BadRequest(m) => (StatusCode::BAD_REQUEST, m.clone()),
            Self::Store(e) => match e {
                StoreError::NotFound => (StatusCode::NOT_FOUND, "no such event".to_owned()),
                StoreError::Conflict(m) => (StatusCode::CONFLICT, m.clone()),
                StoreError::Purged(_) => (StatusCode::CONFLICT, e.to_string()),
                StoreError::Invalid(m) => (StatusCode::BAD_REQUEST, m.clone()),
                StoreError::Overloaded => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the store is busy; retry shortly".to_owned(),
                ),
                other => {
                    tracing::error!(error = %other, "dashboard: store error");
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the store is unavailable; see the server's log".to_owned(),
                    )
                }
            },
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let (status, message) = self.status_and_message();
        let title = status.canonical_reason().unwrap_or("Error");
        let frame = Frame {
            title: title.to_owned(),
            csrf: String::new(),
            can_logout: false,
        };
        render(status, &ErrorPage { frame, message })
    }
}

/// Headers on every dashboard answer: no framing (the buttons must not be
/// clickjacked), scripts and styles from this origin only, no sniffing.
pub(crate) async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// Percent-encodes `s` for a query value or a path segment (RFC 3986:
/// everything but unreserved characters).
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A time as operators read it: `2026-11-25 14:03:07 UTC`.
pub(crate) fn when(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A duration in its two largest units: `850ms`, `12.3s`, `4m 05s`, `3h 12m`, `2d 4h`.
pub(crate) fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Durations read in their two largest units.
    #[test]
    fn spans_read_in_two_units() {
        assert_eq!(span(Duration::from_millis(850)), "850ms");
        assert_eq!(span(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(span(Duration::from_secs(245)), "4m 05s");
        assert_eq!(span(Duration::from_secs(3 * 3600 + 12 * 60)), "3h 12m");
        assert_eq!(span(Duration::from_secs(2 * 86400 + 4 * 3600)), "2d 4h");
        assert_eq!(encode("a b/<é>"), "a%20b%2F%3C%C3%A9%3E");
    }
}
