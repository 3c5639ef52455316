//! The dashboard over HTTP: who gets in (login, sessions, bearer), what a
//! state-changing request must carry (same Origin, the session's CSRF
//! token), that pages escape what senders wrote, and bulk replay of dead
//! letters with its progress page.

use crate::support::{DEADLINE, Db, Server, eventually, start_with};
use mailroom::handler::handler_fn;
use mailroom::{Engine, Event, Field, Mode, OnDead, Outcome, SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const TOKEN: &str = "dashboard-test-token";

/// A server whose `work` topic (sequential on `/customer`, blocking on a
/// dead head) fails every event permanently until `fixed` is set.
async fn server(tokens: &[&str], fixed: Arc<AtomicBool>) -> Server {
    let options = ServerOptions {
        api_tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
        ..ServerOptions::default()
    };
    start_with(Db::fresh().await, "127.0.0.1:0", options, move |store| {
        let key = Field::json("/customer").expect("pointer");
        Engine::builder(store)
            .topic(
                TopicSpec::new("work")
                    .mode(Mode::Sequential {
                        on_dead: OnDead::Block,
                    })
                    .key(key),
            )
            .topic(TopicSpec::new("other"))
            .source(SourceSpec::new("work", "work"))
            .source(SourceSpec::new("other", "other"))
            .handler("work", failing_until(fixed.clone()))
            .handler("other", failing_until(fixed))
    })
    .await
}

fn failing_until(fixed: Arc<AtomicBool>) -> mailroom::handler::SharedHandler {
    handler_fn(move |_: Event| {
        let fixed = fixed.load(Ordering::SeqCst);
        async move {
            if fixed {
                Outcome::Success
            } else {
                Outcome::permanent("receiver said 500: <b>boom</b>")
            }
        }
    })
}

/// A client that never follows redirects (the tests read them).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// The `mailroom_session` value a response sets.
fn session_cookie(resp: &reqwest::Response) -> Option<String> {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix("mailroom_session="))
        .map(|c| c.split(';').next().unwrap_or_default().to_owned())
}

/// The CSRF token a page's forms carry.
fn csrf_of(html: &str) -> String {
    let at = html.find(r#"name="csrf" value=""#).expect("a csrf field") + 19;
    html[at..].split('"').next().unwrap_or_default().to_owned()
}

/// The event's status, read through the engine (`/v1` may need a token).
async fn status(s: &Server, id: &str) -> String {
    let id = id.parse().expect("an event id");
    let event = s
        .engine
        .operator()
        .get(id)
        .await
        .expect("store")
        .expect("stored");
    event.status.as_str().to_owned()
}

/// Waits until the event's status is `want`.
async fn reaches(s: &Server, id: &str, want: &str) {
    eventually(DEADLINE, &format!("event {id} is {want}"), || async {
        (status(s, id).await == want).then_some(())
    })
    .await;
}

async fn dead_event(s: &Server, topic: &str, id: &str, customer: &str) -> String {
    let event = s
        .accept(topic, id, &json!({"customer": customer, "n": id}))
        .await;
    reaches(s, &event, "dead").await;
    event
}

/// Logs in through the form; the session cookie.
async fn log_in(s: &Server, http: &reqwest::Client) -> String {
    let form = http
        .get(s.url("/ui/login"))
        .send()
        .await
        .expect("login form");
    let pre = session_cookie(&form).expect("a pre-login session");
    let csrf = csrf_of(&form.text().await.expect("html"));
    let resp = http
        .post(s.url("/ui/login"))
        .header("origin", &s.base)
        .header("cookie", format!("mailroom_session={pre}"))
        .form(&[("token", TOKEN), ("csrf", &csrf), ("next", "/ui/dead")])
        .send()
        .await
        .expect("login");
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()["location"], "/ui/dead");
    session_cookie(&resp).expect("a session")
}

