//! The fence of the operator's writes (docs/design.md rule 3): what
//! CancelJob and ResolveManualReview check under the job's row lock,
//! decided here once for a single call and for every job of a BulkRepair
//! alike (rule 8: a batch changes how many jobs share a transaction, never
//! the rule per job).

use crate::{CoordinatorError, Job, JobState};

/// Why a cancel of `job` (its row as locked) presenting attempt
/// `presented` is refused, or `None` when it applies: only a `ready` job
/// never dispatched (no provider call can have happened) may be
/// cancelled (`JobNotCancellable` otherwise), and only under the attempt
/// the operator saw ([`attempt_refusal`]).
pub fn cancel_refusal(job: &Job, presented: u64) -> Option<CoordinatorError> {
    if job.state != JobState::Ready || job.dispatch_count > 0 {
        return Some(CoordinatorError::JobNotCancellable {
            job_id: job.id,
            attempt: job.attempt,
            state: job.state,
            dispatch_count: job.dispatch_count,
        });
    }
    attempt_refusal(job, presented)
}

/// Why a resolution of `job` (its row as locked) presenting attempt
/// `presented` is refused, or `None` when it applies: only a job parked in
/// `manual_review` (`JobNotInManualReview` otherwise, e.g. resolved by
/// someone else first), under the attempt the operator saw
/// ([`attempt_refusal`]).
pub fn resolve_refusal(job: &Job, presented: u64) -> Option<CoordinatorError> {
    if job.state != JobState::ManualReview {
        return Some(CoordinatorError::JobNotInManualReview {
            job_id: job.id,
            presented,
            current: job.attempt,
            state: job.state,
        });
    }
    attempt_refusal(job, presented)
}

/// The attempt check both operator writes share once the state is the
/// expected one: `AttemptSuperseded` for an attempt a later claim replaced
/// (the job came back to this state under a later attempt),
/// `AttemptNotIssued` for one never handed out.
pub fn attempt_refusal(job: &Job, presented: u64) -> Option<CoordinatorError> {
    use std::cmp::Ordering::*;
    match presented.cmp(&job.attempt) {
        Equal => None,
        Less => Some(CoordinatorError::AttemptSuperseded {
            job_id: job.id,
            presented,
            current: job.attempt,
            state: job.state,
        }),
        Greater => Some(CoordinatorError::AttemptNotIssued {
            job_id: job.id,
            presented,
            current: job.attempt,
        }),
    }
}

/// Whether `e` is the fence's refusal of an operator write because the
/// job moved after the operator saw it (claimed, finished, resolved by
/// someone else, parked again under a later attempt): a bulk repair skips
/// and counts such a job, where any other error is a failure.
pub fn moved(e: &CoordinatorError) -> bool {
    matches!(
        e,
        CoordinatorError::AttemptSuperseded { .. }
            | CoordinatorError::JobNotInManualReview { .. }
            | CoordinatorError::JobNotCancellable { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DbTime, NextAction};

    fn job(state: JobState, attempt: u64, dispatch_count: u32) -> Job {
        let t = DbTime::default();
        Job {
            id: 7,
            queue: "refunds".into(),
            operation_key: "refund-7".into(),
            payload: "{}".into(),
            state,
            attempt,
            next_action: NextAction::Execute,
            run_at: t,
            lease_until: None,
            lease_owner: None,
            first_dispatched_at: None,
            dispatch_count,
            provider_reference: None,
            result: None,
            last_error: None,
            state_reason: None,
            created_at: t,
            updated_at: t,
            finished_at: None,
            priority: Default::default(),
            fairness_key: None,
        }
    }

    #[test]
    fn a_cancel_applies_to_a_ready_job_never_sent_under_the_attempt_seen() {
        assert!(cancel_refusal(&job(JobState::Ready, 0, 0), 0).is_none());
        for (j, presented) in [
            (job(JobState::Running, 1, 1), 0),
            (job(JobState::Succeeded, 1, 1), 0),
            (job(JobState::Ready, 1, 1), 1),
        ] {
            let refused = cancel_refusal(&j, presented).unwrap();
            assert!(
                matches!(refused, CoordinatorError::JobNotCancellable { .. }),
                "{refused}"
            );
            assert!(moved(&refused));
        }
        let later = cancel_refusal(&job(JobState::Ready, 3, 0), 2).unwrap();
        assert!(matches!(
            later,
            CoordinatorError::AttemptSuperseded { current: 3, .. }
        ));
        let never = cancel_refusal(&job(JobState::Ready, 3, 0), 4).unwrap();
        assert!(matches!(never, CoordinatorError::AttemptNotIssued { .. }));
        assert!(!moved(&never), "an attempt never issued is a client's bug");
    }

    #[test]
    fn a_resolution_applies_to_a_parked_job_under_the_attempt_seen() {
        assert!(resolve_refusal(&job(JobState::ManualReview, 2, 1), 2).is_none());
        let resolved = resolve_refusal(&job(JobState::Failed, 2, 1), 2).unwrap();
        assert!(matches!(
            resolved,
            CoordinatorError::JobNotInManualReview { presented: 2, .. }
        ));
        let parked_again = resolve_refusal(&job(JobState::ManualReview, 4, 2), 2).unwrap();
        assert!(matches!(
            parked_again,
            CoordinatorError::AttemptSuperseded { .. }
        ));
        assert!(moved(&resolved) && moved(&parked_again));
        assert!(!moved(&CoordinatorError::JobNotFound { job_id: 7 }));
    }
}
