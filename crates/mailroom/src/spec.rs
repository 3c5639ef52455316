//! The resolved shape of an engine: its topics and sources, built by hand
//! (library mode) or from `mailroom.toml` by the `mailroom-config` crate,
//! validated once by the engine builder so the data path never re-checks
//! configuration.

use mailroom_core::{BatchError, Mode, Rate, RetryPolicy, RetryPolicyError, duration};
use std::time::Duration;

/// Where a value lives in an incoming request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// A header (case-insensitive).
    Header(String),
    /// A JSON pointer into the body (RFC 6901).
    Json(String),
    /// The SHA-256 of the body (a dedup key of last resort).
    BodySha256,
}

impl Field {
    /// A JSON pointer field; the pointer must be empty or start with `/`.
    pub fn json(pointer: &str) -> Result<Field, FieldError> {
        let field = Field::Json(pointer.to_string());
        field.validate()?;
        Ok(field)
    }

    /// Checks that a header is a valid header name and a pointer a JSON pointer.
    pub fn validate(&self) -> Result<(), FieldError> {
        match self {
            Field::Header(h) if http::HeaderName::from_bytes(h.as_bytes()).is_err() => {
                Err(FieldError::Header(h.clone()))
            }
            Field::Json(p) if !(p.is_empty() || p.starts_with('/')) => {
                Err(FieldError::Pointer(p.clone()))
            }
            _ => Ok(()),
        }
    }
}

/// Why a [`Field`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// Not a valid HTTP header name.
    #[error("{0:?} is not a valid header name")]
    Header(String),
    /// Not a JSON pointer.
    #[error("{0:?} is not a JSON pointer (it must start with '/')")]
    Pointer(String),
}

/// A topic: a named stream of events with one processing mode, one retry
/// policy and one handler. Build one with [`TopicSpec::new`] and its
/// setters; [`EngineBuilder::build`](crate::EngineBuilder::build) checks it
/// with [`TopicSpec::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct TopicSpec {
    /// The name events, sources and handlers refer to it by.
    pub name: String,
    /// How its events are handed out: independently (`single`), one at a
    /// time per key (`sequential`), or together (`batch`).
    pub mode: Mode,
    /// Where the ordering/grouping key lives when the source doesn't say.
    pub key: Option<Field>,
    /// The key of events that carry none; a sequential topic without it
    /// refuses keyless events on every door ([`crate::accept`]).
    pub default_key: Option<String>,
    /// Attempts in flight at once.
    pub concurrency: u32,
    /// How many attempts an event gets and how long it waits between
    /// them.
    pub retry: RetryPolicy,
    /// How long one attempt may run before it is cut off and counted as a
    /// failure.
    pub timeout: Duration,
    /// Lease length; always longer than `timeout`.
    pub lease: Duration,
    /// At most this many attempts started per second, minute or hour
    /// (across instances on PostgreSQL, per process on SQLite).
    pub rate: Option<Rate>,
    /// At most this many events running at once, across every instance
    /// sharing the store.
    pub max_running: Option<u32>,
    /// A pending event older than this is not run: it becomes `expired`
    /// (`expire_after`); `None`: never.
    pub expire_after: Option<Duration>,
    /// The starvation bound of priorities: a due event waits at most about
    /// this long behind higher-priority ones.
    pub max_wait_for_priority: Duration,
    /// The topic a copy of each event that goes dead is enqueued into,
    /// once per death (see [`crate::dead_letter`]); its handler hands the
    /// dead letters on (to a broker's dead-letter exchange). `None`: dead
    /// events stay in the store only.
    pub dead_letter: Option<String>,
}

impl TopicSpec {
    /// Default attempts in flight at once.
    pub const DEFAULT_CONCURRENCY: u32 = 16;
    /// Default bound on one attempt.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// How much longer than the timeout a lease lasts unless set: the time
    /// an attempt cut at its timeout has to record its outcome.
    pub const LEASE_MARGIN: Duration = Duration::from_secs(5);
    /// Default `max_wait_for_priority`: 5 minutes.
    pub const DEFAULT_MAX_WAIT_FOR_PRIORITY: Duration = Duration::from_secs(300);

