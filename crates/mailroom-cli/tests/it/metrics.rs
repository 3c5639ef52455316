//! `/metrics` of the real binary: every documented metric appears after
//! traffic that makes it, with its exact name,
//! `# TYPE` (counter, gauge, histogram) and label set; durations are
//! histograms with buckets from 1 ms to 60 s. AMQP publishing uses the
//! broker of `MAILROOM_TEST_AMQP_URL`; the store is SQLite.

use crate::support;

use crate::support::write_config;
use lapin::options::ExchangeDeleteOptions;
use lapin::{Connection, ConnectionProperties};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The documented metrics: name, `# TYPE`, label names (a histogram's
/// buckets add `le`).
const DOCUMENTED: [(&str, &str, &[&str]); 9] = [
    (
        "mailroom_events_received_total",
        "counter",
        &["source", "topic", "outcome"],
    ),
    (
        "mailroom_events_processed_total",
        "counter",
        &["topic", "outcome"],
    ),
    (
        "mailroom_processing_duration_seconds",
        "histogram",
        &["topic"],
    ),
    ("mailroom_ingest_duration_seconds", "histogram", &["source"]),
    ("mailroom_queue_depth", "gauge", &["topic", "status"]),
    ("mailroom_dead_letter_depth", "gauge", &["topic"]),
    ("mailroom_oldest_pending_age_seconds", "gauge", &["topic"]),
    ("mailroom_blocked_keys", "gauge", &["topic"]),
    ("mailroom_published_total", "counter", &["topic", "outcome"]),
];

/// Label name -> value.
type Labels = BTreeMap<String, String>;

/// One scrape: `# TYPE` per family, and per sample name its samples'
/// labels and values.
#[derive(Default, Debug)]
struct Scrape {
    types: BTreeMap<String, String>,
    samples: BTreeMap<String, Vec<(Labels, f64)>>,
}

fn parse(text: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            s.types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample value");
        let value: f64 = value.parse().expect("numeric sample value");
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        let labels = labels
            .split("\",")
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once("=\"").expect("label=\"value\"");
                (k.to_string(), v.trim_end_matches('"').to_string())
            })
            .collect();
        s.samples
            .entry(name.to_string())
            .or_default()
            .push((labels, value));
    }
    s
}

impl Scrape {
    /// The sum of `name`'s samples whose labels hold every pair (`None`:
    /// no such sample).
    fn sum(&self, name: &str, pairs: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .get(name)?
            .iter()
            .filter(|(l, _)| pairs.iter().all(|(k, w)| l.get(*k).is_some_and(|x| x == w)))
            .map(|(_, v)| *v)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }

    fn has(&self, name: &str, pairs: &[(&str, &str)]) -> bool {
        self.sum(name, pairs).is_some()
    }

    /// The distinct label-name sets of `name`'s samples.
    fn label_sets(&self, name: &str) -> BTreeSet<Vec<String>> {
        self.samples
            .get(name)
            .map(|v| v.iter().map(|(l, _)| l.keys().cloned().collect()).collect())
            .unwrap_or_default()
    }
}

/// Everything the traffic below must make visible.
fn complete(s: &Scrape) -> bool {
    let received = "mailroom_events_received_total";
    let processed = "mailroom_events_processed_total";
    let shop = |o| s.sum(received, &[("source", "shop"), ("outcome", o)]);
    ["accepted", "duplicate"]
        .iter()
        .all(|o| shop(o) == Some(1.0))
        && shop("rejected") == Some(3.0)
        && s.has(processed, &[("topic", "orders"), ("outcome", "done")])
        && s.has(processed, &[("topic", "failing"), ("outcome", "retry")])
        && s.has(processed, &[("topic", "failing"), ("outcome", "dead")])
        && s.has("mailroom_published_total", &[("topic", "outbox")])
        && s.has("mailroom_amqp_connected", &[])
        && s.has("mailroom_dead_letter_depth", &[("topic", "failing")])
        && DOCUMENTED.iter().all(|(name, kind, _)| {
            let sample = if *kind == "histogram" {
                format!("{name}_count")
            } else {
                name.to_string()
            };
            s.samples.contains_key(&sample)
        })
}

fn config(dir: &std::path::Path, receiver: &str, exchange: &str) -> std::path::PathBuf {
    write_config(
        dir,
        &format!(
            r#"
[amqp]
url = "{amqp}"
[[amqp.exchange]]
name = "{exchange}"
kind = "topic"

[[source]]
name = "shop"
topic = "orders"
max_body = "1KB"
id = {{ json = "/id" }}

[[topic]]
name = "orders"
mode = "sequential"
key = "/k"
handler = {{ http = {{ url = "{receiver}" }} }}

[[topic]]
name = "failing"
retry = {{ max_attempts = 2, base = "10ms", max_delay = "10ms" }}
handler = {{ http = {{ url = "http://127.0.0.1:9/closed" }} }}

[[topic]]
name = "outbox"
retry = {{ max_attempts = 1 }}
handler = {{ amqp = {{ exchange = "{exchange}", routing_key = "{{type}}" }} }}
"#,
            amqp = mailroom_testkit::amqp_url()
        ),
    )
}

