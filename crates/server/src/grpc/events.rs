//! `jobfence.v1.JobEvents`: the `job_events` outbox by cursor.
//!
//! ListEvents is one page of [`jobfence_store::JobStore::list_events`].
//! WatchEvents runs the same pages in a loop: it replays from the cursor,
//! then polls for new events every `poll_interval`. It ends with
//! UNAVAILABLE / SERVER_SHUTTING_DOWN when the server shuts down (an endless
//! stream would otherwise hold the graceful shutdown open), so a consumer
//! reconnects from the last event it applied, to this replica or another.

use super::status::{reason, ERROR_DOMAIN};
use super::Rpc;
use jobfence_api::v1::job_events_server::JobEvents;
use jobfence_api::v1::{
    self as proto, ListEventsRequest, ListEventsResponse, WatchEventsRequest, WatchEventsResponse,
};
use jobfence_auth::Action;
use jobfence_core::Coordinator;
use jobfence_domain::feed::FeedEvent;
use jobfence_domain::validate::Violations;
use jobfence_domain::{CoordinatorError, QueueScope};

use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tracing::{instrument, Instrument, Span};

/// Events per page while a WatchEvents replays or follows.
const WATCH_PAGE: u32 = 500;
/// How many messages a slow WatchEvents consumer may have in flight.
const WATCH_BUFFER: usize = 256;

/// An event as sent on the wire.
pub fn event_to_proto(e: FeedEvent) -> proto::JobEvent {
    let state = |s: Option<jobfence_domain::JobState>| {
        s.map_or(proto::JobState::Unspecified, super::convert::state) as i32
    };
    proto::JobEvent {
        event_id: e.id,
        job_id: e.job_id,
        queue: e.queue,
        operation_key: e.operation_key,
        attempt: e.attempt,
        kind: e.kind,
        from_state: state(e.from_state),
        to_state: state(e.to_state),
        current_attempt: e.current_attempt,
        detail: e.detail.unwrap_or_default(),
        created_at: Some(super::convert::timestamp(e.created_at)),
    }
}

/// The tonic service over a [`Coordinator`].
#[derive(Debug, Clone)]
pub struct JobEventsService {
    coordinator: Coordinator,
    poll_interval: Duration,
    shutdown: watch::Receiver<bool>,
}

impl JobEventsService {
    /// `poll_interval`: how often a WatchEvents looks for new events once
    /// it has caught up. `shutdown` turning true ends every WatchEvents.
    pub fn new(
        coordinator: Coordinator,
        poll_interval: Duration,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        JobEventsService {
            coordinator,
            poll_interval,
            shutdown,
        }
    }
}

impl JobEventsService {
    /// The handler skeleton of `method` (see [`Rpc`]).
    fn rpc(&self, method: &'static str) -> Rpc<'_> {
        Rpc::new(self.coordinator.metrics(), method)
    }
}

/// Refuses a feed of a queue outside the caller's scope; a feed of every
/// queue (no `queue` filter) needs a grant on `*`.
/// The feed's queue filter (`None`: every queue), if the caller may read it.
fn feed_queue(scope: &QueueScope, queue: String) -> Result<Option<String>, CoordinatorError> {
    let mut v = Violations::default();
    let queue = v.optional("queue", queue);
    v.finish()?;
    // `*` is in no scope but the unrestricted one.
    scope.check(queue.as_deref().unwrap_or("*"), None)?;
    Ok(queue)
}

fn shutting_down() -> Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        reason::SERVER_SHUTTING_DOWN,
        ERROR_DOMAIN,
        std::collections::HashMap::new(),
    );
    Status::with_error_details(
        jobfence_api::v1::ErrorReason::ServerShuttingDown.code(),
        "server shutting down; reconnect from the last event you applied",
        details,
    )
}

fn transient(e: &CoordinatorError) -> bool {
    matches!(
        e,
        CoordinatorError::DatabaseUnavailable(_) | CoordinatorError::TransactionConflict(_)
    )
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEventsResponse, Status>> + Send>>;

/// Sends every page from `cursor` on, until the client goes away or the
/// server shuts down.
async fn follow(
    coordinator: Coordinator,
    mut cursor: u64,
    queue: Option<String>,
    poll: Duration,
    mut shutdown: watch::Receiver<bool>,
    tx: mpsc::Sender<Result<WatchEventsResponse, Status>>,
) {
    loop {
        if *shutdown.borrow() {
            let _ = tx.send(Err(shutting_down())).await;
            return;
        }
        let mut full = false;
        match coordinator
            .list_events(cursor, WATCH_PAGE, queue.as_deref())
            .await
        {
            Ok(page) => {
                full = page.events.len() as u32 == WATCH_PAGE;
                for e in page.events {
                    let msg = WatchEventsResponse {
                        event: Some(event_to_proto(e)),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                }
                cursor = page.next_after;
            }
            Err(e) if transient(&e) => {
                tracing::warn!(cursor, error = %e, "events feed: retrying after a transient error");
            }
            Err(e) => {
                let _ = tx.send(Err(super::status::to_status(e))).await;
                return;
            }
        }
        if full {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = shutdown.changed() => {}
            _ = tx.closed() => return,
        }
    }
}

#[tonic::async_trait]
impl JobEvents for JobEventsService {
    #[instrument(
        name = "ListEvents",
        skip_all,
        fields(caller, after_event_id, queue, listed, next_after_event_id, outcome)
    )]
    async fn list_events(
        &self,
        request: Request<ListEventsRequest>,
    ) -> Result<Response<ListEventsResponse>, Status> {
        let rpc = self.rpc("ListEvents");
        rpc.scoped(request, Action::ReadEvents, |r, scope| async move {
            let queue = feed_queue(&scope, r.queue)?;
            let feed_starts = self.coordinator.feed_starts();
            let page = self
                .coordinator
                .list_events(r.after_event_id, r.limit, queue.as_deref())
                .await?;
            Ok(ListEventsResponse {
                events: page.events.into_iter().map(event_to_proto).collect(),
                next_after_event_id: page.next_after,
                feed_starts,
            })
        })
        .await
    }

    type WatchEventsStream = WatchStream;

    #[instrument(
        name = "WatchEvents",
        skip_all,
        fields(caller, after_event_id, queue, outcome)
    )]
    async fn watch_events(
        &self,
        request: Request<WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let rpc = self.rpc("WatchEvents");
        let scope = rpc.scope(&request, Action::ReadEvents)?;
        let r = request.into_inner();
        let queue = match feed_queue(&scope, r.queue) {
            Ok(queue) => queue,
            Err(e) => return Err(rpc.fail(e)),
        };
        // Refuse a bad request up front, not as the stream's first message.
        let checked = self
            .coordinator
            .list_events(r.after_event_id, 1, queue.as_deref())
            .await
            .map(|_| ());
        if let Err(e) = checked {
            if !transient(&e) {
                return Err(rpc.fail(e));
            }
        }
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(
            follow(
                self.coordinator.clone(),
                r.after_event_id,
                queue,
                self.poll_interval,
                self.shutdown.clone(),
                tx,
            )
            .instrument(Span::current()),
        );
        rpc.streaming(Box::pin(ReceiverStream::new(rx)))
    }
}
