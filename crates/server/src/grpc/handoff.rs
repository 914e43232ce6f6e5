//! The next-jobs half of Complete and Fail (docs/design.md rule 16): the
//! request's claim fields, and the response's jobs and write refusal.

use super::convert::{self, duration};
use super::status;
use jobfence_api::v1::{NextJobs, NextJobsRequest, WriteRefusal};
use jobfence_core::ClaimParams;
use jobfence_domain::validate::Violations;
use jobfence_domain::{ClaimedJob, CoordinatorError};
use std::time::Duration;

/// How long before the caller's deadline a long poll answers empty.
pub(super) const DEADLINE_MARGIN: Duration = Duration::from_millis(100);

/// The long poll a caller may have: its `wait`, cut so that the call
/// answers before its deadline (`grpc-timeout`), never after it.
pub(super) fn bounded_wait(wait: Duration, deadline: Option<Duration>) -> Duration {
    match deadline {
        Some(d) => wait.min(d.saturating_sub(d / 10 + DEADLINE_MARGIN)),
        None => wait,
    }
}

/// The claim half of a Complete or Fail, as a Claim's parameters (its
/// lease and wait checked into `v`; the rest by the coordinator, as a
/// Claim's).
pub(super) fn next_params(
    v: &mut Violations,
    next: NextJobsRequest,
    deadline: Option<Duration>,
) -> ClaimParams {
    let lease = duration(v, "next.lease", next.lease);
    let wait = duration(v, "next.wait", next.wait).unwrap_or_default();
    ClaimParams {
        queue: next.queue,
        worker_id: next.worker_id,
        max_jobs: next.max_jobs,
        lease,
        wait: bounded_wait(wait, deadline),
    }
}

/// When the conversions of a Complete's or Fail's fields already refuse
/// the call (`v` not empty), the write half's own field checks (`write`,
/// the coordinator's) join them, the write's fields first, then the
/// claim's (`next.…`). The claim half's own checks (`next.queue`,
/// `next.max_jobs`, …) run with the write's in the coordinator, once the
/// conversions pass: a refusal here names the conversions' fields and the
/// write's, not those.
pub(super) fn with_write_checks(v: &mut Violations, write: Result<(), CoordinatorError>) {
    if v.0.is_empty() {
        return; // the coordinator checks the write when it runs it
    }
    if let Err(CoordinatorError::InvalidArgument(w)) = write {
        v.0.extend(w);
        v.0.sort_by_key(|f| f.field.starts_with("next."));
    }
}

/// The response's claim half: the jobs, and the write's refusal if the
/// fence refused it (exactly the status the call without `next` would
/// have ended with).
pub(super) fn next_jobs(jobs: Vec<ClaimedJob>, refused: Option<&CoordinatorError>) -> NextJobs {
    NextJobs {
        jobs: jobs.into_iter().map(convert::claimed).collect(),
        write_refused: refused.map(|e| {
            let (code, reason) = status::code_and_reason(e);
            WriteRefusal {
                code: code as i32,
                reason: reason.to_owned(),
                metadata: status::metadata(e),
                message: e.to_string(),
            }
        }),
    }
}