/// With `api_token` set, every page redirects to the login form and every
/// action answers 401 without a session or bearer token (and changes
/// nothing); a bearer token opens the pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_session_every_page_and_action_is_refused() {
    let s = server(&[TOKEN], Arc::default()).await;
    let dead = dead_event(&s, "work", "w-1", "c1").await;
    let http = client();
    let pages = [
        "/",
        "/ui/topics/work",
        &format!("/ui/events/{dead}"),
        "/ui/dead",
        "/ui/jobs/1",
    ];
    for page in pages {
        let resp = http.get(s.url(page)).send().await.expect("GET");
        assert_eq!(resp.status(), 303, "GET {page}");
        let to = resp.headers()["location"].to_str().expect("location");
        assert!(to.starts_with("/ui/login?next="), "GET {page} -> {to}");
    }
    let actions = [
        format!("/ui/events/{dead}/replay"),
        format!("/ui/events/{dead}/skip"),
        format!("/ui/events/{dead}/cancel"),
        "/ui/dead/replay".to_owned(),
        "/ui/logout".to_owned(),
    ];
    for action in &actions {
        let resp = http
            .post(s.url(action))
            .header("origin", &s.base)
            .form(&[("csrf", "x")])
            .send()
            .await
            .expect("POST");
        assert_eq!(resp.status(), 401, "POST {action}");
        let wrong = http
            .post(s.url(action))
            .header("origin", &s.base)
            .header("cookie", "mailroom_session=guessed")
            .bearer_auth("not-the-token")
            .send()
            .await
            .expect("POST");
        assert_eq!(wrong.status(), 401, "POST {action} with a wrong token");
    }
    assert_eq!(status(&s, &dead).await, "dead", "nothing changed");
    for page in pages {
        let resp = http
            .get(s.url(page))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("GET");
        let status = resp.status().as_u16();
        assert!(
            status == 200 || (page == "/ui/jobs/1" && status == 404),
            "GET {page}: {status}"
        );
    }
    s.stop().await;
}

/// The login form exchanges the token for a fresh HttpOnly, SameSite=Strict
/// session (the pre-login id is worth nothing after); an action with that
/// session is refused from another origin, without Origin, and without or
/// with a wrong CSRF token, and done with both; logout ends the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_origin_and_csrf_guard_every_action() {
    let s = server(&[TOKEN], Arc::default()).await;
    let dead = dead_event(&s, "work", "w-1", "c1").await;
    let http = client();

    let form = http
        .get(s.url("/ui/login"))
        .send()
        .await
        .expect("login form");
    let cookie = form.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pre = session_cookie(&form).expect("pre-login session");
    let csrf = csrf_of(&form.text().await.expect("html"));
    let attempt = |origin: Option<&str>, csrf: &str, token: &str| {
        let mut req = http
            .post(s.url("/ui/login"))
            .header("cookie", format!("mailroom_session={pre}"))
            .form(&[("token", token), ("csrf", csrf), ("next", "/")]);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    let cross = attempt(Some("http://evil.example"), &csrf, TOKEN)
        .await
        .expect("login");
    assert_eq!(cross.status(), 403, "cross-origin login");
    assert_eq!(
        attempt(None, &csrf, TOKEN).await.expect("login").status(),
        403
    );
    assert_eq!(
        attempt(Some(&s.base), "wrong", TOKEN)
            .await
            .expect("login")
            .status(),
        403
    );
    let bad = attempt(Some(&s.base), &csrf, "wrong-token")
        .await
        .expect("login");
    assert_eq!(bad.status(), 401, "a wrong token");
    assert!(
        bad.text()
            .await
            .expect("html")
            .contains("That token is not right")
    );
    let pre_page = http
        .get(s.url("/"))
        .header("cookie", format!("mailroom_session={pre}"))
        .send()
        .await
        .expect("GET");
    assert_eq!(pre_page.status(), 303, "a pre-login session opens nothing");

    let session = log_in(&s, &http).await;
    assert_ne!(session, pre, "login issues a fresh id");
    let with =
        |req: reqwest::RequestBuilder| req.header("cookie", format!("mailroom_session={session}"));
    let page = with(http.get(s.url(&format!("/ui/events/{dead}"))))
        .send()
        .await
        .expect("GET");
    assert_eq!(page.status(), 200);
    let html = page.text().await.expect("html");
    assert!(html.contains("<title>Event "), "every page has a title");
    let csrf = csrf_of(&html);
    let replay = s.url(&format!("/ui/events/{dead}/replay"));
    let post = |origin: Option<&str>, token: Option<&str>| {
        let mut req = with(http.post(&replay));
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        if let Some(t) = token {
            req = req.form(&[("csrf", t)]);
        }
        req.send()
    };
    assert_eq!(
        post(Some("http://evil.example"), Some(&csrf))
            .await
            .expect("POST")
            .status(),
        403
    );
    assert_eq!(
        post(Some("null"), Some(&csrf))
            .await
            .expect("POST")
            .status(),
        403
    );
    assert_eq!(post(None, Some(&csrf)).await.expect("POST").status(), 403);
    assert_eq!(post(Some(&s.base), None).await.expect("POST").status(), 403);
    assert_eq!(
        post(Some(&s.base), Some("0".repeat(64).as_str()))
            .await
            .expect("POST")
            .status(),
        403
    );
    assert_eq!(
        status(&s, &dead).await,
        "dead",
        "no refused request changed it"
    );
    let ok = post(Some(&s.base), Some(&csrf)).await.expect("POST");
    assert_eq!(ok.status(), 303);
    assert_eq!(
        ok.headers()["location"].to_str().expect("to"),
        format!("/ui/events/{dead}?done=replay")
    );
    eventually(DEADLINE, "replayed and attempted again", || async {
        let id = dead.parse().ok()?;
        let e = s.engine.operator().get(id).await.ok()??;
        (e.attempts == 2).then_some(())
    })
    .await;

    let out = with(http.post(s.url("/ui/logout")))
        .header("origin", &s.base)
        .form(&[("csrf", &csrf)])
        .send()
        .await
        .expect("logout");
    assert_eq!(out.status(), 303);
    let after = with(http.get(s.url("/"))).send().await.expect("GET");
    assert_eq!(after.status(), 303, "logged out");
    s.stop().await;
}

