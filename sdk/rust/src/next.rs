//! The next job on write-back (docs/design.md rule 16): the run loop's
//! handles ask their Complete or Fail to claim the worker's next job in
//! the same transaction, so a worker taking one job at a time makes one
//! call and the coordinator one COMMIT per job.

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
