//! The engine: a store, the topics and sources, their handlers, and the loops
//! that run them. Cheap to clone; no global state, so one process may run
//! several engines. An embedder builds it, runs it and enqueues; the other
//! audiences reach it through their own views: [`Engine::operator`]
//! (operators), [`Engine::pull`] (pull workers), [`Engine::hooks`] (the
//! server's and the CLI's intake).

use crate::dispatch::{TopicRuntime, run_topic};
use crate::draft::{Draft, EnqueueError};
use crate::handler::SharedHandler;
use crate::hooks::Hooks;
use crate::maintenance::{AlertNotify, Maintenance};
use crate::operate::Operator;
use crate::pull::Pull;
use crate::shared::Shared;
use crate::spec::{SourceSpec, SourceSpecError, SpecError, TopicSpec};
use mailroom_core::{AlertRules, AlertRulesError};
use mailroom_core::{Inserted, Retention, Store};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A topic's settings are refused by [`TopicSpec::validate`].
    #[error("topic {topic:?}: {error}")]
    Topic {
        /// The refused topic's name.
        topic: String,
        /// The offending key ([`SpecError::key`]).
        key: String,
        /// What is wrong.
        error: SpecError,
    },
    /// A source's settings are refused by [`SourceSpec::validate`].
    #[error("source {source_name:?}: {error}")]
    Source {
        /// The refused source's name.
        source_name: String,
        /// The offending key ([`SourceSpecError::key`]).
        key: &'static str,
        /// What is wrong.
        error: SourceSpecError,
    },
    /// The alert thresholds are refused by [`AlertRules::validate`].
    #[error("alerts.{key}: {error}")]
    Alerts {
        /// The offending key inside `[alerts]` ([`AlertRulesError::key`]).
        key: &'static str,
        /// What is wrong.
        error: AlertRulesError,
    },
    /// `[alerts] notify` is refused ([`AlertNotify`]: an http(s) URL).
    #[error("alerts.notify.http.{0}")]
    AlertNotify(String),
    /// Two topics or two sources share a name.
    #[error("{0}")]
    Duplicate(String),
    /// A handler was registered for a topic that does not exist.
    #[error("handler registered for unknown topic {0:?}")]
    UnknownTopic(String),
    /// A topic's `dead_letter` names no declared topic, itself, or a
    /// topic that hands its own dead letters on.
    #[error("topic {topic:?}: dead_letter: {why}")]
    DeadLetter {
        /// The topic whose dead letters go nowhere sound.
        topic: String,
        /// What is wrong.
        why: String,
    },
}

/// The shortest polling, maintenance or alert period the builder takes:
/// shorter asked periods are raised to it, so a zero cannot spin a loop.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// Assembles an [`Engine`].
#[derive(Debug)]
pub struct EngineBuilder {
    store: Arc<dyn Store>,
    topics: Vec<TopicSpec>,
    sources: Vec<SourceSpec>,
    handlers: HashMap<String, SharedHandler>,
    worker: String,
    poll: Duration,
    maintenance_period: Duration,
    retention: Retention,
    alerts: AlertRules,
    alert_every: Duration,
    alert_notify: Option<AlertNotify>,
    accept_undeclared: bool,
    clock: Arc<dyn crate::clock::Clock>,
}

impl EngineBuilder {
    /// The wall clock used for batch schedules (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn crate::clock::Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Declares a topic: its mode, concurrency, retry policy, timeout and
    /// limits. [`build`](Self::build) validates it.
    pub fn topic(mut self, spec: TopicSpec) -> Self {
        self.topics.push(spec);
        self
    }

    /// Declares a webhook source: the topic its events go to, where its
    /// dedup key, type and key live, and how its signatures are verified.
    pub fn source(mut self, spec: SourceSpec) -> Self {
        self.sources.push(spec);
        self
    }

    /// Registers the handler of `topic` (replacing one from configuration).
    pub fn handler(mut self, topic: impl Into<String>, handler: SharedHandler) -> Self {
        self.handlers.insert(topic.into(), handler);
        self
    }

