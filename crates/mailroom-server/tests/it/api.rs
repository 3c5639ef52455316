//! `/v1` reads (lists, paging, filters, stats), health, and bearer tokens.

use crate::support::{Db, expect_problem, start, start_with};
use mailroom::handler::handler_fn;
use mailroom::{Engine, Event, Outcome, SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use serde_json::{Value, json};

fn ids(events: &Value) -> Vec<String> {
    events
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["id"].as_str().expect("id").to_string())
        .collect()
}

/// `GET /v1/events` lists newest first in cursor-linked pages, filters by
/// topic and status, `/v1/stats` counts by status and shows firing alerts, and `/healthz`, `/readyz`
/// answer 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_list_pages_filters_and_stats_count() {
    let server = start(|store| {
        Engine::builder(store)
            .topic(TopicSpec::new("work"))
            .topic(TopicSpec::new("parked"))
            .source(SourceSpec::new("work", "work"))
            .source(SourceSpec::new("parked", "parked"))
            .alerts(mailroom::AlertRules {
                backlog: Some(4),
                dead_letter_depth: Some(1),
                ..Default::default()
            })
            .handler(
                "work",
                handler_fn(|ev: Event| async move {
                    let payload = ev.payload.unwrap_or_default();
                    if payload.starts_with(b"{\"fail\"") {
                        Outcome::permanent("told to fail")
                    } else {
                        Outcome::Success
                    }
                }),
            )
    })
    .await;

    // Five pull events (stay pending), inserted in order.
    let mut parked = Vec::new();
    for i in 0..5 {
        parked.push(
            server
                .accept("parked", &format!("p-{i}"), &json!({"i": i}))
                .await,
        );
    }
    // Three processed: two done, one dead.
    let ok1 = server.accept("work", "w-1", &json!({"ok": 1})).await;
    let bad = server.accept("work", "w-2", &json!({"fail": 1})).await;
    let ok2 = server.accept("work", "w-3", &json!({"ok": 2})).await;
    server.event_with_status(&ok1, "done").await;
    server.event_with_status(&bad, "dead").await;
    server.event_with_status(&ok2, "done").await;

    // Pages of 2, newest first, linked by next_cursor until null.
    let mut seen = Vec::new();
    let mut path = "/v1/events?topic=parked&limit=2".to_string();
    let mut pages = 0;
    loop {
        let page = server.get_json(&path).await;
        pages += 1;
        let page_ids = ids(&page["events"]);
        assert!(page_ids.len() <= 2);
        seen.extend(page_ids);
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/events?topic=parked&limit=2&cursor={c}"),
            None => break,
        }
        assert!(pages < 10, "paging ends");
    }
    let newest_first: Vec<String> = parked.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    assert_eq!(pages, 3);

    // No filter: every topic, every status, newest first.
    let all = server.get_json("/v1/events").await;
    assert_eq!(all["next_cursor"], Value::Null);
    let mut expected: Vec<String> = parked.clone();
    expected.extend([ok1.clone(), bad.clone(), ok2.clone()]);
    expected.reverse();
    assert_eq!(ids(&all["events"]), expected);
    assert!(
        all["events"][0].get("history").is_none(),
        "lists carry no history"
    );

    // Status filters.
    let dead = server.get_json("/v1/events?status=dead").await;
    assert_eq!(ids(&dead["events"]), [bad.as_str()]);
    assert_eq!(dead["events"][0]["last_error"], "told to fail");
    let done = server.get_json("/v1/events?topic=work&status=done").await;
    assert_eq!(ids(&done["events"]), [ok2.as_str(), ok1.as_str()]);
    let pending = server.get_json("/v1/events?status=pending&limit=100").await;
    assert_eq!(ids(&pending["events"]).len(), 5);
    let resp = server
        .http
        .get(server.url("/v1/events?status=sleeping"))
        .send()
        .await
        .expect("request");
    expect_problem(resp, 400).await;

    // Stats.
    let stats = server.get_json("/v1/stats").await;
    let topic = |name: &str| {
        stats["topics"]
            .as_array()
            .expect("topics")
            .iter()
            .find(|t| t["topic"] == name)
            .unwrap_or_else(|| panic!("{name} in {stats}"))
            .clone()
    };
    let work = topic("work");
    assert_eq!(work["counts"]["done"], 2, "{work}");
    assert_eq!(work["counts"]["dead"], 1, "{work}");
    assert_eq!(work["counts"]["pending"], 0, "{work}");
    assert_eq!(work["handler"], "built-in");
    // Three attempts ended in the last minute: two done, one dead.
    assert_eq!(work["rates"]["window_seconds"], 60, "{work}");
    assert_eq!(work["rates"]["done_per_second"], 2.0 / 60.0, "{work}");
    assert_eq!(work["rates"]["failed_per_second"], 1.0 / 60.0, "{work}");
    assert!(server.engine.has_handler("work") && !server.engine.has_handler("parked"));
    let parked_stats = topic("parked");
    assert_eq!(parked_stats["counts"]["pending"], 5, "{parked_stats}");
    assert_eq!(parked_stats["handler"], "pull");
    assert!(parked_stats["oldest_pending_age_seconds"].is_number());
    // Five pending is over the backlog threshold of 4; one dead is not over 1.
    assert_eq!(
        stats["alerts"],
        serde_json::json!([{
            "topic": "parked",
            "alert": "backlog",
            "value": 5.0,
            "threshold": 4.0,
            "message": "parked: 5 pending events (threshold 4)",
        }]),
        "{stats}"
    );

    for path in ["/healthz", "/readyz"] {
        let resp = server.http.get(server.url(path)).send().await.expect("get");
        assert_eq!(resp.status(), 200, "{path}");
    }
    server.stop().await;
}

