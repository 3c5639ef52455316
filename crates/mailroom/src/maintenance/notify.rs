//! Alert notifications (`[alerts] notify = { http = {...} }`):
//! each time an alert starts firing or resolves, the elected maintenance
//! instance POSTs `{"alert", "topic", "state", "value", "threshold", "at"}`
//! signed with Standard Webhooks headers (<https://www.standardwebhooks.com/>),
//! so a receiver verifies it with any Standard Webhooks library, exactly as
//! it verifies the `http` handler's calls.
//!
//! Deliveries run on their own task, in order, so a slow receiver never
//! delays lease rescue or retention; a failed one is retried with
//! exponential backoff (same `webhook-id`, so a receiver can drop a repeat)
//! and logged, and given up, at ERROR, after [`AlertNotify::max_attempts`].

use crate::handler::http::standard_webhooks_signature;
use jiff::Timestamp;
use mailroom_core::Alert;
use serde::Serialize;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Transitions waiting for delivery; more are dropped (and logged): a
/// receiver that is down for long loses the oldest news, not memory.
const QUEUE: usize = 1024;

/// Where and how alert transitions are sent.
#[derive(Debug, Clone)]
pub struct AlertNotify {
    /// The receiver (http or https).
    pub url: reqwest::Url,
    /// Signing key (see [`HttpHandler::decode_secret`](crate::handler::http::HttpHandler::decode_secret));
    /// without one, no `webhook-signature` header is sent.
    pub secret: Option<Vec<u8>>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Delay before the first retry; doubled each time, up to [`Self::MAX_DELAY`].
    pub retry_base: Duration,
    /// Attempts per transition before it is given up.
    pub max_attempts: u32,
}

impl AlertNotify {
    /// The longest wait between two attempts.
    pub const MAX_DELAY: Duration = Duration::from_secs(60);

    /// Notifications to `url`, signed with `secret`: 10 s timeout, retries
    /// after 1 s, 2 s, 4 s... for 8 attempts (about 2 minutes).
    pub fn new(url: reqwest::Url, secret: Option<Vec<u8>>) -> Self {
        Self {
            url,
            secret,
            timeout: Duration::from_secs(10),
            retry_base: Duration::from_secs(1),
            max_attempts: 8,
        }
    }

    /// An http(s) URL and at least one attempt.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !matches!(self.url.scheme(), "http" | "https") {
            return Err(format!(
                "url: must be http or https, got {}",
                mailroom_core::redact::url(self.url.as_str())
            ));
        }
        if self.max_attempts == 0 {
            return Err("max_attempts: must be at least 1".into());
        }
        Ok(())
    }
}

/// Whether an alert started or stopped firing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum State {
    Firing,
    Resolved,
}

/// The JSON body of a notification.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Message {
    alert: &'static str,
    topic: String,
    state: State,
    /// The measured value when it fired; null on `resolved` (an alert is
    /// only measured while over its threshold).
    value: Option<f64>,
    threshold: f64,
    at: Timestamp,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Firing => "firing",
            State::Resolved => "resolved",
        }
    }
}

impl Message {
    pub(super) fn new(alert: &Alert, state: State) -> Self {
        Self {
            alert: alert.kind.as_str(),
            topic: alert.topic.clone(),
            state,
            value: (state == State::Firing).then_some(alert.value),
            threshold: alert.threshold,
            at: Timestamp::now(),
        }
    }
}

/// The sending side: queues transitions for the delivery task.
#[derive(Debug)]
pub(super) struct Notifier {
    queue: mpsc::Sender<Message>,
}

impl Notifier {
    /// Starts the delivery task, which ends at `shutdown`.
    pub(super) fn start(settings: AlertNotify, shutdown: CancellationToken) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE);
        tokio::spawn(deliver_all(settings, rx, shutdown));
        Self { queue }
    }

    /// Queues one transition.
    pub(super) fn send(&self, message: Message) {
        if let Err(e) = self.queue.try_send(message) {
            let m = match e {
                mpsc::error::TrySendError::Full(m) | mpsc::error::TrySendError::Closed(m) => m,
            };
            error!(topic = %m.topic, alert = m.alert, state = m.state.as_str(), "alert notification dropped: the delivery queue is full");
        }
    }
}

async fn deliver_all(
    settings: AlertNotify,
    mut rx: mpsc::Receiver<Message>,
    shutdown: CancellationToken,
) {
    let client = match reqwest::Client::builder()
        .timeout(settings.timeout)
        .user_agent(concat!("mailroom/", env!("CARGO_PKG_VERSION")))
        // Redirects are not followed: the signed alert goes where the
        // operator configured it, or fails (see `post`).
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            error!(error = %e, "alert notifications disabled: cannot build an HTTP client");
            return;
        }
    };
    loop {
        let message = tokio::select! {
            m = rx.recv() => match m { Some(m) => m, None => return },
            () = shutdown.cancelled() => return,
        };
        tokio::select! {
            () = deliver(&client, &settings, &message) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Sends one message until a 2xx or `max_attempts`, with one `webhook-id`.
async fn deliver(client: &reqwest::Client, settings: &AlertNotify, message: &Message) {
    let id = format!("msg_{}", uuid::Uuid::now_v7().simple());
    let body = match serde_json::to_vec(message) {
        Ok(b) => b,
        Err(e) => return error!(error = %e, "alert notification not serializable"),
    };
    let mut delay = settings.retry_base;
    for attempt in 1..=settings.max_attempts {
        match post(client, settings, &id, &body).await {
            Ok(()) => {
                return info!(topic = %message.topic, alert = message.alert, state = message.state.as_str(), attempt, "alert notification delivered");
            }
            Err(why) if attempt < settings.max_attempts => {
                warn!(topic = %message.topic, alert = message.alert, state = message.state.as_str(), attempt, error = %why, retry_in = ?delay, "alert notification failed; retrying");
            }
            Err(why) => {
                return error!(topic = %message.topic, alert = message.alert, state = message.state.as_str(), attempt, error = %why, "alert notification given up");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(AlertNotify::MAX_DELAY);
    }
}

/// One signed POST; `Err` says why it did not get a 2xx.
async fn post(
    client: &reqwest::Client,
    settings: &AlertNotify,
    id: &str,
    body: &[u8],
) -> Result<(), String> {
    let ts = Timestamp::now().as_second();
    let mut req = client
        .post(settings.url.clone())
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string());
    if let Some(key) = &settings.secret {
        req = req.header(
            "webhook-signature",
            standard_webhooks_signature(key, id, ts, body),
        );
    }
    let resp = req
        .body(body.to_vec())
        .send()
        .await
        .map_err(|e| e.without_url().to_string())?;
    let status = resp.status();
    let location = resp
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|v| mailroom_core::redact::url(&String::from_utf8_lossy(v.as_bytes())));
    match location {
        _ if status.is_success() => Ok(()),
        Some(to) if status.is_redirection() => Err(format!(
            "HTTP {}: redirect to {to} not followed",
            status.as_u16()
        )),
        _ => Err(format!("HTTP {}", status.as_u16())),
    }
}