/// Without a token (loopback) there is no login, but an action still needs
/// this origin and the CSRF token of the browser's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_actions_still_need_origin_and_csrf() {
    let s = server(&[], Arc::default()).await;
    let dead = dead_event(&s, "work", "w-1", "c1").await;
    let http = client();
    let page = http
        .get(s.url(&format!("/ui/events/{dead}")))
        .send()
        .await
        .expect("GET");
    assert_eq!(page.status(), 200);
    assert!(
        http.get(s.url("/ui/login"))
            .send()
            .await
            .expect("GET")
            .status()
            .is_redirection()
    );
    let session = session_cookie(&page).expect("a session for the CSRF token");
    let csrf = csrf_of(&page.text().await.expect("html"));
    let skip = s.url(&format!("/ui/events/{dead}/skip"));
    let cross = http
        .post(&skip)
        .header("origin", "http://evil.example")
        .header("cookie", format!("mailroom_session={session}"))
        .form(&[("csrf", &csrf)])
        .send()
        .await
        .expect("POST");
    assert_eq!(cross.status(), 403, "a cross-origin POST");
    let forged = http
        .post(&skip)
        .header("origin", &s.base)
        .form(&[("csrf", &csrf)])
        .send()
        .await
        .expect("POST");
    assert_eq!(forged.status(), 403, "a token without its session");
    assert_eq!(status(&s, &dead).await, "dead");
    let ok = http
        .post(&skip)
        .header("origin", &s.base)
        .header("cookie", format!("mailroom_session={session}"))
        .form(&[("csrf", &csrf)])
        .send()
        .await
        .expect("POST");
    assert_eq!(ok.status(), 303);
    assert_eq!(status(&s, &dead).await, "skipped");
    s.stop().await;
}

/// What senders wrote (keys, payloads, error texts) is shown escaped, and
/// malformed ids, statuses, cursors and job ids get 4xx pages, not panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_escape_what_senders_wrote_and_refuse_malformed_input() {
    let s = server(&[], Arc::default()).await;
    let evil = "<script>alert(1)</script>";
    let dead = dead_event(&s, "work", "w-1", evil).await;
    let http = client();
    for page in [
        format!("/ui/events/{dead}"),
        "/ui/topics/work".to_owned(),
        "/ui/dead".to_owned(),
        "/".to_owned(),
    ] {
        let html = http
            .get(s.url(&page))
            .send()
            .await
            .expect("GET")
            .text()
            .await
            .expect("html");
        assert!(
            !html.contains(evil) && !html.contains("<b>boom</b>"),
            "{page} escapes"
        );
        assert!(html.contains("<title>"), "{page} has a title");
    }
    let html = http
        .get(s.url(&format!("/ui/events/{dead}")))
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("html");
    assert!(
        html.contains("alert(1)") && html.contains("boom"),
        "shown, escaped"
    );
    let blocked = http
        .get(s.url("/ui/topics/work"))
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("html");
    assert!(
        blocked.contains(&format!("/ui/events/{dead}")),
        "the blocked key's head is linked"
    );
    for (page, status) in [
        ("/ui/events/not-an-id", 404),
        ("/ui/events/0190a5c4-7e1b-7c3a-9f00-3b6d2a1e4c55", 404),
        ("/ui/topics/work?status=bogus", 400),
        ("/ui/topics/work?cursor=%3Cx%3E", 400),
        ("/ui/dead?cursor=zz", 400),
        ("/ui/jobs/99", 404),
        ("/ui/jobs/abc", 400),
    ] {
        let resp = http.get(s.url(page)).send().await.expect("GET");
        assert_eq!(resp.status(), status, "GET {page}");
    }
    s.stop().await;
}

