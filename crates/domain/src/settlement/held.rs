//! Who holds an operation key, as the store reads it ([`Held`]: a job with
//! its queue and payload, or a pruned job's key record), turned into the
//! [`Holder`] settlement's decision takes (docs/design.md rule 15): a
//! job's amount and currency are read from its payload here, by its
//! queue's pointers, so the decision compares them with the refund's.

use super::records::QueueAmounts;
use super::Holder;

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
        };
        assert_eq!(holder(&queues(), Some(&pruned)), pruned.holder);
    }
}