/// Webhooks accepted, duplicate and rejected (no ordering key; no dedup
/// key; a body over `max_body`: all three count as `rejected`); an event
/// that a handler takes; one whose handler is unreachable (retry, then
/// dead); one published to the broker.
async fn traffic(base: &str) {
    let http = reqwest::Client::new();
    let webhook = |body: serde_json::Value| {
        http.post(format!("{base}/webhooks/shop"))
            .json(&body)
            .send()
    };
    let ok = serde_json::json!({"id": "w-1", "k": "c-1"});
    assert_eq!(webhook(ok.clone()).await.expect("post").status(), 200);
    assert_eq!(webhook(ok).await.expect("post").status(), 200, "duplicate");
    let refused = webhook(serde_json::json!({"id": "w-2"}))
        .await
        .expect("post");
    assert!(refused.status().is_client_error(), "{}", refused.status());
    let unusable = webhook(serde_json::json!({"k": "c-1"}))
        .await
        .expect("post");
    assert_eq!(unusable.status(), 400, "no dedup key");
    let oversized = http
        .post(format!("{base}/webhooks/shop"))
        .header("content-type", "application/json")
        .body(vec![b' '; 2048])
        .send()
        .await
        .expect("post");
    assert_eq!(oversized.status(), 413, "over max_body");
    for (topic, key) in [("failing", "f-1"), ("outbox", "o-1")] {
        let resp = http
            .post(format!("{base}/v1/events"))
            .header("Idempotency-Key", key)
            .json(&serde_json::json!({"topic": topic, "type": "t.x", "payload": {}}))
            .send()
            .await
            .expect("POST /v1/events");
        assert_eq!(resp.status(), 201);
    }
}

async fn scrape(base: &str) -> (String, Scrape) {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let parsed = parse(&text);
    (text, parsed)
}

/// Every documented metric: exact name, type and label set; histograms carry
/// buckets 0.001 .. 60 and `+Inf`, `_sum` and `_count`.
fn check_documented(text: &str, s: &Scrape) {
    for (name, kind, labels) in DOCUMENTED {
        assert_eq!(
            s.types.get(name).map(String::as_str),
            Some(kind),
            "# TYPE of {name} in\n{text}"
        );
        let mut want: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        want.sort();
        let plain = [(name.to_string(), want.clone())];
        let series: Vec<(String, Vec<String>)> = if kind == "histogram" {
            let mut with_le = want.clone();
            with_le.push("le".into());
            with_le.sort();
            vec![
                (format!("{name}_bucket"), with_le),
                (format!("{name}_sum"), want.clone()),
                (format!("{name}_count"), want),
            ]
        } else {
            plain.to_vec()
        };
        for (sample, labels) in series {
            assert_eq!(
                s.label_sets(&sample),
                BTreeSet::from([labels]),
                "label set of {sample} in\n{text}"
            );
        }
        if kind == "histogram" {
            for le in ["0.001", "0.005", "0.1", "1", "10", "60", "+Inf"] {
                assert!(
                    s.has(&format!("{name}_bucket"), &[("le", le)]),
                    "{name} has no bucket le={le} in\n{text}"
                );
            }
        }
    }
    // The AMQP connection's state, a gauge per connection.
    assert_eq!(
        s.types.get("mailroom_amqp_connected").map(String::as_str),
        Some("gauge")
    );
    assert_eq!(
        s.label_sets("mailroom_amqp_connected"),
        BTreeSet::from([vec!["connection".to_string()]])
    );
    let bounded = |name: &str, key: &str, allowed: &[&str]| {
        for (l, _) in &s.samples[name] {
            assert!(allowed.contains(&l[key].as_str()), "{name} {l:?}");
        }
    };
    let received = ["accepted", "duplicate", "rejected"];
    bounded("mailroom_events_received_total", "outcome", &received);
    let processed = ["done", "retry", "dead"];
    bounded("mailroom_events_processed_total", "outcome", &processed);
    let published = ["confirmed", "returned", "nacked", "error"];
    bounded("mailroom_published_total", "outcome", &published);
}

/// Every series `deploy/prometheus-alerts.yml` queries is one the binary
/// serves (a histogram through `_bucket`, `_sum` or `_count`).
fn check_alert_rules(text: &str, s: &Scrape) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/prometheus-alerts.yml"
    );
    let rules = std::fs::read_to_string(path).expect("read the alert rules");
    let mut names = BTreeSet::new();
    let queries = rules.lines().filter(|l| !l.trim_start().starts_with('#'));
    for line in queries {
        for (i, _) in line.match_indices("mailroom_") {
            let rest = &line[i..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            names.insert(rest[..end].to_string());
        }
    }
    assert!(names.len() >= 5, "{names:?}");
    for name in names {
        assert!(
            s.samples.contains_key(&name),
            "the alert rules query {name}, which /metrics does not serve:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_named_typed_and_labelled_as_documented() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (receiver, _calls) = support::receiver(Duration::ZERO).await;
    let exchange = format!("metrics-{:08x}.events", support::rand_below(1 << 32));
    let path = config(dir.path(), &receiver.url, &exchange);
    let store = format!("sqlite://{}", dir.path().join("m.db").display());
    let serve = std::thread::spawn(move || support::serve(&path, &store))
        .join()
        .expect("start serve");
    traffic(&serve.base).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    let (text, scraped) = loop {
        let (text, scraped) = scrape(&serve.base).await;
        if complete(&scraped) || Instant::now() > deadline {
            break (text, scraped);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(complete(&scraped), "not every metric appeared:\n{text}");
    check_documented(&text, &scraped);
    check_alert_rules(&text, &scraped);

    drop(serve);
    let conn = Connection::connect(
        &mailroom_testkit::amqp_url(),
        ConnectionProperties::default(),
    )
    .await
    .expect("connect to the test RabbitMQ");
    let ch = conn.create_channel().await.expect("channel");
    let _ = ch
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
}
