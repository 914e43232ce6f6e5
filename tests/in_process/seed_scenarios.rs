//! The seed article's acceptance scenarios, against a real MariaDB. Each
//! asserts the exact status the caller got and the row afterwards. The
//! schedule is the order of the calls: the "zombie" is a client whose call
//! is simply made after the takeover committed.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    self as proto, CompleteRequest, FailDisposition, FailRequest, GetJobRequest, NextAction,
    ObservationOutcome, ObservationSource, RecordObservationRequest, TakeoverRequest,
};
use jobfence_domain::JobState;
use kit::{meta, reason, secs, Harness};
use tonic::Code;

const Q: &str = "refunds";

fn complete(job_id: u64, attempt: u64, reference: &str) -> CompleteRequest {
    CompleteRequest {
        job_id,
        attempt,
        provider_reference: reference.into(),
        result: format!("{{\"refund\":\"{reference}\",\"status\":\"succeeded\"}}"),
        next: None,
    }
}

fn fail(job_id: u64, attempt: u64, d: FailDisposition) -> FailRequest {
    FailRequest {
        job_id,
        attempt,
        disposition: d as i32,
        error: "socket timeout".into(),
        retry_delay: secs(0),
        provider_retry_after: None,
        next: None,
    }
}

fn takeover(job_id: u64, worker: &str) -> TakeoverRequest {
    TakeoverRequest {
        job_id,
        worker_id: worker.into(),
        lease: None,
    }
}

/// Claims the job, then has it taken over until the current attempt is
/// `attempt` (each takeover is a real one, on a lease forced expired).
async fn hold_attempt(h: &Harness, job_id: u64, attempt: u64) -> proto::Job {
    let mut job = h.claim_one(Q, "warmup").await;
    assert_eq!(job.job_id, job_id);
    while job.attempt < attempt {
        h.force_lease_expired(job_id).await;
        job = h
            .client
            .clone()
            .takeover(takeover(job_id, "warmup"))
            .await
            .unwrap()
            .into_inner()
            .claimed
            .unwrap()
            .job
            .unwrap();
    }
    job
}

