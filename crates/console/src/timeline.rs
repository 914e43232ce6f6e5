//! An event of `job_events`, told as a line of the job's story: a claim
//! with its attempt, a takeover, a zombie's refused write, a late result
//! kept as evidence, a resend allowed or refused, an operator's action.
//! Pure functions of the event, so the Job page, the Manual review page
//! and the Events feed tell it the same way.

use jobfence_domain::event::parse_fail_detail;
use jobfence_domain::feed::FeedEvent;
use jobfence_domain::{EventKind, FailDisposition, NextAction, OverrideReason};

/// How an entry is coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// The normal course: enqueued, claimed, renewed.
    Info,
    /// A good ending or good news: completed, a success observed.
    Good,
    /// Something went wrong and was handled: a takeover, a resend, a park.
    Warn,
    /// The fence at work: a write from a superseded attempt refused.
    Fence,
    /// A terminal failure.
    Bad,
    /// A person acted.
    Operator,
}

impl Tone {
    /// The CSS class of the tone.
    pub fn class(self) -> &'static str {
        match self {
            Tone::Info => "info",
            Tone::Good => "good",
            Tone::Warn => "warn",
            Tone::Fence => "fence",
            Tone::Bad => "bad",
            Tone::Operator => "operator",
        }
    }
}

/// One event, told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    /// Its colour.
    pub tone: Tone,
    /// A few words: "Taken over: attempt 2".
    pub title: String,
    /// The sentence under it.
    pub text: String,
}

fn told(tone: Tone, title: impl Into<String>, text: impl Into<String>) -> Told {
    Told {
        tone,
        title: title.into(),
        text: text.into(),
    }
}

/// A field of an operator event's JSON detail.
fn json_field(detail: &str, key: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(detail).ok()?;
    v.get(key)?.as_str().map(str::to_owned)
}

fn override_reason(why: Option<OverrideReason>) -> &'static str {
    match why {
        Some(OverrideReason::ResendWindowClosed) => {
            "a resend was refused: the provider's idempotency window, counted from the first \
             dispatch, is closed, so the provider may no longer de-duplicate it"
        }
        Some(OverrideReason::MaxDispatchesReached) => {
            "a resend was refused: the queue's dispatches are used up"
        }
        None => "the worker asked for an operator",
    }
}

fn state_name(s: Option<jobfence_domain::JobState>) -> &'static str {
    s.map_or("unchanged", |s| s.as_str())
}

/// Tells `e`: one arm per kind, grouped by family; a kind whose sentence
/// takes more than a line has a function of its own below.
pub fn tell(e: &FeedEvent) -> Told {
    let a = e.attempt;
    let detail = e.detail.as_deref().unwrap_or("");
    let Some(kind) = e.event_kind() else {
        // A kind a newer coordinator wrote: told as it is.
        return told(Tone::Info, e.kind.clone(), detail.to_owned());
    };
    match kind {
        // The job's course, as its workers move it.
        EventKind::Enqueued => told(
            Tone::Info,
            "Enqueued",
            format!("in queue {}, operation_key {}", e.queue, e.operation_key),
        ),
        EventKind::Claimed => claimed(a, detail),
        EventKind::TakenOver => taken_over(a),
        EventKind::LeaseRenewed => told(
            Tone::Info,
            format!("Lease renewed by attempt {a}"),
            "the worker is still on it",
        ),
        EventKind::Completed => told(
            Tone::Good,
            format!("Completed by attempt {a}"),
            "the job succeeded",
        ),
        EventKind::RetryScheduled => retry_scheduled(a, detail),
        EventKind::Failed => told(
            Tone::Bad,
            format!("Failed by attempt {a}"),
            "the outcome is known: the operation did not and will not happen",
        ),
        EventKind::ManualReview => parked(a, detail),
        // The fence, and the evidence it keeps.
        EventKind::StaleWriteRejected => stale_write(e, detail),
        EventKind::ObservationRecorded => observation(e, detail),
        // A person's action, and the fence refusing one.
        EventKind::ManualReviewResolved => resolved(e, detail),
        EventKind::ResolveRejected => operator_refused("Resolution", a, detail),
        EventKind::CancelRejected => operator_refused("Cancel", a, detail),
        EventKind::Cancelled => cancelled(detail),
        // A failed refund tried again as a new operation.
        EventKind::RetriedAsNewOperation | EventKind::RetryOf => retry_link(kind, detail),
        // The fence moved after the database was restored from a backup.
        EventKind::RestoreFenced => restore_fenced(e),
    }
}

