//! Rejections are logged without flooding: a burst of one class of bad
//! requests gives one WARN line with its count, not one line per request.

use super::support::{Server, start};
use mailroom::{SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use mailroom_server::shedding::Limits;
use mailroom_signatures::{DEFAULT_TOLERANCE, Scheme, Verifier};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The log lines, as JSON, shared with the subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lines").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    /// The `rejected` count of every rejection line of `class`.
    fn rejected(&self, class: &str) -> Vec<u64> {
        let text = String::from_utf8_lossy(&self.0.lock().expect("lines")).into_owned();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["fields"]["class"] == class)
            .filter_map(|v| v["fields"]["rejected"].as_u64())
            .collect()
    }
}

async fn server(window: Duration) -> Server {
    let mut source = SourceSpec::new("src", "t");
    source.verifier = Some(
        Verifier::new(
            Scheme::Token {
                header: "x-token".into(),
            },
            ["right-token"],
            DEFAULT_TOLERANCE,
        )
        .expect("verifier"),
    );
    start(
        |_| {},
        |b| b.topic(TopicSpec::new("t")).source(source),
        ServerOptions {
            limits: Limits {
                header_read_timeout: Duration::from_millis(300),
                rejection_log_every: window,
                ..Limits::default()
            },
            ..ServerOptions::default()
        },
    )
    .await
}

/// Writes `bytes` on a fresh connection and reads until the server closes it.
async fn raw(s: &Server, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(s.addr).await.expect("connect");
    c.write_all(bytes).await.expect("write");
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the server kept the connection open");
    String::from_utf8_lossy(&got).into_owned()
}

/// 200 bad tokens, 20 malformed JSON bodies, 3 slow header senders and 3
/// header names with invalid UTF-8 within one window: one line per class,
/// the first with count 1; after the window the next rejection's line
/// carries the count of those held back.
#[tokio::test]
async fn a_burst_of_rejections_logs_one_line_per_class_with_its_count() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // A window long enough to hold the whole burst on a loaded machine
    // (it takes about a second, the slow header senders most of it).
    let window = Duration::from_secs(5);
    let s = server(window).await;
    for _ in 0..200 {
        let r = s.webhook("src", &[("x-token", "wrong")], "{}").await;
        assert_eq!(r.status(), 401);
    }
    for _ in 0..20 {
        let r = s
            .http
            .post(s.url("/v1/events"))
            .header("idempotency-key", "k")
            .body("{\"topic\": ")
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 400);
    }
    for _ in 0..3 {
        let answer = raw(&s, b"POST /webhooks/src HTTP/1.1\r\nhost: localhost\r\n").await;
        assert!(!answer.contains(" 200 "), "{answer}");
        let answer = raw(&s, b"POST /webhooks/src HTTP/1.1\r\nx-\xff\xfe: 1\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    }
    assert_eq!(lines.rejected("unauthorized"), [1]);
    assert_eq!(lines.rejected("bad_request"), [1]);
    assert_eq!(lines.rejected("header_timeout"), [1]);
    assert_eq!(lines.rejected("malformed"), [1]);
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    let r = s.webhook("src", &[("x-token", "wrong")], "{}").await;
    assert_eq!(r.status(), 401);
    assert_eq!(lines.rejected("unauthorized"), [1, 200]);
}
