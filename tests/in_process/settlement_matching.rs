//! How a report's line finds its job (docs/design.md rule 15): a line
//! that names no operation key by the provider reference a job (or a
//! pruned job's key record) recorded, reading only the rows it finds; and
//! an operation key two of the provider's queues hold, by the job whose
//! recorded reference is the line's, or, when the report cannot tell them
//! apart, an exception that names each queue.

use jobfence_testkit as kit;

use crate::settlement::{import, provider, succeeded, unresolved, Q};
use jobfence_domain::settlement::records::QueueAmounts;
use jobfence_domain::settlement::ExceptionKind;
use kit::settlement::line;
use kit::Harness;
use sqlx::MySqlConnection;
use std::collections::BTreeMap;

/// `line` without its operation key (a refund made by hand, or one whose
/// metadata lacks the key).
fn keyless(n: u64, reference: &str, amount: i64) -> jobfence_domain::settlement::mapping::RawLine {
    let mut l = line(n, reference, "", amount, "succeeded");
    l.fields.remove("merchant_reference");
    l
}

/// A refund made by hand names no key: it is matched by the provider
/// reference its job recorded on Complete, and one no job recorded is an
/// UNKNOWN_REFERENCE under its reference.
#[tokio::test]
async fn a_line_with_no_key_is_matched_by_the_reference_its_job_recorded() {
    let h = Harness::start().await;
    provider(&h).await;
    succeeded(&h, "refund-known", 500).await;
    let summary = import(
        &h,
        &[
            keyless(2, "re_refund-known", 500),
            keyless(3, "re_by-hand", 700),
        ],
    )
    .await;
    assert_eq!(summary.lines.new, 2, "{summary:?}");
    assert_eq!(summary.decided.matched, 1, "{summary:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::UnknownReference, "re_by-hand".into())]
    );
    let key: Option<String> = sqlx::query_scalar(
        "SELECT CAST(operation_key AS CHAR) FROM settlement_lines WHERE provider_reference = 're_refund-known'",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(
        key.as_deref(),
        Some("refund-known"),
        "the line took its job's key"
    );
    h.finish().await;
}

/// The session's `Handler_read…` counters, by name.
async fn handler_reads(conn: &mut MySqlConnection) -> BTreeMap<String, i64> {
    let rows: Vec<(String, String)> = sqlx::query_as("SHOW SESSION STATUS LIKE 'Handler_read%'")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    rows.into_iter()
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect()
}

/// Handler reads between `before` and `after`, all counters together.
fn moved(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>) -> i64 {
    after
        .iter()
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
        .sum()
}

const MANY: u64 = 5_000;

/// A derived table `(i)` of 1 to [`MANY`] (the test server allows 1,000
/// recursions of a common table expression).
fn numbers() -> String {
    let digit = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                 UNION ALL SELECT 8 UNION ALL SELECT 9)";
    format!(
        "(SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS i \
         FROM {digit} a, {digit} b, {digit} c, {digit} e \
         HAVING i <= {MANY}) AS n"
    )
}

/// `MANY` succeeded jobs of the queue with references `re_bulk_<i>`, and
/// as many key records of pruned ones with `re_pruned_<i>`.
async fn fill(h: &Harness) {
    sqlx::query(&format!(
        "INSERT INTO jobs (queue, operation_key, request_digest, payload, state, attempt, \
         run_at, provider_reference, created_at, updated_at, finished_at) \
         SELECT ?, CONCAT('bulk-', i), UNHEX(SHA2(i, 256)), '{{}}', 'succeeded', 1, \
         UTC_TIMESTAMP(6), CONCAT('re_bulk_', i), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), \
         UTC_TIMESTAMP(6) FROM {numbers}",
        numbers = numbers()
    ))
    .bind(Q)
    .execute(&h.pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO operation_keys (queue, operation_key, request_digest, job_id, final_state, \
         attempt, dispatch_count, provider_reference, created_at, finished_at, pruned_at) \
         SELECT ?, CONCAT('pruned-', i), UNHEX(SHA2(i, 256)), 1000000 + i, 'succeeded', 1, 1, \
         CONCAT('re_pruned_', i), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) FROM {numbers}",
        numbers = numbers()
    ))
    .bind(Q)
    .execute(&h.pool)
    .await
    .unwrap();
}

