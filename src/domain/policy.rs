//! The resend policy (DESIGN.md rule 6) and the dispatch bookkeeping of a
//! claim, as pure functions of facts read under the row lock. Time here is
//! always a difference measured by the database clock (rule 2).

use super::{FailDisposition, NextAction, OverrideReason, QueuePolicy};
use std::time::Duration;

/// Facts about a job's past dispatches, read under the row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchFacts {
    /// DB time elapsed since the first dispatch; `None` if never dispatched.
    pub since_first_dispatch: Option<Duration>,
    /// How many times the job was handed out with `execute`.
    pub dispatch_count: u32,
}

/// What Fail applies for a requested disposition.
///
/// A `RetryExecute` of a job already dispatched is a resend: it is applied
/// only if the resend would become due (after `retry_delay`) while the
/// provider's idempotency window, counted from the first dispatch, is still
/// open, and only while dispatches remain. Otherwise the outcome is unknown
/// with no live idempotency guarantee, and the job goes to manual review.
pub fn decide_fail(
    requested: FailDisposition,
    retry_delay: Duration,
    facts: DispatchFacts,
    policy: QueuePolicy,
) -> (FailDisposition, Option<OverrideReason>) {
    if requested != FailDisposition::RetryExecute {
        return (requested, None);
    }
    if let Some(elapsed) = facts.since_first_dispatch {
        if elapsed.saturating_add(retry_delay) >= policy.resend_window {
            return (
                FailDisposition::ManualReview,
                Some(OverrideReason::ResendWindowClosed),
            );
        }
    }
    if facts.dispatch_count >= policy.max_dispatches {
        return (
            FailDisposition::ManualReview,
            Some(OverrideReason::MaxDispatchesReached),
        );
    }
    (FailDisposition::RetryExecute, None)
}

/// The next action a claim hands out, and whether it counts as a dispatch.
///
/// A takeover always reconciles first (rule 5). A stored `execute` whose
/// resend window has closed while the job waited is handed out as
/// `reconcile`: the worker must look before it may ask to send again.
pub fn claim_action(
    takeover: bool,
    stored: NextAction,
    facts: DispatchFacts,
    policy: QueuePolicy,
) -> (NextAction, bool) {
    if takeover {
        return (NextAction::Reconcile, false);
    }
    match (stored, facts.since_first_dispatch) {
        (NextAction::Execute, Some(elapsed)) if elapsed >= policy.resend_window => {
            (NextAction::Reconcile, false)
        }
        (NextAction::Execute, _) => (NextAction::Execute, true),
        (NextAction::Reconcile, _) => (NextAction::Reconcile, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn policy() -> QueuePolicy {
        QueuePolicy {
            resend_window: 24 * HOUR,
            max_dispatches: 3,
        }
    }

    fn facts(hours: Option<u64>, count: u32) -> DispatchFacts {
        DispatchFacts {
            since_first_dispatch: hours.map(|h| HOUR * h as u32),
            dispatch_count: count,
        }
    }

    #[test]
    fn resend_inside_the_window_is_an_execute_retry() {
        assert_eq!(
            decide_fail(
                FailDisposition::RetryExecute,
                HOUR,
                facts(Some(1), 1),
                policy()
            ),
            (FailDisposition::RetryExecute, None)
        );
    }

    #[test]
    fn resend_due_after_the_window_goes_to_manual_review() {
        // Dispatched 23 h ago, due again in 1 h: the key may be gone by then.
        assert_eq!(
            decide_fail(
                FailDisposition::RetryExecute,
                HOUR,
                facts(Some(23), 1),
                policy()
            ),
            (
                FailDisposition::ManualReview,
                Some(OverrideReason::ResendWindowClosed)
            )
        );
    }

    #[test]
    fn exhausted_dispatches_go_to_manual_review() {
        assert_eq!(
            decide_fail(
                FailDisposition::RetryExecute,
                Duration::ZERO,
                facts(Some(0), 3),
                policy()
            ),
            (
                FailDisposition::ManualReview,
                Some(OverrideReason::MaxDispatchesReached)
            )
        );
    }

    #[test]
    fn other_dispositions_are_applied_as_asked() {
        for d in [
            FailDisposition::RetryReconcile,
            FailDisposition::Failed,
            FailDisposition::ManualReview,
        ] {
            assert_eq!(
                decide_fail(d, 100 * HOUR, facts(Some(100), 99), policy()),
                (d, None)
            );
        }
    }

    #[test]
    fn takeover_always_reconciles_and_never_dispatches() {
        for stored in [NextAction::Execute, NextAction::Reconcile] {
            assert_eq!(
                claim_action(true, stored, facts(None, 0), policy()),
                (NextAction::Reconcile, false)
            );
        }
    }

    #[test]
    fn stale_execute_is_handed_out_as_reconcile() {
        assert_eq!(
            claim_action(false, NextAction::Execute, facts(Some(25), 1), policy()),
            (NextAction::Reconcile, false)
        );
        assert_eq!(
            claim_action(false, NextAction::Execute, facts(Some(2), 1), policy()),
            (NextAction::Execute, true)
        );
        assert_eq!(
            claim_action(false, NextAction::Execute, facts(None, 0), policy()),
            (NextAction::Execute, true)
        );
    }
}
