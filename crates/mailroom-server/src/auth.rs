//! Who may talk to the server.
//!
//! - With `api_token` set: `Authorization: Bearer <api_token>` on `/v1/*`
//!   ([`require_token`]; the dashboard's login and bearer access use the
//!   same [`Tokens::matches`]). Tokens are compared as SHA-256 digests in
//!   constant time, so neither the content nor the length of a configured
//!   token shows in the answer's timing. Wrong tokens are counted per
//!   client ([`Failures`]): after [`MAX_FAILURES`] in [`FAILURE_WINDOW`] a
//!   client's next attempts get 429 with `Retry-After` until the window
//!   ends, so the token cannot be guessed at network speed.
//! - Without a token (loopback only: `serve` refuses anything else): every
//!   request must be addressed to a loopback name ([`local_only`]: `Host`
//!   `localhost`, `127.0.0.1` or `[::1]`, any port), which defeats DNS
//!   rebinding, and a state-changing request that carries an `Origin`
//!   must come from that same origin, which defeats cross-site writes from
//!   a page open in the operator's browser. Tools (curl, scripts) send no
//!   `Origin` and pass.

use crate::AppState;
use crate::problem::Problem;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, header};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;

/// Wrong tokens a client may present within [`FAILURE_WINDOW`]; the next
/// attempts are refused with 429 until the window ends.
pub(crate) const MAX_FAILURES: u32 = 10;
/// The window [`MAX_FAILURES`] is counted over, from a client's first
/// failure.
pub(crate) const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Clients whose failures are remembered at once; beyond it the one whose
/// window started first is forgotten (bounded memory under a spread-out
/// attack).
const MAX_CLIENTS: usize = 10_000;

/// Where an authentication failed, the `route` label of
/// [`mailroom::metrics::AUTH_FAILURES`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Route {
    /// A bearer token on `/v1/*` (or `/metrics`, `/readyz` when protected).
    Api,
    /// A bearer token on a dashboard page or action.
    Dashboard,
    /// The dashboard's login form.
    Login,
}

impl Route {
    fn label(self) -> &'static str {
        match self {
            Route::Api => "api",
            Route::Dashboard => "dashboard",
            Route::Login => "login",
        }
    }
}

/// The configured API tokens, kept as digests.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    digests: Vec<[u8; 32]>,
}

impl Tokens {
    pub(crate) fn new(tokens: &[String]) -> Self {
        Self {
            digests: tokens.iter().map(|t| digest(t)).collect(),
        }
    }

    /// No token configured: the loopback-only, open mode.
    pub(crate) fn open(&self) -> bool {
        self.digests.is_empty()
    }

    /// Whether `presented` is one of the tokens. Fixed-length digests are
    /// compared, every one of them (no early exit), so timing tells
    /// neither which matched nor how long a token is.
    pub(crate) fn matches(&self, presented: &str) -> bool {
        let d = digest(presented);
        self.digests
            .iter()
            .fold(subtle::Choice::from(0), |acc, t| acc | t.ct_eq(&d))
            .into()
    }
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Authentication failures per client, in a fixed window each.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    map: Mutex<HashMap<IpAddr, Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    count: u32,
}

impl Failures {
    /// How long `client` must wait before its next attempt, if it used up
    /// its failures.
    pub(crate) fn wait(&self, client: IpAddr) -> Option<Duration> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let w = map.get(&client)?;
        let elapsed = w.start.elapsed();
        (w.count >= MAX_FAILURES && elapsed < FAILURE_WINDOW).then(|| FAILURE_WINDOW - elapsed)
    }

    /// Counts one failure of `client`.
    pub(crate) fn record(&self, client: IpAddr) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(&client) && map.len() >= MAX_CLIENTS {
            map.retain(|_, w| w.start.elapsed() < FAILURE_WINDOW);
            if map.len() >= MAX_CLIENTS {
                let first = map.iter().min_by_key(|(_, w)| w.start).map(|(k, _)| *k);
                if let Some(k) = first {
                    map.remove(&k);
                }
            }
        }
        let now = Instant::now();
        let w = map.entry(client).or_insert(Window {
            start: now,
            count: 0,
        });
        if w.start.elapsed() >= FAILURE_WINDOW {
            *w = Window {
                start: now,
                count: 0,
            };
        }
        w.count = w.count.saturating_add(1);
    }
}