// The job's course.

/// A claim, to send or to reconcile first (the claim's detail is its next
/// action).
fn claimed(a: u64, detail: &str) -> Told {
    told(
        Tone::Info,
        format!("Claimed: attempt {a}"),
        if matches!(detail.parse(), Ok(NextAction::Reconcile)) {
            "handed out to a worker, to reconcile first (ask the provider what happened)".to_owned()
        } else {
            "handed out to a worker, to send the operation".to_owned()
        },
    )
}

/// A takeover: the attempt before this one may no longer write.
fn taken_over(a: u64) -> Told {
    told(
        Tone::Warn,
        format!("Taken over: attempt {a}"),
        format!(
            "the lease of attempt {} expired and another worker took the job; attempt {} \
             may no longer write, and attempt {a} reconciles first",
            a.saturating_sub(1),
            a.saturating_sub(1)
        ),
    )
}

/// A retry: a resend the window still allows, or a reconcile. A Fail's
/// detail says what was applied (domain::event::fail_detail).
fn retry_scheduled(a: u64, detail: &str) -> Told {
    if matches!(
        parse_fail_detail(detail),
        Some((FailDisposition::RetryExecute, _))
    ) {
        told(
            Tone::Warn,
            format!("Resend allowed for attempt {a}"),
            "the outcome was unknown and the provider's idempotency window is still open: \
             the operation will be sent again with the same operation_key",
        )
    } else {
        told(
            Tone::Info,
            format!("Retry scheduled by attempt {a}"),
            "back to ready; the next worker reconciles first",
        )
    }
}

/// A park in manual review, and why it differs from what the worker asked
/// (a refused resend), from the Fail's detail.
fn parked(a: u64, detail: &str) -> Told {
    let why = parse_fail_detail(detail).and_then(|(_, why)| why);
    told(
        Tone::Warn,
        "Parked for manual review",
        format!("attempt {a}: {}", override_reason(why)),
    )
}

// The fence.

/// A write from a superseded attempt, refused; its detail starts with the
/// call (`fail: …`).
fn stale_write(e: &FeedEvent, detail: &str) -> Told {
    let a = e.attempt;
    let head = detail.split_once(':').map_or(detail, |(h, _)| h);
    told(
        Tone::Fence,
        format!("Stale write refused: attempt {a}"),
        format!(
            "a {} from attempt {a} arrived after the job had moved on (now attempt {}, {}); \
             it was refused and changed nothing",
            if head.is_empty() { "write" } else { head },
            e.current_attempt,
            state_name(e.from_state),
        ),
    )
}

/// The provider's answer, recorded (`source outcome`); from a superseded
/// attempt it is kept as evidence and writes nothing.
fn observation(e: &FeedEvent, detail: &str) -> Told {
    let a = e.attempt;
    let (source, outcome) = detail.split_once(' ').unwrap_or((detail, ""));
    let stale = if a < e.current_attempt {
        format!(
            " — from attempt {a}, already superseded by attempt {}: kept as evidence, \
             not written",
            e.current_attempt
        )
    } else {
        String::new()
    };
    told(
        if outcome == "succeeded" {
            Tone::Good
        } else {
            Tone::Info
        },
        format!("Observation: {source} saw {outcome}"),
        format!("the provider's answer, recorded{stale}"),
    )
}

// A person's action; its detail is JSON.

/// An operator's resolution of a parked job.
fn resolved(e: &FeedEvent, detail: &str) -> Told {
    let operator = json_field(detail, "operator").unwrap_or_default();
    let action = json_field(detail, "action").unwrap_or_default();
    let reason = json_field(detail, "reason").unwrap_or_default();
    told(
        Tone::Operator,
        format!("Resolved by {operator}: {}", action.replace('_', " ")),
        format!("now {}; reason: {reason}", state_name(e.to_state)),
    )
}

/// An operator's resolution or cancel (`what`) that the fence refused.
fn operator_refused(what: &str, a: u64, detail: &str) -> Told {
    let operator = json_field(detail, "operator").unwrap_or_default();
    let refused = json_field(detail, "refused").unwrap_or_default();
    told(
        Tone::Fence,
        format!("{what} by {operator} refused"),
        format!("presented attempt {a}: {refused}"),
    )
}

/// An operator's cancel of a job never dispatched.
fn cancelled(detail: &str) -> Told {
    let operator = json_field(detail, "operator").unwrap_or_default();
    let reason = json_field(detail, "reason").unwrap_or_default();
    told(
        Tone::Operator,
        format!("Cancelled by {operator}"),
        format!("never dispatched; reason: {reason}"),
    )
}

