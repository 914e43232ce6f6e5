//! Settlement (docs/design.md rule 15) against a real MariaDB: a
//! provider's report imported through the coordinator, matched by
//! operation key; each outcome, and the races and cuts that must not
//! change it.

use jobfence_testkit as kit;

use jobfence_api::v1::{CompleteRequest, FailDisposition, FailRequest};
use jobfence_core::settlement::{ImportHeader, ImportSummary};
use jobfence_domain::budget::Budget;
use jobfence_domain::providers::{ChangeBy, PutProvider};
use jobfence_domain::settlement::mapping::{Mapping, RawLine};
use jobfence_domain::settlement::records::{PutSettlementSettings, QueueAmounts};
use jobfence_domain::settlement::{ExceptionKind, ExceptionState};
use jobfence_domain::{DbTime, JobState};
use kit::Harness;

const Q: &str = "refunds";
const P: &str = "psp";

fn by() -> ChangeBy {
    ChangeBy {
        operator: "alice".into(),
        reason: "settlement test".into(),
    }
}

/// A provider `psp` for queue `refunds`, read with the fake provider's
/// preset, amounts at `/amount` and `/currency`, and a lag of 0 (a job
/// succeeded in a covered period with no refund is missing at once).
async fn provider(h: &Harness) {
    let store = h.coordinator.store();
    store
        .put_provider(&PutProvider {
            name: P.into(),
            budget: Budget {
                rate_per_second: 1000.0,
                burst: 1000,
                max_in_flight: None,
                execute_cost: 1,
                reconcile_cost: 1,
            },
            queues: vec![Q.into()],
            by: by(),
        })
        .await
        .unwrap();
    store
        .put_settlement_settings(&PutSettlementSettings {
            provider: P.into(),
            preset: Some("fake".into()),
            mapping: Mapping::fake(),
            lag: std::time::Duration::ZERO,
            queues: vec![QueueAmounts {
                queue: Q.into(),
                amount_pointer: Some("/amount".into()),
                currency_pointer: Some("/currency".into()),
            }],
            by: by(),
        })
        .await
        .unwrap();
}

fn payload(amount: i64) -> String {
    format!("{{\"amount\":{amount},\"currency\":\"usd\"}}")
}

/// A job of `key` completed with provider reference `re_<key>`.
async fn succeeded(h: &Harness, key: &str, amount: i64) -> u64 {
    let job = h.enqueue(Q, key, &payload(amount)).await;
    let claimed = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: claimed.job_id,
            attempt: claimed.attempt,
            provider_reference: format!("re_{key}"),
            result: String::new(),
        })
        .await
        .unwrap();
    job.job_id
}

/// A job of `key` failed with `disposition`.
async fn failed(h: &Harness, key: &str, disposition: FailDisposition) -> u64 {
    let job = h.enqueue(Q, key, &payload(500)).await;
    let claimed = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .fail(FailRequest {
            job_id: claimed.job_id,
            attempt: claimed.attempt,
            disposition: disposition as i32,
            error: "the provider said nothing clear".into(),
            retry_delay: None,
            provider_retry_after: None,
        })
        .await
        .unwrap();
    job.job_id
}

/// A fake-provider report line.
fn line(n: u64, reference: &str, key: &str, amount: i64, status: &str) -> RawLine {
    RawLine {
        line: n,
        fields: [
            ("id", reference.to_owned()),
            ("merchant_reference", key.to_owned()),
            ("amount", amount.to_string()),
            ("currency", "usd".to_owned()),
            ("status", status.to_owned()),
            ("created", "1764547200".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
    }
}

fn day(s: &str) -> DbTime {
    DbTime::parse_from_str(&format!("{s} 00:00:00"), "%Y-%m-%d %H:%M:%S").unwrap()
}

/// Imports `lines` as the report of a period covering every job a test
/// makes (2000–2100), by `operator`.
async fn import(h: &Harness, lines: &[RawLine]) -> ImportSummary {
    let mut import = h
        .coordinator
        .start_import(ImportHeader {
            provider: P.into(),
            period: (day("2000-01-01"), day("2100-01-01")),
            operator: "alice".into(),
            check_only: false,
        })
        .await
        .unwrap();
    import.lines(lines).await.unwrap();
    import.finish().await.unwrap()
}

async fn unresolved(h: &Harness) -> Vec<(ExceptionKind, String)> {
    let mut found: Vec<(ExceptionKind, String)> = h
        .coordinator
        .store()
        .list_settlement_exceptions(
            Some(P),
            &[ExceptionState::Open, ExceptionState::Acknowledged],
            None,
            100,
        )
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.kind, e.subject))
        .collect();
    found.sort();
    found
}

#[tokio::test]
async fn each_outcome_of_a_report() {
    let h = Harness::start().await;
    provider(&h).await;
    let ok = succeeded(&h, "refund-ok", 500).await;
    let twice = succeeded(&h, "refund-twice", 500).await;
    let _missing = succeeded(&h, "refund-missing", 500).await;
    let _short = succeeded(&h, "refund-short", 500).await;
    let failed_job = failed(&h, "refund-failed", FailDisposition::Failed).await;
    let parked = failed(&h, "refund-parked", FailDisposition::ManualReview).await;
    let report = [
        line(2, "re_ok", "refund-ok", 500, "succeeded"),
        line(3, "re_t1", "refund-twice", 500, "succeeded"),
        line(4, "re_t2", "refund-twice", 500, "succeeded"),
        line(5, "re_f", "refund-failed", 500, "succeeded"),
        line(6, "re_p", "refund-parked", 500, "succeeded"),
        line(7, "re_s", "refund-short", 499, "succeeded"),
        line(8, "re_x", "made-by-hand", 700, "succeeded"),
        line(9, "re_pending", "refund-pending", 100, "pending"),
    ];
    let summary = import(&h, &report).await;
    assert_eq!(summary.lines.new, 8, "{summary:?}");
    assert_eq!(summary.decided.resolved.len(), 1, "{summary:?}");
    let row = h.row(parked).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.provider_reference.as_deref(), Some("re_p"));
    assert_eq!(h.row(ok).await.state, JobState::Succeeded);
    assert_eq!(
        h.row(failed_job).await.state,
        JobState::Failed,
        "never a silent rewrite"
    );
    assert_eq!(
        unresolved(&h).await,
        vec![
            (ExceptionKind::DoubleRefund, "refund-twice".into()),
            (ExceptionKind::RefundNotRecorded, "refund-failed".into()),
            (ExceptionKind::MissingAtProvider, "refund-missing".into()),
            (ExceptionKind::AmountMismatch, "refund-short".into()),
            (ExceptionKind::UnknownReference, "made-by-hand".into()),
        ]
    );
    let _ = twice;
    // The same report again changes nothing.
    let again = import(&h, &report).await;
    assert_eq!(again.lines.unchanged, 8, "{again:?}");
    assert_eq!(again.decided.exceptions_opened, 0, "{again:?}");
    h.finish().await;
}
