//! The next job on write-back (docs/design.md rule 16): the run loop's
//! handles ask their Complete or Fail to claim the worker's next job in
//! the same transaction, so a worker taking one job at a time makes one
//! call and the coordinator one COMMIT per job.

use crate::handle::ClaimedJob;
use crate::proto;
use crate::reason::ERROR_DOMAIN;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tonic_types::{ErrorDetails, StatusExt};

/// What a handle's Complete or Fail asks for, set by the run loop: one job
/// of the worker's queue, with its lease, no long poll (when nothing is
/// due, the loop's own Claim waits for work). Nothing is asked once the
/// loop is stopping.
#[derive(Debug, Clone)]
pub(crate) struct NextAsk {
    pub(crate) request: proto::NextJobsRequest,
    pub(crate) stopping: Arc<AtomicBool>,
}

impl NextAsk {
    /// One job of `queue` with `lease`, asked for on every write-back (no
    /// run loop to stop it).
    pub(crate) fn always(queue: &str, worker_id: &str, lease: std::time::Duration) -> Self {
        NextAsk {
            request: proto::NextJobsRequest {
                queue: queue.to_owned(),
                worker_id: worker_id.to_owned(),
                max_jobs: 1,
                lease: Some(crate::client::proto_duration(lease)),
                wait: None,
            },
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The request to carry now: `None` once the loop is stopping.
    pub(crate) fn now(&self) -> Option<proto::NextJobsRequest> {
        (!self.stopping.load(Ordering::Relaxed)).then(|| self.request.clone())
    }
}

/// A write's refusal carried in a successful answer, as the status the same
/// call without a next-job request would have ended with, so the write's
/// error is classified exactly as before.
pub(crate) fn refusal_status(w: &proto::WriteRefusal) -> tonic::Status {
    let details = ErrorDetails::with_error_info(&w.reason, ERROR_DOMAIN, w.metadata.clone());
    tonic::Status::with_error_details(tonic::Code::from(w.code), &w.message, details)
}

impl ClaimedJob {
    /// Makes this handle's [`complete`](Self::complete) and
    /// [`fail`](Self::fail) also claim the worker's next job of its queue
    /// (the client's queue, lease and worker id) in the same call and
    /// transaction (docs/design.md rule 16); take it with
    /// [`take_next_job`](Self::take_next_job) after the write. The run
    /// loop does this for every job it hands to a handler.
    ///
    /// Each half answers for itself: a write refused as superseded still
    /// brings its next job (the error is the write's); an empty claim
    /// leaves the write applied. A write whose outcome is unknown brings
    /// none, and the SDK's retry of it is answered as a replay, which
    /// claims nothing: a job the lost call claimed comes back after its
    /// lease through a takeover that reconciles first.
    pub fn ask_for_next_job(&mut self) {
        let config = &self.client.config;
        self.next = Some(NextAsk::always(
            &config.queue,
            &config.worker_id,
            config.lease,
        ));
    }

    /// The next job a write-back of this handle brought (see
    /// [`ask_for_next_job`](Self::ask_for_next_job)), asking for its own
    /// next job the same way; `None` when none came.
    pub fn take_next_job(&mut self) -> Option<ClaimedJob> {
        self.take_handed().pop()
    }

    /// Makes this handle's Complete and Fail ask for the worker's next job
    /// in the same transaction (the run loop does; docs/design.md rule 16).
    pub(crate) fn ask_next(&mut self, ask: NextAsk) {
        self.next = Some(ask);
    }

    /// The jobs this handle's write-back was answered with, as handles
    /// that ask for their own next job the same way.
    pub(crate) fn take_handed(&mut self) -> Vec<ClaimedJob> {
        let ask = self.next.clone();
        std::mem::take(&mut self.handed)
            .into_iter()
            .filter_map(|c| ClaimedJob::from_proto(self.client.clone(), c))
            .map(|mut job| {
                job.next = ask.clone();
                job
            })
            .collect()
    }

    /// Keeps the next jobs of a write's answer, and gives the write's
    /// refusal, if the fence refused it, as the status the same call
    /// without a next-job request would have ended with.
    pub(crate) fn answered(&mut self, next: Option<proto::NextJobs>) -> Result<(), tonic::Status> {
        let Some(next) = next else { return Ok(()) };
        self.handed.extend(next.jobs);
        match next.write_refused {
            Some(w) => Err(refusal_status(&w)),
            None => Ok(()),
        }
    }
}
