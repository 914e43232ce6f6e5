//! What a fenced write (RenewLease, Complete, Fail) does to the row it
//! names, decided on that row as read under its lock: the pure half of a
//! group commit (the store's `writeback.rs` locks, writes and commits).
//!
//! Each call is decided on its own row (docs/design.md rule 8): a caller of
//! another queue learns nothing (its refusal leaves no event); a caller
//! that no longer holds the job is refused with exactly why (rule 3); the
//! holder's write becomes the job's next row image and one event, with a
//! resend decided by the queue's policy (rule 6).

use crate::event::{fail_detail, EventKind};
use crate::fence::{self, FenceCheck};
use crate::policy::{decide_fail, DispatchFacts};
use crate::{
    transition, CoordinatorError, DbTime, FailDisposition, FencedWrite, Job, OverrideReason,
    QueuePolicies, QueueScope, MANUAL_REVIEW_REQUESTED,
};
use std::time::Duration;

/// What one fenced call does, decided on its locked row.
// Nearly every plan is an `Apply`: boxing it would only add an allocation
// per call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum WritePlan {
    /// No such job.
    NotFound(u64),
    /// The job's queue is outside the caller's scope: nothing is written,
    /// not even a refusal event.
    Forbidden(CoordinatorError),
    /// The caller holds the job: write the new image and its event.
    Apply(AppliedWrite),
    /// The caller does not hold the job: refused with this error and a
    /// `stale_write_rejected` event (unless the events show this very call
    /// was applied before, which the store looks up).
    Refuse(CoordinatorError),
}

/// The holder's write: the row image and the event it leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct AppliedWrite {
    /// The job afterwards.
    pub after: Job,
    /// The event's kind.
    pub kind: EventKind,
    /// The event's detail (a Complete's provider reference, a Fail's
    /// [`fail_detail`]).
    pub detail: Option<String>,
    /// For a Fail: what was applied, and why it differs from the request.
    pub fail: Option<(FailDisposition, Option<OverrideReason>)>,
    /// For a Fail that reports the provider's Retry-After: how long.
    pub throttle: Option<Duration>,
}

