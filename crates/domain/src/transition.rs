//! The transitions of docs/design.md's table as pure functions: the row a
//! change leaves behind, computed from the row read under its lock and the
//! database clock read in the same transaction (rule 2: `now` is always
//! `UTC_TIMESTAMP(6)` of the database, never this process's clock).
//!
//! The store writes exactly the image these return, in an UPDATE that is
//! still fenced on the `state` and `attempt` it was computed from, so the
//! answer a caller gets is the row as committed without reading it again.

use super::{
    CoordinatorError, DbTime, FailDisposition, Job, JobState, NextAction, OverrideReason,
    QueueScope,
};
use std::time::Duration;

/// `now + d`, to the microsecond (the precision of `DATETIME(6)`),
/// saturating far in the future rather than overflowing.
pub fn after(now: DbTime, d: Duration) -> DbTime {
    let micros = i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    now.checked_add_signed(chrono::TimeDelta::microseconds(micros))
        .unwrap_or(DbTime::MAX)
}

/// Claim or Takeover of `job` (ready and due, or running with an expired
/// lease): the attempt goes up by one and the job is leased to `worker_id`
/// until `now + lease`. `dispatch` counts the hand-out as a send (an
/// `execute`), which also starts the resend window if it is the first.
pub fn hand_out(
    job: &Job,
    action: NextAction,
    dispatch: bool,
    lease: Duration,
    worker_id: &str,
    now: DbTime,
) -> Job {
    Job {
        attempt: job.attempt + 1,
        state: JobState::Running,
        next_action: action,
        lease_until: Some(after(now, lease)),
        lease_owner: Some(worker_id.to_owned()),
        dispatch_count: job.dispatch_count + u32::from(dispatch),
        first_dispatched_at: match (dispatch, job.first_dispatched_at) {
            (true, None) => Some(now),
            (_, first) => first,
        },
        updated_at: now,
        ..job.clone()
    }
}

/// Checks a hand-out before it is written: one that takes over a running
/// job (an expired lease) must hand it out as `reconcile` (docs/design.md rule
/// 5: a takeover's first step is always reconcile). A plan that does not is
/// a bug, refused `Internal` before anything is written, in release builds
/// too (a worker handed such a job would send the operation again).
pub fn check_hand_out(before: &Job, after: &Job) -> Result<(), CoordinatorError> {
    if before.state == JobState::Running && after.next_action != NextAction::Reconcile {
        return Err(CoordinatorError::Internal(format!(
            "a takeover of job {} was planned as {} instead of reconcile",
            before.id,
            after.next_action.as_str()
        )));
    }
    Ok(())
}

/// Why a named Takeover of `job` (read under its row lock) must not
/// happen, if it must not: a caller of another queue (it learns nothing of
/// the job's state), a finished job, a job that is not running, a lease
/// that has not expired by the DB clock (rule 1: expiry only opens a job
/// to takeover).
pub fn takeover_refusal(
    job: &Job,
    lease_expired: bool,
    scope: &QueueScope,
) -> Option<CoordinatorError> {
    if let Err(e) = scope.check(&job.queue, Some(job.id)) {
        Some(e)
    } else if job.state.is_terminal() {
        Some(CoordinatorError::JobFinished {
            job_id: job.id,
            attempt: job.attempt,
            state: job.state,
        })
    } else if job.state != JobState::Running {
        Some(CoordinatorError::JobNotRunning {
            job_id: job.id,
            attempt: job.attempt,
            state: job.state,
        })
    } else if !lease_expired {
        Some(CoordinatorError::LeaseNotExpired {
            job_id: job.id,
            attempt: job.attempt,
            lease_until: job.lease_until.unwrap_or(job.updated_at),
        })
    } else {
        None
    }
}

/// A due resend that a claim does not hand out (see
/// [`super::policy::ClaimDecision::Park`]): parked in `manual_review` with
/// the reason, under the attempt it already had (nobody was handed it).
pub fn park(job: &Job, reason: OverrideReason, now: DbTime) -> Job {
    Job {
        state: JobState::ManualReview,
        state_reason: Some(reason.as_str().to_owned()),
        lease_until: None,
        updated_at: now,
        ..job.clone()
    }
}

