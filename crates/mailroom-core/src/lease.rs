//! Claims, leases and fencing tokens.
//!
//! A claim moves an event to `running` for one worker until `lease_until`
//! (computed on the database clock). Each claim carries a new
//! [`FencingToken`]; the store accepts a completion, nack or extension only
//! with the event's current token, so a worker whose lease expired (and whose
//! event was rescued and claimed again) cannot overwrite the newer outcome.

use crate::event::Event;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Proof of holding an event's current lease.
///
/// It is the attempt number the claim started: strictly increasing per event
/// (replays keep counting), so every claim of an event gets a new, larger
/// token and an older one can always be told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(pub u32);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An event handed to one worker under a lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The event, in state `running`; `attempts` counts this attempt.
    pub event: Event,
    /// The claim's fencing token.
    pub token: FencingToken,
    /// When the lease ends unless extended (database clock).
    pub lease_until: Timestamp,
}
