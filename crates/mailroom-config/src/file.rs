//! The serde types of `mailroom.toml`: one struct per table, unknown
//! keys refused, defaults pointing at the runtime's own (`Default` impls and
//! consts of the spec types), so a default has one home.

use mailroom::{Retention, RetryPolicy, TopicSpec, duration};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address of the HTTP listener.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Bearer tokens accepted on `/v1/*` and the dashboard.
    #[serde(default)]
    pub api_token: Option<OneOrMany>,
    /// Accept webhooks for sources the file does not declare. Unset: only
    /// the quick start (no config file) on a loopback listener does; `true`
    /// is refused with a listener that is not loopback.
    #[serde(default)]
    pub accept_undeclared_sources: Option<bool>,
    /// With `api_token` set, `/metrics` and the detail of `/readyz` need
    /// the token too (default false: both open, for scrapers and probes).
    #[serde(default)]
    pub protect_metrics: bool,
    /// The store.
    #[serde(default)]
    pub store: StoreConfig,
    /// Retention windows.
    #[serde(default)]
    pub retention: RetentionConfig,
    /// Alert thresholds.
    #[serde(default)]
    pub alerts: AlertsConfig,
    /// Limits of the HTTP listener (load shedding, read deadlines).
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Intake sources.
    #[serde(default, rename = "source")]
    pub sources: Vec<SourceConfig>,
    /// Topics.
    #[serde(default, rename = "topic")]
    pub topics: Vec<TopicConfig>,
    /// AMQP topology (declared at start and by `mailroom amqp declare`).
    #[serde(default)]
    pub amqp: Option<AmqpConfig>,
    /// Span export (OTLP); off unless `otlp_endpoint` is set.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// HTTPS on `listen` (absent: plain HTTP).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Where this configuration came from, for messages.
    #[serde(skip)]
    pub origin: String,
    /// Whether it was read from a file (`false`: the quick start's defaults).
    #[serde(skip)]
    pub from_file: bool,
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            api_token: None,
            accept_undeclared_sources: None,
            protect_metrics: false,
            store: StoreConfig::default(),
            retention: RetentionConfig::default(),
            alerts: AlertsConfig::default(),
            limits: LimitsConfig::default(),
            sources: vec![],
            topics: vec![],
            amqp: None,
            telemetry: TelemetryConfig::default(),
            tls: None,
            origin: "defaults".into(),
            from_file: false,
        }
    }
}

/// One string, or a list (for secrets and tokens under rotation).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(untagged)]
pub enum OneOrMany {
    /// A single value.
    One(String),
    /// Several values, all accepted.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The values, empty strings dropped.
    pub fn values(&self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
    }
}

/// `[tls]`: the listener serves HTTPS with this certificate; `SIGHUP`
/// re-reads both files.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate, followed by its chain if any.
    pub cert_file: PathBuf,
    /// PEM private key of the certificate (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// `[store]`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `sqlite://mailroom.db` (default) or `postgres://user@host/db`.
    #[serde(default = "default_store_url")]
    pub url: String,
    /// Group many concurrent intakes into one commit (default on). Turning it
    /// off commits each write alone; it exists for the benchmark's baseline.
    #[serde(default = "yes")]
    pub group_commit: bool,
    /// Whether verbs apply pending schema migrations when they open the
    /// store (`auto`, the default) or only check the schema (`never`: for
    /// a role without rights to change it; `mailroom migrate` applies).
    #[serde(default)]
    pub migrate: MigrateMode,
    /// PostgreSQL: a direct connection to the database of `url`, when `url`
    /// is a connection pooler in transaction mode (PgBouncer): LISTEN, the
    /// sequential topics' session locks and migrations use it.
    #[serde(default)]
    pub direct_url: Option<String>,
}

/// `[store] migrate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(transform = crate::interpolated::or_interpolated)]
pub enum MigrateMode {
    /// Every verb applies the missing migrations when it opens the store.
    #[default]
    Auto,
    /// No verb but `mailroom migrate` changes the schema: an older schema
    /// is refused, naming `mailroom migrate`.
    Never,
}

fn default_store_url() -> String {
    "sqlite://mailroom.db".into()
}

