//! Settlement (docs/design.md rule 15) against a real MariaDB: a
//! provider's report imported through the coordinator, matched by
//! operation key; each outcome, and the races and cuts that must not
//! change it.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    CompleteRequest, FailDisposition, FailRequest, ObservationSource, TakeoverRequest,
};
use jobfence_core::settlement::{ImportHeader, ImportSummary};
use jobfence_domain::settlement::mapping::RawLine;
use jobfence_domain::settlement::{ExceptionKind, ExceptionState};
use jobfence_domain::JobState;
use kit::Harness;

pub(crate) use kit::settlement::{day, line, until_now, P, Q};

/// A provider `psp` for queue `refunds`, read with the fake provider's
/// preset, amounts at `/amount` and `/currency`, and a lag of 0 (a job
/// succeeded in a covered period with no refund is missing at once).
pub(crate) async fn provider(h: &Harness) {
    provider_on(h.coordinator.store(), true).await;
}

pub(crate) use kit::settlement::provider_on;

pub(crate) fn payload(amount: i64) -> String {
    format!("{{\"amount\":{amount},\"currency\":\"usd\"}}")
}

/// A job of `key` completed with provider reference `re_<key>`.
pub(crate) async fn succeeded(h: &Harness, key: &str, amount: i64) -> u64 {
    let job = h.enqueue(Q, key, &payload(amount)).await;
    let claimed = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: claimed.job_id,
            attempt: claimed.attempt,
            provider_reference: format!("re_{key}"),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    job.job_id
}

/// A job of `key` failed with `disposition`.
pub(crate) async fn failed(h: &Harness, key: &str, disposition: FailDisposition) -> u64 {
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
            next: None,
        })
        .await
        .unwrap();
    job.job_id
}

/// Imports `lines` as the report of a period covering every job a test
/// has made (from 2000 to now), by `alice`.
pub(crate) async fn import(h: &Harness, lines: &[RawLine]) -> ImportSummary {
    kit::settlement::import(&h.coordinator, P, lines).await
}

pub(crate) async fn unresolved(h: &Harness) -> Vec<(ExceptionKind, String)> {
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
    let d = &summary.decided;
    assert_eq!(
        (d.matched, d.undecided, d.observed),
        (2, 1, 0),
        "matched: refund-ok and refund-short; undecided: the pending line; {summary:?}"
    );
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

/// A batch's keys and references travel to the database as one JSON
/// document (crates/store/src/settlement/mod.rs, `json_list`): a quote, a
/// backslash, a tab or a character outside ASCII arrives intact and
/// matches its job, and a key that differs from a job's only in case
/// matches nothing (the keys compare byte for byte, as the jobs' index
/// does). The same report again is held line for line. Fails when the
/// JSON is not escaped: the database refuses the document.
#[tokio::test]
async fn keys_and_references_of_any_bytes_match_exactly() {
    let h = Harness::start().await;
    provider(&h).await;
    let keys = [
        "say \"hi\"",
        "back\\slash",
        "tab\there",
        "ünï-💸",
        "Case-Key",
    ];
    for k in keys {
        succeeded(&h, k, 500).await;
    }
    let mut report: Vec<RawLine> = keys[..4]
        .iter()
        .enumerate()
        .map(|(i, k)| line(i as u64 + 2, &format!("re_{k}"), k, 500, "succeeded"))
        .collect();
    report.push(line(6, "re_case", "case-key", 500, "succeeded"));
    let summary = import(&h, &report).await;
    assert_eq!(summary.lines.new, 5, "{summary:?}");
    assert_eq!(summary.decided.matched, 4, "{summary:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![
            (ExceptionKind::MissingAtProvider, "Case-Key".into()),
            (ExceptionKind::UnknownReference, "case-key".into()),
        ]
    );
    let again = import(&h, &report).await;
    assert_eq!(again.lines.unchanged, 5, "{again:?}");
    assert_eq!(again.decided.exceptions_opened, 0, "{again:?}");
    h.finish().await;
}