/// The client a request came from, as rate limits count it: its IP
/// address (an IPv6 address by its /64, what one host is usually given).
/// Behind a reverse proxy this is the proxy. A router served without
/// connection info (nested in a host application) counts every client as
/// one.
pub(crate) fn client(req: &Request) -> IpAddr {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED), |c| {
            c.0.ip().to_canonical()
        });
    match ip {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// Counts a failure in the metric and, for a wrong token, against the
/// client.
pub(crate) fn failed(s: &AppState, route: Route, client: IpAddr) {
    s.auth_failures.record(client);
    metrics::counter!(mailroom::metrics::AUTH_FAILURES, "route" => route.label(), "reason" => "wrong_token")
        .increment(1);
}

/// The answer to a client that used up its failures: 429 with
/// `Retry-After`, counted in the metric.
pub(crate) fn too_many(route: Route, wait: Duration) -> Problem {
    metrics::counter!(mailroom::metrics::AUTH_FAILURES, "route" => route.label(), "reason" => "rate_limited")
        .increment(1);
    let secs = u32::try_from(wait.as_secs().saturating_add(1)).unwrap_or(u32::MAX);
    Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "Too Many Requests",
        format!(
            "too many wrong tokens from this client: wait {secs}s (at most {MAX_FAILURES} per {}s)",
            FAILURE_WINDOW.as_secs()
        ),
    )
    .retry_after(secs)
}

/// What a bearer header says about a request.
pub(crate) enum Bearer {
    /// None presented.
    Missing,
    /// A configured token.
    Valid,
    /// A wrong token (counted).
    Wrong,
    /// Refused unseen: the client used up its failures.
    Limited(Duration),
}

/// Checks the request's bearer token against the configured ones, counting
/// a wrong one against the client.
pub(crate) fn check_bearer(s: &AppState, req: &Request, route: Route) -> Bearer {
    let Some(presented) = bearer(req.headers()) else {
        return Bearer::Missing;
    };
    let client = client(req);
    if let Some(wait) = s.auth_failures.wait(client) {
        return Bearer::Limited(wait);
    }
    if s.tokens.matches(presented) {
        Bearer::Valid
    } else {
        failed(s, route, client);
        Bearer::Wrong
    }
}

/// `/v1/*` (and the protected read routes): a configured bearer token, or
/// 401 (429 once a client has sent too many wrong ones).
pub(crate) async fn require_token(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if s.tokens.open() {
        return next.run(req).await;
    }
    match check_bearer(&s, &req, Route::Api) {
        Bearer::Valid => next.run(req).await,
        Bearer::Limited(wait) => too_many(Route::Api, wait).into_response(),
        Bearer::Missing | Bearer::Wrong => unauthorized(),
    }
}

/// The read routes `protect_metrics` puts behind the token (`/metrics`;
/// `/readyz`'s detail): `None` when open (no token, or the setting off) or
/// the request carries a configured token, else the refusal.
pub(crate) fn refuse_protected_read(s: &AppState, req: &Request) -> Option<Response> {
    if s.tokens.open() || !s.options.protect_metrics {
        return None;
    }
    match check_bearer(s, req, Route::Api) {
        Bearer::Valid => None,
        Bearer::Limited(wait) => Some(too_many(Route::Api, wait).into_response()),
        Bearer::Missing | Bearer::Wrong => Some(unauthorized()),
    }
}

/// 401 with `WWW-Authenticate: Bearer`.
pub(crate) fn unauthorized() -> Response {
    let mut resp = Problem::new(
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
        "missing or wrong bearer token",
    )
    .into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static("Bearer"),
    );
    resp
}

