//! The resend policy (docs/design.md rule 6), lease renewal (and the seed's
//! matched-vs-changed rows trap), and Fail's dispositions, end to end.

use jobfence_testkit as kit;

use jobfence_api::v1::{FailDisposition, FailRequest, RenewLeaseRequest};
use jobfence_domain::{JobState, NextAction, QueuePolicy};
use jobfence_server::ServeOptions;
use kit::{reason, secs, test_config, Harness};
use std::time::Duration;

const Q: &str = "refunds";

async fn harness(resend_window: Duration, max_dispatches: u32) -> Harness {
    let mut config = test_config();
    config.policies.by_queue.insert(
        Q.into(),
        QueuePolicy {
            resend_window,
            max_dispatches,
        },
    );
    Harness::start_with(
        config,
        ServeOptions {
            health_interval: Duration::from_millis(100),
            health_timeout: Duration::from_millis(100),
            drain_delay: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(10),
        },
    )
    .await
}

fn fail(job_id: u64, attempt: u64, d: FailDisposition, delay_secs: i64) -> FailRequest {
    FailRequest {
        job_id,
        attempt,
        disposition: d as i32,
        error: "provider said not found".into(),
        retry_delay: secs(delay_secs),
        provider_retry_after: None,
        next: None,
    }
}

