//! The `job_events` log: what each entry records ([`EventKind`], stored in
//! `job_events.kind`) and the detail a Fail leaves there, read back when
//! the very same Fail is sent again (a replay is answered with what was
//! applied then).

use crate::{FailDisposition, OverrideReason};

/// What an entry of the events log records. Every transition and every
/// refused write has one (docs/design.md: the log is written in the transaction
/// of the change and doubles as the outbox).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A job was created by Enqueue.
    Enqueued,
    /// A Claim handed out a ready job (a new attempt).
    Claimed,
    /// A Claim or Takeover handed out a job whose lease had expired.
    TakenOver,
    /// RenewLease extended the current attempt's lease.
    LeaseRenewed,
    /// Complete: the job succeeded.
    Completed,
    /// Fail with a retry: ready again after the delay.
    RetryScheduled,
    /// Fail: the job failed for good.
    Failed,
    /// The job was parked for an operator (by Fail, or by a claim that
    /// refused a resend).
    ManualReview,
    /// A write from an attempt that no longer holds the job was refused.
    StaleWriteRejected,
    /// RecordObservation kept a piece of evidence (the job did not change).
    ObservationRecorded,
    /// An operator resolved a job parked in manual review.
    ManualReviewResolved,
    /// An operator's resolution was refused (not parked, stale attempt).
    ResolveRejected,
    /// An operator cancelled a job never dispatched.
    Cancelled,
    /// An operator's cancellation was refused.
    CancelRejected,
    /// An operator tried a failed or cancelled job again as a new
    /// operation: the detail names the new operation key (the job itself
    /// does not change).
    RetriedAsNewOperation,
    /// The first event after `enqueued` of a job made by trying another
    /// again: the detail names the old job and its key.
    RetryOf,
    /// `jobfence restore fence` moved an unfinished job of a restored
    /// database to a new restore epoch of its attempt (docs/design.md
    /// rule 17): `attempt` is the one the backup held, `current_attempt`
    /// the new one; the state does not change (`to_state` unset). The
    /// detail is a JSON object (`action`, `operator`, `previous_attempt`,
    /// `epoch`, and for a running job `lease: "expired"`).
    RestoreFenced,
}

impl EventKind {
    /// Every kind, in the life-cycle order above.
    pub const ALL: [EventKind; 17] = [
        EventKind::Enqueued,
        EventKind::Claimed,
        EventKind::TakenOver,
        EventKind::LeaseRenewed,
        EventKind::Completed,
        EventKind::RetryScheduled,
        EventKind::Failed,
        EventKind::ManualReview,
        EventKind::StaleWriteRejected,
        EventKind::ObservationRecorded,
        EventKind::ManualReviewResolved,
        EventKind::ResolveRejected,
        EventKind::Cancelled,
        EventKind::CancelRejected,
        EventKind::RetriedAsNewOperation,
        EventKind::RetryOf,
        EventKind::RestoreFenced,
    ];

    /// The value stored in `job_events.kind` (and served by the events
    /// feed).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Claimed => "claimed",
            EventKind::TakenOver => "taken_over",
            EventKind::LeaseRenewed => "lease_renewed",
            EventKind::Completed => "completed",
            EventKind::RetryScheduled => "retry_scheduled",
            EventKind::Failed => "failed",
            EventKind::ManualReview => "manual_review",
            EventKind::StaleWriteRejected => "stale_write_rejected",
            EventKind::ObservationRecorded => "observation_recorded",
            EventKind::ManualReviewResolved => "manual_review_resolved",
            EventKind::ResolveRejected => "resolve_rejected",
            EventKind::Cancelled => "cancelled",
            EventKind::CancelRejected => "cancel_rejected",
            EventKind::RetriedAsNewOperation => "retried_as_new_operation",
            EventKind::RetryOf => "retry_of",
            EventKind::RestoreFenced => "restore_fenced",
        }
    }

    /// The kind of the event an applied Fail leaves.
    pub fn of_fail(applied: FailDisposition) -> EventKind {
        match applied {
            FailDisposition::RetryReconcile | FailDisposition::RetryExecute => {
                EventKind::RetryScheduled
            }
            FailDisposition::Failed => EventKind::Failed,
            FailDisposition::ManualReview => EventKind::ManualReview,
        }
    }
}

impl_str_enum!(
    EventKind,
    "event kind",
    [
        EventKind::Enqueued,
        EventKind::Claimed,
        EventKind::TakenOver,
        EventKind::LeaseRenewed,
        EventKind::Completed,
        EventKind::RetryScheduled,
        EventKind::Failed,
        EventKind::ManualReview,
        EventKind::StaleWriteRejected,
        EventKind::ObservationRecorded,
        EventKind::ManualReviewResolved,
        EventKind::ResolveRejected,
        EventKind::Cancelled,
        EventKind::CancelRejected,
        EventKind::RetriedAsNewOperation,
        EventKind::RetryOf,
        EventKind::RestoreFenced
    ]
);

/// `applied[:OVERRIDE_REASON]`: the detail of an applied Fail's event.
pub fn fail_detail(applied: FailDisposition, why: Option<OverrideReason>) -> String {
    match why {
        Some(why) => format!("{applied}:{why}"),
        None => applied.as_str().to_owned(),
    }
}

/// What an applied Fail's event detail says was applied ([`fail_detail`]);
/// `None` for a detail that is not one.
pub fn parse_fail_detail(detail: &str) -> Option<(FailDisposition, Option<OverrideReason>)> {
    let (applied, why) = match detail.split_once(':') {
        Some((a, w)) => (a, Some(w)),
        None => (detail, None),
    };
    let applied = applied.parse().ok()?;
    let why = match why {
        None => None,
        Some(w) => Some(w.parse().ok()?),
    };
    Some((applied, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_as_itself() {
        for k in EventKind::ALL {
            assert_eq!(k.as_str().parse::<EventKind>().unwrap(), k);
        }
        assert!("lease_lost".parse::<EventKind>().is_err());
    }

    #[test]
    fn a_fail_detail_reads_back_as_what_was_applied() {
        use FailDisposition::*;
        use OverrideReason::*;
        for (applied, why, text) in [
            (RetryReconcile, None, "retry_reconcile"),
            (
                ManualReview,
                Some(ResendWindowClosed),
                "manual_review:RESEND_WINDOW_CLOSED",
            ),
            (
                ManualReview,
                Some(MaxDispatchesReached),
                "manual_review:MAX_DISPATCHES_REACHED",
            ),
            (Failed, None, "failed"),
        ] {
            assert_eq!(fail_detail(applied, why), text);
            assert_eq!(parse_fail_detail(text), Some((applied, why)));
        }
        assert_eq!(parse_fail_detail("manual_review:TOO_LATE"), None);
        assert_eq!(parse_fail_detail("burnt"), None);
        assert_eq!(EventKind::of_fail(RetryExecute), EventKind::RetryScheduled);
    }
}