    /// A `single` topic with the documented defaults: concurrency 16, 15
    /// attempts from 2 s, 30 s timeout, 35 s lease.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            mode: Mode::Single,
            key: None,
            default_key: None,
            concurrency: Self::DEFAULT_CONCURRENCY,
            retry: RetryPolicy::default(),
            timeout: Self::DEFAULT_TIMEOUT,
            lease: Self::DEFAULT_TIMEOUT + Self::LEASE_MARGIN,
            rate: None,
            max_running: None,
            expire_after: None,
            max_wait_for_priority: Self::DEFAULT_MAX_WAIT_FOR_PRIORITY,
            dead_letter: None,
        }
    }

    /// Copies each event that goes dead into the topic `into` (see
    /// [`TopicSpec::dead_letter`]).
    pub fn dead_letter(mut self, into: impl Into<String>) -> Self {
        self.dead_letter = Some(into.into());
        self
    }

    /// Pending events older than `after` are not run but `expired`.
    pub fn expire_after(mut self, after: Duration) -> Self {
        self.expire_after = Some(after);
        self
    }

    /// Sets the starvation bound of priorities.
    pub fn max_wait_for_priority(mut self, wait: Duration) -> Self {
        self.max_wait_for_priority = wait;
        self
    }

    /// A claim request for this topic's events as its mode, expiry and
    /// starvation bound say.
    pub fn claim_request(
        &self,
        worker: &str,
        max: u32,
        lease: Duration,
    ) -> mailroom_core::ClaimRequest {
        mailroom_core::ClaimRequest {
            per_key: self.mode.per_key(),
            max_wait_for_priority: Some(self.max_wait_for_priority),
            expire_after: self.expire_after,
            ..mailroom_core::ClaimRequest::new(self.name.clone(), worker, max, lease)
        }
    }

    /// Caps the attempts started per period, across instances.
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// Caps the events running at once, across instances (at least 1;
    /// [`TopicSpec::validate`]).
    pub fn max_running(mut self, n: u32) -> Self {
        self.max_running = Some(n);
        self
    }

    /// Whether a claim of this topic must ask its limits first.
    pub fn is_limited(&self) -> bool {
        self.rate.is_some() || self.max_running.is_some()
    }

    /// Sets how events are handed out (`single`, `sequential`, `batch`).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets where the ordering key lives in requests whose source does not
    /// say.
    pub fn key(mut self, key: Field) -> Self {
        self.key = Some(key);
        self
    }

    /// Sets the concurrency (at least 1).
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Sets the attempt budget and the backoff between attempts.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Sets the attempt timeout; the lease becomes timeout + 5 s unless longer.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.lease = self.lease.max(timeout + Self::LEASE_MARGIN);
        self
    }

    /// Sets the lease (must exceed the timeout; [`TopicSpec::validate`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Checks everything a topic needs to run, naming the first key that is
    /// wrong: the engine builder calls it on every topic, hand-built or read
    /// from `mailroom.toml`, so both are held to the same rules.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.name.is_empty() {
            return Err(SpecError::EmptyName);
        }
        if self.concurrency == 0 {
            return Err(SpecError::NoConcurrency);
        }
        if self.timeout.is_zero() {
            return Err(SpecError::ZeroTimeout);
        }
        if self.max_running == Some(0) {
            return Err(SpecError::NoMaxRunning);
        }
        if matches!(self.mode, Mode::Batch(_)) {
            if self.rate.is_some() {
                return Err(SpecError::LimitOnBatch("rate"));
            }
            if self.max_running.is_some() {
                return Err(SpecError::LimitOnBatch("max_running"));
            }
        }
        if self.lease <= self.timeout {
            return Err(SpecError::LeaseTooShort {
                lease: self.lease,
                timeout: self.timeout,
            });
        }
        if let Some(key) = &self.key {
            key.validate().map_err(SpecError::Key)?;
        }
        if self.default_key.as_deref() == Some("") {
            return Err(SpecError::EmptyDefaultKey);
        }
        if self.expire_after.is_some_and(|d| d.is_zero()) {
            return Err(SpecError::ZeroExpireAfter);
        }
        if self.max_wait_for_priority.is_zero() {
            return Err(SpecError::ZeroMaxWaitForPriority);
        }
        self.retry.validate()?;
        if let Mode::Batch(b) = &self.mode {
            b.validate()?;
        }
        Ok(())
    }
}