/// The lookup of a keyless line's reference reads the rows it finds, not
/// the jobs of the provider's queues: with 5,000 jobs and 5,000 key
/// records in the queue, three references (a job's, a key record's, and
/// one nobody recorded) cost a handful of handler reads, counted on the
/// session that runs the store's own statement. (Before the index on
/// `(queue, provider_reference)` (migration 20261215000001), the same
/// statement read both tables whole for the queue: 20,021 handler reads;
/// with it, 28.)
#[tokio::test]
async fn matching_by_reference_reads_the_rows_it_finds_not_every_job_of_the_queues() {
    let h = Harness::start().await;
    provider(&h).await;
    fill(&h).await;
    sqlx::query("ANALYZE TABLE jobs, operation_keys")
        .execute(&h.pool)
        .await
        .unwrap();
    let queues = [
        QueueAmounts {
            queue: Q.into(),
            amount_pointer: None,
            currency_pointer: None,
        },
        QueueAmounts {
            queue: "refunds-other".into(),
            amount_pointer: None,
            currency_pointer: None,
        },
    ];
    let refs = ["re_bulk_4321", "re_pruned_17", "re_nobody"];
    let mut conn = h.pool.acquire().await.unwrap();
    // Prepared, and the counters' own read measured, before the window.
    jobfence_store::settlement::keys_by_reference(&mut conn, &queues, &refs)
        .await
        .unwrap();
    let a = handler_reads(&mut conn).await;
    let b = handler_reads(&mut conn).await;
    let own = moved(&a, &b);
    let before = handler_reads(&mut conn).await;
    let found = jobfence_store::settlement::keys_by_reference(&mut conn, &queues, &refs)
        .await
        .unwrap();
    let after = handler_reads(&mut conn).await;
    let reads = moved(&before, &after) - own;
    let keys: Vec<(&str, &str, bool)> = found
        .iter()
        .map(|(r, by)| (r.as_str(), by.operation_key.as_str(), by.pruned))
        .collect();
    assert_eq!(
        keys,
        [
            ("re_bulk_4321", "bulk-4321", false),
            ("re_pruned_17", "pruned-17", true)
        ]
    );
    eprintln!(
        "matching three references among {MANY} jobs and {MANY} key records: {reads} handler reads"
    );
    assert!(
        reads < 50,
        "{reads} handler reads for three references among {MANY} jobs and {MANY} key records"
    );
    drop(conn);
    h.finish().await;
}

/// The provider's second queue.
const EU: &str = "refunds-eu";

/// `psp` for the queues `refunds` and `refunds-eu`, amounts compared in
/// both.
async fn two_queues(h: &Harness) {
    use jobfence_domain::budget::Budget;
    use jobfence_domain::providers::PutProvider;
    use jobfence_domain::settlement::mapping::Mapping;
    use jobfence_domain::settlement::records::PutSettlementSettings;
    let store = h.coordinator.store();
    store
        .put_provider(&PutProvider {
            name: kit::settlement::P.into(),
            budget: Budget {
                rate_per_second: 1000.0,
                burst: 1000,
                max_in_flight: None,
                execute_cost: 1,
                reconcile_cost: 1,
                per_key: Default::default(),
            },
            queues: vec![Q.into(), EU.into()],
            by: kit::settlement::by(),
        })
        .await
        .unwrap();
    let amounts = |queue: &str| QueueAmounts {
        queue: queue.into(),
        amount_pointer: Some("/amount".into()),
        currency_pointer: Some("/currency".into()),
    };
    store
        .put_settlement_settings(&PutSettlementSettings {
            provider: kit::settlement::P.into(),
            preset: Some("fake".into()),
            mapping: Mapping::fake(),
            lag: std::time::Duration::ZERO,
            queues: vec![amounts(Q), amounts(EU)],
            by: kit::settlement::by(),
        })
        .await
        .unwrap();
}