/// A settled refund of a job that is still ready or running changes
/// nothing of the job: the line is kept as a SETTLEMENT observation, and
/// the reconcile of the takeover that follows hands it to the worker.
#[tokio::test]
async fn a_settled_refund_of_a_running_job_is_only_an_observation_its_reconcile_sees() {
    let h = Harness::start().await;
    provider(&h).await;
    let job = h.enqueue(Q, "refund-live", &payload(500)).await;
    let held = h.claim_one(Q, "worker-a").await;
    assert_eq!(held.job_id, job.job_id);
    let summary = import(&h, &[line(2, "re_live", "refund-live", 500, "succeeded")]).await;
    assert_eq!(summary.decided.observed, 1, "{summary:?}");
    assert!(summary.decided.resolved.is_empty(), "{summary:?}");
    let row = h.row(job.job_id).await;
    assert_eq!(
        (row.state, row.attempt, row.provider_reference),
        (JobState::Running, held.attempt, None),
        "the job itself is untouched"
    );
    assert!(unresolved(&h).await.is_empty());
    h.force_lease_expired(job.job_id).await;
    let taken = h
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: job.job_id,
            worker_id: "worker-b".into(),
            lease: kit::secs(30),
        })
        .await
        .unwrap()
        .into_inner()
        .claimed
        .unwrap();
    let seen: Vec<(i32, String)> = taken
        .observations
        .iter()
        .map(|o| (o.source, o.provider_reference.clone()))
        .collect();
    assert_eq!(
        seen,
        vec![(ObservationSource::Settlement as i32, "re_live".to_owned())],
        "the reconcile sees the provider's own record"
    );
    h.finish().await;
}

/// A pruned job is matched through its key record (docs/design.md rule
/// 14): a settled refund of a pruned succeeded job is matched, one of a
/// pruned failed job is a refund not recorded.
#[tokio::test]
async fn a_pruned_job_is_matched_through_its_key_record() {
    let h = Harness::start().await;
    provider(&h).await;
    let ok = succeeded(&h, "refund-ok", 500).await;
    let failed_job = failed(&h, "refund-failed", FailDisposition::Failed).await;
    sqlx::query("UPDATE jobs SET finished_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 40 DAY)")
        .execute(&h.pool)
        .await
        .unwrap();
    let retention = jobfence_domain::Retention {
        jobs: std::time::Duration::from_secs(30 * 86_400),
        keys: None,
    };
    h.coordinator
        .store()
        .prune(&retention, 500, |_| {})
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "both jobs pruned");
    let summary = import(
        &h,
        &[
            line(2, "re_ok", "refund-ok", 500, "succeeded"),
            line(3, "re_f", "refund-failed", 500, "succeeded"),
        ],
    )
    .await;
    assert_eq!(summary.decided.matched, 1, "{summary:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::RefundNotRecorded, "refund-failed".into())],
        "the pruned succeeded job matched; its key record's failed one is an exception"
    );
    let e = &h
        .coordinator
        .store()
        .list_settlement_exceptions(Some(P), &[ExceptionState::Open], None, 10)
        .await
        .unwrap()[0];
    assert_eq!(e.job_id, Some(failed_job));
    let _ = ok;
    h.finish().await;
}

