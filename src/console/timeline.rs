//! An event of `job_events`, told as a line of the job's story: a claim
//! with its attempt, a takeover, a zombie's refused write, a late result
//! kept as evidence, a resend allowed or refused, an operator's action.
//! Pure functions of the event, so the Job page, the Manual review page
//! and the Events feed tell it the same way.

use crate::store::FeedEvent;

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

fn override_reason(why: Option<&str>) -> &'static str {
    match why {
        Some("RESEND_WINDOW_CLOSED") => {
            "a resend was refused: the provider's idempotency window, counted from the first \
             dispatch, is closed, so the provider may no longer de-duplicate it"
        }
        Some("MAX_DISPATCHES_REACHED") => {
            "a resend was refused: the queue's dispatches are used up"
        }
        _ => "the worker asked for an operator",
    }
}

fn state_name(s: Option<crate::domain::JobState>) -> &'static str {
    s.map_or("unchanged", |s| s.as_str())
}

/// Tells `e`.
pub fn tell(e: &FeedEvent) -> Told {
    let a = e.attempt;
    let detail = e.detail.as_deref().unwrap_or("");
    let (head, why) = match detail.split_once(':') {
        Some((h, w)) => (h, Some(w.trim())),
        None => (detail, None),
    };
    match e.kind.as_str() {
        "enqueued" => told(
            Tone::Info,
            "Enqueued",
            format!("in queue {}, operation_key {}", e.queue, e.operation_key),
        ),
        "claimed" => told(
            Tone::Info,
            format!("Claimed: attempt {a}"),
            if detail == "reconcile" {
                "handed out to a worker, to reconcile first (ask the provider what happened)"
                    .to_owned()
            } else {
                "handed out to a worker, to send the operation".to_owned()
            },
        ),
        "taken_over" => told(
            Tone::Warn,
            format!("Taken over: attempt {a}"),
            format!(
                "the lease of attempt {} expired and another worker took the job; attempt {} \
                 may no longer write, and attempt {a} reconciles first",
                a.saturating_sub(1),
                a.saturating_sub(1)
            ),
        ),
        "lease_renewed" => told(
            Tone::Info,
            format!("Lease renewed by attempt {a}"),
            "the worker is still on it",
        ),
        "completed" => told(
            Tone::Good,
            format!("Completed by attempt {a}"),
            "the job succeeded",
        ),
        "retry_scheduled" if head == "retry_execute" => told(
            Tone::Warn,
            format!("Resend allowed for attempt {a}"),
            "the outcome was unknown and the provider's idempotency window is still open: \
             the operation will be sent again with the same operation_key",
        ),
        "retry_scheduled" => told(
            Tone::Info,
            format!("Retry scheduled by attempt {a}"),
            "back to ready; the next worker reconciles first",
        ),
        "failed" => told(
            Tone::Bad,
            format!("Failed by attempt {a}"),
            "the outcome is known: the operation did not and will not happen",
        ),
        "manual_review" => told(
            Tone::Warn,
            "Parked for manual review",
            format!("attempt {a}: {}", override_reason(why)),
        ),
        "stale_write_rejected" => told(
            Tone::Fence,
            format!("Stale write refused: attempt {a}"),
            format!(
                "a {} from attempt {a} arrived after the job had moved on (now attempt {}, {}); \
                 it was refused and changed nothing",
                if head.is_empty() { "write" } else { head },
                e.current_attempt,
                state_name(e.from_state),
            ),
        ),
        "observation_recorded" => {
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
        "manual_review_resolved" => {
            let operator = json_field(detail, "operator").unwrap_or_default();
            let action = json_field(detail, "action").unwrap_or_default();
            let reason = json_field(detail, "reason").unwrap_or_default();
            told(
                Tone::Operator,
                format!("Resolved by {operator}: {}", action.replace('_', " ")),
                format!("now {}; reason: {reason}", state_name(e.to_state)),
            )
        }
        "resolve_rejected" | "cancel_rejected" => {
            let operator = json_field(detail, "operator").unwrap_or_default();
            let refused = json_field(detail, "refused").unwrap_or_default();
            let what = if e.kind == "cancel_rejected" {
                "Cancel"
            } else {
                "Resolution"
            };
            told(
                Tone::Fence,
                format!("{what} by {operator} refused"),
                format!("presented attempt {a}: {refused}"),
            )
        }
        "cancelled" => {
            let operator = json_field(detail, "operator").unwrap_or_default();
            let reason = json_field(detail, "reason").unwrap_or_default();
            told(
                Tone::Operator,
                format!("Cancelled by {operator}"),
                format!("never dispatched; reason: {reason}"),
            )
        }
        other => told(Tone::Info, other.to_owned(), detail.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::JobState;

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
