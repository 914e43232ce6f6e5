//! The resend policy (docs/design.md rule 6) and the dispatch bookkeeping of a
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
/// only if the whole resend — due after `retry_delay`, then sent at any
/// time within its lease (`lease`, the lease the next claim is expected to
/// get) — falls while the provider's idempotency window, counted from the
/// first dispatch, is still open, and only while dispatches remain.
/// Otherwise the outcome is unknown with no live idempotency guarantee, and
/// the job goes to manual review.
pub fn decide_fail(
    requested: FailDisposition,
    retry_delay: Duration,
    lease: Duration,
    facts: DispatchFacts,
    policy: QueuePolicy,
) -> (FailDisposition, Option<OverrideReason>) {
    if requested != FailDisposition::RetryExecute {
        return (requested, None);
    }
    if let Some(elapsed) = facts.since_first_dispatch {
        if elapsed.saturating_add(retry_delay).saturating_add(lease) >= policy.resend_window {
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

/// What a claim does with a job it found due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimDecision {
    /// Hand it out with `action`; `dispatch` counts the hand-out as a send.
    HandOut { action: NextAction, dispatch: bool },
    /// Do not hand it out: park it in manual review for this reason.
    Park(OverrideReason),
}

/// What a claim does with a due job.
///
/// A takeover always reconciles first (rule 5). A stored `execute` of a job
/// already dispatched is a resend, and a resend is checked again when it is
/// handed out, not only when Fail accepted it: if the provider's window
/// would close before the end of this claim's `lease` (the worker may send
/// at any moment of it) — a resend that waited in the queue, or for the
/// provider's budget, until then — it is not handed out but parked in
/// manual review as RESEND_WINDOW_CLOSED, the reason Fail gives for a
/// resend it refuses (rule 6). Nothing is spent on it.
pub fn claim_action(
    takeover: bool,
    stored: NextAction,
    lease: Duration,
    facts: DispatchFacts,
    policy: QueuePolicy,
) -> ClaimDecision {
    if takeover {
        return ClaimDecision::HandOut {
            action: NextAction::Reconcile,
            dispatch: false,
        };
    }
    match (stored, facts.since_first_dispatch) {
        (NextAction::Execute, Some(elapsed))
            if elapsed.saturating_add(lease) >= policy.resend_window =>
        {
            ClaimDecision::Park(OverrideReason::ResendWindowClosed)
        }
        (NextAction::Execute, _) => ClaimDecision::HandOut {
            action: NextAction::Execute,
            dispatch: true,
        },
        (NextAction::Reconcile, _) => ClaimDecision::HandOut {
            action: NextAction::Reconcile,
            dispatch: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const SEND: ClaimDecision = ClaimDecision::HandOut {
        action: NextAction::Execute,
        dispatch: true,
    };
    const RECONCILE: ClaimDecision = ClaimDecision::HandOut {
        action: NextAction::Reconcile,
        dispatch: false,
    };
    const LEASE: Duration = Duration::from_secs(30);

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
                Duration::ZERO,
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
                Duration::ZERO,
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
    fn a_resend_whose_lease_would_outlive_the_window_goes_to_manual_review() {
        // Due in 1 h at 22 h 30 min, with a 45 min lease: the send may
        // happen at 24 h 15 min, after the provider forgot the key.
        let at = |minutes: u64| DispatchFacts {
            since_first_dispatch: Some(Duration::from_secs(minutes * 60)),
            dispatch_count: 1,
        };
        let lease = Duration::from_secs(45 * 60);
        assert_eq!(
            decide_fail(
                FailDisposition::RetryExecute,
                HOUR,
                lease,
                at(22 * 60 + 30),
                policy()
            )
            .1,
            Some(OverrideReason::ResendWindowClosed)
        );
        assert_eq!(
            decide_fail(
                FailDisposition::RetryExecute,
                HOUR,
                lease,
                at(22 * 60),
                policy()
            ),
            (FailDisposition::RetryExecute, None)
        );
        // The same at hand-out: 23 h 30 min in, a 45 min lease parks it.
        assert_eq!(
            claim_action(
                false,
                NextAction::Execute,
                lease,
                at(23 * 60 + 30),
                policy()
            ),
            ClaimDecision::Park(OverrideReason::ResendWindowClosed)
        );
        assert_eq!(
            claim_action(false, NextAction::Execute, lease, at(23 * 60), policy()),
            SEND
        );
    }

    #[test]
    fn exhausted_dispatches_go_to_manual_review() {
        assert_eq!(
            decide_fail(
                FailDisposition::RetryExecute,
                Duration::ZERO,
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
                decide_fail(d, 100 * HOUR, HOUR, facts(Some(100), 99), policy()),
                (d, None)
            );
        }
    }

    #[test]
    fn takeover_always_reconciles_and_never_dispatches() {
        for stored in [NextAction::Execute, NextAction::Reconcile] {
            assert_eq!(
                claim_action(true, stored, LEASE, facts(Some(100), 9), policy()),
                RECONCILE
            );
        }
    }

    #[test]
    fn a_resend_past_its_window_is_parked_at_hand_out() {
        assert_eq!(
            claim_action(
                false,
                NextAction::Execute,
                LEASE,
                facts(Some(25), 1),
                policy()
            ),
            ClaimDecision::Park(OverrideReason::ResendWindowClosed)
        );
        assert_eq!(
            claim_action(
                false,
                NextAction::Execute,
                LEASE,
                facts(Some(2), 1),
                policy()
            ),
            SEND
        );
        // A first send has no window to miss; a reconcile sends nothing.
        assert_eq!(
            claim_action(false, NextAction::Execute, LEASE, facts(None, 0), policy()),
            SEND
        );
        assert_eq!(
            claim_action(
                false,
                NextAction::Reconcile,
                LEASE,
                facts(Some(25), 1),
                policy()
            ),
            RECONCILE
        );
    }
}
