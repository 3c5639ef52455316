//! Handlers: what processes a topic's events. The dispatcher gives each
//! attempt to a [`Handler`] under the topic's timeout and turns its
//! [`Outcome`] into a store completion.
//!
//! Built in: [`http::HttpHandler`] (POST to an endpoint, Standard Webhooks
//! signed), [`command::CommandHandler`] (run a program). Library users
//! register any `async` closure with [`handler_fn`].

pub mod command;
pub mod http;

use mailroom_core::{Event, EventId, Outcome};
use std::future::Future;
use std::sync::Arc;

/// Processes events. Implementations must be cancel-safe: when an attempt
/// exceeds its topic's timeout the future is dropped.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + std::fmt::Debug + 'static {
    /// Handles one attempt of `event` (`event.attempts` is this attempt's number).
    async fn handle(&self, event: &Event) -> Outcome;

    /// Handles a batch (batch topics). The default hands the events to
    /// [`handle`](Handler::handle) one after another and reports each verdict.
    async fn handle_batch(&self, events: &[Event]) -> BatchOutcome {
        let mut verdicts = Vec::with_capacity(events.len());
        for e in events {
            verdicts.push((e.id, self.handle(e).await));
        }
        BatchOutcome::Each(verdicts)
    }
}

/// A handler's verdict on a batch. Each event keeps its own attempt history;
/// its verdict is resolved against its own attempt budget.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchOutcome {
    /// One verdict for every event of the batch.
    All(Outcome),
    /// Per-event verdicts; events not listed succeeded.
    Each(Vec<(EventId, Outcome)>),
}

impl BatchOutcome {
    /// The verdict for one event of the batch.
    pub fn for_event(&self, id: EventId) -> Outcome {
        match self {
            BatchOutcome::All(o) => o.clone(),
            BatchOutcome::Each(list) => list
                .iter()
                .find(|(e, _)| *e == id)
                .map(|(_, o)| o.clone())
                .unwrap_or(Outcome::Success),
        }
    }
}

impl<T: Into<Outcome>> From<T> for BatchOutcome {
    fn from(o: T) -> Self {
        BatchOutcome::All(o.into())
    }
}

/// A handler as the engine holds it: shared by every attempt of its
/// topic, across the topic loop's tasks.
pub type SharedHandler = Arc<dyn Handler>;

/// The W3C `traceparent` to send with one handler call of `event`: a child
/// of the one it arrived with (same trace id and flags, a fresh span id per
/// call, so each attempt is its own span of the trace), or `None` when it
/// came without one. With span export on ([`crate::otel`]) it is the
/// exported `handler call` span itself, so the handler's spans nest under
/// it. Sent as the HTTP header and the AMQP header `traceparent`, and the
/// command's `TRACEPARENT` variable.
pub fn outgoing_traceparent(event: &Event) -> Option<String> {
    if let Some(own) = crate::otel::traceparent_of(&tracing::Span::current()) {
        return Some(own);
    }
    let parent = mailroom_core::TraceParent::parse(event.traceparent.as_deref()?)?;
    Some(parent.child(rand::random()).to_string())
}

/// Wraps an async closure as a [`Handler`]. The closure gets the event (with
/// its payload) and returns anything convertible into an [`Outcome`] — an
/// `Outcome`, or a `Result<(), E: Display>` where `Err` means "retry".
///
/// ```
/// use mailroom::handler::handler_fn;
/// use mailroom::Event;
///
/// let h = handler_fn(|event: Event| async move {
///     println!("got {}", event.id);
///     Ok::<(), String>(())
/// });
/// # let _ = h;
/// ```
pub fn handler_fn<F, Fut, O>(f: F) -> SharedHandler
where
    F: Fn(Event) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<Outcome> + 'static,
{
    Arc::new(FnHandler(f))
}

/// Wraps an async closure over a whole batch as a [`Handler`] for batch
/// topics. It returns anything convertible into a [`BatchOutcome`]: one
/// verdict for all (`Outcome`, `Result<(), E>`), or per-event verdicts.
///
/// ```
/// use mailroom::handler::{BatchOutcome, batch_handler_fn};
/// use mailroom::{Event, Outcome};
///
/// let h = batch_handler_fn(|events: Vec<Event>| async move {
///     // Fail only the events whose payload is empty.
///     let failed = events
///         .iter()
///         .filter(|e| e.payload.as_ref().is_none_or(|p| p.is_empty()))
///         .map(|e| (e.id, Outcome::retry("empty payload")))
///         .collect();
///     BatchOutcome::Each(failed)
/// });
/// # let _ = h;
/// ```
pub fn batch_handler_fn<F, Fut, O>(f: F) -> SharedHandler
where
    F: Fn(Vec<Event>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<BatchOutcome> + 'static,
{
    Arc::new(BatchFnHandler(f))
}

struct BatchFnHandler<F>(F);

impl<F> std::fmt::Debug for BatchFnHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BatchFnHandler")
    }
}

#[async_trait::async_trait]
impl<F, Fut, O> Handler for BatchFnHandler<F>
where
    F: Fn(Vec<Event>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<BatchOutcome> + 'static,
{
    async fn handle(&self, event: &Event) -> Outcome {
        let id = event.id;
        (self.0)(vec![event.clone()]).await.into().for_event(id)
    }

    async fn handle_batch(&self, events: &[Event]) -> BatchOutcome {
        (self.0)(events.to_vec()).await.into()
    }
}

struct FnHandler<F>(F);

impl<F> std::fmt::Debug for FnHandler<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FnHandler")
    }
}

#[async_trait::async_trait]
impl<F, Fut, O> Handler for FnHandler<F>
where
    F: Fn(Event) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = O> + Send + 'static,
    O: Into<Outcome> + 'static,
{
    async fn handle(&self, event: &Event) -> Outcome {
        (self.0)(event.clone()).await.into()
    }
}

/// Keeps the last `max` bytes of a failure text, on a char boundary.
pub(crate) fn tail(text: &str, max: usize) -> String {
    let text = text.trim();
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}
