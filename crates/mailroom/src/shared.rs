//! What every door of an engine shares: the store, the validated topics and
//! sources with their wake-ups, and the settings the loops run with. The
//! engine and each audience's view hold it behind one `Arc`.

use crate::dispatch::TopicRuntime;
use crate::maintenance::AlertNotify;
use crate::spec::{SourceSpec, TopicSpec};
use mailroom_core::{AlertRules, Mode, OnDead, Retention, Store, StoreError, TopicStats};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) topics: HashMap<String, Arc<TopicRuntime>>,
    pub(crate) sources: HashMap<String, SourceSpec>,
    pub(crate) worker: String,
    pub(crate) poll: Duration,
    pub(crate) maintenance_period: Duration,
    pub(crate) retention: Retention,
    pub(crate) alerts: AlertRules,
    pub(crate) alert_every: Duration,
    pub(crate) alert_notify: Option<AlertNotify>,
    pub(crate) accept_undeclared: bool,
    pub(crate) clock: Arc<dyn crate::clock::Clock>,
}

impl Shared {
    /// A declared topic's settings.
    pub(crate) fn topic(&self, name: &str) -> Option<&TopicSpec> {
        self.topics.get(name).map(|t| &t.spec)
    }

    /// Whether `topic` has a built-in or registered handler (else it is pulled).
    pub(crate) fn has_handler(&self, topic: &str) -> bool {
        self.topics.get(topic).is_some_and(|t| t.handler.is_some())
    }

    /// Wakes a topic's loop.
    pub(crate) fn wake(&self, topic: &str) {
        if let Some(t) = self.topics.get(topic) {
            t.wake.notify_one();
        }
    }

    /// The settings of `topic`, or the defaults a topic nobody declared gets
    /// (events of such a topic may sit in a shared store).
    pub(crate) fn spec_or_default(&self, topic: &str) -> Cow<'_, TopicSpec> {
        match self.topic(topic) {
            Some(spec) => Cow::Borrowed(spec),
            None => Cow::Owned(TopicSpec::new(topic)),
        }
    }

    /// Per-topic numbers, with `blocked_keys` counted only where a dead head
    /// really blocks its key (sequential topics with `on_dead = "block"`):
    /// the store cannot know a topic's mode.
    pub(crate) async fn stats(&self) -> Result<Vec<TopicStats>, StoreError> {
        let mut stats = self.store.stats().await?;
        for s in &mut stats {
            let blocks = self.topics.get(&s.topic).is_some_and(|t| {
                matches!(
                    t.spec.mode,
                    Mode::Sequential {
                        on_dead: OnDead::Block
                    }
                )
            });
            if !blocks {
                s.blocked_keys = 0;
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
impl Shared {
    /// `store` with no topic or source and short periods: for tests of the
    /// tasks that run beside the topics.
    pub(crate) fn bare(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            topics: HashMap::new(),
            sources: HashMap::new(),
            worker: "test".into(),
            poll: Duration::from_millis(50),
            maintenance_period: Duration::from_millis(50),
            retention: Retention::default(),
            alerts: AlertRules::default(),
            alert_every: Duration::from_millis(50),
            alert_notify: None,
            accept_undeclared: false,
            clock: Arc::new(crate::clock::SystemClock),
        }
    }
}
