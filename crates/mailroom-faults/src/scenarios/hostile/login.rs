//! The login flood, against a second `mailroom serve` with `api_token`
//! (the main attack's instance has none, so it has no login): an operator
//! logs in, then anonymous clients ask for the login form [`FORMS`] times
//! (each ask makes a pre-login session) while one client guesses the token
//! [`GUESSES`] times. The guesses must turn into 429s after the allowed
//! failures, and the operator's session must survive.

use crate::Report;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Login forms asked for: past the server's 10,000 sessions per pool.
const FORMS: usize = 10_050;
/// Wrong tokens sent to `POST /ui/login`.
const GUESSES: usize = 50;
/// Wrong tokens a client may send before 429 (the server's limit).
const ALLOWED_FAILURES: u64 = 10;
const TOKEN: &str = "hostile-login-token-0123456789abcdef";

/// The form's pre-login cookie and CSRF token.
async fn form(http: &reqwest::Client, base: &str) -> anyhow::Result<(String, String)> {
    let resp = http.get(format!("{base}/ui/login")).send().await?;
    let cookie = cookie(&resp).ok_or_else(|| anyhow::anyhow!("no pre-login cookie"))?;
    let html = resp.text().await?;
    let at = html
        .find(r#"name="csrf" value=""#)
        .ok_or_else(|| anyhow::anyhow!("no csrf field"))?
        + 19;
    let csrf = html[at..].split('"').next().unwrap_or_default().to_owned();
    Ok((cookie, csrf))
}

fn cookie(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("mailroom_session="))
        .map(|c| c.split(';').next().unwrap_or_default().to_owned())
}

async fn log_in(
    http: &reqwest::Client,
    base: &str,
    (pre, csrf): &(String, String),
    token: &str,
) -> anyhow::Result<reqwest::Response> {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([("token", token), ("csrf", csrf), ("next", "/")])
        .finish();
    Ok(http
        .post(format!("{base}/ui/login"))
        .header("origin", base)
        .header("cookie", format!("mailroom_session={pre}"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await?)
}

/// Runs the flood in `dir` (its own config and SQLite store) and judges it.
pub async fn run(dir: &Path, r: &mut Report) -> anyhow::Result<()> {
    let config = dir.join("login.toml");
    std::fs::write(&config, format!("api_token = \"{TOKEN}\"\n"))?;
    let store = format!("sqlite://{}", dir.join("login.db").display());
    let mut serve = crate::child::serve(&config, &store).await?;
    let base = serve.base.clone();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(64)
        .build()?;
    let operator_form = form(&http, &base).await?;
    let session = cookie(&log_in(&http, &base, &operator_form, TOKEN).await?)
        .ok_or_else(|| anyhow::anyhow!("the operator's login set no session"))?;

    let started = Instant::now();
    let forms_ok = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let workers = 16;
    for _ in 0..workers {
        let (http, base, ok) = (http.clone(), base.clone(), forms_ok.clone());
        tasks.spawn(async move {
            for _ in 0..FORMS.div_ceil(workers) {
                if let Ok(resp) = http.get(format!("{base}/ui/login")).send().await
                    && resp.status() == 200
                {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    let guesser = form(&http, &base).await?;
    let (mut refused, mut limited, mut other) = (0u64, 0u64, Vec::new());
    for i in 0..GUESSES {
        match log_in(&http, &base, &guesser, &format!("guess-{i}"))
            .await?
            .status()
            .as_u16()
        {
            401 => refused += 1,
            429 => limited += 1,
            s => other.push(s),
        }
    }
    while tasks.join_next().await.is_some() {}
    let took = started.elapsed();
    let still = http
        .get(format!("{base}/"))
        .header("cookie", format!("mailroom_session={session}"))
        .send()
        .await?
        .status();
    serve.signal_term()?;
    serve
        .exit_within(std::time::Duration::from_secs(30))
        .await?;

    let forms = forms_ok.load(Ordering::Relaxed);
    r.sent += forms + GUESSES as u64;
    r.notes.push(format!(
        "login flood (instance with api_token): {forms} login forms in {:.1}s; {GUESSES} wrong tokens: {refused}x 401, {limited}x 429{}; the operator's session afterwards: {still}",
        took.as_secs_f64(),
        if other.is_empty() {
            String::new()
        } else {
            format!(", else {other:?}")
        }
    ));
    if forms < FORMS as u64 {
        r.failures.push(format!(
            "login flood: only {forms} of {FORMS} login forms answered 200"
        ));
    }
    if refused > ALLOWED_FAILURES || limited == 0 || !other.is_empty() {
        r.failures.push(format!(
            "login flood: wrong tokens not limited to {ALLOWED_FAILURES} then 429 ({refused}x 401, {limited}x 429, others {other:?})"
        ));
    }
    if still != 200 {
        r.failures.push(format!(
            "login flood: the operator's session was lost (GET / answered {still})"
        ));
    }
    Ok(())
}