/// A job of `key` on `queue`, parked for a person (manual_review) with no
/// provider reference.
async fn parked(h: &Harness, queue: &str, key: &str) -> u64 {
    use jobfence_api::v1::{FailDisposition, FailRequest};
    let job = h
        .enqueue(queue, key, &crate::settlement::payload(500))
        .await;
    let claimed = h.claim_one(queue, "w").await;
    h.client
        .clone()
        .fail(FailRequest {
            job_id: claimed.job_id,
            attempt: claimed.attempt,
            disposition: FailDisposition::ManualReview as i32,
            error: "the provider said nothing clear".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    job.job_id
}

/// A job of `key` on `queue`, completed with `reference`.
async fn completed(h: &Harness, queue: &str, key: &str, reference: &str) -> u64 {
    use jobfence_api::v1::CompleteRequest;
    let job = h
        .enqueue(queue, key, &crate::settlement::payload(500))
        .await;
    let claimed = h.claim_one(queue, "w").await;
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: claimed.job_id,
            attempt: claimed.attempt,
            provider_reference: reference.into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    job.job_id
}

async fn state_of(h: &Harness, job_id: u64) -> String {
    sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM jobs WHERE id = ?")
        .bind(job_id)
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// An operation key both of the provider's queues used: its refund is the
/// job's whose recorded provider reference it is (decided as the line is
/// inserted), not the oldest job's, whose manual review it leaves alone.
#[tokio::test]
async fn a_key_in_two_queues_goes_to_the_job_that_recorded_its_refund() {
    let h = Harness::start().await;
    two_queues(&h).await;
    let older = parked(&h, Q, "k-both").await;
    let newer = completed(&h, EU, "k-both", "re_k-both").await;
    assert!(older < newer);
    let summary = import(&h, &[line(2, "re_k-both", "k-both", 500, "succeeded")]).await;
    assert_eq!(summary.decided.matched, 1, "{summary:?}");
    assert!(summary.decided.resolved.is_empty(), "{summary:?}");
    assert_eq!(unresolved(&h).await, vec![]);
    assert_eq!(state_of(&h, older).await, "manual_review");
    h.finish().await;
}

/// When no single job of the key recorded the refund's reference and the
/// jobs would be decided differently, the refund is an AMBIGUOUS_KEY that
/// names each queue and job, and neither manual review is resolved.
#[tokio::test]
async fn a_key_in_two_queues_no_job_recorded_is_an_exception_naming_each_queue() {
    let h = Harness::start().await;
    two_queues(&h).await;
    let first = parked(&h, Q, "k-unsure").await;
    let second = parked(&h, EU, "k-unsure").await;
    let summary = import(&h, &[line(2, "re_k-unsure", "k-unsure", 500, "succeeded")]).await;
    assert!(summary.decided.resolved.is_empty(), "{summary:?}");
    assert_eq!(summary.decided.exceptions_opened, 1, "{summary:?}");
    assert_eq!(
        unresolved(&h).await,
        vec![(ExceptionKind::AmbiguousKey, "k-unsure".into())]
    );
    let listed = h
        .coordinator
        .settlement_exceptions(None, &[], None, 10)
        .await
        .unwrap()
        .exceptions;
    let detail = &listed[0].detail;
    for named in [
        format!("job {first} of queue {Q} (manual_review)"),
        format!("job {second} of queue {EU} (manual_review)"),
    ] {
        assert!(detail.contains(&named), "{detail}");
    }
    assert_eq!(listed[0].job_id, Some(first));
    assert_eq!(state_of(&h, first).await, "manual_review");
    assert_eq!(state_of(&h, second).await, "manual_review");
    h.finish().await;
}
