//! COMMIT_OUTCOME_UNKNOWN over gRPC on a single server (docs/design.md rule 4)
//! for Complete, Fail, Takeover and Enqueue, each twice: the connection of
//! the paused transaction is killed before its COMMIT (the server rolls
//! back), or its COMMIT goes through and only the answer is lost (the
//! write landed). Either way the caller is told COMMIT_OUTCOME_UNKNOWN,
//! never success or a refusal, and the same call sent again is answered
//! as a replay or with the job's true state.
//!
//! The coordinator talks to MariaDB through a relay the test controls
//! (`NetCut`): "after COMMIT" swallows the answers, releases the paused
//! transaction, waits until the database shows the write committed, then
//! kills that session, so the coordinator's COMMIT never gets its answer.

use jobfence_testkit as kit;

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    CompleteRequest, EnqueueRequest, FailDisposition, FailRequest, TakeoverRequest,
};
use jobfence_domain::{JobState, NextAction};
use jobfence_fake_provider::netcut::NetCut;
use jobfence_store::PausePoint;
use kit::{meta, reason, Harness};
use std::future::Future;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Code, Status};

const Q: &str = "refunds";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Lost {
    /// The session is killed before COMMIT: rolled back.
    BeforeCommit,
    /// COMMIT ran and committed; its answer never arrives.
    AfterCommit,
}

/// Runs `call` on a client of its own with `point` armed, loses the paused
/// transaction's connection as `lost` says, and returns the call's error
/// (it must not succeed). `landed` is a `SELECT COUNT(*)` that is 1 once
/// the write committed.
async fn lose<T, F, Fut>(
    h: &Harness,
    proxy: &NetCut,
    point: PausePoint,
    lost: Lost,
    landed: &str,
    call: F,
) -> Status
where
    T: std::fmt::Debug + Send + 'static,
    F: FnOnce(JobCoordinatorClient<Channel>) -> Fut,
    Fut: Future<Output = Result<T, Status>> + Send + 'static,
{
    let mut gate = h.pauses.arm(point);
    let running = tokio::spawn(call(h.another_client().await));
    gate.reached().await;
    match lost {
        Lost::BeforeCommit => {
            kit::kill_the_paused_session(h, &gate).await;
            gate.release();
        }
        Lost::AfterCommit => {
            proxy.swallow_responses(true);
            gate.release();
            until_count(h, landed, 1).await;
            kit::kill_the_paused_session(h, &gate).await;
        }
    }
    let outcome = running.await.unwrap();
    proxy.swallow_responses(false);
    if lost == Lost::BeforeCommit {
        assert_eq!(count(h, landed).await, 0, "the kill rolled it back");
    }
    let status = outcome.expect_err("a lost COMMIT is never reported as applied");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(reason(&status), "COMMIT_OUTCOME_UNKNOWN");
    status
}

async fn count(h: &Harness, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&h.pool).await.unwrap()
}

/// Waits until `sql` counts `want` (read on the direct pool: committed
/// rows only); panics after 10 s.
async fn until_count(h: &Harness, sql: &str, want: i64) {
    for _ in 0..1000 {
        if count(h, sql).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never counted {want}: {sql}");
}

/// Sends the call again, as a worker that was told "unknown" does: a
/// connection the relay closed may fail once more with
/// DATABASE_UNAVAILABLE (nothing applied), which is retried too.
async fn again<T, F, Fut>(h: &Harness, call: F) -> Result<T, Status>
where
    F: Fn(JobCoordinatorClient<Channel>) -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    for _ in 0..5 {
        match call(h.another_client().await).await {
            Err(s) if s.code() == Code::Unavailable && reason(&s) == "DATABASE_UNAVAILABLE" => {
                continue
            }
            other => return other,
        }
    }
    panic!("the database stayed unavailable");
}

async fn running_job(h: &Harness, key: &str) -> jobfence_api::v1::Job {
    h.enqueue(Q, key, "{}").await;
    h.claim_one(Q, "worker-a").await
}

fn complete(job_id: u64, attempt: u64) -> CompleteRequest {
    CompleteRequest {
        job_id,
        attempt,
        provider_reference: "re_1".into(),
        result: "{\"ok\":true}".into(),
        next: None,
    }
}

