//! The handler side: an HTTP/1.1 endpoint on 127.0.0.1:0 that records every
//! call mailroom makes (event id, attempt, start, end, outcome) in a
//! [`Recorder`].
//!
//! Written over a bare `TcpStream` rather than a server framework because
//! the attacks need what frameworks hide: resetting a connection (linger 0)
//! and noticing the caller hang up while the handler is still "working".
//! A payload's `"fail"` field picks the misbehaviour: `"500"`, `"reset"`,
//! `"hang"` (never answers); anything else succeeds after the receiver's delay.

use super::record::{Call, Outcome, Recorder};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Requests larger than this are not ours: the connection is dropped.
const MAX_REQUEST: usize = 1 << 20;

/// A running receiver; serves until the runtime ends.
#[derive(Debug, Clone)]
pub struct Receiver {
    /// `http://127.0.0.1:<port>/deliver`.
    pub url: String,
}

/// How long a successful call takes.
#[derive(Debug, Clone, Copy)]
enum Delay {
    /// Always this long.
    Fixed(Duration),
    /// A random time from zero to this, so that overlapping runs of one
    /// event would show as overlapping calls.
    UpTo(Duration),
}

impl Delay {
    fn pick(self) -> Duration {
        match self {
            Self::Fixed(d) => d,
            Self::UpTo(max) => {
                let us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
                Duration::from_micros(super::rand_below(us.saturating_add(1)))
            }
        }
    }
}

impl Receiver {
    /// Binds and serves; each successful call takes `delay`.
    pub async fn start(rec: Recorder, delay: Duration) -> std::io::Result<Self> {
        Self::serve(rec, Delay::Fixed(delay)).await
    }

    /// Binds and serves; each successful call takes a random time up to
    /// `max`.
    pub async fn start_jittered(rec: Recorder, max: Duration) -> std::io::Result<Self> {
        Self::serve(rec, Delay::UpTo(max)).await
    }

    async fn serve(rec: Recorder, delay: Delay) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(connection(stream, rec.clone(), delay));
            }
        });
        Ok(Self {
            url: format!("http://{addr}/deliver"),
        })
    }
}

/// One request as parsed.
struct Request {
    event_id: String,
    attempt: u32,
    fail: Option<String>,
}

/// Serves one keep-alive connection, request after request.
async fn connection(mut stream: TcpStream, rec: Recorder, delay: Delay) {
    let mut buf = Vec::new();
    while let Some(req) = read_request(&mut stream, &mut buf).await {
        let start = rec.now();
        let (outcome, answered) = respond(&mut stream, &req, delay.pick(), &rec).await;
        let end = rec.now();
        // Keep the connection only after a whole answer.
        let keep = answered.is_some() && outcome != Outcome::Cut;
        let call = Call {
            event_id: req.event_id,
            attempt: req.attempt,
            start,
            answered: answered.unwrap_or(end),
            end,
            outcome,
        };
        rec.lock().calls.push(call);
        if !keep {
            return;
        }
    }
}

/// Answers (or misbehaves); how the call ended, and when the answer began
/// to be written (`None` when none was).
async fn respond(
    stream: &mut TcpStream,
    req: &Request,
    delay: Duration,
    rec: &Recorder,
) -> (Outcome, Option<Duration>) {
    let (status, text) = match req.fail.as_deref() {
        // `exit` and `signal`: the command handler in front crashes on it.
        Some("500" | "exit" | "signal") => ("500 Internal Server Error", "poisoned: http 500"),
        Some("reset") => {
            // Linger 0: the close sends RST at once. tokio deprecates
            // set_linger because a non-zero linger blocks the thread on
            // drop; zero never waits.
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
            return (Outcome::Failed, None);
        }
        Some("hang") => {
            hung_up(stream, Duration::from_secs(3600)).await;
            return (Outcome::Cut, None);
        }
        _ => ("200 OK", "ok"),
    };
    if !delay.is_zero() && hung_up(stream, delay).await {
        return (Outcome::Cut, None);
    }
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{text}",
        text.len()
    );
    // Taken before the write: once the first byte is out the caller may
    // act on the verdict while this task is still descheduled.
    let answered = rec.now();
    let outcome = match stream.write_all(answer.as_bytes()).await {
        Ok(()) if status.starts_with('2') => Outcome::Succeeded,
        Ok(()) => Outcome::Failed,
        Err(_) => Outcome::Cut,
    };
    (outcome, Some(answered))
}

/// Waits `limit`; true if the caller hung up first.
async fn hung_up(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut probe = [0u8; 1];
    tokio::select! {
        _ = tokio::time::sleep(limit) => false,
        // The caller sends nothing more until answered: a read ends only
        // when it closes the connection.
        _ = stream.read(&mut probe) => true,
    }
}

/// Reads one request (headers and a `content-length` body).
async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Request> {
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_REQUEST || !fill(stream, buf).await {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    let len: usize = header("content-length").parse().unwrap_or(0);
    if len > MAX_REQUEST {
        return None;
    }
    while buf.len() < head_end + len {
        if !fill(stream, buf).await {
            return None;
        }
    }
    let body: Vec<u8> = buf.drain(..head_end + len).skip(head_end).collect();
    let fail = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("fail")?.as_str().map(str::to_owned));
    Some(Request {
        event_id: header("webhook-id"),
        attempt: header("mailroom-attempt").parse().unwrap_or(0),
        fail,
    })
}

/// Reads more bytes; false at end of stream or on error.
async fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}
