//! Who may use the dashboard, and how a browser proves it.
//!
//! - With `api_token` set, the login form exchanges the token for a session:
//!   a random id kept server-side, sent as an `HttpOnly; SameSite=Strict`
//!   cookie (over TLS also `Secure`, named `__Host-mailroom_session`),
//!   renewed (a fresh id) at login so an id planted before login is worth
//!   nothing. A session ends after [`IDLE`] unused, and [`MAX_AGE`] after
//!   login whatever its use. An `Authorization: Bearer` header works too
//!   (scripts, the bench). Wrong tokens count against the client's
//!   failures (`crate::auth`): too many get 429.
//! - The login form's pre-login sessions (each `GET /ui/login` makes one,
//!   for its CSRF token) live in a pool of their own, so however many
//!   anonymous visitors ask for the form, no logged-in session is evicted.
//! - Without a token (loopback only) there is no login, but each browser
//!   still gets a session, for its CSRF token.
//! - Every state-changing request (any method but GET/HEAD) must come with
//!   an `Origin` naming this host and, unless authenticated by a bearer
//!   header (which a browser never attaches by itself), the session's CSRF
//!   token as the form field `csrf` or the header `X-CSRF-Token` (the OWASP
//!   synchronizer-token pattern).

use super::view::{self, Frame, PageError, Session};
use crate::AppState;
use crate::auth::{self, Bearer, Route, same_origin};
use askama::Template;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use rand::RngCore;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// The session cookie's name over plain HTTP.
pub(crate) const COOKIE: &str = "mailroom_session";
/// Its name over TLS: the `__Host-` prefix makes browsers accept it only
/// with `Secure`, `Path=/` and no `Domain`, so no other host (a sibling
/// subdomain) can set or overwrite it.
pub(crate) const TLS_COOKIE: &str = "__Host-mailroom_session";
/// A session unused this long ends.
const IDLE: Duration = Duration::from_secs(12 * 3600);
/// A session ends this long after it began, however often it is used.
const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// At most this many sessions are kept in each pool (logged in, and
/// pre-login forms); the one idle longest in that pool goes first.
const MAX_SESSIONS: usize = 10_000;
/// The largest form a dashboard action reads.
const MAX_FORM: usize = 64 * 1024;

#[derive(Debug, Clone)]
struct Entry {
    csrf: String,
    authenticated: bool,
    created: Instant,
    last_used: Instant,
}

impl Entry {
    /// Whether it is still valid at `now`: used within [`IDLE`], begun
    /// within [`MAX_AGE`].
    fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last_used) < IDLE
            && now.saturating_duration_since(self.created) < MAX_AGE
    }
}

/// Server-side sessions by random id: those that may use the dashboard,
/// and the login forms' pre-login ones, each pool bounded on its own.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: Mutex<HashMap<String, Entry>>,
    pre_login: Mutex<HashMap<String, Entry>>,
}

impl Sessions {
    fn pool(&self, authenticated: bool) -> &Mutex<HashMap<String, Entry>> {
        if authenticated {
            &self.map
        } else {
            &self.pre_login
        }
    }

    /// A new session; its id (the cookie's value) and CSRF token.
    fn create(&self, authenticated: bool) -> (String, String) {
        let (id, csrf) = (random_token(), random_token());
        let mut map = self
            .pool(authenticated)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_SESSIONS {
            let now = Instant::now();
            map.retain(|_, e| e.live(now));
        }
        if map.len() >= MAX_SESSIONS {
            let oldest = map
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                map.remove(&k);
            }
        }
        let now = Instant::now();
        let entry = Entry {
            csrf: csrf.clone(),
            authenticated,
            created: now,
            last_used: now,
        };
        map.insert(id.clone(), entry);
        (id, csrf)
    }

    /// The live session `id` of the pool, marked as used now.
    fn touch(&self, id: &str, authenticated: bool) -> Option<Entry> {
        let mut map = self
            .pool(authenticated)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = map.get_mut(id)?;
        if !entry.live(Instant::now()) {
            map.remove(id);
            return None;
        }
        entry.last_used = Instant::now();
        Some(entry.clone())
    }

    fn remove(&self, id: &str, authenticated: bool) {
        self.pool(authenticated)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

/// 32 random bytes from the thread's CSPRNG, in hex.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The session cookie's name for this server: [`TLS_COOKIE`] when clients
/// come over TLS, else [`COOKIE`].
fn cookie_name(s: &AppState) -> &'static str {
    if s.options.tls { TLS_COOKIE } else { COOKIE }
}