/// The dead letters page counts every dead event across topics, filters by
/// topic and key, and "replay all" runs as a job whose page shows it
/// finished with each matching event replayed (and only those).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_replay_all_matching_with_progress() {
    let fixed = Arc::new(AtomicBool::new(false));
    let s = server(&[], fixed.clone()).await;
    let a = dead_event(&s, "work", "w-1", "c1").await;
    let b = dead_event(&s, "work", "w-2", "c2").await;
    let c = dead_event(&s, "other", "o-1", "c1").await;
    let http = client();
    let page = http.get(s.url("/ui/dead")).send().await.expect("GET");
    let session = session_cookie(&page).expect("session");
    let html = page.text().await.expect("html");
    assert!(
        html.contains("<strong>3</strong> dead events match"),
        "{html}"
    );
    let csrf = csrf_of(&html);
    let matching = |query: &'static str| {
        let req = http
            .get(s.url(&format!("/ui/dead?{query}")))
            .header("cookie", format!("mailroom_session={session}"));
        async move {
            let html = req.send().await.expect("GET").text().await.expect("html");
            let needle = r#"<p id="matching"><strong>"#;
            let at = html.find(needle).expect("a count") + needle.len();
            html[at..].split('<').next().unwrap_or_default().to_owned()
        }
    };
    assert_eq!(matching("topic=work&key=").await, "2", "by topic");
    assert_eq!(matching("topic=work&key=c2").await, "1", "by key");
    assert_eq!(matching("error=said+500").await, "3", "by error text");
    assert_eq!(matching("error=said+404").await, "0", "by error text");
    assert_eq!(
        matching("from=2000-01-01T00%3A00&until=2999-01-01T00%3A00").await,
        "3"
    );
    assert_eq!(matching("from=2999-01-01T00%3A00").await, "0", "by time");
    let bad = http
        .get(s.url("/ui/dead?from=yesterday"))
        .send()
        .await
        .expect("GET");
    assert_eq!(bad.status(), 400, "a time that is not one");
    fixed.store(true, Ordering::SeqCst);
    let started = http
        .post(s.url("/ui/dead/replay"))
        .header("origin", &s.base)
        .header("cookie", format!("mailroom_session={session}"))
        .form(&[("csrf", csrf.as_str()), ("topic", "work"), ("key", "")])
        .send()
        .await
        .expect("POST");
    assert_eq!(started.status(), 303);
    let job = started.headers()["location"]
        .to_str()
        .expect("to")
        .to_owned();
    assert!(job.starts_with("/ui/jobs/"), "{job}");
    eventually(DEADLINE, "the job page shows it finished", || async {
        let html = http
            .get(s.url(&job))
            .header("cookie", format!("mailroom_session={session}"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        (html.contains(r#"id="job-state">finished"#)
            && html.contains(r#"<span id="replayed">2</span>"#))
        .then_some(())
    })
    .await;
    reaches(&s, &a, "done").await;
    reaches(&s, &b, "done").await;
    assert_eq!(status(&s, &c).await, "dead", "another topic's event stays");
    s.stop().await;
}

/// A pending event's page offers Cancel (a dead one's does not); pressing
/// it, with the session and its CSRF token, cancels the event; a second
/// press answers 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_event_can_be_cancelled_from_its_page() {
    let s = server(&[], Arc::default()).await;
    let dead = dead_event(&s, "work", "w-1", "c1").await;
    // Blocked behind its key's dead head: pending until someone acts.
    let waiting = s
        .accept("work", "w-2", &json!({"customer": "c1", "n": 2}))
        .await;
    let http = client();
    let dead_page = http
        .get(s.url(&format!("/ui/events/{dead}")))
        .send()
        .await
        .expect("GET")
        .text()
        .await
        .expect("html");
    assert!(
        !dead_page.contains(r#"id="cancel""#),
        "no Cancel on a dead event"
    );
    let page = http
        .get(s.url(&format!("/ui/events/{waiting}")))
        .send()
        .await
        .expect("GET");
    let session = session_cookie(&page).expect("a session");
    let html = page.text().await.expect("html");
    assert!(html.contains(r#"id="cancel""#), "Cancel on a pending event");
    let csrf = csrf_of(&html);
    let press = || {
        http.post(s.url(&format!("/ui/events/{waiting}/cancel")))
            .header("origin", &s.base)
            .header("cookie", format!("mailroom_session={session}"))
            .form(&[("csrf", &csrf)])
            .send()
    };
    assert_eq!(press().await.expect("POST").status(), 303);
    assert_eq!(status(&s, &waiting).await, "cancelled");
    assert_eq!(
        press().await.expect("POST").status(),
        409,
        "already cancelled"
    );
    s.stop().await;
}
