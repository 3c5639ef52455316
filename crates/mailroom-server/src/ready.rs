//! `GET /readyz`: ready when the store answers and every
//! dependency the host registered (the binary registers each AMQP
//! connection) is up. The body says which part is not, so an operator (or a
//! probe's log) sees why without reading mailroom's logs.

use crate::AppState;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use std::sync::Arc;

/// Something besides the store that mailroom needs to be ready, e.g. a
/// broker connection. The server only asks whether it is up.
#[derive(Clone)]
pub struct Dependency {
    /// Its kind, the key it is listed under in `/readyz` (`"amqp"`).
    pub kind: &'static str,
    /// Its name, shown as is: must carry no secret (a URL without password).
    pub name: String,
    /// Whether it is up now; called on every `/readyz`, so cheap.
    pub up: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for Dependency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dependency")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("up", &(self.up)())
            .finish()
    }
}

/// 200 when everything is up, else 503 with `Retry-After: 1`; both with
/// `{"ready", "store": {"up", "error"?}, "<kind>": [{"connection", "up"}]}`.
/// With `protect_metrics`, a request without the bearer token gets the
/// status and `{"ready"}` only.
#[utoipa::path(get, path = "/readyz", tag = "meta",
    responses(
        (status = 200, description = "Ready: `{\"ready\": true, \"store\": {\"up\": true}, \"amqp\": [{\"connection\", \"up\"}]}` (only `ready` without the token when `protect_metrics` is on)", body = Object),
        (status = 503, description = "Not ready: the same body says which part is down", body = Object),
    ))]
pub(crate) async fn ready(State(s): State<AppState>, req: Request) -> Response {
    let detailed = crate::auth::refuse_protected_read(&s, &req).is_none();
    let store = s.engine.operator().ready().await;
    let mut ready = store.is_ok();
    let mut body = serde_json::json!({
        "store": match &store {
            Ok(()) => serde_json::json!({ "up": true }),
            Err(e) => serde_json::json!({ "up": false, "error": e.to_string() }),
        },
    });
    for d in &s.options.dependencies {
        let up = (d.up)();
        ready &= up;
        let entry = serde_json::json!({ "connection": d.name, "up": up });
        match body[d.kind].as_array_mut() {
            Some(list) => list.push(entry),
            None => body[d.kind] = serde_json::json!([entry]),
        }
    }
    body["ready"] = ready.into();
    if !detailed {
        body = serde_json::json!({ "ready": ready });
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if !ready {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(1u32));
    }
    resp
}