fn session_id<'h>(s: &AppState, headers: &'h HeaderMap) -> Option<&'h str> {
    let name = cookie_name(s);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value)
}

/// `Set-Cookie` for session `id`; an empty id with `Max-Age=0` ends it.
fn set_cookie(s: &AppState, resp: &mut Response, id: &str, max_age: Duration) {
    let secure = if s.options.tls { "; Secure" } else { "" };
    let cookie = format!(
        "{}={id}; Path=/; HttpOnly; SameSite=Strict{secure}; Max-Age={}",
        cookie_name(s),
        max_age.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
}

#[derive(Debug, Deserialize)]
struct CsrfField {
    csrf: String,
}

/// The CSRF token a request carries (header, else form field), and the
/// request rebuilt around the body that was read to find it.
async fn presented_csrf(req: Request) -> Result<(Option<String>, Request), Response> {
    if let Some(t) = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
    {
        let t = t.to_owned();
        return Ok((Some(t), req));
    }
    let (parts, body) = req.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, MAX_FORM)
        .await
        .map_err(|_| view::plain(StatusCode::PAYLOAD_TOO_LARGE, "form too large"))?;
    let copy = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
    let token = Form::<CsrfField>::from_request(copy, &())
        .await
        .ok()
        .map(|Form(f)| f.csrf);
    Ok((token, Request::from_parts(parts, Body::from(bytes))))
}

fn is_read(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// Lets a request through to a dashboard route only with a session (or a
/// bearer token), and a state-changing one only from this origin with the
/// session's CSRF token. Others get a redirect to the login form (pages)
/// or 401 (actions), or 403.
pub(crate) async fn guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let open = s.tokens.open();
    let sessions = &s.dashboard.sessions;
    let entry = session_id(&s, req.headers())
        .and_then(|id| sessions.touch(id, true))
        .filter(|e| e.authenticated);
    let by_bearer = !open
        && match auth::check_bearer(&s, &req, Route::Dashboard) {
            Bearer::Valid => true,
            Bearer::Limited(wait) => {
                return auth::too_many(Route::Dashboard, wait).into_response();
            }
            Bearer::Missing | Bearer::Wrong => false,
        };
    let mut new_cookie = None;
    let session = match entry {
        Some(e) => Session {
            csrf: e.csrf,
            can_logout: !open,
        },
        None if by_bearer => Session {
            csrf: String::new(),
            can_logout: false,
        },
        None if open => {
            let (id, csrf) = sessions.create(true);
            new_cookie = Some(id);
            Session {
                csrf,
                can_logout: false,
            }
        }
        None => return refuse(&req),
    };
    let mut req = req;
    if !is_read(req.method()) {
        req = match check_write(req, &session, by_bearer).await {
            Ok(req) => req,
            Err(resp) => return resp,
        };
    }
    req.extensions_mut().insert(session);
    let mut resp = next.run(req).await;
    if let Some(id) = new_cookie {
        set_cookie(&s, &mut resp, &id, IDLE);
    }
    resp
}