/// Why a [`TopicSpec`] was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The name is empty: nothing could refer to the topic.
    #[error("name must not be empty")]
    EmptyName,
    /// `concurrency` is 0.
    #[error("concurrency must be at least 1")]
    NoConcurrency,
    /// `max_running` is 0: nothing would ever run.
    #[error("max_running must be at least 1")]
    NoMaxRunning,
    /// `rate` or `max_running` on a batch topic, whose deliveries they do
    /// not gate.
    #[error(
        "{0} is not supported on batch topics (only single and sequential topics and pull workers)"
    )]
    LimitOnBatch(&'static str),
    /// `timeout` is 0: every attempt would time out.
    #[error("timeout must be more than 0")]
    ZeroTimeout,
    /// The lease does not outlast the timeout, so a slow attempt could lose
    /// its lease (and be run twice) before it is cut.
    #[error(
        "lease ({}) must be longer than timeout ({})",
        duration::format(*.lease),
        duration::format(*.timeout)
    )]
    LeaseTooShort {
        /// The lease asked for.
        lease: Duration,
        /// The attempt timeout it must outlast.
        timeout: Duration,
    },
    /// Where the key lives is not a valid header name or JSON pointer.
    #[error("{0}")]
    Key(FieldError),
    /// `default_key` is the empty string.
    #[error("default_key must not be empty")]
    EmptyDefaultKey,
    /// `expire_after` is 0: every event would expire before it could run.
    #[error("expire_after must be more than 0")]
    ZeroExpireAfter,
    /// `max_wait_for_priority` is 0: priorities would mean nothing.
    #[error("max_wait_for_priority must be more than 0")]
    ZeroMaxWaitForPriority,
    /// The retry policy is inconsistent.
    #[error(transparent)]
    Retry(#[from] RetryPolicyError),
    /// The batch settings are inconsistent.
    #[error(transparent)]
    Batch(#[from] BatchError),
}

impl SpecError {
    /// The offending key, as written in a `[[topic]]` table (`lease`,
    /// `retry.jitter`, `batch.schedule`...).
    pub fn key(&self) -> String {
        match self {
            SpecError::EmptyName => "name".into(),
            SpecError::NoConcurrency => "concurrency".into(),
            SpecError::ZeroTimeout => "timeout".into(),
            SpecError::NoMaxRunning => "max_running".into(),
            SpecError::LimitOnBatch(key) => (*key).into(),
            SpecError::LeaseTooShort { .. } => "lease".into(),
            SpecError::Key(_) => "key".into(),
            SpecError::EmptyDefaultKey => "default_key".into(),
            SpecError::ZeroExpireAfter => "expire_after".into(),
            SpecError::ZeroMaxWaitForPriority => "max_wait_for_priority".into(),
            SpecError::Retry(e) => format!("retry.{}", e.key()),
            SpecError::Batch(e) => format!("batch.{}", e.key()),
        }
    }
}

/// A webhook source: an endpoint `POST /webhooks/{name}` feeding one topic,
/// with where its dedup key, type and key live and how its signatures are
/// verified. Build one with [`SourceSpec::new`];
/// [`EngineBuilder::build`](crate::EngineBuilder::build) checks it with
/// [`SourceSpec::validate`].
#[derive(Debug, Clone)]
pub struct SourceSpec {
    /// URL segment and `source` of its events.
    pub name: String,
    /// The topic its events go to.
    pub topic: String,
    /// Where the dedup key lives, first present wins; empty means the
    /// default chain (`webhook-id`, `Idempotency-Key`, `/id`, SHA-256 of the body).
    pub id: Vec<Field>,
    /// Where the event type lives (a header or a JSON pointer).
    pub event_type: Option<Field>,
    /// Where the ordering key lives (overrides the topic's).
    pub key: Option<Field>,
    /// Where an RFC 3339 time before which the event must not run lives;
    /// absent in a request means now.
    pub deliver_at: Option<Field>,
    /// Where the event's priority (an integer; absent means 0) lives.
    pub priority: Option<Field>,
    /// Where the payload's schema version lives; absent (or not found) means
    /// the `mailroom-version` header, else `"1"`.
    pub version: Option<Field>,
    /// Signature verification, checked before anything else.
    pub verifier: Option<mailroom_signatures::Verifier>,
    /// Largest accepted body in bytes; a larger one is answered 413.
    pub max_body: u64,
    /// Requests accepted per time unit (`rate_limit = "1000/s"`); `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
}

/// A source's request budget, `"<n>/s"`, `"<n>/m"` or `"<n>/h"`, enforced by
/// the server as a token bucket holding at most `requests` (so a burst of
/// one period is allowed) and refilled at `requests / per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    /// Requests per period (at least 1).
    pub requests: u32,
    /// The period the budget refills over.
    pub per: Duration,
}

impl std::str::FromStr for RateLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("{s:?} is not a rate: write \"<n>/s\", \"<n>/m\" or \"<n>/h\", e.g. \"1000/s\"")
        };
        let (n, unit) = s.trim().split_once('/').ok_or_else(bad)?;
        let requests: u32 = n.trim().parse().map_err(|_| bad())?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        if requests == 0 {
            return Err(format!("{s:?}: the number of requests must be at least 1"));
        }
        Ok(RateLimit { requests, per })
    }
}

/// Default `max_body`: 1 MiB.
pub const DEFAULT_MAX_BODY: u64 = 1024 * 1024;