/// With an API token configured, `/v1/*` answers 401 without it or with a
/// wrong one and 200 with it, while webhooks and health need no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_token_guards_v1_but_not_webhooks() {
    let server = start_with(
        Db::fresh().await,
        "127.0.0.1:0",
        ServerOptions {
            api_tokens: vec!["t".into()],
            ..ServerOptions::default()
        },
        |store| {
            Engine::builder(store)
                .topic(TopicSpec::new("inbox"))
                .source(SourceSpec::new("inbox", "inbox"))
        },
    )
    .await;

    // Webhooks need no token.
    let id = server.accept("inbox", "a-1", &json!({"x": 1})).await;

    for path in ["/v1/events", &format!("/v1/events/{id}"), "/v1/stats"] {
        let resp = server.http.get(server.url(path)).send().await.expect("get");
        let www = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        expect_problem(resp, 401).await;
        assert_eq!(www.as_deref(), Some("Bearer"), "{path}");

        for wrong in ["Bearer x", "Bearer tt", "Bearer ", "Basic dDp0", "t"] {
            let resp = server
                .http
                .get(server.url(path))
                .header("authorization", wrong)
                .send()
                .await
                .expect("get");
            expect_problem(resp, 401).await;
        }
        let resp = server
            .http
            .get(server.url(path))
            .bearer_auth("t")
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), 200, "{path} with the token");
    }
    let resp = server
        .http
        .post(server.url(&format!("/v1/events/{id}/replay")))
        .send()
        .await
        .expect("post");
    expect_problem(resp, 401).await;

    for path in ["/healthz", "/readyz"] {
        let resp = server.http.get(server.url(path)).send().await.expect("get");
        assert_eq!(resp.status(), 200, "{path} needs no token");
    }
    server.stop().await;
}