/// Decides `write` on its row `locked` (the job and its dispatch facts, or
/// `None` when no such job exists), under `policies`, at the database's
/// `now`.
pub fn plan(
    write: &FencedWrite,
    scope: &QueueScope,
    locked: Option<(&Job, DispatchFacts)>,
    policies: &QueuePolicies,
    now: DbTime,
) -> WritePlan {
    let Some((job, dispatch)) = locked else {
        return WritePlan::NotFound(write.job_id());
    };
    // Before the fence: a caller of another queue learns nothing of the
    // job's attempt, and its refusal leaves no event.
    if let Err(e) = scope.check(&job.queue, Some(job.id)) {
        return WritePlan::Forbidden(e);
    }
    if let FenceCheck::NotHolder(why) =
        fence::check(job.id, job.state, job.attempt, write.attempt())
    {
        return WritePlan::Refuse(why);
    }
    WritePlan::Apply(match write {
        FencedWrite::RenewLease(r) => AppliedWrite {
            after: transition::renew(job, r.lease, now),
            kind: EventKind::LeaseRenewed,
            detail: None,
            fail: None,
            throttle: None,
        },
        FencedWrite::Complete(r) => AppliedWrite {
            after: transition::complete(
                job,
                r.provider_reference.as_deref(),
                r.result.as_deref(),
                now,
            ),
            kind: EventKind::Completed,
            detail: r.provider_reference.clone(),
            fail: None,
            throttle: None,
        },
        FencedWrite::Fail(r) => {
            let (applied, why) = decide_fail(
                r.disposition,
                r.retry_delay,
                r.expected_lease,
                dispatch,
                policies.get(&job.queue),
            );
            // Why it is parked: the coordinator's override, or the
            // worker's own request.
            let reason = (applied == FailDisposition::ManualReview)
                .then(|| why.map_or(MANUAL_REVIEW_REQUESTED, OverrideReason::as_str));
            AppliedWrite {
                after: transition::fail(job, applied, &r.error, r.retry_delay, reason, now),
                kind: EventKind::of_fail(applied),
                detail: Some(fail_detail(applied, why)),
                fail: Some((applied, why)),
                throttle: r.provider_retry_after,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Complete, Fail, JobState, NextAction, QueuePolicy, RenewLease};

    fn t(s: i64) -> DbTime {
        chrono::DateTime::from_timestamp(1_800_000_000 + s, 0)
            .unwrap()
            .naive_utc()
    }

    fn running(attempt: u64) -> Job {
        Job {
            id: 7,
            queue: "refunds".into(),
            operation_key: "refund-7".into(),
            payload: "{}".into(),
            state: JobState::Running,
            attempt,
            next_action: NextAction::Execute,
            run_at: t(0),
            lease_until: Some(t(30)),
            lease_owner: Some("w".into()),
            first_dispatched_at: Some(t(0)),
            dispatch_count: 1,
            provider_reference: None,
            result: None,
            last_error: None,
            state_reason: None,
            created_at: t(0),
            updated_at: t(0),
            finished_at: None,
            priority: Default::default(),
            fairness_key: None,
        }
    }

    fn facts(since_first: u64, count: u32) -> DispatchFacts {
        DispatchFacts {
            since_first_dispatch: Some(Duration::from_secs(since_first)),
            dispatch_count: count,
        }
    }

    fn fail(attempt: u64, disposition: FailDisposition) -> FencedWrite {
        FencedWrite::Fail(Fail {
            job_id: 7,
            attempt,
            disposition,
            error: "provider timed out".into(),
            retry_delay: Duration::from_secs(5),
            expected_lease: Duration::from_secs(30),
            provider_retry_after: None,
        })
    }

    fn applied(p: WritePlan) -> AppliedWrite {
        match p {
            WritePlan::Apply(a) => a,
            other => panic!("not applied: {other:?}"),
        }
    }

    #[test]
    fn the_holder_completes_and_leaves_its_reference_in_the_event() {
        let write = FencedWrite::Complete(Complete {
            job_id: 7,
            attempt: 3,
            provider_reference: Some("re_1".into()),
            result: None,
        });
        let job = running(3);
        let p = plan(
            &write,
            &QueueScope::Any,
            Some((&job, facts(1, 1))),
            &Default::default(),
            t(5),
        );
        let a = applied(p);
        assert_eq!(a.after.state, JobState::Succeeded);
        assert_eq!(a.kind, EventKind::Completed);
        assert_eq!(a.detail.as_deref(), Some("re_1"));
    }

    #[test]
    fn a_superseded_attempt_is_refused_and_another_queue_learns_nothing() {
        let job = running(4);
        let write = FencedWrite::RenewLease(RenewLease {
            job_id: 7,
            attempt: 3,
            lease: Duration::from_secs(30),
        });
        let p = plan(
            &write,
            &QueueScope::Any,
            Some((&job, facts(1, 1))),
            &Default::default(),
            t(5),
        );
        assert!(matches!(
            p,
            WritePlan::Refuse(CoordinatorError::AttemptSuperseded { current: 4, .. })
        ));
        let payouts = QueueScope::of(["payouts"]);
        let p = plan(
            &write,
            &payouts,
            Some((&job, facts(1, 1))),
            &Default::default(),
            t(5),
        );
        assert!(matches!(
            p,
            WritePlan::Forbidden(CoordinatorError::QueueNotAllowed { .. })
        ));
        let p = plan(&write, &QueueScope::Any, None, &Default::default(), t(5));
        assert!(matches!(p, WritePlan::NotFound(7)));
    }

    #[test]
    fn a_resend_past_the_window_is_parked_with_the_coordinators_reason() {
        let job = running(3);
        let policies = QueuePolicies {
            default: QueuePolicy {
                resend_window: Duration::from_secs(60),
                max_dispatches: 3,
            },
            ..Default::default()
        };
        let write = fail(3, FailDisposition::RetryExecute);
        let a = applied(plan(
            &write,
            &QueueScope::Any,
            Some((&job, facts(59, 1))),
            &policies,
            t(5),
        ));
        assert_eq!(a.kind, EventKind::ManualReview);
        assert_eq!(a.after.state, JobState::ManualReview);
        assert_eq!(
            a.after.state_reason.as_deref(),
            Some("RESEND_WINDOW_CLOSED")
        );
        assert_eq!(
            a.fail,
            Some((
                FailDisposition::ManualReview,
                Some(OverrideReason::ResendWindowClosed)
            ))
        );
        assert_eq!(
            a.detail.as_deref(),
            Some("manual_review:RESEND_WINDOW_CLOSED")
        );
        // Inside the window it is a retry.
        let a = applied(plan(
            &write,
            &QueueScope::Any,
            Some((&job, facts(1, 1))),
            &policies,
            t(5),
        ));
        assert_eq!(a.kind, EventKind::RetryScheduled);
        assert_eq!(a.fail, Some((FailDisposition::RetryExecute, None)));
    }

    #[test]
    fn a_worker_that_asks_for_manual_review_is_recorded_as_requested() {
        let job = running(3);
        let write = fail(3, FailDisposition::ManualReview);
        let a = applied(plan(
            &write,
            &QueueScope::Any,
            Some((&job, facts(1, 1))),
            &Default::default(),
            t(5),
        ));
        assert_eq!(
            a.after.state_reason.as_deref(),
            Some(MANUAL_REVIEW_REQUESTED)
        );
        assert_eq!(a.detail.as_deref(), Some("manual_review"));
    }
}