fn yes() -> bool {
    true
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: default_store_url(),
            group_commit: true,
            migrate: MigrateMode::Auto,
            direct_url: None,
        }
    }
}

/// `[retention]`; unset keys keep their defaults.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Payloads of done events are dropped after this.
    #[serde(with = "duration::serde_str")]
    #[schemars(with = "crate::schema::DurationText")]
    pub done: Duration,
    /// Payloads of dead events are dropped after this.
    #[serde(with = "duration::serde_str")]
    #[schemars(with = "crate::schema::DurationText")]
    pub dead: Duration,
    /// Rows (and so dedup keys) are kept at least this long.
    #[serde(with = "duration::serde_str")]
    #[schemars(with = "crate::schema::DurationText")]
    pub dedup: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        let Retention { done, dead, dedup } = Retention::default();
        Self { done, dead, dedup }
    }
}

/// `[alerts]`: thresholds evaluated continuously, per topic.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// Dead events per topic.
    pub dead_letter_depth: Option<u64>,
    /// Pending events per topic.
    pub backlog: Option<u64>,
    /// Share of failed attempts in the last 5 minutes, in (0, 1].
    pub failure_rate: Option<f64>,
    /// p95 attempt duration in the last 5 minutes, or the longest running one.
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub processing_time: Option<Duration>,
    /// `notify = { http = { url, secret } }`: where each alert's start and
    /// end is POSTed.
    pub notify: Option<AlertNotifyConfig>,
}

/// `[alerts] notify = { http = {...} }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AlertNotifyConfig {
    /// A signed POST per transition.
    pub http: AlertHttpConfig,
}

/// `notify = { http = { url, secret, timeout } }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AlertHttpConfig {
    /// Receiver URL (http or https).
    pub url: String,
    /// Standard Webhooks signing secret (`whsec_<base64>`, or any string).
    pub secret: Option<String>,
    /// Per-request timeout (default 10s).
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub timeout: Option<Duration>,
}

/// `[telemetry]`: spans of intake, attempts and handler calls,
/// exported over OTLP/HTTP (protobuf) when `otlp_endpoint` is set.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318`;
    /// spans go to `<otlp_endpoint>/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans (default `mailroom`).
    pub service_name: Option<String>,
    /// The deployment's name (e.g. `production`), published in the AMQP
    /// envelope's `metadata.environment` (default: null).
    pub environment: Option<String>,
}

/// `[limits]`: protections of the HTTP listener. Unset keys keep the
/// server's documented defaults.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Requests handled at once; more get 503 + `Retry-After` (default 1024).
    pub max_concurrent_requests: Option<usize>,
    /// Open connections (default 4096).
    pub max_connections: Option<usize>,
    /// Time to send the request line and headers (default 10s).
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub header_read_timeout: Option<Duration>,
    /// Time to send the whole body (default 10s); then 408.
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub body_read_timeout: Option<Duration>,
    /// With `[tls]`: time to finish the TLS handshake (default 10s).
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub tls_handshake_timeout: Option<Duration>,
    /// Headers per request (default 100); more get 431.
    pub max_headers: Option<usize>,
    /// Bytes of request line plus headers (default 16KiB); more get 431.
    pub max_header_bytes: Option<ByteSize>,
    /// Largest `POST /v1/events` body (default 1MiB).
    pub api_max_body: Option<ByteSize>,
}

/// Where a value lives in a request: a header or a JSON pointer into the body.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FieldConfig {
    /// Header name.
    pub header: Option<String>,
    /// JSON pointer (RFC 6901), e.g. `/id`.
    pub json: Option<String>,
}