/// The two ends of a retry as a new operation: the old job (which stays
/// as it is) names the new key, the new job the old one.
fn retry_link(kind: EventKind, detail: &str) -> Told {
    let operator = json_field(detail, "operator").unwrap_or_default();
    let reason = json_field(detail, "reason").unwrap_or_default();
    if kind == EventKind::RetryOf {
        let old = serde_json::from_str::<serde_json::Value>(detail)
            .ok()
            .and_then(|d| d["old_job_id"].as_u64())
            .unwrap_or_default();
        let key = json_field(detail, "old_operation_key").unwrap_or_default();
        return told(
            Tone::Operator,
            format!("Retry of job {old}, by {operator}"),
            format!(
                "a new operation for the failed job {old} (operation_key {key}); reason: {reason}"
            ),
        );
    }
    let key = json_field(detail, "new_operation_key").unwrap_or_default();
    told(
        Tone::Operator,
        format!("Tried again as a new operation, by {operator}"),
        format!("as operation_key {key}; this job stays as it is; reason: {reason}"),
    )
}

/// `jobfence restore fence` (docs/design.md rule 17): every attempt
/// handed out before it, whatever the backup knew of, may no longer
/// write.
fn restore_fenced(e: &FeedEvent) -> Told {
    told(
        Tone::Warn,
        format!("Fenced after a restore: attempt {}", e.current_attempt),
        format!(
            "the database was restored from a backup that held attempt {}; no attempt \
             handed out before the restore may write, and the next holder reconciles first",
            e.attempt
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use jobfence_domain::JobState;

    fn event(kind: &str, attempt: u64, current: u64, detail: &str) -> FeedEvent {
        FeedEvent {
            id: 1,
            job_id: 9,
            queue: "refunds".into(),
            operation_key: "refund-pay_9".into(),
            attempt,
            kind: kind.into(),
            from_state: Some(JobState::Running),
            to_state: None,
            current_attempt: current,
            detail: (!detail.is_empty()).then(|| detail.to_owned()),
            created_at: chrono::NaiveDateTime::default(),
        }
    }

    #[test]
    fn the_seed_story_reads_in_order() {
        let story = [
            event("claimed", 1, 1, "execute"),
            event("taken_over", 2, 2, "reconcile"),
            event(
                "stale_write_rejected",
                1,
                2,
                "fail: attempt 1 of job 9 was superseded by attempt 2",
            ),
            event("observation_recorded", 1, 2, "worker succeeded"),
            event("completed", 2, 2, ""),
        ];
        let told: Vec<Told> = story.iter().map(tell).collect();
        assert_eq!(told[0].title, "Claimed: attempt 1");
        assert_eq!(told[1].tone, Tone::Warn);
        assert!(told[1].text.contains("lease of attempt 1 expired"));
        assert_eq!(told[2].tone, Tone::Fence);
        assert!(told[2].text.starts_with("a fail from attempt 1"));
        assert!(told[2].text.contains("now attempt 2"));
        assert_eq!(told[3].title, "Observation: worker saw succeeded");
        assert!(told[3].text.contains("superseded by attempt 2"));
        assert_eq!(told[4].tone, Tone::Good);
    }

    #[test]
    fn resend_decisions_and_operators_are_told() {
        let refused = tell(&event(
            "manual_review",
            3,
            3,
            "manual_review:RESEND_WINDOW_CLOSED",
        ));
        assert!(refused.text.contains("idempotency window"));
        let allowed = tell(&event("retry_scheduled", 1, 1, "retry_execute"));
        assert!(allowed.title.starts_with("Resend allowed"));
        let mut resolved = event(
            "manual_review_resolved",
            3,
            3,
            r#"{"action":"retry_reconcile","operator":"alice","reason":"checked"}"#,
        );
        resolved.to_state = Some(JobState::Ready);
        let t = tell(&resolved);
        assert_eq!(t.title, "Resolved by alice: retry reconcile");
        assert_eq!(t.text, "now ready; reason: checked");
        let rejected = tell(&event(
            "resolve_rejected",
            3,
            3,
            r#"{"action":"failed","operator":"bob","reason":"x","refused":"job 9 is succeeded"}"#,
        ));
        assert_eq!(rejected.title, "Resolution by bob refused");
        assert!(rejected.text.contains("job 9 is succeeded"));
    }
}