/// A refund seen again with a new status is updated and its key matched
/// again: pending decides nothing, settled resolves the review; a second
/// refund that later fails is no longer a double refund.
#[tokio::test]
async fn a_line_seen_again_with_a_new_status_is_matched_again() {
    let h = Harness::start().await;
    provider(&h).await;
    let parked = failed(&h, "refund-parked", FailDisposition::ManualReview).await;
    let first = import(&h, &[line(2, "re_p", "refund-parked", 500, "pending")]).await;
    assert_eq!(
        (first.lines.new, first.decided.undecided),
        (1, 1),
        "{first:?}"
    );
    assert_eq!(
        h.row(parked).await.state,
        JobState::ManualReview,
        "pending decides nothing"
    );
    let second = import(&h, &[line(2, "re_p", "refund-parked", 500, "succeeded")]).await;
    assert_eq!(second.lines.updated, 1, "{second:?}");
    assert_eq!(second.decided.resolved, vec![(parked, "re_p".to_owned())]);
    assert_eq!(h.row(parked).await.state, JobState::Succeeded);

    let _twice = succeeded(&h, "refund-twice", 500).await;
    let both = [
        line(2, "re_t1", "refund-twice", 500, "succeeded"),
        line(3, "re_t2", "refund-twice", 500, "succeeded"),
    ];
    import(&h, &both).await;
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::DoubleRefund, "refund-twice".into())]
    );
    let reversed = import(
        &h,
        &[
            line(2, "re_t1", "refund-twice", 500, "succeeded"),
            line(3, "re_t2", "refund-twice", 500, "failed"),
        ],
    )
    .await;
    assert_eq!(reversed.decided.exceptions_resolved, 1, "{reversed:?}");
    assert!(
        unresolved(&h).await.is_empty(),
        "the second refund failed: no money moved twice"
    );
    h.finish().await;
}

/// Bad lines are refused with their numbers and nothing of them is
/// written; the import goes on. A mapping naming a column the report does
/// not have refuses the import; so do an unknown provider and a reversed
/// period, each naming its field.
#[tokio::test]
async fn bad_input_is_refused_with_its_line_or_field_and_writes_nothing() {
    let h = Harness::start().await;
    provider(&h).await;
    let _ok = succeeded(&h, "refund-ok", 500).await;
    let summary = import(
        &h,
        &[
            line(2, "re_ok", "refund-ok", 500, "succeeded"),
            line(3, "re_bad", "refund-x", 0, "succeeded"),
            line(4, "re_bad2", "refund-y", 10, "settled-ish"),
        ],
    )
    .await;
    assert_eq!(
        (summary.lines_read, summary.lines_refused),
        (3, 2),
        "{summary:?}"
    );
    let refused: Vec<(u64, &str)> = summary.refusals.iter().map(|r| (r.line, r.field)).collect();
    assert_eq!(refused, [(3, "amount"), (4, "status")]);
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM settlement_lines")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(stored, 1, "only the good line is written");

    let field_of = |e: jobfence_domain::CoordinatorError| match e {
        jobfence_domain::CoordinatorError::InvalidArgument(v) => v[0].field.clone(),
        other => panic!("refused with {other:?}"),
    };
    let header = |provider: &str, start: &str, end: &str| ImportHeader {
        provider: provider.into(),
        period: (day(start), day(end)),
        operator: "alice".into(),
        check_only: false,
        allow_empty: false,
    };
    let unknown = h
        .coordinator
        .start_import(header("nobody", "2000-01-01", "2020-01-01"))
        .await
        .err()
        .expect("an unknown provider is refused");
    assert_eq!(field_of(unknown), "provider");
    let reversed = h
        .coordinator
        .start_import(header(P, "2020-01-01", "2000-01-01"))
        .await
        .err()
        .expect("a reversed period is refused");
    assert_eq!(field_of(reversed), "period_end");
    let mut wrong_file = h
        .coordinator
        .start_import(header(P, "2000-01-01", "2020-01-01"))
        .await
        .unwrap();
    let mut no_amount = line(2, "re_z", "refund-z", 5, "succeeded");
    no_amount.fields.remove("amount");
    let refused = wrong_file.lines(&[no_amount]).await.unwrap_err();
    assert_eq!(field_of(refused), "columns.amount");
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM settlement_lines")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    assert_eq!(stored, 1, "nothing of the refused import is written");
    h.finish().await;
}

