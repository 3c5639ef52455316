//! Rejected requests are logged without flooding (logs are bounded like
//! everything else): each class of rejection gets at most
//! one WARN line per window, and that line says how many were rejected
//! since the previous one. A flood of bad signatures or slow clients costs a
//! handful of lines, yet an operator still sees that it happens and how big
//! it is. Each answer is still counted in the metrics as before.

use http::StatusCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What kind of rejection (the `class` field of the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The request line and headers did not arrive within the header read
    /// timeout: the connection was closed.
    HeaderTimeout,
    /// Not parseable as HTTP/1 (a byte that has no place in a header name,
    /// a bad request line), or headers over their limits: hyper answered
    /// 400/431 and closed.
    Malformed,
    /// The body did not arrive within the body read timeout (408).
    BodyTimeout,
    /// The body was over its limit (413).
    TooLarge,
    /// The request was refused as invalid (400: malformed JSON, bad fields).
    BadRequest,
    /// The signature, token or bearer did not verify (401).
    Unauthorized,
    /// On an HTTPS listener: the TLS handshake failed (plain HTTP sent to
    /// the HTTPS port, no shared protocol version or cipher) or did not end
    /// within the handshake deadline: the connection was closed.
    TlsHandshake,
    /// Refused for where it came from (403: a foreign `Origin`, a wrong
    /// CSRF token) or where it was sent (421: a foreign `Host` without
    /// `api_token`).
    Forbidden,
}

const CLASSES: usize = 8;

impl Class {
    fn index(self) -> usize {
        self as usize
    }

    /// The name logged in the `class` field.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Class::HeaderTimeout => "header_timeout",
            Class::Malformed => "malformed",
            Class::BodyTimeout => "body_timeout",
            Class::TooLarge => "too_large",
            Class::BadRequest => "bad_request",
            Class::Unauthorized => "unauthorized",
            Class::TlsHandshake => "tls_handshake",
            Class::Forbidden => "forbidden",
        }
    }

    /// The class of an answer the router gave, if it is a rejection.
    pub(crate) fn of_status(status: StatusCode) -> Option<Self> {
        match status {
            StatusCode::BAD_REQUEST => Some(Class::BadRequest),
            StatusCode::UNAUTHORIZED => Some(Class::Unauthorized),
            StatusCode::FORBIDDEN | StatusCode::MISDIRECTED_REQUEST => Some(Class::Forbidden),
            StatusCode::REQUEST_TIMEOUT => Some(Class::BodyTimeout),
            StatusCode::PAYLOAD_TOO_LARGE => Some(Class::TooLarge),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => Some(Class::Malformed),
            _ => None,
        }
    }

    /// The class of a connection hyper ended with an error, if the client
    /// caused it.
    pub(crate) fn of_connection_error(e: &hyper::Error) -> Option<Self> {
        if e.is_timeout() {
            Some(Class::HeaderTimeout)
        } else if e.is_parse() {
            Some(Class::Malformed)
        } else {
            None
        }
    }
}

/// Per class: rejections not yet reported, and when the last line was logged.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    pending: u64,
    last: Option<Instant>,
}

/// The throttle: one line per class per `every`.
#[derive(Debug)]
pub(crate) struct RejectionLog {
    every: Duration,
    slots: Mutex<[Slot; CLASSES]>,
}

impl RejectionLog {
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            every,
            slots: Mutex::new([Slot::default(); CLASSES]),
        }
    }

    /// Counts one rejection of `class`; logs (with the count since the last
    /// line and `example`, one request of the batch) when that class's last
    /// line is at least the window old. Returns the count logged, if any.
    pub(crate) fn note(&self, class: Class, example: &dyn std::fmt::Display) -> Option<u64> {
        let due = {
            // A poisoned lock only means a panic between two integer writes.
            let mut slots = self
                .slots
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let slot = &mut slots[class.index()];
            slot.pending = slot.pending.saturating_add(1);
            let now = Instant::now();
            if slot
                .last
                .is_some_and(|t| now.duration_since(t) < self.every)
            {
                None
            } else {
                slot.last = Some(now);
                Some(std::mem::take(&mut slot.pending))
            }
        };
        if let Some(n) = due {
            tracing::warn!(
                class = class.name(),
                rejected = n,
                window_secs = self.every.as_secs_f64(),
                example = %example,
                "requests rejected (one line per class per window)"
            );
        }
        due
    }
}

/// Router middleware: notes every rejection answer ([`Class::of_status`]).
pub(crate) async fn note_answers(
    axum::extract::State(log): axum::extract::State<std::sync::Arc<RejectionLog>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let resp = next.run(req).await;
    if let Some(class) = Class::of_status(resp.status()) {
        // The path is the client's: bounded, and shown escaped.
        let path: String = uri.path().chars().take(80).collect();
        log.note(class, &format_args!("{method} {path:?}"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_reported_once_per_window_with_the_count_since_the_last_line() {
        let log = RejectionLog::new(Duration::from_millis(200));
        assert_eq!(log.note(Class::Unauthorized, &"a"), Some(1));
        for _ in 0..999 {
            assert_eq!(log.note(Class::Unauthorized, &"a"), None);
        }
        // Another class has its own window.
        assert_eq!(log.note(Class::TooLarge, &"b"), Some(1));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(log.note(Class::Unauthorized, &"a"), Some(1000));
    }
}