/// The Origin and CSRF checks of a state-changing request.
async fn check_write(
    req: Request,
    session: &Session,
    by_bearer: bool,
) -> Result<Request, Response> {
    let origin_ok =
        same_origin(req.headers()) || (by_bearer && !req.headers().contains_key(header::ORIGIN));
    if !origin_ok {
        return Err(view::plain(
            StatusCode::FORBIDDEN,
            "cross-origin request refused",
        ));
    }
    if by_bearer {
        return Ok(req);
    }
    let (token, req) = presented_csrf(req).await?;
    let ok = token.is_some_and(|t| bool::from(t.as_bytes().ct_eq(session.csrf.as_bytes())));
    if ok {
        Ok(req)
    } else {
        Err(view::plain(
            StatusCode::FORBIDDEN,
            "missing or wrong CSRF token",
        ))
    }
}

fn refuse(req: &Request) -> Response {
    if is_read(req.method()) {
        let next = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let to = format!("/ui/login?next={}", view::encode(&next));
        Redirect::to(&to).into_response()
    } else {
        view::plain(StatusCode::UNAUTHORIZED, "log in first")
    }
}

#[derive(Template)]
#[template(path = "dashboard/login.html")]
struct LoginPage {
    frame: Frame,
    next: String,
    failed: bool,
}

/// Query of the login form.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct LoginQuery {
    next: Option<String>,
}

/// `GET /ui/login`: the form, with a fresh pre-login session for its CSRF
/// token. Without a configured token there is nothing to log in to.
pub(crate) async fn login_form(State(s): State<AppState>, Query(q): Query<LoginQuery>) -> Response {
    if s.tokens.open() {
        return Redirect::to("/").into_response();
    }
    let (id, csrf) = s.dashboard.sessions.create(false);
    let page = LoginPage {
        frame: Frame::new(
            "Log in",
            Session {
                csrf,
                can_logout: false,
            },
        ),
        next: safe_next(q.next.as_deref()).to_owned(),
        failed: false,
    };
    let mut resp = view::render(StatusCode::OK, &page);
    set_cookie(&s, &mut resp, &id, IDLE);
    resp
}

/// Form of `POST /ui/login`.
#[derive(Debug, Deserialize)]
pub(crate) struct LoginForm {
    token: String,
    csrf: String,
    #[serde(default)]
    next: String,
}

/// `POST /ui/login`: from this origin, with the pre-login session's CSRF
/// token and a configured API token, starts a session under a fresh id.
/// A client that sent too many wrong tokens gets 429 until its window ends.
pub(crate) async fn login(State(s): State<AppState>, req: Request) -> Response {
    let client = auth::client(&req);
    let (parts, body) = req.into_parts();
    let headers = parts.headers.clone();
    let Ok(Form(f)) = Form::<LoginForm>::from_request(Request::from_parts(parts, body), &()).await
    else {
        return view::plain(StatusCode::BAD_REQUEST, "malformed login form");
    };
    let sessions = &s.dashboard.sessions;
    if !same_origin(&headers) {
        return view::plain(StatusCode::FORBIDDEN, "cross-origin request refused");
    }
    let pre = session_id(&s, &headers).map(|id| (id, sessions.touch(id, false)));
    let Some((pre_id, Some(pre))) = pre else {
        return Redirect::to("/ui/login").into_response();
    };
    if !bool::from(f.csrf.as_bytes().ct_eq(pre.csrf.as_bytes())) {
        return view::plain(StatusCode::FORBIDDEN, "missing or wrong CSRF token");
    }
    if let Some(wait) = s.auth_failures.wait(client) {
        let mut resp = auth::too_many(Route::Login, wait).into_response();
        let text = "too many wrong tokens from this address: wait a minute before trying again";
        *resp.body_mut() = Body::from(text);
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return resp;
    }
    if s.tokens.open() || !s.tokens.matches(f.token.trim()) {
        if !s.tokens.open() {
            auth::failed(&s, Route::Login, client);
        }
        let page = LoginPage {
            frame: Frame::new(
                "Log in",
                Session {
                    csrf: pre.csrf,
                    can_logout: false,
                },
            ),
            next: safe_next(Some(&f.next)).to_owned(),
            failed: true,
        };
        return view::render(StatusCode::UNAUTHORIZED, &page);
    }
    sessions.remove(pre_id, false);
    let (id, _) = sessions.create(true);
    let mut resp = Redirect::to(safe_next(Some(&f.next))).into_response();
    set_cookie(&s, &mut resp, &id, IDLE);
    resp
}