/// Two settled refunds of one key are a double refund whatever the job
/// recorded: here the job's own provider reference is one of them.
#[tokio::test]
async fn a_double_refund_is_raised_when_one_refund_is_the_jobs_own() {
    let h = Harness::start().await;
    provider(&h).await;
    let job = h.enqueue(Q, "d2", "{}").await;
    let claimed = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: claimed.job_id,
            attempt: claimed.attempt,
            provider_reference: "re_d2".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    let summary = import(
        &h,
        &[
            line(2, "re_d2", "d2", 500, "succeeded"),
            line(3, "re_d2b", "d2", 500, "succeeded"),
        ],
    )
    .await;
    assert_eq!(summary.decided.matched, 0, "{summary:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::DoubleRefund, "d2".into())],
        "job {}",
        job.job_id
    );
    h.finish().await;
}

/// A failed job whose refund the provider's report shows settled is a
/// refund not recorded, and it cannot be tried again as a new operation:
/// the money moved, and a new operation key would refund twice. A retry
/// made before the report showed it is still answered as a replay; one
/// reserved but never enqueued is not.
#[tokio::test]
async fn a_failed_job_the_provider_refunded_cannot_be_tried_again() {
    let h = Harness::start().await;
    provider(&h).await;
    let refunded = failed(&h, "refund-moved", FailDisposition::Failed).await;
    let declined = failed(&h, "refund-declined", FailDisposition::Failed).await;
    let cut = failed(&h, "refund-cut", FailDisposition::Failed).await;
    import(&h, &[line(2, "re_moved", "refund-moved", 500, "succeeded")]).await;
    assert_eq!(
        unresolved(&h).await,
        [(ExceptionKind::RefundNotRecorded, "refund-moved".to_owned())]
    );
    let retry = |job_id: u64, key: &str| jobfence_domain::admin::RetryJob {
        job_id,
        new_operation_key: Some(key.to_owned()),
        operator: "alice".into(),
        reason: "the customer asked again".into(),
    };
    let Err(refused) = h
        .coordinator
        .retry_as_new_operation(retry(refunded, "refund-moved-2"))
        .await
    else {
        panic!("a refunded job is not tried again");
    };
    match refused {
        jobfence_domain::CoordinatorError::InvalidArgument(v) => {
            assert_eq!(v[0].field, "job_id");
            assert!(v[0].description.contains("re_moved"), "{v:?}");
        }
        other => panic!("refused with {other:?}"),
    }
    let first = h
        .coordinator
        .retry_as_new_operation(retry(declined, "refund-declined-2"))
        .await
        .expect("a job the provider did not refund is tried again");
    // A later report shows that refund settled after all: the same
    // command again still answers the job it made, not a refusal that
    // would hide it.
    import(
        &h,
        &[line(3, "re_declined", "refund-declined", 500, "succeeded")],
    )
    .await;
    let again = h
        .coordinator
        .retry_as_new_operation(retry(declined, "refund-declined-2"))
        .await
        .expect("a replay is answered");
    assert_eq!((again.new.id, again.created), (first.new.id, false));

    // A retry cut off between its reservation and its enqueue made no
    // job: asked again once the report shows the refund settled, it is
    // refused like any new operation, not answered as a replay.
    h.coordinator
        .store()
        .reserve_retry(&retry(cut, "refund-cut-2"), "refund-cut-2")
        .await
        .expect("reserved, and then the call was cut off");
    import(&h, &[line(4, "re_cut", "refund-cut", 500, "succeeded")]).await;
    let Err(refused) = h
        .coordinator
        .retry_as_new_operation(retry(cut, "refund-cut-2"))
        .await
    else {
        panic!("a reservation with no job is no replay of a made operation");
    };
    assert!(format!("{refused:?}").contains("re_cut"), "{refused:?}");
    let made: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE operation_key = 'refund-cut-2'")
            .fetch_one(&h.pool)
            .await
            .unwrap();
    assert_eq!(made, 0, "no new operation for money that moved");
    h.finish().await;
}
