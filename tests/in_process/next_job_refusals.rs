//! Complete and Fail with a next-job request refused whole (docs/design.md
//! rule 16): a bad field of either half, every one named by its path in
//! the request; a next-job queue outside the caller's scope; a write on a
//! job of a queue outside it. Nothing is written and nothing handed out.

use jobfence_testkit as kit;

use crate::next_job::{complete_next, next, Q};
use jobfence_api::v1::{self as proto, FailDisposition, FailRequest};
use jobfence_domain::JobState;
use kit::secure::Secure;
use kit::{reason, Harness};
use tonic::Code;

/// Bad claim fields refuse the whole call: nothing written, not even
/// the write half.
#[tokio::test]
async fn a_bad_next_job_request_refuses_the_whole_call() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let mut req = complete_next(&a, "worker-a");
    if let Some(n) = req.next.as_mut() {
        n.max_jobs = 0;
        n.wait = Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        });
    }
    let status = h.client.clone().complete(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(&status), "INVALID_REQUEST");
    assert!(status.message().contains("next.wait"), "{status:?}");
    assert_eq!(h.row(a.job_id).await.state, JobState::Running);
    let mut req = complete_next(&a, "worker-a");
    req.next.as_mut().unwrap().max_jobs = 0;
    let status = h.client.clone().complete(req).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("max_jobs"), "{status:?}");
    assert_eq!(h.row(a.job_id).await.state, JobState::Running);
    assert_eq!(h.count_events(a.job_id, "completed").await, 0);
    h.finish().await;
}

/// Every field violation of both halves comes in one refusal, the claim
/// half's named by their path in the request (`next.max_jobs`), and
/// nothing is written.
#[tokio::test]
async fn both_halves_bad_fields_are_refused_together_by_their_paths() {
    use tonic_types::StatusExt as _;
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let fields = |status: tonic::Status| -> Vec<String> {
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let bad = status.get_details_bad_request().expect("BadRequest detail");
        bad.field_violations.into_iter().map(|v| v.field).collect()
    };
    let mut req = complete_next(&a, "worker-a");
    req.attempt = 0;
    let n = req.next.as_mut().unwrap();
    (n.max_jobs, n.worker_id, n.queue) = (0, String::new(), String::new());
    let status = h.client.clone().complete(req).await.unwrap_err();
    assert_eq!(
        fields(status),
        ["attempt", "next.queue", "next.worker_id", "next.max_jobs"]
    );
    let fail = FailRequest {
        job_id: a.job_id,
        attempt: a.attempt,
        disposition: FailDisposition::Unspecified as i32,
        error: String::new(),
        retry_delay: None,
        provider_retry_after: None,
        next: next(Q, "worker-a").map(|mut n| {
            n.wait = Some(prost_types::Duration {
                seconds: -5,
                nanos: 0,
            });
            n
        }),
    };
    let status = h.client.clone().fail(fail).await.unwrap_err();
    assert_eq!(fields(status), ["disposition", "error", "next.wait"]);
    // A Complete's write fields join a conversion refusal of its claim
    // half too (`next.wait` is refused before the coordinator runs).
    let mut req = complete_next(&a, "worker-a");
    req.attempt = 0;
    req.next.as_mut().unwrap().wait = Some(prost_types::Duration {
        seconds: -5,
        nanos: 0,
    });
    let status = h.client.clone().complete(req).await.unwrap_err();
    assert_eq!(fields(status), ["attempt", "next.wait"]);
    assert_eq!(h.row(a.job_id).await.state, JobState::Running);
    assert_eq!(h.count_events(a.job_id, "completed").await, 0);
    h.finish().await;
}

/// A worker scoped to `refunds` asking for its next job from `payouts`
/// is refused before anything runs: its own job stays running.
#[tokio::test]
async fn a_queue_scoped_worker_cannot_take_another_queues_next_job() {
    let s = Secure::start(false).await;
    let job = s.running("refund-1").await;
    let mut refunds = s.worker(Some("refunds-worker")).await;
    let mut req = complete_next(&job, "w");
    req.next = next("payouts", "w");
    let status = refunds.complete(req).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(reason(&status), "QUEUE_NOT_ALLOWED");
    assert_eq!(kit::meta(&status, "queue"), "payouts");
    let state: String = sqlx::query_scalar("SELECT CAST(state AS CHAR) FROM jobs WHERE id = ?")
        .bind(job.job_id)
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(state, "running", "nothing of the write applied");
    // Its own queue is fine.
    let r = refunds
        .complete(complete_next(&job, "w"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.job.is_some());
    s.stop().await;
}

/// A worker scoped to `payouts` completing a job of `refunds` (which it
/// does not hold) and asking for its next job from `payouts`: the write's
/// scope refusal is the whole call's, as without a next-job request, and
/// no payout is handed out.
#[tokio::test]
async fn a_write_on_a_job_outside_the_callers_scope_refuses_its_next_job_too() {
    let s = Secure::start(false).await;
    let refund = s.running("refund-1").await;
    let mut payouts = s.worker(Some("payouts-worker")).await;
    payouts
        .enqueue(proto::EnqueueRequest {
            queue: "payouts".into(),
            operation_key: "payout-1".into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap();
    let mut req = complete_next(&refund, "w");
    req.next = next("payouts", "w");
    let status = payouts.complete(req).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(reason(&status), "QUEUE_NOT_ALLOWED");
    assert_eq!(kit::meta(&status, "queue"), "refunds");
    let rows: Vec<(String, String, u64)> = sqlx::query_as(
        "SELECT CAST(operation_key AS CHAR), CAST(state AS CHAR), attempt FROM jobs \
         ORDER BY operation_key",
    )
    .fetch_all(&s.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("payout-1".into(), "ready".into(), 0),
            ("refund-1".into(), "running".into(), 1)
        ],
        "nothing written, no payout handed out"
    );
    s.stop().await;
}