/// `[[source]]`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// URL segment: `POST /webhooks/{name}`.
    pub name: String,
    /// Topic its events go to (default: the source's name).
    pub topic: Option<String>,
    /// Known provider: fills in `verify`, `id` and `type`.
    #[schemars(with = "Option<crate::schema::PresetName>")]
    pub preset: Option<String>,
    /// Where the dedup key lives.
    pub id: Option<FieldConfig>,
    /// Where the event type lives.
    #[serde(rename = "type")]
    pub event_type: Option<FieldConfig>,
    /// Where the ordering key lives (overrides the topic's).
    pub key: Option<FieldConfig>,
    /// Where an RFC 3339 time lives before which the event must not run
    /// (`{ header = "..." }` or `{ json = "/pointer" }`).
    pub deliver_at: Option<FieldConfig>,
    /// Where the event's priority (an integer) lives
    /// (`{ header = "..." }` or `{ json = "/pointer" }`).
    pub priority: Option<FieldConfig>,
    /// Where the payload's schema version lives (`{ header = "..." }` or
    /// `{ json = "/pointer" }`), published by AMQP handlers as
    /// `mailroom-version` and the envelope's `version`; default: the
    /// `mailroom-version` header, else `"1"`.
    pub version: Option<FieldConfig>,
    /// Signature verification.
    pub verify: Option<VerifyConfig>,
    /// Largest accepted body, e.g. `"1MiB"` or `65536`.
    pub max_body: Option<ByteSize>,
    /// Consume a RabbitMQ queue instead of receiving webhooks.
    pub amqp: Option<AmqpSourceConfig>,
    /// Per-source rate limit, `"<n>/s"`, `"<n>/m"` or `"<n>/h"`, e.g.
    /// `"1000/s"`; requests beyond it get 429 with `Retry-After`.
    #[schemars(with = "Option<crate::schema::RequestRate>")]
    pub rate_limit: Option<String>,
}

/// `verify = { scheme, secret | secrets, header, prefix, encoding, tolerance }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyConfig {
    /// `standard-webhooks`, `stripe`, `github`, `shopify`, `slack`, `token`, `hmac`.
    #[schemars(with = "Option<crate::schema::SchemeName>")]
    pub scheme: Option<String>,
    /// One secret.
    pub secret: Option<String>,
    /// Several secrets (rotation).
    pub secrets: Option<Vec<String>>,
    /// Header (token, hmac).
    pub header: Option<String>,
    /// Signature prefix (hmac), e.g. `sha256=`.
    pub prefix: Option<String>,
    /// `hex` or `base64` (hmac).
    #[schemars(with = "Option<crate::schema::EncodingName>")]
    pub encoding: Option<String>,
    /// Timestamp tolerance, default 5m.
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub tolerance: Option<Duration>,
}

/// A byte size: an integer, or a string like `"1MiB"`, `"512KiB"`, `"2MB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => parse_size(&s).map(ByteSize).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "invalid size {s:?}: expected bytes or a number with B, KB, KiB, MB, MiB"
                ))
            }),
        }
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1000,
        "kib" | "k" => 1024,
        "mb" => 1_000_000,
        "mib" | "m" => 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// `[[topic]]`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicConfig {
    /// Topic name.
    pub name: String,
    /// `single` (default), `sequential` or `batch`.
    #[serde(default)]
    pub mode: ModeName,
    /// JSON pointer of the ordering / grouping key.
    pub key: Option<String>,
    /// Header holding the ordering key.
    pub key_header: Option<String>,
    /// Key used for events that carry none; without it a sequential topic
    /// refuses them (400, an AMQP reject, an `Err` from `enqueue`).
    pub default_key: Option<String>,
    /// `block` (default) or `skip`.
    #[serde(default)]
    pub on_dead: OnDeadName,
    /// Attempts in flight at once (default 16; 1024 for a `single` or
    /// `sequential` topic whose handler publishes to RabbitMQ, whose
    /// attempts mostly wait for the broker's confirms).
    pub concurrency: Option<u32>,
    /// Retry policy.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Bound on each attempt (default 30s).
    #[serde(default = "default_timeout", with = "duration::serde_str")]
    #[schemars(with = "crate::schema::DurationText")]
    pub timeout: Duration,
    /// Lease length (default timeout + 5s).
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub lease: Option<Duration>,
    /// Batch settings.
    pub batch: Option<BatchConfig>,
    /// At most this many attempts started per second, minute or hour
    /// (`"50/s"`, `"100/m"`, `"3/h"`), across instances on PostgreSQL.
    #[schemars(with = "Option<crate::schema::TopicRate>")]
    pub rate: Option<String>,
    /// At most this many events running at once, across instances.
    pub max_running: Option<u32>,
    /// A pending event older than this is not run but `expired`.
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub expire_after: Option<Duration>,
    /// The starvation bound of priorities (default 5m).
    #[serde(
        default = "default_max_wait_for_priority",
        with = "duration::serde_str"
    )]
    #[schemars(with = "crate::schema::DurationText")]
    pub max_wait_for_priority: Duration,
    /// What processes the events; none means pull workers.
    pub handler: Option<HandlerConfig>,
    /// `dead_letter = { amqp = {...} }`: each event that goes dead is also
    /// published there, once per death, with its last error; it stays dead
    /// (and replayable) here.
    pub dead_letter: Option<TopicDeadLetterConfig>,
}