#[tokio::test]
async fn zombie_worker_wakes_after_takeover_and_cannot_write() {
    let h = Harness::start().await;
    let job = h
        .enqueue(Q, "refund-pay_1-500-TWD", r#"{"amount":500}"#)
        .await;
    // Worker A holds attempt 7 and has sent its refund; then it stalls.
    let a = hold_attempt(&h, job.job_id, 7).await;
    assert_eq!(a.attempt, 7);
    let mut worker_a = h.another_client().await;

    // Lease runs out (forced on test data); B takes over with attempt 8.
    h.force_lease_expired(job.job_id).await;
    let b = h
        .client
        .clone()
        .takeover(takeover(job.job_id, "worker-b"))
        .await
        .expect("B takes over")
        .into_inner()
        .claimed
        .unwrap();
    let b_job = b.job.unwrap();
    assert_eq!(b_job.attempt, 8);
    assert_eq!(b_job.next_action, NextAction::Reconcile as i32);
    assert_eq!(b_job.operation_key, "refund-pay_1-500-TWD");
    // B reconciles (finds the refund) and completes with attempt 8.
    let done = h
        .client
        .clone()
        .complete(complete(job.job_id, 8, "re_B"))
        .await
        .expect("B completes")
        .into_inner();
    assert!(!done.replayed);

    // A wakes up: every write it tries is refused as superseded.
    let attempts = [
        worker_a
            .complete(complete(job.job_id, 7, "re_A"))
            .await
            .unwrap_err(),
        worker_a
            .fail(fail(job.job_id, 7, FailDisposition::RetryReconcile))
            .await
            .unwrap_err(),
        worker_a
            .fail(fail(job.job_id, 7, FailDisposition::RetryExecute))
            .await
            .unwrap_err(),
        worker_a
            .fail(fail(job.job_id, 7, FailDisposition::ManualReview))
            .await
            .unwrap_err(),
    ];
    for status in &attempts {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(reason(status), "ATTEMPT_SUPERSEDED");
        assert_eq!(meta(status, "current_attempt"), "8");
        assert_eq!(meta(status, "presented_attempt"), "7");
        assert_eq!(meta(status, "current_state"), "succeeded");
    }

    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.attempt, 8);
    assert_eq!(row.provider_reference.as_deref(), Some("re_B"));
    assert!(row.result.unwrap().contains("re_B"));
    assert_eq!(row.lease_until, None);
    assert_eq!(h.count_events(job.job_id, "stale_write_rejected").await, 4);
    assert_eq!(h.count_events(job.job_id, "completed").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn lease_expired_but_no_takeover_yet_the_holder_still_completes() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-2", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    // Thirty seconds pass (forced): the job is only *open* to takeover.
    h.force_lease_expired(job.job_id).await;

    let done = h
        .client
        .clone()
        .complete(complete(job.job_id, a.attempt, "re_A"))
        .await
        .expect("an expired lease does not revoke the write right")
        .into_inner();
    assert_eq!(done.job.unwrap().state, proto::JobState::Succeeded as i32);

    // B arrives late: a precise refusal, and the job stays A's.
    let status = h
        .client
        .clone()
        .takeover(takeover(job.job_id, "worker-b"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "JOB_FINISHED");
    assert_eq!(meta(&status, "current_state"), "succeeded");
    assert!(h.claim(Q, "worker-b", 10).await.is_empty());

    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.attempt, a.attempt);
    assert_eq!(row.provider_reference.as_deref(), Some("re_A"));
    h.finish().await;
}

#[tokio::test]
async fn takeover_of_a_live_lease_is_refused_with_its_expiry() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-live", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let status = h
        .client
        .clone()
        .takeover(takeover(job.job_id, "worker-b"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "LEASE_NOT_EXPIRED");
    assert_eq!(meta(&status, "current_attempt"), a.attempt.to_string());
    assert!(!meta(&status, "lease_until").is_empty());
    // A job that is not running at all.
    let ready = h.enqueue(Q, "refund-ready", "{}").await;
    let status = h
        .client
        .clone()
        .takeover(takeover(ready.job_id, "worker-b"))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "JOB_NOT_RUNNING");
    assert_eq!(h.row(job.job_id).await.attempt, a.attempt);
    h.finish().await;
}

