//! Who holds an operation key, as the store reads it ([`Held`]: a job with
//! its queue and payload, or a pruned job's key record), turned into the
//! [`Holder`] settlement's decision takes (docs/design.md rule 15): a
//! job's amount and currency are read from its payload here, by its
//! queue's pointers, so the decision compares them with the refund's.
//!
//! A key is unique per queue, so two of a provider's queues may each hold
//! it. The lines are then decided against the job whose recorded provider
//! reference is the settled refund's ([`decide_held`]); when no single job
//! recorded it, against every one of them, and only what they all agree
//! on is decided: otherwise the key is an [`ExceptionKind::AmbiguousKey`]
//! naming each queue and job, and no job changes.

use super::records::QueueAmounts;
use super::{decide, Decision, ExceptionKind, Holder, Outcome, SettlementLine};

/// Who holds an operation key among a provider's queues, as read from the
/// database, before the job's amount is read from its payload.
#[derive(Debug, Clone)]
pub struct Held {
    /// A [`Holder::Job`] whose `amount` is left `None` ([`holder`] reads
    /// it from `payload`), or a [`Holder::Pruned`] key record.
    pub holder: Holder,
    /// The queue of the job or key record; without one the amounts are
    /// not compared.
    pub queue: Option<String>,
    /// The job's payload, JSON text as enqueued; `None` for a key record
    /// (the payload is pruned with the job).
    pub payload: Option<String>,
    /// The provider reference the job (or key record) recorded; `None`
    /// while it has none.
    pub provider_reference: Option<String>,
}

/// The holder settlement's decision ([`super::decide()`]) takes: nobody
/// when no one holds the key (`held` is `None`), a job with its amount
/// read from its payload by its queue's pointers (`None` when its queue
/// has none or the payload lacks a value), a key record as read. `queues`
/// are the provider's, with their amount pointers.
pub fn holder(queues: &[QueueAmounts], held: Option<&Held>) -> Holder {
    match held {
        None => Holder::Nobody,
        Some(h) => match &h.holder {
            Holder::Job {
                id, state, attempt, ..
            } => Holder::Job {
                id: *id,
                state: *state,
                attempt: *attempt,
                amount: payload_amount(queues, h),
            },
            other => other.clone(),
        },
    }
}

/// What the `lines` of one key decide, and against whom, given `held`:
/// every job of the provider's `queues` that holds the key, and the key
/// record of a pruned one in each queue where no job holds it (oldest
/// first; empty when nobody holds it).
///
/// One holder: the lines are decided against it. Two or more (the key
/// used in two of the provider's queues): against the one whose recorded
/// provider reference is a settled line's, if exactly one is. Otherwise
/// the decision is made against each of them; if every one gives the same
/// outcome (matched, nothing yet, or the same exceptions) that outcome
/// stands, against the oldest, and if not the key is an
/// [`ExceptionKind::AmbiguousKey`] and nothing is written to any job (a
/// resolution or an observation would pick one without grounds). Every
/// exception of a key held more than once names each queue and job.
pub fn decide_held(
    queues: &[QueueAmounts],
    held: &[Held],
    lines: &[SettlementLine],
) -> (Holder, Decision) {
    let settled: Vec<&str> = lines
        .iter()
        .filter(|l| l.status.moved_money())
        .map(|l| l.provider_reference.as_str())
        .collect();
    let recorded: Vec<&Held> = held
        .iter()
        .filter(|h| {
            h.provider_reference
                .as_deref()
                .is_some_and(|r| settled.contains(&r))
        })
        .collect();
    let chosen: Vec<&Held> = match (held.len(), recorded.len()) {
        (0, _) => vec![],
        (1, _) => vec![&held[0]],
        (_, 1) => recorded.clone(),
        _ => held.iter().collect(),
    };
    let mut each: Vec<(Holder, Decision)> = chosen
        .iter()
        .map(|h| {
            let x = holder(queues, Some(h));
            let d = decide(&x, lines);
            (x, d)
        })
        .collect();
    if each.is_empty() {
        return (Holder::Nobody, decide(&Holder::Nobody, lines));
    }
    let agreed = each.len() == 1 || each.iter().all(|(_, d)| agree(d, &each[0].1));
    let (holder, mut decision) = each.swap_remove(0);
    if !agreed {
        decision = Decision {
            outcome: Outcome::Exception,
            exceptions: vec![(
                ExceptionKind::AmbiguousKey,
                format!(
                    "refund {} names an operation key held in more than one of the provider's \
                     queues, and {}; no job was changed (a person decides which job it was)",
                    settled.join(", "),
                    if recorded.is_empty() {
                        "no job recorded its provider reference".to_owned()
                    } else {
                        format!("{} jobs recorded its provider reference", recorded.len())
                    }
                ),
            )],
        };
    }
    if held.len() > 1 {
        let all: Vec<String> = held.iter().map(describe).collect();
        for (_, detail) in &mut decision.exceptions {
            detail.push_str(&format!(" (the key is held by {})", all.join(" and ")));
        }
    }
    (holder, decision)
}

