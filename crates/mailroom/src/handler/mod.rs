//! Handlers: what processes a topic's events. The dispatcher gives each
//! attempt to a [`Handler`] under the topic's timeout and turns its
//! [`Outcome`] into a store completion.
//!
//! Built in: [`http::HttpHandler`] (POST to an endpoint, Standard Webhooks
//! signed), [`command::CommandHandler`] (run a program). Library users
//! register any `async` closure with [`handler_fn`].

pub mod command;
pub mod http;

use mailroom_core::{Event, Outcome};
use std::future::Future;
use std::sync::Arc;

/// Processes one event per call. Implementations must be cancel-safe: when an
/// attempt exceeds its topic's timeout the future is dropped.
#[async_trait::async_trait]
pub trait Handler: Send + Sync + std::fmt::Debug + 'static {
    /// Handles one attempt of `event` (`event.attempts` is this attempt's number).
    async fn handle(&self, event: &Event) -> Outcome;
}

/// A shared handler.
pub type SharedHandler = Arc<dyn Handler>;

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