#[tokio::test]
async fn completed_then_response_lost_the_retry_is_a_replay() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-3", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let first = h
        .client
        .clone()
        .complete(complete(job.job_id, a.attempt, "re_3"))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.replayed);
    let before = h.row(job.job_id).await;

    // The response was lost; the worker sends the identical call again.
    let again = h
        .client
        .clone()
        .complete(complete(job.job_id, a.attempt, "re_3"))
        .await
        .expect("an identical retry is OK")
        .into_inner();
    assert!(again.replayed);
    assert_eq!(again.job.unwrap().provider_reference, "re_3");
    assert_eq!(h.row(job.job_id).await, before, "row unchanged");
    assert_eq!(h.count_events(job.job_id, "completed").await, 1);
    assert_eq!(h.count_events(job.job_id, "stale_write_rejected").await, 0);

    // A *different* write with the same attempt is not a replay.
    let status = h
        .client
        .clone()
        .complete(complete(job.job_id, a.attempt, "re_other"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(reason(&status), "JOB_NOT_RUNNING");
    assert_eq!(h.row(job.job_id).await, before);

    // A Fail retry replayed after the job moved on is still recognised.
    let job2 = h.enqueue(Q, "refund-3b", "{}").await;
    let c = h.claim_one(Q, "worker-a").await;
    assert_eq!(c.job_id, job2.job_id);
    let req = fail(job2.job_id, c.attempt, FailDisposition::RetryReconcile);
    h.client.clone().fail(req.clone()).await.unwrap();
    let replay = h.client.clone().fail(req).await.unwrap().into_inner();
    assert!(replay.replayed);
    assert_eq!(replay.applied, FailDisposition::RetryReconcile as i32);
    assert_eq!(h.count_events(job2.job_id, "retry_scheduled").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn late_success_from_a_stale_worker_is_kept_as_an_observation() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-4", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(job.job_id).await;
    let b = h
        .client
        .clone()
        .takeover(takeover(job.job_id, "worker-b"))
        .await
        .unwrap()
        .into_inner()
        .claimed
        .unwrap()
        .job
        .unwrap();

    // A finally receives the provider's "refund succeeded".
    let status = h
        .client
        .clone()
        .complete(complete(job.job_id, a.attempt, "re_4"))
        .await
        .unwrap_err();
    assert_eq!(reason(&status), "ATTEMPT_SUPERSEDED");
    let obs = RecordObservationRequest {
        job_id: job.job_id,
        attempt: a.attempt,
        source: ObservationSource::Worker as i32,
        outcome: ObservationOutcome::Succeeded as i32,
        provider_reference: "re_4".into(),
        body: r#"{"id":"re_4","status":"succeeded"}"#.into(),
        dedup_key: "worker-a:re_4".into(),
    };
    let first = h
        .client
        .clone()
        .record_observation(obs.clone())
        .await
        .expect("stale attempts may record evidence")
        .into_inner();
    assert!(!first.duplicate);
    let repeat = h
        .client
        .clone()
        .record_observation(obs)
        .await
        .unwrap()
        .into_inner();
    assert!(repeat.duplicate);
    assert_eq!(
        repeat.observation.as_ref().unwrap().observation_id,
        first.observation.as_ref().unwrap().observation_id
    );

    // The job is untouched: still B's, running.
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.attempt, b.attempt);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-b"));
    assert_eq!(row.provider_reference, None);

    // The current holder sees the evidence, once.
    let seen = h
        .client
        .clone()
        .get_job(GetJobRequest { job_id: job.job_id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen.observations.len(), 1);
    let o = &seen.observations[0];
    assert_eq!(o.attempt, a.attempt);
    assert_eq!(o.provider_reference, "re_4");
    assert_eq!(o.outcome, ObservationOutcome::Succeeded as i32);

    // A later takeover by claim also hands the evidence over.
    h.force_lease_expired(job.job_id).await;
    let c = h.claim(Q, "worker-c", 1).await;
    assert_eq!(c.len(), 1);
    assert!(c[0].takeover);
    assert_eq!(c[0].observations.len(), 1);
    assert_eq!(h.row(job.job_id).await.state, JobState::Running);
    h.finish().await;
}

#[tokio::test]
async fn takeover_always_starts_with_reconcile_and_keeps_the_operation_key() {
    let h = Harness::start().await;
    let named = h.enqueue(Q, "refund-named", "{}").await;
    let inline = h.enqueue(Q, "refund-inline", "{}").await;
    let claimed = h.claim(Q, "worker-a", 2).await;
    assert_eq!(claimed.len(), 2);
    for c in &claimed {
        let j = c.job.as_ref().unwrap();
        assert!(!c.takeover);
        assert_eq!(j.next_action, NextAction::Execute as i32);
        assert_eq!(j.attempt, 1);
        assert_eq!(j.dispatch_count, 1);
    }

    h.force_lease_expired(named.job_id).await;
    let t = h
        .client
        .clone()
        .takeover(takeover(named.job_id, "worker-b"))
        .await
        .unwrap()
        .into_inner()
        .claimed
        .unwrap();
    assert!(t.takeover);
    let tj = t.job.unwrap();
    assert_eq!(tj.next_action, NextAction::Reconcile as i32);
    assert_eq!(tj.operation_key, "refund-named");
    assert_eq!(tj.attempt, 2);
    assert_eq!(tj.dispatch_count, 1, "a reconcile is not a dispatch");

    h.force_lease_expired(inline.job_id).await;
    let c = h.claim(Q, "worker-c", 5).await;
    assert_eq!(c.len(), 1);
    assert!(c[0].takeover);
    let cj = c[0].job.as_ref().unwrap();
    assert_eq!(cj.job_id, inline.job_id);
    assert_eq!(cj.next_action, NextAction::Reconcile as i32);
    assert_eq!(cj.operation_key, "refund-inline");
    assert_eq!(cj.attempt, 2);
    assert_eq!(cj.lease_owner, "worker-c");
    assert_eq!(h.count_events(inline.job_id, "taken_over").await, 1);
    h.finish().await;
}