    /// Names this process in attempt histories (default: `hostname:pid`).
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker = id.into();
        self
    }

    /// The polling fallback (default 1 s): the longest an idle topic waits
    /// before looking for work written by another process.
    pub fn poll_interval(mut self, d: Duration) -> Self {
        self.poll = d.max(MIN_PERIOD);
        self
    }

    /// How often expired leases are rescued (default 1 s).
    pub fn maintenance_period(mut self, d: Duration) -> Self {
        self.maintenance_period = d.max(MIN_PERIOD);
        self
    }

    /// Retention windows applied by maintenance.
    pub fn retention(mut self, r: Retention) -> Self {
        self.retention = r;
        self
    }

    /// Alert thresholds: evaluated by maintenance (on the elected instance,
    /// logging each alert as it fires and resolves, and setting the
    /// `mailroom_alert_firing` gauge) and on demand by
    /// [`Operator::alerts`].
    pub fn alerts(mut self, rules: AlertRules) -> Self {
        self.alerts = rules;
        self
    }

    /// POST each alert's start and end, signed, to a receiver (from the
    /// elected maintenance instance; see [`AlertNotify`]).
    pub fn alert_notify(mut self, notify: AlertNotify) -> Self {
        self.alert_notify = Some(notify);
        self
    }

    /// How often maintenance evaluates the alerts (default 10 s).
    pub fn alert_interval(mut self, d: Duration) -> Self {
        self.alert_every = d.max(MIN_PERIOD);
        self
    }

    /// Accept webhooks for undeclared sources (each gets a pull topic named
    /// after it), except a name that is a known topic's (declared, or named
    /// by a declared source): those answer unknown source. `mailroom serve`
    /// enables this only for the quick start (no config file, loopback).
    pub fn accept_undeclared_sources(mut self, yes: bool) -> Self {
        self.accept_undeclared = yes;
        self
    }

    /// Validates every topic and source ([`TopicSpec::validate`],
    /// [`SourceSpec::validate`]) and the alert thresholds
    /// ([`AlertRules::validate`]), and builds.
    pub fn build(self) -> Result<Engine, BuildError> {
        self.alerts.validate().map_err(|error| BuildError::Alerts {
            key: error.key(),
            error,
        })?;
        if let Some(n) = &self.alert_notify {
            n.validate().map_err(BuildError::AlertNotify)?;
        }
        let mut topics = topic_runtimes(self.topics, &self.handlers)?;
        let sources = source_map(self.sources, &mut topics)?;
        Ok(Engine {
            inner: Arc::new(Shared {
                store: self.store,
                topics,
                sources,
                worker: self.worker,
                poll: self.poll,
                maintenance_period: self.maintenance_period,
                retention: self.retention,
                alerts: self.alerts,
                alert_every: self.alert_every,
                alert_notify: self.alert_notify,
                accept_undeclared: self.accept_undeclared,
                clock: self.clock,
            }),
        })
    }
}

