//! The Rust refund worker meeting the fake provider's rate limit: a 429 to
//! a send or to a lookup is reported to the coordinator with the provider's
//! Retry-After, and the coordinator holds the provider's hand-outs for it.
//! These tests also need the test database (an in-process coordinator,
//! `crates/testkit/src`).

use super::*;

/// A harness whose queue dispatches to the provider `fake` (a budget far
/// above what the test spends), and a fake provider whose one-request
/// burst is already spent, on a clock that stands still: its next `/v1`
/// request is refused with a Retry-After of exactly [`RETRY_AFTER`].
async fn throttling_provider() -> (
    kit::Harness,
    JobAdminClient<tonic::transport::Channel>,
    ProviderHandle,
    ProviderClient,
) {
    let h = kit::Harness::start().await;
    let mut admin = JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap();
    admin
        .put_provider(PutProviderRequest {
            name: "fake".into(),
            budget: Some(ProviderBudget {
                rate_per_second: 1000.0,
                burst: 100,
                ..ProviderBudget::default()
            }),
            queues: vec![WORKER_QUEUE.into()],
            operator: "test".into(),
            reason: "the fake provider's budget".into(),
        })
        .await
        .expect("put the provider");
    let (handle, client) = limited_provider(RateLimitConfig::per_second(0.01)).await;
    client
        .find_by_merchant_reference("someone-else", OK)
        .await
        .expect("the one request of the burst");
    (h, admin, handle, client)
}

/// Claims the one due job with the SDK and lets the refund worker's handler
/// handle it.
async fn run_the_refund_worker(h: &kit::Harness, provider: &ProviderClient) {
    let worker = WorkerClient::connect(
        format!("http://{}", h.addr),
        WorkerConfig::new("rust-refund-worker", WORKER_QUEUE),
    )
    .await
    .unwrap();
    let mut jobs = worker.claim(1).await.expect("claim");
    assert_eq!(jobs.len(), 1, "one job is due");
    let handler = RefundHandler::new(provider.clone(), RefundTimings::default());
    handler
        .handle(&mut jobs[0])
        .await
        .expect("the handler writes back");
}

/// The provider's throttle as the coordinator stored it: reports received,
/// and how long from now (database clock) it holds hand-outs.
async fn stored_throttle(
    h: &kit::Harness,
    admin: &mut JobAdminClient<tonic::transport::Channel>,
) -> (u64, Duration) {
    let listed = admin
        .list_providers(ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .providers;
    assert_eq!(listed.len(), 1);
    let held_us: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), throttled_until) FROM providers WHERE name = 'fake'",
    )
    .fetch_one(&h.pool)
    .await
    .expect("the provider is throttled");
    (
        listed[0].throttle_reports,
        Duration::from_micros(u64::try_from(held_us).expect("in the future")),
    )
}

/// How long from now (database clock) the job is due again.
async fn due_in(h: &kit::Harness, job_id: u64) -> Duration {
    let us: i64 = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), run_at) FROM jobs WHERE id = ?",
    )
    .bind(job_id)
    .fetch_one(&h.pool)
    .await
    .unwrap();
    Duration::from_micros(u64::try_from(us).expect("due in the future"))
}

/// Within the time the test took since the Fail: `d` counts down from
/// [`RETRY_AFTER`] on the database clock.
fn about_retry_after(d: Duration) -> bool {
    d <= RETRY_AFTER && d > RETRY_AFTER - Duration::from_secs(30)
}

const PAYLOAD: &str = r#"{"payment_id":"pay_1","amount":500,"currency":"twd"}"#;

#[tokio::test]
async fn the_refund_worker_reports_a_429_to_a_send_with_provider_retry_after() {
    let (h, mut admin, handle, provider) = throttling_provider().await;
    let job = h.enqueue(WORKER_QUEUE, "refund-pay_1-500", PAYLOAD).await;

    run_the_refund_worker(&h, &provider).await;

    // The send was refused before anything was done: the same send, later.
    let row = h.row(job.job_id).await;
    assert_eq!(
        (row.state, row.next_action),
        (JobState::Ready, NextAction::Execute)
    );
    assert!(
        row.last_error.as_deref().unwrap_or("").contains("429"),
        "{:?}",
        row.last_error
    );
    let due = due_in(&h, job.job_id).await;
    assert!(about_retry_after(due), "due again in {due:?}");
    // The Fail carried the provider's Retry-After: the coordinator holds
    // the provider's hand-outs for every worker until then.
    let (reports, held) = stored_throttle(&h, &mut admin).await;
    assert_eq!(reports, 1);
    assert!(about_retry_after(held), "held for {held:?}");
    assert_eq!(
        provider
            .ledger()
            .await
            .unwrap()
            .by_merchant_reference("refund-pay_1-500")
            .refunds,
        0
    );
    assert_eq!(handle.stats().rate_limited, 1);
    h.finish().await;
}