/// `dead_letter = { amqp = {...} }` of a topic.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopicDeadLetterConfig {
    /// Publish dead events to RabbitMQ.
    pub amqp: Option<AmqpDeadLetterPublishConfig>,
}

/// `dead_letter = { amqp = { url, exchange, routing_key, envelope } }` of a
/// topic.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpDeadLetterPublishConfig {
    /// Broker (default: `[amqp].url`).
    pub url: Option<String>,
    /// Exchange dead events are published to (`""`: the default exchange).
    pub exchange: String,
    /// Routing key; `{type}`, `{topic}` and `{key}` are the dead event's.
    pub routing_key: String,
    /// Publish the JSON envelope instead of the raw payload (default false).
    #[serde(default)]
    pub envelope: bool,
}

fn default_timeout() -> Duration {
    TopicSpec::DEFAULT_TIMEOUT
}
fn default_max_wait_for_priority() -> Duration {
    TopicSpec::DEFAULT_MAX_WAIT_FOR_PRIORITY
}

/// Processing mode names.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(transform = crate::interpolated::or_interpolated)]
pub enum ModeName {
    /// Independent events.
    #[default]
    Single,
    /// Ordered per key.
    Sequential,
    /// Delivered in batches.
    Batch,
}

/// `on_dead` names.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
#[schemars(transform = crate::interpolated::or_interpolated)]
pub enum OnDeadName {
    /// Keep the key blocked.
    #[default]
    Block,
    /// Let the next event go.
    Skip,
}

/// `retry = { max_attempts, base, factor, max_delay, jitter }` or
/// `{ schedule = [...] }`; unset keys keep their defaults.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts before `dead` (default 15).
    pub max_attempts: u32,
    /// First delay (default 2s).
    #[serde(with = "duration::serde_str")]
    #[schemars(with = "crate::schema::DurationText")]
    pub base: Duration,
    /// Growth (default 2.0).
    pub factor: f64,
    /// Cap (default 1h).
    #[serde(with = "duration::serde_str")]
    #[schemars(with = "crate::schema::DurationText")]
    pub max_delay: Duration,
    /// ± share (default 0.2).
    pub jitter: f64,
    /// Explicit delays instead of exponential growth.
    #[schemars(with = "Option<Vec<crate::schema::DurationText>>")]
    pub schedule: Option<Vec<String>>,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: RetryPolicy::DEFAULT_MAX_ATTEMPTS,
            base: RetryPolicy::DEFAULT_BASE,
            factor: RetryPolicy::DEFAULT_FACTOR,
            max_delay: RetryPolicy::DEFAULT_MAX_DELAY,
            jitter: RetryPolicy::DEFAULT_JITTER,
            schedule: None,
        }
    }
}

/// `batch = { max_size, max_wait, schedule, group_by }`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Flush at this many events (default 100).
    pub max_size: Option<u32>,
    /// Flush when the oldest waited this long (default 1s).
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub max_wait: Option<Duration>,
    /// Cron schedule (UTC).
    pub schedule: Option<String>,
    /// JSON pointer of the grouping key.
    pub group_by: Option<String>,
}

/// `handler = { http = {...} }`, `{ command = [...] }` (or `{ command = { argv = [...], env = [...] } }`), `{ amqp = {...} }` or `{ pull = true }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    /// POST to an endpoint.
    pub http: Option<HttpHandlerConfig>,
    /// Run a program.
    pub command: Option<CommandConfig>,
    /// Publish to RabbitMQ.
    pub amqp: Option<AmqpHandlerConfig>,
    /// External pull workers.
    pub pull: Option<bool>,
}

