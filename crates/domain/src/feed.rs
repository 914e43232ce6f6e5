//! The outbox: the events log read by cursor (`JobEvents.ListEvents` and
//! `WatchEvents`, the console's feed). A consumer that stores the last
//! event id it applied sees every committed event once, in order.

use crate::{DbTime, EventKind, JobState};

/// One entry of the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedEvent {
    /// The cursor value: strictly increasing in the order served.
    pub id: u64,
    /// The job it is about.
    pub job_id: u64,
    /// The job's queue.
    pub queue: String,
    /// The job's business identity (the provider's idempotency key).
    pub operation_key: String,
    /// The attempt that caused the event (for a refusal: the one presented).
    pub attempt: u64,
    /// What happened: an [`EventKind`]'s name as stored. Served as text, so
    /// a kind a newer coordinator writes reaches every consumer of the
    /// feed; [`event_kind`](Self::event_kind) reads it.
    pub kind: String,
    /// The state before, when it applies.
    pub from_state: Option<JobState>,
    /// The state the event moved the job to; `None` when it did not move.
    pub to_state: Option<JobState>,
    /// The job's attempt when the event was written.
    pub current_attempt: u64,
    /// Free text or JSON, depending on the kind.
    pub detail: Option<String>,
    /// When it was written (DB clock, UTC).
    pub created_at: DbTime,
}

/// One page of the feed.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedPage {
    /// In id order.
    pub events: Vec<FeedEvent>,
    /// The cursor for the next call: at or past the last event returned,
    /// never past an event that may still commit.
    pub next_after: u64,
}

impl FeedEvent {
    /// The kind, when this coordinator knows it.
    pub fn event_kind(&self) -> Option<EventKind> {
        self.kind.parse().ok()
    }
}