#[tokio::test]
async fn the_refund_worker_reports_a_429_to_a_lookup_with_provider_retry_after() {
    let (h, mut admin, handle, provider) = throttling_provider().await;
    let job = h.enqueue(WORKER_QUEUE, "refund-pay_1-500", PAYLOAD).await;
    // Its first worker vanished: the job comes back as a takeover, which
    // reconciles first.
    h.claim_one(WORKER_QUEUE, "vanished").await;
    h.force_lease_expired(job.job_id).await;

    run_the_refund_worker(&h, &provider).await;

    let row = h.row(job.job_id).await;
    assert_eq!(
        (row.state, row.next_action, row.attempt),
        (JobState::Ready, NextAction::Reconcile, 2),
        "a lookup refused is a reconcile still to do, never a send"
    );
    let due = due_in(&h, job.job_id).await;
    assert!(about_retry_after(due), "due again in {due:?}");
    let (reports, held) = stored_throttle(&h, &mut admin).await;
    assert_eq!(reports, 1);
    assert!(about_retry_after(held), "held for {held:?}");
    assert_eq!(handle.stats().rate_limited, 1);
    h.finish().await;
}

/// Handles the one due job of [`WORKER_QUEUE`] with the Rust refund
/// worker's handler (retry delays of zero, so the next hand-out is due at
/// once) and returns the provider requests it made.
async fn requests_of_one_hand_out(
    h: &kit::Harness,
    handle: &ProviderHandle,
    provider: &ProviderClient,
) -> (NextAction, u64) {
    let worker = WorkerClient::connect(
        format!("http://{}", h.addr),
        WorkerConfig::new("rust-refund-worker", WORKER_QUEUE),
    )
    .await
    .unwrap();
    let mut jobs = worker.claim(1).await.expect("claim");
    assert_eq!(jobs.len(), 1, "one job is due");
    let action = match jobs[0].next_action() {
        jobfence_worker::proto::NextAction::Reconcile => NextAction::Reconcile,
        _ => NextAction::Execute,
    };
    let timings = RefundTimings {
        reconcile_delay: Duration::ZERO,
        resend_delay: Duration::ZERO,
        ..RefundTimings::default()
    };
    let before = handle.stats().requests;
    RefundHandler::new(provider.clone(), timings)
        .handle(&mut jobs[0])
        .await
        .expect("the handler writes back");
    (action, handle.stats().requests - before)
}

// A provider budget can only keep a worker under the provider's limit if
// the cost of a hand-out covers every call the worker makes for it: the
// demo charges execute 1 and reconcile 2 for the refund workers' queue.
// Evidence handed over with a claim is checked with one lookup however
// many observations the job has, and a send never follows evidence the
// provider could not confirm in the same hand-out.
#[tokio::test]
async fn the_refund_worker_calls_the_provider_at_most_once_per_execute_and_twice_per_reconcile() {
    let h = kit::Harness::start().await;
    let (handle, provider) = default_provider().await;
    let job = h.enqueue(WORKER_QUEUE, "refund-pay_1-500", PAYLOAD).await;
    let first = h.claim_one(WORKER_QUEUE, "gone").await;
    // Two late receipts the provider cannot confirm (no such refunds).
    for reference in ["re_unknown_1", "re_unknown_2"] {
        h.client
            .clone()
            .record_observation(jobfence_api::v1::RecordObservationRequest {
                job_id: job.job_id,
                attempt: first.attempt,
                source: jobfence_api::v1::ObservationSource::Worker as i32,
                outcome: jobfence_api::v1::ObservationOutcome::Succeeded as i32,
                provider_reference: reference.into(),
                body: "{}".into(),
                dedup_key: format!("gone:{reference}"),
            })
            .await
            .expect("record the observation");
    }
    h.client
        .clone()
        .fail(jobfence_api::v1::FailRequest {
            job_id: job.job_id,
            attempt: first.attempt,
            disposition: jobfence_api::v1::FailDisposition::RetryExecute as i32,
            error: "gone".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .expect("a resend inside the window");

    // The send carries the evidence: one lookup, no send after it.
    assert_eq!(
        requests_of_one_hand_out(&h, &handle, &provider).await,
        (NextAction::Execute, 1)
    );
    let row = h.row(job.job_id).await;
    assert_eq!(
        (row.state, row.next_action),
        (JobState::Ready, NextAction::Reconcile),
        "evidence not confirmed: reconcile before any send"
    );
    // The reconcile: the evidence, then the lookup by merchant reference.
    assert_eq!(
        requests_of_one_hand_out(&h, &handle, &provider).await,
        (NextAction::Reconcile, 2)
    );
    assert_eq!(
        provider
            .ledger()
            .await
            .unwrap()
            .by_merchant_reference("refund-pay_1-500")
            .refunds,
        0,
        "nothing was sent"
    );
    h.finish().await;
}