/// A keyless event in a sequential topic is refused with a 400 problem on
/// both HTTP doors (`POST /v1/events` and a webhook), by the engine's one
/// rule set, and nothing is stored; with its key it is accepted.
#[tokio::test]
async fn keyless_events_in_a_sequential_topic_are_refused_on_both_doors() {
    let server = start(|store| {
        Engine::builder(store)
            .topic(
                TopicSpec::new("orders")
                    .mode(mailroom::Mode::Sequential {
                        on_dead: mailroom::OnDead::Block,
                    })
                    .key(mailroom::Field::Json("/customer".into())),
            )
            .source(SourceSpec::new("shop", "orders"))
    })
    .await;
    let api = |body: Value| {
        server
            .http
            .post(server.url("/v1/events"))
            .header("idempotency-key", "k-1")
            .json(&body)
            .send()
    };
    let p = expect_problem(
        api(json!({"topic": "orders", "payload": {"n": 1}}))
            .await
            .expect("request"),
        400,
    )
    .await;
    assert!(
        p["detail"]
            .as_str()
            .is_some_and(|d| d.contains("ordering key")),
        "{p}"
    );
    let hook = server
        .webhook("shop", &[("webhook-id", "w-1")], r#"{"n":1}"#)
        .await;
    let p = expect_problem(hook, 400).await;
    assert!(
        p["detail"]
            .as_str()
            .is_some_and(|d| d.contains("/customer")),
        "{p}"
    );
    assert!(server.events_of("orders").await.is_empty());

    let ok = api(json!({"topic": "orders", "key": "c-1", "payload": {"n": 1}}))
        .await
        .expect("request");
    assert_eq!(ok.status(), 201);
    server
        .accept("shop", "w-2", &json!({"customer": "c-1"}))
        .await;
    assert_eq!(server.events_of("orders").await.len(), 2);
}

/// `POST /v1/events/{id}/cancel` withdraws a pending event (shown as
/// `cancelled` in the event, the list and the stats) and answers 409 for a
/// running one; `POST /v1/cancel` previews with `dry_run`, then cancels the
/// pending events of the filter only; a replay makes a cancelled event
/// pending again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_one_and_by_filter_with_a_preview() {
    let server = start(|store| {
        Engine::builder(store)
            .topic(TopicSpec::new("parked"))
            .source(SourceSpec::new("parked", "parked"))
    })
    .await;
    let first = server.accept("parked", "p-0", &json!({"i": 0})).await;
    let mut rest = vec![];
    for i in 1..4 {
        rest.push(
            server
                .accept("parked", &format!("p-{i}"), &json!({"i": i}))
                .await,
        );
    }
    let claimed = server
        .engine
        .pull()
        .claim("parked", 1, None, "w")
        .await
        .expect("claim");
    assert_eq!(claimed[0].event.id.to_string(), first);

    let resp = server
        .http
        .post(server.url(&format!("/v1/events/{first}/cancel")))
        .send()
        .await
        .expect("POST cancel");
    expect_problem(resp, 409).await;
    let e = server
        .post_json(&format!("/v1/events/{}/cancel", rest[0]))
        .await;
    assert_eq!(e["status"], "cancelled", "{e}");
    let resp = server
        .http
        .post(server.url(&format!("/v1/events/{}/cancel", rest[0])))
        .send()
        .await
        .expect("POST cancel again");
    expect_problem(resp, 409).await;

    let bulk = |body: Value| {
        server
            .http
            .post(server.url("/v1/cancel"))
            .json(&body)
            .send()
    };
    let preview: Value = bulk(json!({"topic": "parked", "dry_run": true}))
        .await
        .expect("preview")
        .json()
        .await
        .expect("json");
    assert_eq!(preview, json!({"matching": 2, "cancelled": 0}));
    let report: Value = bulk(json!({"topic": "parked"}))
        .await
        .expect("cancel")
        .json()
        .await
        .expect("json");
    assert_eq!(report, json!({"matching": 2, "cancelled": 2}));

    let list = server
        .get_json("/v1/events?topic=parked&status=cancelled")
        .await;
    assert_eq!(ids(&list["events"]).len(), 3, "{list}");
    let stats = server.get_json("/v1/stats").await;
    let parked = stats["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .find(|t| t["topic"] == "parked")
        .expect("parked")
        .clone();
    assert_eq!(parked["counts"]["cancelled"], 3, "{parked}");
    assert_eq!(parked["counts"]["running"], 1, "{parked}");
    let again = server
        .post_json(&format!("/v1/events/{}/replay", rest[1]))
        .await;
    assert_eq!(again["status"], "pending", "{again}");
}

/// `POST /v1/events` with `delay` or `deliver_at` answers 201 at once with
/// the event pending and due then (`next_attempt_at`); both at once, a bad
/// time or a bad duration answer 400 and store nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_events_can_be_delivered_later() {
    let server = start(|store| Engine::builder(store).topic(TopicSpec::new("later"))).await;
    let post = |key: &str, extra: Value| {
        let mut body = json!({"topic": "later", "payload": {"k": key}});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        server
            .http
            .post(server.url("/v1/events"))
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let before = jiff::Timestamp::now();
    let delayed: Value = {
        let resp = post("d", json!({"delay": "1h"})).await.expect("POST");
        assert_eq!(resp.status(), 201);
        resp.json().await.expect("json")
    };
    assert_eq!(delayed["status"], "pending");
    let due: jiff::Timestamp = delayed["next_attempt_at"]
        .as_str()
        .expect("due")
        .parse()
        .expect("time");
    assert!(
        due >= before + std::time::Duration::from_secs(3590),
        "{due}"
    );
    let at = "2099-01-02T03:04:05Z";
    let resp = post("a", json!({"deliver_at": at})).await.expect("POST");
    assert_eq!(resp.status(), 201);
    let scheduled: Value = resp.json().await.expect("json");
    assert_eq!(scheduled["next_attempt_at"], at, "{scheduled}");
    for (key, bad) in [
        ("both", json!({"delay": "1h", "deliver_at": at})),
        ("bad-time", json!({"deliver_at": "tomorrow"})),
        ("bad-delay", json!({"delay": "soon"})),
    ] {
        let resp = post(key, bad).await.expect("POST");
        expect_problem(resp, 400).await;
    }
    let list = server.get_json("/v1/events?topic=later").await;
    assert_eq!(ids(&list["events"]).len(), 2, "{list}");
    assert!(
        server
            .engine
            .pull()
            .claim("later", 10, None, "w")
            .await
            .expect("claim")
            .is_empty(),
        "nothing due yet"
    );
}