/// Where to go after login: a path on this site, never another site.
/// `//host` and `/\host` would leave it, and so would either once a
/// browser strips the tab or newline it ignores in URLs (`/\t/host`), so
/// any control character or whitespace sends to `/`.
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && !n.starts_with("/\\")
                && !n.chars().any(|c| c.is_control() || c.is_whitespace()) =>
        {
            n
        }
        _ => "/",
    }
}

/// `POST /ui/logout`: ends the session.
pub(crate) async fn logout(
    State(s): State<AppState>,
    Extension(_session): Extension<Session>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    if let Some(id) = session_id(&s, &headers) {
        s.dashboard.sessions.remove(id, true);
    }
    let mut resp = Redirect::to("/ui/login").into_response();
    set_cookie(&s, &mut resp, "", Duration::ZERO);
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only paths on this site are followed after login.
    #[test]
    fn next_never_leaves_the_site() {
        assert_eq!(safe_next(Some("/ui/dead?topic=a")), "/ui/dead?topic=a");
        assert_eq!(safe_next(Some("//evil.example/")), "/");
        assert_eq!(safe_next(Some("/\\evil.example/")), "/");
        assert_eq!(safe_next(Some("https://evil.example/")), "/");
        assert_eq!(safe_next(None), "/");
        // Browsers drop tabs and newlines from URLs: `/\t/evil` is `//evil`.
        assert_eq!(safe_next(Some("/\t/evil.example/")), "/");
        assert_eq!(safe_next(Some("/\n/evil.example/")), "/");
        assert_eq!(safe_next(Some("/ /evil.example/")), "/");
        assert_eq!(safe_next(Some("/ui/dead\r\nSet-Cookie: x=1")), "/");
        assert_eq!(safe_next(Some("/\u{85}/evil.example/")), "/");
    }

    /// However many pre-login sessions anonymous visitors make, the
    /// logged-in ones stay; the pre-login pool stays bounded.
    #[test]
    fn login_forms_never_evict_a_logged_in_session() {
        let sessions = Sessions::default();
        let (operator, _) = sessions.create(true);
        for _ in 0..MAX_SESSIONS + 50 {
            sessions.create(false);
        }
        assert!(sessions.touch(&operator, true).is_some());
        let pre = sessions.pre_login.lock().expect("lock").len();
        assert!(pre <= MAX_SESSIONS, "{pre}");
        // A pre-login id is no logged-in session, nor the reverse.
        let (form, _) = sessions.create(false);
        assert!(sessions.touch(&form, true).is_none());
        assert!(sessions.touch(&operator, false).is_none());
    }

    /// A session in constant use still ends `MAX_AGE` after it began; an
    /// unused one after `IDLE`.
    #[test]
    fn sessions_end_at_their_absolute_lifetime() {
        let begun = Instant::now();
        let minute = Duration::from_secs(60);
        let mut e = Entry {
            csrf: String::new(),
            authenticated: true,
            created: begun,
            last_used: begun,
        };
        assert!(e.live(begun + IDLE - minute));
        assert!(!e.live(begun + IDLE));
        e.last_used = begun + MAX_AGE - minute;
        assert!(e.live(begun + MAX_AGE - Duration::from_secs(1)));
        assert!(!e.live(begun + MAX_AGE));
    }

    /// The Origin must name the Host the request was sent to.
    #[test]
    fn same_origin_compares_origin_with_host() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(!same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9090"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
    }
}