/// The token of an `Authorization: Bearer` header, if any.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Every route of a token-less server: only requests addressed to a
/// loopback name, or to none (else 421), and state-changing ones only without an
/// `Origin` or from this very origin (else 403). With a token configured
/// the bearer token is the defence, and a reverse proxy may present any
/// `Host`.
pub(crate) async fn local_only(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if !s.tokens.open() {
        return next.run(req).await;
    }
    if !request_host(&req).is_ok_and(|h| h.is_none_or(is_loopback_host)) {
        return Problem::new(
            StatusCode::MISDIRECTED_REQUEST,
            "Misdirected Request",
            "without api_token mailroom answers only requests addressed to localhost, 127.0.0.1 or [::1]",
        )
        .into_response();
    }
    let read = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    if !read && req.headers().contains_key(header::ORIGIN) && !same_origin(req.headers()) {
        return Problem::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "cross-origin request refused: a state-changing request must come from this origin or carry no Origin",
        )
        .into_response();
    }
    next.run(req).await
}

/// The authority a request was addressed to: its `Host` header, or the
/// URI's authority (absolute-form requests), which must then agree. None
/// when it names none: no browser sends such a request (a router driven
/// in-process, an HTTP/1.0 tool), so it cannot be a rebinding attack.
/// `Err` when the two disagree or `Host` is not text.
fn request_host(req: &Request) -> Result<Option<&str>, ()> {
    let header = match req.headers().get(header::HOST) {
        Some(v) => Some(v.to_str().map_err(|_| ())?),
        None => None,
    };
    match (header, req.uri().authority().map(|a| a.as_str())) {
        (Some(h), Some(a)) if !h.eq_ignore_ascii_case(a) => Err(()),
        (Some(h), _) => Ok(Some(h)),
        (None, a) => Ok(a),
    }
}

/// `localhost`, a loopback IP literal (`127.0.0.1`, `[::1]`), each with
/// any port. Names other than `localhost` could be re-pointed at this
/// machine by their owner (DNS rebinding), so none is accepted.
pub(crate) fn is_loopback_host(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) if port.is_empty() || valid_port(port) => v6,
            _ => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((h, port)) if valid_port(&format!(":{port}")) => h,
            Some(_) => return false,
            None => authority,
        },
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn valid_port(colon_port: &str) -> bool {
    colon_port
        .strip_prefix(':')
        .is_some_and(|p| !p.is_empty() && p.parse::<u16>().is_ok())
}

/// Whether the request's `Origin` names the host it was sent to. A missing
/// or opaque (`null`) origin does not.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let origin = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok());
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let (Some(origin), Some(host)) = (origin, host) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    authority.is_some_and(|a| a.eq_ignore_ascii_case(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback names and literals pass with any port; other names, and
    /// tricks that end in a loopback-looking suffix, do not.
    #[test]
    fn only_loopback_hosts_pass() {
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "rebind.evil.example",
            "rebind.evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "evil.example:127.0.0.1",
            "localhost:notaport",
            "localhost:",
            "[::1]x",
            "[::ffff:8.8.8.8]:80",
            "10.0.0.1:8080",
            "",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    /// Tokens match only exactly, whatever their length.
    #[test]
    fn tokens_match_exactly() {
        let t = Tokens::new(&["first-token".to_owned(), "second".to_owned()]);
        assert!(t.matches("first-token") && t.matches("second"));
        for wrong in ["", "first", "first-token-", "secon", "Second"] {
            assert!(!t.matches(wrong), "{wrong}");
        }
        assert!(Tokens::new(&[]).open());
    }

    /// Ten failures within the window are allowed; the eleventh attempt
    /// waits out the window, and other clients are not affected.
    #[test]
    fn failures_are_limited_per_client() {
        let f = Failures::default();
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let b: IpAddr = "192.0.2.2".parse().expect("ip");
        for _ in 0..MAX_FAILURES {
            assert!(f.wait(a).is_none());
            f.record(a);
        }
        let wait = f.wait(a).expect("limited");
        assert!(wait <= FAILURE_WINDOW && wait > FAILURE_WINDOW - Duration::from_secs(5));
        assert!(f.wait(b).is_none());
    }

    /// The memory of failures is bounded: a flood of distinct clients
    /// keeps at most `MAX_CLIENTS` entries.
    #[test]
    fn failures_memory_is_bounded() {
        let f = Failures::default();
        for i in 0..(MAX_CLIENTS as u32 + 500) {
            f.record(IpAddr::V4(std::net::Ipv4Addr::from(i)));
        }
        let len = f.map.lock().expect("lock").len();
        assert!(len <= MAX_CLIENTS, "{len}");
    }
}