async fn complete_case(lost: Lost) {
    let (h, proxy) = Harness::start_behind_proxy(kit::test_options()).await;
    let job = running_job(&h, "refund-1").await;
    let req = complete(job.job_id, job.attempt);
    let landed = format!(
        "SELECT COUNT(*) FROM jobs WHERE id = {} AND state = 'succeeded'",
        job.job_id
    );
    let r = req.clone();
    lose(
        &h,
        &proxy,
        PausePoint::WriteBeforeCommit,
        lost,
        &landed,
        |mut c| async move { c.complete(r).await },
    )
    .await;
    let retry = again(&h, |mut c| {
        let r = req.clone();
        async move { c.complete(r).await }
    })
    .await
    .expect("the same Complete again is answered")
    .into_inner();
    assert_eq!(retry.replayed, lost == Lost::AfterCommit);
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.attempt, job.attempt);
    assert_eq!(row.provider_reference.as_deref(), Some("re_1"));
    assert_eq!(h.count_events(job.job_id, "completed").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn complete_killed_before_commit_is_unknown_and_the_retry_applies() {
    complete_case(Lost::BeforeCommit).await;
}

#[tokio::test]
async fn complete_whose_commit_landed_is_unknown_and_the_retry_is_a_replay() {
    complete_case(Lost::AfterCommit).await;
}

async fn fail_case(lost: Lost) {
    let (h, proxy) = Harness::start_behind_proxy(kit::test_options()).await;
    let job = running_job(&h, "refund-1").await;
    let req = FailRequest {
        job_id: job.job_id,
        attempt: job.attempt,
        disposition: FailDisposition::RetryReconcile as i32,
        error: "provider timed out".into(),
        retry_delay: None,
        provider_retry_after: None,
        next: None,
    };
    let landed = format!(
        "SELECT COUNT(*) FROM jobs WHERE id = {} AND state = 'ready'",
        job.job_id
    );
    let r = req.clone();
    lose(
        &h,
        &proxy,
        PausePoint::WriteBeforeCommit,
        lost,
        &landed,
        |mut c| async move { c.fail(r).await },
    )
    .await;
    let retry = again(&h, |mut c| {
        let r = req.clone();
        async move { c.fail(r).await }
    })
    .await
    .expect("the same Fail again is answered")
    .into_inner();
    assert_eq!(retry.replayed, lost == Lost::AfterCommit);
    assert_eq!(retry.applied, FailDisposition::RetryReconcile as i32);
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    assert_eq!(row.next_action, NextAction::Reconcile);
    assert_eq!(row.attempt, job.attempt);
    let events = h.events(job.job_id).await;
    assert_eq!(events.len(), 3, "enqueued, claimed, one retry: {events:?}");
    h.finish().await;
}

#[tokio::test]
async fn fail_killed_before_commit_is_unknown_and_the_retry_applies() {
    fail_case(Lost::BeforeCommit).await;
}

#[tokio::test]
async fn fail_whose_commit_landed_is_unknown_and_the_retry_is_a_replay() {
    fail_case(Lost::AfterCommit).await;
}

async fn takeover_case(lost: Lost) {
    let (h, proxy) = Harness::start_behind_proxy(kit::test_options()).await;
    let job = running_job(&h, "refund-1").await;
    h.force_lease_expired(job.job_id).await;
    let req = TakeoverRequest {
        job_id: job.job_id,
        worker_id: "worker-b".into(),
        lease: None,
    };
    let landed = format!(
        "SELECT COUNT(*) FROM jobs WHERE id = {} AND attempt = {}",
        job.job_id,
        job.attempt + 1
    );
    let r = req.clone();
    lose(
        &h,
        &proxy,
        PausePoint::TakeoverBeforeCommit,
        lost,
        &landed,
        |mut c| async move { c.takeover(r).await },
    )
    .await;
    let retry = again(&h, |mut c| {
        let r = req.clone();
        async move { c.takeover(r).await }
    })
    .await;
    match lost {
        // Rolled back: the lease is still expired and the retry wins it.
        Lost::BeforeCommit => {
            let got = retry.expect("the takeover again").into_inner();
            assert_eq!(got.claimed.unwrap().job.unwrap().attempt, job.attempt + 1);
        }
        // It committed: nobody may infer ownership from that, so the
        // retry is told the job's true state, a live lease of attempt 2.
        Lost::AfterCommit => {
            let refused = retry.expect_err("the lease is live now");
            assert_eq!(refused.code(), Code::FailedPrecondition);
            assert_eq!(reason(&refused), "LEASE_NOT_EXPIRED");
            assert_eq!(
                meta(&refused, "current_attempt"),
                (job.attempt + 1).to_string()
            );
        }
    }
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.attempt, job.attempt + 1);
    assert_eq!(row.next_action, NextAction::Reconcile);
    assert_eq!(h.count_events(job.job_id, "taken_over").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn takeover_killed_before_commit_is_unknown_and_the_retry_takes_over() {
    takeover_case(Lost::BeforeCommit).await;
}

#[tokio::test]
async fn takeover_whose_commit_landed_is_unknown_and_the_retry_sees_the_live_lease() {
    takeover_case(Lost::AfterCommit).await;
}

async fn enqueue_case(lost: Lost) {
    let (h, proxy) = Harness::start_behind_proxy(kit::test_options()).await;
    let req = EnqueueRequest {
        queue: Q.into(),
        operation_key: "refund-1".into(),
        payload: "{\"amount\":100}".into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    };
    let landed = "SELECT COUNT(*) FROM jobs WHERE operation_key = 'refund-1'";
    let r = req.clone();
    lose(
        &h,
        &proxy,
        PausePoint::EnqueueBeforeCommit,
        lost,
        landed,
        |mut c| async move { c.enqueue(r).await },
    )
    .await;
    let retry = again(&h, |mut c| {
        let r = req.clone();
        async move { c.enqueue(r).await }
    })
    .await
    .expect("the same Enqueue again is answered")
    .into_inner();
    assert_eq!(retry.created, lost == Lost::BeforeCommit);
    let job = retry.job.unwrap();
    assert_eq!(count(&h, landed).await, 1, "one job for the key");
    assert_eq!(h.row(job.job_id).await.state, JobState::Ready);
    assert_eq!(h.count_events(job.job_id, "enqueued").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn enqueue_killed_before_commit_is_unknown_and_the_retry_creates_it() {
    enqueue_case(Lost::BeforeCommit).await;
}

#[tokio::test]
async fn enqueue_whose_commit_landed_is_unknown_and_the_retry_finds_it() {
    enqueue_case(Lost::AfterCommit).await;
}

/// A Complete that claims the next job (docs/design.md rule 16) whose
/// COMMIT is lost: unknown for both halves. Before COMMIT, the next job is
/// untouched and the same call again applies and hands it out; after
/// COMMIT, the next job is leased to a caller who never learnt of it, the
/// same call again is a replay that hands out no second job, and once the
/// lease expires the next claimant takes the job over with a reconcile.
async fn handoff_case(lost: Lost) {
    let (h, proxy) = Harness::start_behind_proxy(kit::test_options()).await;
    let job = running_job(&h, "refund-1").await;
    let next_job = h.enqueue(Q, "refund-2", "{}").await;
    let mut req = complete(job.job_id, job.attempt);
    req.next = Some(jobfence_api::v1::NextJobsRequest {
        queue: Q.into(),
        worker_id: "worker-a".into(),
        max_jobs: 1,
        lease: kit::secs(30),
        wait: None,
    });
    let landed = format!(
        "SELECT COUNT(*) FROM jobs WHERE id = {} AND state = 'succeeded'",
        job.job_id
    );
    let r = req.clone();
    lose(
        &h,
        &proxy,
        PausePoint::HandoffBeforeCommit,
        lost,
        &landed,
        |mut c| async move { c.complete(r).await },
    )
    .await;
    let row = h.row(next_job.job_id).await;
    match lost {
        Lost::BeforeCommit => assert_eq!((row.state, row.attempt), (JobState::Ready, 0)),
        Lost::AfterCommit => assert_eq!((row.state, row.attempt), (JobState::Running, 1)),
    }
    let retry = again(&h, |mut c| {
        let r = req.clone();
        async move { c.complete(r).await }
    })
    .await
    .expect("the same call again is answered")
    .into_inner();
    assert_eq!(retry.replayed, lost == Lost::AfterCommit);
    let handed: Vec<u64> = retry
        .next
        .expect("a next-jobs answer")
        .jobs
        .into_iter()
        .filter_map(|c| c.job.map(|j| j.job_id))
        .collect();
    if lost == Lost::BeforeCommit {
        assert_eq!(handed, [next_job.job_id], "the retry applies both halves");
    } else {
        assert!(handed.is_empty(), "a replay hands out no second job");
        h.force_lease_expired(next_job.job_id).await;
        let taken = h.claim(Q, "worker-b", 1).await;
        assert_eq!(taken.len(), 1);
        assert!(taken[0].takeover, "taken over, never handed out as new");
        let taken = taken[0].job.clone().unwrap();
        assert_eq!(taken.job_id, next_job.job_id);
        assert_eq!(taken.attempt, 2);
        assert_eq!(
            taken.next_action,
            jobfence_api::v1::NextAction::Reconcile as i32
        );
    }
    assert_eq!(h.row(job.job_id).await.state, JobState::Succeeded);
    assert_eq!(h.count_events(next_job.job_id, "claimed").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_complete_with_its_next_job_killed_before_commit_leaves_the_job_untouched() {
    handoff_case(Lost::BeforeCommit).await;
}

#[tokio::test]
async fn a_complete_with_its_next_job_whose_commit_landed_hands_out_no_second_job() {
    handoff_case(Lost::AfterCommit).await;
}