/// `command = ["prog", "arg"]` or `command = { argv = ["prog", "arg"], env = ["NAME"] }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandConfig {
    /// The program and its arguments.
    Argv(Vec<String>),
    /// The program and its arguments, and the variables of mailroom's
    /// environment it is also given.
    Table(CommandTable),
}

/// `command = { argv, env }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandTable {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Variables passed through from mailroom's environment, besides
    /// `PATH`, `HOME`, `LANG`, `LC_*`, `TZ` and `TMPDIR`.
    #[serde(default)]
    pub env: Vec<String>,
}

impl CommandConfig {
    /// The program and its arguments.
    pub fn argv(&self) -> &[String] {
        match self {
            CommandConfig::Argv(argv) | CommandConfig::Table(CommandTable { argv, .. }) => argv,
        }
    }

    /// The variables passed through.
    pub fn env(&self) -> &[String] {
        match self {
            CommandConfig::Argv(_) => &[],
            CommandConfig::Table(t) => &t.env,
        }
    }
}

/// `http = { url, timeout, secret, headers, permanent_statuses, ca_file,
/// client_cert, client_key }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpHandlerConfig {
    /// Endpoint URL.
    pub url: String,
    /// Per-request timeout (default: the topic's).
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub timeout: Option<Duration>,
    /// Standard Webhooks signing secret (`whsec_<base64>`, or any string).
    pub secret: Option<String>,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Statuses that mean "never retry" (default `[410]`).
    pub permanent_statuses: Option<Vec<u16>>,
    /// PEM CA certificates trusted in addition to the system roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (and chain) for mutual TLS; needs `client_key`.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
}

/// `[amqp]`: exchanges, queues and bindings declared at `url` when `serve`
/// starts, after every reconnect, and by `mailroom amqp declare`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct AmqpConfig {
    /// Broker the topology is declared on; also the default `url` of AMQP
    /// sources and handlers.
    pub url: Option<String>,
    /// `[[amqp.exchange]]`.
    #[serde(default, rename = "exchange")]
    pub exchanges: Vec<AmqpExchangeConfig>,
    /// `[[amqp.queue]]`.
    #[serde(default, rename = "queue")]
    pub queues: Vec<AmqpQueueConfig>,
    /// `[[amqp.binding]]`: bindings beside the queues' own `bind`.
    #[serde(default, rename = "binding")]
    pub bindings: Vec<AmqpBindingConfig>,
}

/// `[[amqp.exchange]]`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpExchangeConfig {
    /// Its name.
    pub name: String,
    /// `topic`, `direct`, `fanout` or `headers`.
    #[schemars(with = "crate::schema::ExchangeKind")]
    pub kind: String,
    /// Survives a broker restart (default true).
    #[serde(default = "yes")]
    pub durable: bool,
}

/// `[[amqp.queue]]`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpQueueConfig {
    /// Its name.
    pub name: String,
    /// Survives a broker restart (default true).
    #[serde(default = "yes")]
    pub durable: bool,
    /// Message TTL (`x-message-ttl`), e.g. `"7d"`.
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub ttl: Option<Duration>,
    /// Most ready messages kept (`x-max-length`).
    pub max_length: Option<u64>,
    /// `true`: declare `<exchange>.dlx` (direct) and `<queue>.dlq`, and
    /// dead-letter into them (`x-dead-letter-exchange`); `{ exchange,
    /// routing_key }`: the same through the named exchange and routing key.
    #[serde(default)]
    pub dead_letter: AmqpDeadLetter,
    /// `bind = { exchange, routing_key }`, or a list of them.
    pub bind: Option<AmqpBinds>,
    /// `classic` (the broker's default), `quorum` or `stream` (`x-queue-type`).
    #[serde(rename = "type")]
    #[schemars(with = "Option<crate::schema::QueueTypeName>")]
    pub queue_type: Option<String>,
    /// Deliveries of a message before a quorum queue dead-letters it
    /// (`x-delivery-limit`).
    pub delivery_limit: Option<u32>,
    /// Priorities the queue orders by, 1 to 255 (`x-max-priority`).
    pub max_priority: Option<u8>,
    /// What a full queue does with a new message: `drop-head`,
    /// `reject-publish` or `reject-publish-dlx` (`x-overflow`).
    #[schemars(with = "Option<crate::schema::OverflowName>")]
    pub overflow: Option<String>,
    /// Used by its declaring connection only (default false).
    #[serde(default)]
    pub exclusive: bool,
    /// Deleted when its last consumer leaves (default false).
    #[serde(default)]
    pub auto_delete: bool,
    /// Further queue arguments as the broker takes them, e.g.
    /// `{ "x-queue-leader-locator" = "balanced" }`.
    #[serde(default)]
    pub arguments: BTreeMap<String, AmqpArgument>,
}