impl SourceSpec {
    /// A source with the default dedup chain, no verification, 1 MiB bodies.
    pub fn new(name: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            topic: topic.into(),
            id: vec![],
            event_type: None,
            key: None,
            deliver_at: None,
            priority: None,
            version: None,
            verifier: None,
            max_body: DEFAULT_MAX_BODY,
            rate_limit: None,
        }
    }

    /// Checks what intake relies on, naming the first key that is wrong: the
    /// engine builder calls it on every source, hand-built or from a file.
    pub fn validate(&self) -> Result<(), SourceSpecError> {
        let url_safe = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
        if self.name.is_empty() || !self.name.chars().all(url_safe) {
            return Err(SourceSpecError::Name);
        }
        if self.topic.is_empty() {
            return Err(SourceSpecError::NoTopic);
        }
        if self.max_body == 0 {
            return Err(SourceSpecError::ZeroMaxBody);
        }
        if self.rate_limit.is_some_and(|r| r.requests == 0) {
            return Err(SourceSpecError::ZeroRate);
        }
        let fields = (self.id.iter().map(|f| ("id", f)))
            .chain(self.event_type.iter().map(|f| ("type", f)))
            .chain(self.key.iter().map(|f| ("key", f)))
            .chain(self.deliver_at.iter().map(|f| ("deliver_at", f)))
            .chain(self.priority.iter().map(|f| ("priority", f)))
            .chain(self.version.iter().map(|f| ("version", f)));
        for (key, f) in fields {
            f.validate().map_err(|e| SourceSpecError::Field(key, e))?;
        }
        Ok(())
    }
}

/// Why a [`SourceSpec`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SourceSpecError {
    /// The name is empty or not a URL segment.
    #[error("use letters, digits, '-', '_' or '.' (it is a URL segment)")]
    Name,
    /// No topic named: its events would have nowhere to go.
    #[error("topic must not be empty")]
    NoTopic,
    /// `max_body` is 0.
    #[error("must be more than 0")]
    ZeroMaxBody,
    /// A rate limit of 0 requests.
    #[error("the number of requests must be at least 1")]
    ZeroRate,
    /// The dedup key, type or ordering key cannot be read.
    #[error("{1}")]
    Field(&'static str, FieldError),
}

impl SourceSpecError {
    /// The offending key, as written in a `[[source]]` table.
    pub fn key(&self) -> &'static str {
        match self {
            SourceSpecError::Name => "name",
            SourceSpecError::NoTopic => "topic",
            SourceSpecError::ZeroMaxBody => "max_body",
            SourceSpecError::ZeroRate => "rate_limit",
            SourceSpecError::Field(key, _) => key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rates parse per second, minute and hour; anything else is refused.
    #[test]
    fn rate_limits_parse_per_second_minute_and_hour() {
        let r: RateLimit = "1000/s".parse().unwrap();
        assert_eq!((r.requests, r.per), (1000, Duration::from_secs(1)));
        let r: RateLimit = " 60 / m ".parse().unwrap();
        assert_eq!((r.requests, r.per), (60, Duration::from_secs(60)));
        assert_eq!(
            "5/h".parse::<RateLimit>().unwrap().per,
            Duration::from_secs(3600)
        );
        for bad in ["", "1000", "0/s", "-1/s", "x/s", "10/d", "1.5/s"] {
            assert!(bad.parse::<RateLimit>().is_err(), "{bad:?}");
        }
    }

    /// A hand-built source is checked key by key: a name that is no URL
    /// segment, an empty body limit, a zero rate or an unreadable field.
    #[test]
    fn source_specs_are_checked_key_by_key() {
        fn with(f: impl FnOnce(&mut SourceSpec)) -> Result<(), &'static str> {
            let mut s = SourceSpec::new("github", "pushes");
            f(&mut s);
            s.validate().map_err(|e| e.key())
        }
        assert_eq!(with(|_| ()), Ok(()));
        assert_eq!(with(|s| s.name = "a/b".into()), Err("name"));
        assert_eq!(with(|s| s.topic = String::new()), Err("topic"));
        assert_eq!(with(|s| s.max_body = 0), Err("max_body"));
        let zero = Some(RateLimit {
            requests: 0,
            per: Duration::from_secs(1),
        });
        assert_eq!(with(|s| s.rate_limit = zero), Err("rate_limit"));
        assert_eq!(with(|s| s.id = vec![Field::Json("id".into())]), Err("id"));
        assert_eq!(
            with(|s| s.event_type = Some(Field::Header("a b".into()))),
            Err("type")
        );
        assert_eq!(with(|s| s.key = Some(Field::Json("k".into()))), Err("key"));
    }
}