/// Each topic, validated, with its handler; a handler for no topic is refused.
fn topic_runtimes(
    specs: Vec<TopicSpec>,
    handlers: &HashMap<String, SharedHandler>,
) -> Result<HashMap<String, Arc<TopicRuntime>>, BuildError> {
    let mut topics = HashMap::new();
    for spec in specs {
        spec.validate().map_err(|error| BuildError::Topic {
            topic: spec.name.clone(),
            key: error.key(),
            error,
        })?;
        let name = spec.name.clone();
        let rt = Arc::new(TopicRuntime::new(spec, handlers.get(&name).cloned()));
        if topics.insert(name.clone(), rt).is_some() {
            return Err(BuildError::Duplicate(format!(
                "topic {name:?} is declared twice"
            )));
        }
    }
    if let Some(t) = handlers.keys().find(|t| !topics.contains_key(*t)) {
        return Err(BuildError::UnknownTopic(t.clone()));
    }
    for t in topics.values() {
        let Some(into) = &t.spec.dead_letter else {
            continue;
        };
        let why = match topics.get(into) {
            _ if into == &t.spec.name => Some("a topic cannot take its own dead letters".into()),
            None => Some(format!("topic {into:?} is not declared")),
            Some(d) if d.spec.dead_letter.is_some() => Some(format!(
                "topic {into:?} hands its own dead letters on; a dead-letter topic cannot"
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            return Err(BuildError::DeadLetter {
                topic: t.spec.name.clone(),
                why,
            });
        }
    }
    Ok(topics)
}

/// Each source, validated, by name; a source naming an undeclared topic
/// gets one with defaults.
fn source_map(
    specs: Vec<SourceSpec>,
    topics: &mut HashMap<String, Arc<TopicRuntime>>,
) -> Result<HashMap<String, SourceSpec>, BuildError> {
    let mut sources = HashMap::new();
    for s in specs {
        s.validate().map_err(|error| BuildError::Source {
            source_name: s.name.clone(),
            key: error.key(),
            error,
        })?;
        topics
            .entry(s.topic.clone())
            .or_insert_with(|| Arc::new(TopicRuntime::new(TopicSpec::new(s.topic.clone()), None)));
        let name = s.name.clone();
        if sources.insert(name.clone(), s).is_some() {
            return Err(BuildError::Duplicate(format!(
                "source {name:?} is declared twice"
            )));
        }
    }
    Ok(sources)
}

/// The running heart of mailroom. See the crate docs for an example.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Shared>,
}

impl Engine {
    /// Starts building an engine over `store`.
    pub fn builder(store: Arc<dyn Store>) -> EngineBuilder {
        EngineBuilder {
            store,
            topics: vec![],
            sources: vec![],
            handlers: HashMap::new(),
            worker: default_worker_id(),
            poll: Duration::from_secs(1),
            maintenance_period: Duration::from_secs(1),
            retention: Retention::default(),
            alerts: AlertRules::default(),
            alert_every: Duration::from_secs(10),
            alert_notify: None,
            accept_undeclared: false,
            clock: Arc::new(crate::clock::SystemClock),
        }
    }

    /// A topic's settings.
    pub fn topic(&self, name: &str) -> Option<&TopicSpec> {
        self.inner.topic(name)
    }

    /// All topics' settings.
    pub fn topics(&self) -> impl Iterator<Item = &TopicSpec> {
        self.inner.topics.values().map(|t| &t.spec)
    }

    /// Whether `topic` has a built-in or registered handler (else it is pulled).
    pub fn has_handler(&self, topic: &str) -> bool {
        self.inner.has_handler(topic)
    }

    /// A declared webhook source's settings.
    pub fn source(&self, name: &str) -> Option<&SourceSpec> {
        self.inner.sources.get(name)
    }

    /// Wakes a topic's loop (e.g. after an outside write).
    pub fn wake(&self, topic: &str) {
        self.inner.wake(topic);
    }

    /// Checks `draft` against its topic's rules ([`crate::accept`]), stores
    /// it durably (the call returns after the commit) and wakes its topic.
    /// Deduplicated by (source, dedup key): a dedup key already stored
    /// answers the stored event's id with `duplicate: true`.
    pub async fn enqueue(&self, draft: Draft) -> Result<Inserted, EnqueueError> {
        let accepted = crate::hooks::accept_draft(&self.inner, draft)?;
        Ok(crate::hooks::insert(&self.inner, accepted).await?)
    }

    /// The operators' door: read events and numbers, replay, skip, cancel,
    /// purge, alerts.
    pub fn operator(&self) -> Operator {
        Operator::new(self.inner.clone())
    }

    /// The pull workers' door: claim, extend, finish.
    pub fn pull(&self) -> Pull {
        Pull::new(self.inner.clone())
    }

    /// The server's and the CLI's hooks into intake: webhooks, body limits,
    /// and [`enqueue`](Self::enqueue) in its two halves.
    pub fn hooks(&self) -> Hooks {
        Hooks::new(self.inner.clone())
    }

    /// Runs every topic that has a handler, plus maintenance, until
    /// `shutdown` is cancelled; then lets attempts in flight finish (each is
    /// bounded by its topic's timeout) and returns.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut tasks = tokio::task::JoinSet::new();
        for t in self.inner.topics.values() {
            let Some(handler) = t.handler.clone() else {
                continue;
            };
            if let mailroom_core::Mode::Batch(settings) = &t.spec.mode {
                let l = crate::dispatch::batch::BatchLoop {
                    store: self.inner.store.clone(),
                    topic: t.clone(),
                    settings: settings.clone(),
                    handler,
                    worker: self.inner.worker.clone(),
                    poll: self.inner.poll,
                    clock: self.inner.clock.clone(),
                };
                tasks.spawn(crate::dispatch::batch::run_batch_topic(l, shutdown.clone()));
                continue;
            }
            tasks.spawn(run_topic(
                self.inner.store.clone(),
                t.clone(),
                handler,
                self.inner.worker.clone(),
                self.inner.poll,
                shutdown.clone(),
            ));
        }
        for t in self.inner.topics.values() {
            if let Some(into) = &t.spec.dead_letter {
                tasks.spawn(crate::dead_letter::run(
                    self.inner.clone(),
                    t.clone(),
                    into.clone(),
                    shutdown.clone(),
                ));
            }
        }
        let maintenance = Maintenance {
            store: self.inner.store.clone(),
            topics: self.inner.topics.values().cloned().collect(),
            retention: self.inner.retention,
            alerts: self.inner.alerts,
            alert_every: self.inner.alert_every,
            notify: self.inner.alert_notify.clone(),
            period: self.inner.maintenance_period,
            worker: self.inner.worker.clone(),
        };
        tasks.spawn(maintenance.run(shutdown.clone()));
        if let Some(stream) = self.inner.store.notifications() {
            tasks.spawn(crate::dispatch::run_notifications(
                stream,
                self.inner.topics.clone(),
                shutdown.clone(),
            ));
        }
        tasks.spawn(crate::observe::run_gauges(
            self.inner.clone(),
            shutdown.clone(),
        ));
        while tasks.join_next().await.is_some() {}
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "mailroom".into());
    format!("{host}:{}", std::process::id())
}
