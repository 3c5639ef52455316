//! The one HTTP error type: RFC 9457 `application/problem+json`. Inner
//! causes are logged, never leaked beyond what the client needs.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use http_body_util::BodyExt;
use mailroom::intake::IntakeError;
use mailroom::pull::ClaimError;
use mailroom::{ParseEventIdError, Refused, StoreError};

/// An error answer.
#[derive(Debug)]
pub struct Problem {
    status: StatusCode,
    title: &'static str,
    detail: String,
    retry_after: Option<u32>,
}

impl Problem {
    /// A problem with `status`, a short `title` and a human `detail`.
    pub fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            title,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// 400.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Bad Request", detail)
    }

    /// 404.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not Found", detail)
    }

    /// Adds `Retry-After: secs`.
    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// 503 with `Retry-After`.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        let mut p = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Service Unavailable",
            detail,
        );
        p.retry_after = Some(1);
        p
    }
}

/// The body of every error answer (RFC 9457), as `/openapi.json` documents it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(example = json!({"type": "about:blank", "title": "Not Found", "status": 404, "detail": "no such event"}))]
pub struct ProblemBody<'a> {
    /// Always `about:blank`: the status says what kind of problem it is.
    #[serde(rename = "type")]
    pub problem_type: &'static str,
    /// The status's reason phrase.
    pub title: &'a str,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong, for a human; never internals or secrets.
    pub detail: &'a str,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = ProblemBody {
            problem_type: "about:blank",
            title: self.title,
            status: self.status.as_u16(),
            detail: &self.detail,
        };
        let body = serde_json::to_string(&body).unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// Every error answer as problem+json: axum's own refusals (a body that is
/// not JSON or lacks `Content-Type: application/json`, a query or path that
/// does not decode, an unknown path, a method the route does not serve)
/// come as plain text or empty; they are answered with the same status and
/// headers (`Allow` on a 405), their text as the detail. HTML error pages
/// (the dashboard's) are left as they are.
pub(crate) async fn errors_as_problems(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let plain = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|ct| ct.starts_with("text/plain"));
    if !plain {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = match http_body_util::Limited::new(body, MAX_REJECTION_TEXT)
        .collect()
        .await
    {
        Ok(bytes) => String::from_utf8_lossy(&bytes.to_bytes())
            .trim()
            .to_string(),
        Err(_) => String::new(),
    };
    let title = status.canonical_reason().unwrap_or("Error");
    let detail = if text.is_empty() {
        title.to_string()
    } else {
        text
    };
    let mut problem = Problem::new(status, title, detail).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            problem.headers_mut().append(name, value.clone());
        }
    }
    problem
}

/// The most of a refusal's text kept as a problem's detail.
const MAX_REJECTION_TEXT: usize = 4096;

impl From<StoreError> for Problem {
    fn from(e: StoreError) -> Self {
        match &e {
            StoreError::NotFound => Problem::not_found("no such event"),
            StoreError::StaleToken => Problem::new(
                StatusCode::CONFLICT,
                "Conflict",
                "stale fencing token: the lease was lost",
            ),
            StoreError::Conflict(m) => Problem::new(StatusCode::CONFLICT, "Conflict", m),
            // 409, not 410: the event is still there (GET shows it); its
            // state, a purged payload, is what refuses the replay.
            StoreError::Purged(_) => Problem::new(StatusCode::CONFLICT, "Conflict", e.to_string()),
            StoreError::Invalid(m) => Problem::bad_request(m),
            StoreError::Overloaded => {
                Problem::unavailable("the write queue is full; retry shortly")
            }
            other => {
                tracing::error!(error = %other, "store error");
                Problem::unavailable(
                    "the store is unavailable; the event may not have been stored, so retry (a repeat is deduplicated)",
                )
            }
        }
    }
}

impl From<ClaimError> for Problem {
    fn from(e: ClaimError) -> Self {
        match e {
            ClaimError::NotPullTopic(_) => {
                Problem::new(StatusCode::CONFLICT, "Conflict", e.to_string())
            }
            ClaimError::Store(s) => s.into(),
            other => Problem::bad_request(other.to_string()),
        }
    }
}

impl From<IntakeError> for Problem {
    fn from(e: IntakeError) -> Self {
        match e {
            IntakeError::UnknownSource(s) => Problem::not_found(format!("unknown source {s:?}")),
            IntakeError::Unauthorized(v) => {
                Problem::new(StatusCode::UNAUTHORIZED, "Unauthorized", v.to_string())
            }
            IntakeError::TooLarge { limit } => Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Payload Too Large",
                format!("the body exceeds this source's max_body of {limit} bytes"),
            ),
            IntakeError::BadRequest(m) => Problem::bad_request(m),
            IntakeError::Refused(r) => r.into(),
            IntakeError::Store(s) => s.into(),
            other => Problem::bad_request(other.to_string()),
        }
    }
}

impl From<Refused> for Problem {
    fn from(e: Refused) -> Self {
        Problem::bad_request(e.to_string())
    }
}

/// An id in a URL that is no event id names no resource: 404.
impl From<ParseEventIdError> for Problem {
    fn from(e: ParseEventIdError) -> Self {
        Problem::not_found(e.to_string())
    }
}