/// `dead_letter = true` or `dead_letter = { exchange, routing_key }`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(untagged)]
pub enum AmqpDeadLetter {
    /// On (`<exchange>.dlx`, routing key the queue's name) or off.
    On(bool),
    /// On, through this exchange and routing key.
    Route(AmqpDeadLetterRoute),
}

impl Default for AmqpDeadLetter {
    fn default() -> Self {
        AmqpDeadLetter::On(false)
    }
}

/// `dead_letter = { exchange, routing_key }` of a queue.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AmqpDeadLetterRoute {
    /// The dead-letter exchange (default `<exchange>.dlx`).
    pub exchange: Option<String>,
    /// The routing key of dead letters (default the queue's name).
    pub routing_key: Option<String>,
}

/// A queue argument's value: text, an integer or a boolean.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(untagged)]
pub enum AmqpArgument {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// Text.
    Text(String),
}

/// One binding, or several.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum AmqpBinds {
    /// `bind = { exchange, routing_key }`.
    One(AmqpBindConfig),
    /// `bind = [{...}, {...}]`.
    Many(Vec<AmqpBindConfig>),
}

impl AmqpBinds {
    /// The bindings, in order.
    pub fn all(&self) -> &[AmqpBindConfig] {
        match self {
            AmqpBinds::One(b) => std::slice::from_ref(b),
            AmqpBinds::Many(v) => v,
        }
    }
}

/// `bind = { exchange, routing_key }` of a queue.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpBindConfig {
    /// The exchange.
    pub exchange: String,
    /// The routing key, a pattern on topic exchanges (default `""`).
    #[serde(default)]
    pub routing_key: String,
}

/// `[[amqp.binding]]`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpBindingConfig {
    /// A queue of `[[amqp.queue]]`.
    pub queue: String,
    /// The exchange.
    pub exchange: String,
    /// The routing key (default `""`).
    #[serde(default)]
    pub routing_key: String,
}

/// `amqp = { url, queue, prefetch }` of a `[[source]]`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpSourceConfig {
    /// Broker (default: `[amqp].url`).
    pub url: Option<String>,
    /// Queue consumed.
    pub queue: String,
    /// Unacknowledged deliveries in flight (`basic.qos`, default 10).
    #[serde(default = "default_prefetch")]
    pub prefetch: u16,
}

fn default_prefetch() -> u16 {
    mailroom_amqp::AmqpSourceSpec::DEFAULT_PREFETCH
}

/// `amqp = { url, exchange, routing_key, envelope }` of a topic's handler.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpHandlerConfig {
    /// Broker (default: `[amqp].url`).
    pub url: Option<String>,
    /// Exchange published to (`""`: the default exchange).
    pub exchange: String,
    /// Routing key; `{type}`, `{topic}` and `{key}` are filled in.
    pub routing_key: String,
    /// Publish the JSON envelope instead of the raw payload (default false).
    #[serde(default)]
    pub envelope: bool,
    /// Each message's expiration, e.g. `"10m"`: a queue drops (or
    /// dead-letters) it after waiting that long.
    #[serde(default, with = "duration::serde_opt")]
    #[schemars(with = "Option<crate::schema::DurationText>")]
    pub expiration: Option<Duration>,
    /// Each message's priority, 0 to 255 (for queues with `max_priority`).
    pub priority: Option<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte sizes accept plain numbers and KiB/MiB suffixes, and refuse unknown units.
    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("512KiB"), Some(512 * 1024));
        assert_eq!(parse_size("10"), Some(10));
        assert_eq!(parse_size("1GB"), None);
    }
}
