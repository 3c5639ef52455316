//! The one rule set an incoming event must satisfy for its topic before it
//! is stored, whatever its door: webhooks ([`Hooks::ingest_webhook`]),
//! `POST /v1/events`, the library ([`Engine::enqueue`]) and AMQP sources
//! all pass their [`NewEvent`] through [`check`] (from a [`Draft`], through
//! [`Hooks::accept`]).
//!
//! - The topic is declared ([`Engine::enqueue`]; a webhook source's topic
//!   always exists: a source naming an undeclared topic gets one with
//!   defaults).
//! - A keyless event gets the topic's `default_key`; in a `sequential`
//!   topic an event must then have a key, or it is refused.
//! - The dedup key, key, type, correlation and causation ids and content
//!   type are 1 to [`MAX_FIELD_LEN`] bytes (bounded everything), without
//!   control characters (C0 with CR, LF, NUL and ESC, DEL, C1): they travel
//!   on as HTTP headers, environment variables and terminal output, where
//!   a line break forges a header or a log line and an escape drives a
//!   terminal.
//!
//! Bodies are bounded where they are read (a source's `max_body`, the API's
//! body limit), before they are buffered, so that is not repeated here.
//!
//! The outbox is the one path that cannot be refused: its rows are written
//! by the application's own SQL. A keyless outbox row in a sequential topic
//! is processed as an independent event, outside every key's order (the
//! store contract, [`ClaimRequest::per_key`](mailroom_core::ClaimRequest)).
//!
//! [`Hooks::ingest_webhook`]: crate::hooks::Hooks::ingest_webhook
//! [`Engine::enqueue`]: crate::Engine::enqueue
//! [`Hooks::accept`]: crate::hooks::Hooks::accept
//! [`Draft`]: crate::Draft

use crate::spec::TopicSpec;
use mailroom_core::{Mode, NewEvent};

/// Longest accepted dedup key, key, type, correlation or causation id or
/// version, in bytes.
pub const MAX_FIELD_LEN: usize = 512;

/// Why an incoming event was refused before it reached the store. Every
/// door answers it as a client error: 400, an AMQP reject without requeue,
/// an `Err` from [`Engine::enqueue`](crate::Engine::enqueue).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// The topic is not declared.
    #[error("unknown topic {0:?}")]
    UnknownTopic(String),
    /// A sequential topic without a `default_key` got an event without an
    /// ordering key.
    #[error("sequential topic {topic:?} needs an ordering key{}", hint_suffix(.hint))]
    KeyRequired {
        /// The topic.
        topic: String,
        /// Where the key was looked for, when the door knows (e.g. "header
        /// x-customer is missing").
        hint: Option<String>,
    },
    /// A field is empty or longer than [`MAX_FIELD_LEN`].
    #[error("{field} must be 1 to {MAX_FIELD_LEN} bytes (got {len})")]
    FieldLength {
        /// The field (`dedup key`, `key`, `type`, `correlation_id`,
        /// `causation_id`, `version`, `content type`).
        field: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// A field holds a control character ([`mailroom_core::redact::is_control`]).
    #[error("{field} must not contain control characters (found U+{code:04X} at byte {at})")]
    ControlCharacter {
        /// The field, named as in [`Refused::FieldLength`].
        field: &'static str,
        /// The first control character's code point.
        code: u32,
        /// Its byte offset in the field.
        at: usize,
    },
}

fn hint_suffix(hint: &Option<String>) -> String {
    hint.as_ref().map(|h| format!(": {h}")).unwrap_or_default()
}

impl Refused {
    /// Adds where the ordering key was looked for to a [`Refused::KeyRequired`].
    pub fn with_key_hint(self, where_: impl Into<String>) -> Self {
        match self {
            Refused::KeyRequired { topic, .. } => Refused::KeyRequired {
                topic,
                hint: Some(where_.into()),
            },
            other => other,
        }
    }
}