/// Whether two decisions of one key's lines, against two holders, come
/// to the same: matched, nothing yet, or an exception of the same kinds.
/// A resolution or an observation writes to its own job: never the same.
fn agree(a: &Decision, b: &Decision) -> bool {
    let kinds = |d: &Decision| d.exceptions.iter().map(|(k, _)| *k).collect::<Vec<_>>();
    let same_outcome = matches!(
        (&a.outcome, &b.outcome),
        (Outcome::Matched, Outcome::Matched)
            | (Outcome::Undecided, Outcome::Undecided)
            | (Outcome::Exception, Outcome::Exception)
    );
    same_outcome && kinds(a) == kinds(b)
}

/// A holder in an exception's words: `job 7 of queue refunds-eu
/// (manual_review)`, or a pruned job's key record.
fn describe(h: &Held) -> String {
    let queue = h.queue.as_deref().unwrap_or("?");
    match &h.holder {
        Holder::Job { id, state, .. } => {
            format!("job {id} of queue {queue} ({})", state.as_str())
        }
        Holder::Pruned {
            job_id,
            final_state,
        } => format!(
            "pruned job {job_id} of queue {queue} ({})",
            final_state.as_str()
        ),
        Holder::Nobody => "nobody".to_owned(),
    }
}

/// The job's amount and currency from its payload, by the JSON pointers
/// (RFC 6901) of its queue among `queues`: the amount in the currency's
/// minor unit, as the payload writes it (a JSON integer, or a string
/// holding one), and the currency upper-cased. `None` when the queue is
/// not among `queues` or has no pointers (amounts are then not compared),
/// or the payload is missing, is not JSON, or lacks either value.
fn payload_amount(queues: &[QueueAmounts], held: &Held) -> Option<(i64, String)> {
    let queue = queues
        .iter()
        .find(|q| Some(&q.queue) == held.queue.as_ref())?;
    let (amount_at, currency_at) = (
        queue.amount_pointer.as_ref()?,
        queue.currency_pointer.as_ref()?,
    );
    let payload: serde_json::Value = serde_json::from_str(held.payload.as_ref()?).ok()?;
    let amount = match payload.pointer(amount_at)? {
        serde_json::Value::Number(n) => n.as_i64()?,
        serde_json::Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    let currency = payload.pointer(currency_at)?.as_str()?.to_ascii_uppercase();
    Some((amount, currency))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobState;

    fn queues() -> Vec<QueueAmounts> {
        vec![
            QueueAmounts {
                queue: "refunds".into(),
                amount_pointer: Some("/amount".into()),
                currency_pointer: Some("/money/currency".into()),
            },
            QueueAmounts {
                queue: "bare".into(),
                amount_pointer: None,
                currency_pointer: None,
            },
        ]
    }

    fn job(queue: &str, payload: Option<&str>) -> Held {
        Held {
            holder: Holder::Job {
                id: 7,
                state: JobState::Succeeded,
                attempt: 2,
                amount: None,
            },
            queue: Some(queue.into()),
            payload: payload.map(str::to_owned),
            provider_reference: None,
        }
    }

    fn amount(queue: &str, payload: &str) -> Option<(i64, String)> {
        payload_amount(&queues(), &job(queue, Some(payload)))
    }

    #[test]
    fn the_amount_is_read_by_the_queues_pointers() {
        let want = Some((500, "USD".to_owned()));
        let p = r#"{"amount": 500, "money": {"currency": "usd"}}"#;
        assert_eq!(amount("refunds", p), want);
        let p = r#"{"amount": " 500 ", "money": {"currency": "USD"}}"#;
        assert_eq!(amount("refunds", p), want);
    }

    #[test]
    fn no_amount_without_pointers_or_values() {
        let whole = r#"{"amount": 500, "money": {"currency": "USD"}}"#;
        assert_eq!(amount("bare", whole), None);
        assert_eq!(amount("other", whole), None);
        for payload in [
            "not json",
            r#"{"money": {"currency": "USD"}}"#,
            r#"{"amount": 500}"#,
            r#"{"amount": 5.5, "money": {"currency": "USD"}}"#,
            r#"{"amount": "5.5", "money": {"currency": "USD"}}"#,
            r#"{"amount": true, "money": {"currency": "USD"}}"#,
            r#"{"amount": 500, "money": {"currency": 840}}"#,
        ] {
            assert_eq!(amount("refunds", payload), None, "{payload}");
        }
        assert_eq!(payload_amount(&queues(), &job("refunds", None)), None);
        let mut no_queue = job("refunds", Some(whole));
        no_queue.queue = None;
        assert_eq!(payload_amount(&queues(), &no_queue), None);
    }

    #[test]
    fn the_holder_is_nobody_a_job_with_its_amount_or_a_key_record() {
        assert_eq!(holder(&queues(), None), Holder::Nobody);
        let held = job(
            "refunds",
            Some(r#"{"amount": 12, "money": {"currency": "eur"}}"#),
        );
        assert_eq!(
            holder(&queues(), Some(&held)),
            Holder::Job {
                id: 7,
                state: JobState::Succeeded,
                attempt: 2,
                amount: Some((12, "EUR".into())),
            }
        );
        let pruned = Held {
            holder: Holder::Pruned {
                job_id: 9,
                final_state: JobState::Failed,
            },
            queue: Some("refunds".into()),
            payload: None,
            provider_reference: None,
        };
        assert_eq!(holder(&queues(), Some(&pruned)), pruned.holder);
    }
}
