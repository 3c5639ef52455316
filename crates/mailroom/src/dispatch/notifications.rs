//! Wake-ups from the store: commits and topic pauses announced by any
//! instance sharing it.

use super::TopicRuntime;
use futures::StreamExt;
use mailroom_core::TopicStream;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Wakes topic loops when the store announces commits from any instance.
pub(crate) async fn run_notifications(
    mut stream: TopicStream,
    topics: HashMap<String, Arc<TopicRuntime>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            next = stream.next() => match next {
                // "*": notifications may have been missed (the listener
                // reconnected, or we fell behind): wake every topic.
                Some(topic) if topic == "*" => topics.values().for_each(|t| t.wake.notify_one()),
                Some(notice) => {
                    // A pause is read before the topic's next claim; the
                    // wake-up makes a napping loop see it.
                    let paused = mailroom_core::paused_topic(&notice);
                    if let Some(t) = topics.get(paused.unwrap_or(&notice)) {
                        if paused.is_some() {
                            t.pause.announced();
                        }
                        t.wake.notify_one();
                    }
                }
                None => break,
            },
            () = shutdown.cancelled() => break,
        }
    }
}