/// Applies `topic`'s rules to `event`: fills in the topic's `default_key`
/// and attempt budget, then refuses what the topic cannot take.
pub fn check(topic: &TopicSpec, mut event: NewEvent) -> Result<NewEvent, Refused> {
    if event.key.is_none() {
        event.key.clone_from(&topic.default_key);
    }
    if event.key.is_none() && matches!(topic.mode, Mode::Sequential { .. }) {
        return Err(Refused::KeyRequired {
            topic: topic.name.clone(),
            hint: None,
        });
    }
    event.max_attempts = topic.retry.max_attempts;
    check_len("dedup key", Some(&event.dedup_key))?;
    check_len("key", event.key.as_deref())?;
    check_len("type", event.event_type.as_deref())?;
    check_len("correlation_id", event.correlation_id.as_deref())?;
    check_len("causation_id", event.causation_id.as_deref())?;
    check_len("version", event.version.as_deref())?;
    check_len("content type", event.content_type.as_deref())?;
    Ok(event)
}

fn check_len(field: &'static str, value: Option<&str>) -> Result<(), Refused> {
    match value {
        Some(v) if v.is_empty() || v.len() > MAX_FIELD_LEN => Err(Refused::FieldLength {
            field,
            len: v.len(),
        }),
        Some(v) => match v
            .char_indices()
            .find(|(_, c)| mailroom_core::redact::is_control(*c))
        {
            Some((at, c)) => Err(Refused::ControlCharacter {
                field,
                code: u32::from(c),
                at,
            }),
            None => Ok(()),
        },
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use mailroom_core::{EventId, OnDead};

    fn event(key: Option<&str>) -> NewEvent {
        NewEvent {
            id: EventId::new(),
            source: "s".into(),
            topic: "t".into(),
            dedup_key: "d".into(),
            key: key.map(str::to_owned),
            event_type: None,
            correlation_id: None,
            causation_id: None,
            version: None,
            traceparent: None,
            content_type: None,
            payload: Bytes::from_static(b"{}"),
            max_attempts: 1,
            delivery: mailroom_core::Delivery::Now,
            priority: 0,
        }
    }

    fn sequential() -> TopicSpec {
        TopicSpec::new("t").mode(Mode::Sequential {
            on_dead: OnDead::Block,
        })
    }

    /// A sequential topic refuses a keyless event unless it has a default
    /// key, which the event then gets.
    #[test]
    fn sequential_topics_need_a_key_or_a_default() {
        let err = check(&sequential(), event(None)).unwrap_err();
        assert!(matches!(err, Refused::KeyRequired { .. }), "{err}");
        assert_eq!(
            check(&sequential(), event(Some("k")))
                .unwrap()
                .key
                .as_deref(),
            Some("k")
        );
        let mut topic = sequential();
        topic.default_key = Some("none".into());
        assert_eq!(
            check(&topic, event(None)).unwrap().key.as_deref(),
            Some("none")
        );
        assert_eq!(check(&TopicSpec::new("t"), event(None)).unwrap().key, None);
    }

    /// Empty and oversized fields are refused, naming the field; the attempt
    /// budget is the topic's.
    #[test]
    fn fields_are_bounded() {
        let long = "x".repeat(MAX_FIELD_LEN + 1);
        let mut e = event(Some(&long));
        let err = check(&TopicSpec::new("t"), e.clone()).unwrap_err();
        assert_eq!(
            err,
            Refused::FieldLength {
                field: "key",
                len: MAX_FIELD_LEN + 1
            }
        );
        e.key = None;
        e.event_type = Some(String::new());
        let err = check(&TopicSpec::new("t"), e.clone()).unwrap_err();
        assert!(matches!(err, Refused::FieldLength { field: "type", .. }));
        e.event_type = Some("x".repeat(MAX_FIELD_LEN));
        let ok = check(&TopicSpec::new("t"), e).unwrap();
        assert_eq!(ok.max_attempts, TopicSpec::new("t").retry.max_attempts);
    }
}