/// Moves the first dispatch of a job into the past, on test data.
async fn first_dispatched_ago(h: &Harness, job_id: u64, minutes: i64) {
    sqlx::query(
        "UPDATE jobs SET first_dispatched_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL ? MINUTE) WHERE id = ?",
    )
    .bind(minutes)
    .bind(job_id)
    .execute(&h.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_resend_inside_the_window_becomes_an_execute_retry() {
    let h = harness(Duration::from_secs(3600), 3).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    assert_eq!(a.dispatch_count, 1);
    let out = h
        .client
        .clone()
        .fail(fail(
            job.job_id,
            a.attempt,
            FailDisposition::RetryExecute,
            0,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::RetryExecute as i32);
    assert_eq!(out.override_reason, "");
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    assert_eq!(row.next_action, NextAction::Execute);
    assert_eq!(row.last_error.as_deref(), Some("provider said not found"));
    // The resend is a second dispatch with the same operation_key.
    let again = h.claim_one(Q, "worker-b").await;
    assert_eq!(
        again.next_action,
        jobfence_api::v1::NextAction::Execute as i32
    );
    assert_eq!(again.dispatch_count, 2);
    assert_eq!(again.operation_key, "refund-1");
    h.finish().await;
}

#[tokio::test]
async fn a_resend_outside_the_window_goes_to_manual_review() {
    let h = harness(Duration::from_secs(3600), 3).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    first_dispatched_ago(&h, job.job_id, 61).await;
    let out = h
        .client
        .clone()
        .fail(fail(
            job.job_id,
            a.attempt,
            FailDisposition::RetryExecute,
            0,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::ManualReview as i32);
    assert_eq!(out.override_reason, "RESEND_WINDOW_CLOSED");
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::ManualReview);
    assert_eq!(row.state_reason.as_deref(), Some("RESEND_WINDOW_CLOSED"));
    assert_eq!(row.lease_until, None);
    assert!(h.claim(Q, "worker-b", 10).await.is_empty());
    assert_eq!(h.count_events(job.job_id, "manual_review").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_resend_that_would_become_due_after_the_window_goes_to_manual_review() {
    let h = harness(Duration::from_secs(3600), 3).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    first_dispatched_ago(&h, job.job_id, 30).await;
    // Due again in 45 minutes: 75 minutes after the first dispatch.
    let out = h
        .client
        .clone()
        .fail(fail(
            job.job_id,
            a.attempt,
            FailDisposition::RetryExecute,
            45 * 60,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::ManualReview as i32);
    assert_eq!(out.override_reason, "RESEND_WINDOW_CLOSED");
    h.finish().await;
}

#[tokio::test]
async fn exhausted_dispatches_go_to_manual_review() {
    let h = harness(Duration::from_secs(3600), 2).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "w").await;
    let out = h
        .client
        .clone()
        .fail(fail(
            job.job_id,
            a.attempt,
            FailDisposition::RetryExecute,
            0,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::RetryExecute as i32);
    let b = h.claim_one(Q, "w").await;
    assert_eq!(b.dispatch_count, 2);
    let out = h
        .client
        .clone()
        .fail(fail(
            job.job_id,
            b.attempt,
            FailDisposition::RetryExecute,
            0,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::ManualReview as i32);
    assert_eq!(out.override_reason, "MAX_DISPATCHES_REACHED");
    assert_eq!(h.row(job.job_id).await.state, JobState::ManualReview);
    h.finish().await;
}

/// A resend is checked again when it is handed out (docs/design.md rule 6):
/// one that waited in the queue (or for the provider's budget) until its
/// window would close within the lease is not sent, and not handed out
/// either: it goes to manual review with the reason Fail gives.
#[tokio::test]
async fn an_execute_that_waited_past_the_window_is_parked_not_handed_out() {
    let h = harness(Duration::from_secs(3600), 3).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .fail(fail(
            job.job_id,
            a.attempt,
            FailDisposition::RetryExecute,
            0,
        ))
        .await
        .unwrap();
    // The queue was backed up: by the time it is claimed the window closed.
    first_dispatched_ago(&h, job.job_id, 90).await;
    assert!(
        h.claim(Q, "w", 5).await.is_empty(),
        "a resend past its window is never handed out"
    );
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::ManualReview);
    assert_eq!(row.state_reason.as_deref(), Some("RESEND_WINDOW_CLOSED"));
    assert_eq!(row.attempt, a.attempt, "nobody was handed a new attempt");
    assert_eq!(row.dispatch_count, 1, "nothing was dispatched again");
    assert_eq!(h.count_events(job.job_id, "manual_review").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn retry_as_reconcile_failed_and_manual_review_are_applied_as_asked() {
    let h = harness(Duration::from_secs(3600), 3).await;
    for (i, (d, state)) in [
        (FailDisposition::RetryReconcile, JobState::Ready),
        (FailDisposition::Failed, JobState::Failed),
        (FailDisposition::ManualReview, JobState::ManualReview),
    ]
    .into_iter()
    .enumerate()
    {
        let job = h.enqueue(Q, &format!("refund-{i}"), "{}").await;
        let a = h.claim_one(Q, "w").await;
        assert_eq!(a.job_id, job.job_id);
        let out = h
            .client
            .clone()
            .fail(fail(job.job_id, a.attempt, d, 600))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(out.applied, d as i32);
        let row = h.row(job.job_id).await;
        assert_eq!(row.state, state);
        assert_eq!(row.lease_until, None);
        assert_eq!(row.finished_at.is_some(), state == JobState::Failed);
        if d == FailDisposition::RetryReconcile {
            assert_eq!(row.next_action, NextAction::Reconcile);
            assert!(row.run_at > row.updated_at, "due after the delay");
        }
    }
    // The retried job is not due yet (run_at is 10 minutes out).
    assert!(h.claim(Q, "w", 10).await.is_empty());
    h.finish().await;
}

#[tokio::test]
async fn a_renewal_that_changes_no_value_is_still_applied() {
    // sqlx reports matched rows (CLIENT_FOUND_ROWS). A renewal shorter than
    // the remaining lease changes no column, so a driver counting *changed*
    // rows would report 0 and the call would look like a stale write.
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h
        .client
        .clone()
        .claim(jobfence_api::v1::ClaimRequest {
            queue: Q.into(),
            worker_id: "w".into(),
            max_jobs: 1,
            lease: secs(600),
            wait: None,
        })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .remove(0)
        .job
        .unwrap();
    let before = h.row(job.job_id).await;
    let out = h
        .client
        .clone()
        .renew_lease(RenewLeaseRequest {
            job_id: job.job_id,
            attempt: a.attempt,
            lease: secs(1),
        })
        .await
        .expect("a no-change renewal is applied, not refused")
        .into_inner();
    assert!(!out.replayed);
    assert_eq!(h.row(job.job_id).await, before, "no column changed");
    assert_eq!(h.count_events(job.job_id, "lease_renewed").await, 1);

    // A longer renewal does move the lease.
    h.client
        .clone()
        .renew_lease(RenewLeaseRequest {
            job_id: job.job_id,
            attempt: a.attempt,
            lease: secs(3000),
        })
        .await
        .unwrap();
    assert!(h.row(job.job_id).await.lease_until > before.lease_until);

    // And a renewal from a superseded attempt is refused like any write.
    h.force_lease_expired(job.job_id).await;
    h.claim_one(Q, "w2").await;
    let status = h
        .client
        .clone()
        .renew_lease(RenewLeaseRequest {
            job_id: job.job_id,
            attempt: a.attempt,
            lease: secs(60),
        })
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "ATTEMPT_SUPERSEDED");
    h.finish().await;
}

/// A takeover of a resend in flight (the job was failed as RETRY_EXECUTE,
/// handed out again as an execute, then its lease ran out) starts with
/// reconcile, named or inline: the resend may have reached the provider
/// (docs/design.md rule 5). Neither counts as a dispatch.
#[tokio::test]
async fn a_takeover_after_a_retry_execute_resend_starts_with_reconcile() {
    let h = harness(Duration::from_secs(3600), 5).await;
    let named = h.enqueue(Q, "refund-named", "{}").await;
    let inline = h.enqueue(Q, "refund-inline", "{}").await;
    for _ in 0..2 {
        let first = h.claim_one(Q, "worker-a").await;
        let out = h
            .client
            .clone()
            .fail(fail(
                first.job_id,
                first.attempt,
                FailDisposition::RetryExecute,
                0,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(out.applied, FailDisposition::RetryExecute as i32);
    }
    // The resends go out: execute, the second dispatch of each job.
    let resent = h.claim(Q, "worker-b", 2).await;
    assert_eq!(resent.len(), 2);
    for c in &resent {
        let j = c.job.as_ref().unwrap();
        assert!(!c.takeover);
        assert_eq!(j.next_action, jobfence_api::v1::NextAction::Execute as i32);
        assert_eq!((j.attempt, j.dispatch_count), (2, 2));
    }
    assert_eq!(h.row(named.job_id).await.next_action, NextAction::Execute);

    h.force_lease_expired(named.job_id).await;
    let t = h
        .client
        .clone()
        .takeover(jobfence_api::v1::TakeoverRequest {
            job_id: named.job_id,
            worker_id: "worker-c".into(),
            lease: None,
        })
        .await
        .unwrap()
        .into_inner()
        .claimed
        .unwrap();
    assert!(t.takeover);
    let tj = t.job.unwrap();
    assert_eq!(
        tj.next_action,
        jobfence_api::v1::NextAction::Reconcile as i32
    );
    assert_eq!((tj.attempt, tj.dispatch_count), (3, 2));
    let row = h.row(named.job_id).await;
    assert_eq!(row.next_action, NextAction::Reconcile);
    assert_eq!(row.dispatch_count, 2);

    h.force_lease_expired(inline.job_id).await;
    let c = h.claim(Q, "worker-d", 5).await;
    assert_eq!(c.len(), 1);
    assert!(c[0].takeover);
    let cj = c[0].job.as_ref().unwrap();
    assert_eq!(cj.job_id, inline.job_id);
    assert_eq!(
        cj.next_action,
        jobfence_api::v1::NextAction::Reconcile as i32
    );
    assert_eq!((cj.attempt, cj.dispatch_count), (3, 2));
    let row = h.row(inline.job_id).await;
    assert_eq!(row.next_action, NextAction::Reconcile);
    assert_eq!(row.dispatch_count, 2);
    h.finish().await;
}