/// RenewLease: the lease runs until `now + lease`, or stays where it is if
/// that is later (a renewal never shortens a lease). `updated_at` is left
/// alone: a renewal is not a change of state.
pub fn renew(job: &Job, lease: Duration, now: DbTime) -> Job {
    let asked = after(now, lease);
    Job {
        lease_until: Some(job.lease_until.map_or(asked, |l| l.max(asked))),
        ..job.clone()
    }
}

/// Complete: `succeeded`, with the provider's reference and result.
pub fn complete(
    job: &Job,
    provider_reference: Option<&str>,
    result: Option<&str>,
    now: DbTime,
) -> Job {
    Job {
        state: JobState::Succeeded,
        provider_reference: provider_reference.map(str::to_owned),
        result: result.map(str::to_owned),
        lease_until: None,
        state_reason: None,
        updated_at: now,
        finished_at: Some(now),
        ..job.clone()
    }
}

/// Fail with an applied disposition (after the resend policy decided; see
/// [`super::policy::decide_fail`]). A retry makes the job `ready` again
/// after `retry_delay`, to reconcile or to execute; `failed` is terminal;
/// `manual_review` is parked with `state_reason` saying why.
pub fn fail(
    job: &Job,
    applied: FailDisposition,
    error: &str,
    retry_delay: Duration,
    state_reason: Option<&str>,
    now: DbTime,
) -> Job {
    let base = Job {
        lease_until: None,
        last_error: Some(error.to_owned()),
        updated_at: now,
        ..job.clone()
    };
    match applied {
        FailDisposition::RetryReconcile | FailDisposition::RetryExecute => Job {
            state: JobState::Ready,
            next_action: if applied == FailDisposition::RetryExecute {
                NextAction::Execute
            } else {
                NextAction::Reconcile
            },
            run_at: after(now, retry_delay),
            state_reason: None,
            ..base
        },
        FailDisposition::Failed => Job {
            state: JobState::Failed,
            state_reason: None,
            finished_at: Some(now),
            ..base
        },
        FailDisposition::ManualReview => Job {
            state: JobState::ManualReview,
            state_reason: state_reason.map(str::to_owned),
            finished_at: None,
            ..base
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DbTime {
        DbTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f").unwrap()
    }

    fn running() -> Job {
        Job {
            id: 7,
            queue: "refunds".into(),
            operation_key: "refund-1".into(),
            payload: "{}".into(),
            state: JobState::Running,
            attempt: 7,
            next_action: NextAction::Execute,
            run_at: t("2026-01-01 00:00:00"),
            lease_until: Some(t("2026-01-01 00:00:30")),
            lease_owner: Some("a".into()),
            first_dispatched_at: Some(t("2026-01-01 00:00:00")),
            dispatch_count: 1,
            provider_reference: None,
            result: None,
            last_error: None,
            state_reason: None,
            created_at: t("2026-01-01 00:00:00"),
            updated_at: t("2026-01-01 00:00:00"),
            finished_at: None,
            priority: Default::default(),
            fairness_key: None,
        }
    }

    #[test]
    fn a_takeover_handed_out_as_anything_but_reconcile_is_refused() {
        let now = t("2026-01-01 00:01:00");
        let lease = Duration::from_secs(30);
        let reconcile = hand_out(&running(), NextAction::Reconcile, false, lease, "b", now);
        let execute = hand_out(&running(), NextAction::Execute, true, lease, "b", now);
        assert!(check_hand_out(&running(), &reconcile).is_ok());
        assert!(matches!(
            check_hand_out(&running(), &execute),
            Err(CoordinatorError::Internal(_))
        ));
        // A first claim of a ready job may execute.
        let ready = Job {
            state: JobState::Ready,
            ..running()
        };
        let claimed = hand_out(&ready, NextAction::Execute, true, lease, "b", now);
        assert!(check_hand_out(&ready, &claimed).is_ok());
    }

    #[test]
    fn a_takeover_is_refused_in_the_order_the_design_gives() {
        let scope = QueueScope::of(["refunds"]);
        let other = QueueScope::of(["payouts"]);
        // Expired and running: taken over.
        assert!(takeover_refusal(&running(), true, &scope).is_none());
        // A caller of another queue learns nothing, whatever the state.
        let done = Job {
            state: JobState::Succeeded,
            ..running()
        };
        assert!(matches!(
            takeover_refusal(&done, true, &other),
            Some(CoordinatorError::QueueNotAllowed { .. })
        ));
        // Finished before not running before the lease.
        assert!(matches!(
            takeover_refusal(&done, false, &scope),
            Some(CoordinatorError::JobFinished { .. })
        ));
        let ready = Job {
            state: JobState::Ready,
            ..running()
        };
        assert!(matches!(
            takeover_refusal(&ready, false, &scope),
            Some(CoordinatorError::JobNotRunning { .. })
        ));
        // Rule 1: only an expired lease opens a running job to takeover.
        assert!(matches!(
            takeover_refusal(&running(), false, &scope),
            Some(CoordinatorError::LeaseNotExpired { lease_until, .. })
                if Some(lease_until) == running().lease_until
        ));
    }

    #[test]
    fn a_takeover_adds_one_to_the_attempt_and_keeps_the_first_dispatch() {
        let now = t("2026-01-01 00:01:00.000001");
        let next = hand_out(
            &running(),
            NextAction::Reconcile,
            false,
            Duration::from_secs(30),
            "b",
            now,
        );
        assert_eq!(next.attempt, 8);
        assert_eq!(next.lease_until, Some(t("2026-01-01 00:01:30.000001")));
        assert_eq!(next.lease_owner.as_deref(), Some("b"));
        assert_eq!(next.dispatch_count, 1);
        assert_eq!(next.first_dispatched_at, running().first_dispatched_at);
        assert_eq!(
            next.operation_key, "refund-1",
            "the business identity stays"
        );
    }

    #[test]
    fn a_first_execute_starts_the_resend_window() {
        let ready = Job {
            state: JobState::Ready,
            attempt: 0,
            dispatch_count: 0,
            first_dispatched_at: None,
            lease_until: None,
            ..running()
        };
        let now = t("2026-01-01 00:00:05");
        let next = hand_out(
            &ready,
            NextAction::Execute,
            true,
            Duration::from_secs(1),
            "a",
            now,
        );
        assert_eq!((next.attempt, next.dispatch_count), (1, 1));
        assert_eq!(next.first_dispatched_at, Some(now));
    }

    #[test]
    fn a_renewal_never_shortens_the_lease() {
        let now = t("2026-01-01 00:00:01");
        let short = renew(&running(), Duration::from_secs(1), now);
        assert_eq!(short.lease_until, running().lease_until);
        let long = renew(&running(), Duration::from_secs(60), now);
        assert_eq!(long.lease_until, Some(t("2026-01-01 00:01:01")));
        assert_eq!(long.updated_at, running().updated_at);
    }

    #[test]
    fn fail_dispositions_leave_the_rows_the_design_says() {
        let now = t("2026-01-01 00:00:10");
        let retry = fail(
            &running(),
            FailDisposition::RetryExecute,
            "timeout",
            Duration::from_secs(5),
            None,
            now,
        );
        assert_eq!(retry.state, JobState::Ready);
        assert_eq!(retry.next_action, NextAction::Execute);
        assert_eq!(retry.run_at, t("2026-01-01 00:00:15"));
        assert_eq!(retry.lease_until, None);
        let parked = fail(
            &running(),
            FailDisposition::ManualReview,
            "unknown",
            Duration::ZERO,
            Some("RESEND_WINDOW_CLOSED"),
            now,
        );
        assert_eq!(parked.state, JobState::ManualReview);
        assert_eq!(parked.finished_at, None, "manual_review is not terminal");
        assert_eq!(parked.state_reason.as_deref(), Some("RESEND_WINDOW_CLOSED"));
        let failed = fail(
            &running(),
            FailDisposition::Failed,
            "declined",
            Duration::ZERO,
            None,
            now,
        );
        assert_eq!(failed.finished_at, Some(now));
        let done = complete(&running(), Some("re_1"), None, now);
        assert_eq!(done.state, JobState::Succeeded);
        assert_eq!(done.attempt, 7, "a write back never changes the attempt");
        assert_eq!(done.lease_until, None);
    }
}
