//! Races on deterministic schedules: a call is paused at a named point
//! inside its transaction (holding its row locks), the competitor runs, and
//! where the competitor must wait for a row lock the test waits until InnoDB
//! reports that wait (`SHOW ENGINE INNODB STATUS`, see `kit::locks`) before
//! releasing the first call. No sleeps.

use jobfence_testkit as kit;

use jobfence_api::v1::{CompleteRequest, TakeoverRequest};
use jobfence_domain::JobState;
use kit::{meta, reason, secs, Harness};
use std::collections::HashSet;
use tonic::Code;

const Q: &str = "refunds";

fn takeover(job_id: u64, worker: &str) -> TakeoverRequest {
    TakeoverRequest {
        job_id,
        worker_id: worker.into(),
        lease: None,
    }
}

/// A Claim of `max_jobs` by `worker` on a client of its own, sent in the
/// background (to stop at an armed pause point); its answer.
async fn spawn_claim(
    h: &Harness,
    worker: &str,
    max_jobs: u32,
) -> tokio::task::JoinHandle<Result<tonic::Response<jobfence_api::v1::ClaimResponse>, tonic::Status>>
{
    let mut c = h.another_client().await;
    let worker_id = worker.to_owned();
    tokio::spawn(async move {
        c.claim(jobfence_api::v1::ClaimRequest {
            queue: Q.into(),
            worker_id,
            max_jobs,
            lease: None,
            wait: None,
        })
        .await
    })
}

#[tokio::test]
async fn two_racing_claims_never_get_the_same_job() {
    let h = Harness::start().await;
    let mut ids = HashSet::new();
    for i in 0..5 {
        ids.insert(h.enqueue(Q, &format!("refund-{i}"), "{}").await.job_id);
    }
    // A scans and locks three rows, then stops before updating them.
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::ClaimAfterScan);
    let a = spawn_claim(&h, "worker-a", 3).await;
    gate.reached().await;
    // B claims everything it can meanwhile: it must skip A's rows.
    let b = h.claim(Q, "worker-b", 5).await;
    gate.release();
    let a = a.await.unwrap().unwrap().into_inner().jobs;
    assert_eq!(a.len(), 3);
    assert_eq!(b.len(), 2, "B gets only the rows A did not lock");
    let a_ids: HashSet<u64> = a.iter().map(|c| c.job.as_ref().unwrap().job_id).collect();
    let b_ids: HashSet<u64> = b.iter().map(|c| c.job.as_ref().unwrap().job_id).collect();
    assert!(a_ids.is_disjoint(&b_ids), "a job was handed to both");
    assert_eq!(&a_ids | &b_ids, ids);
    for id in ids {
        let row = h.row(id).await;
        assert_eq!(row.attempt, 1, "each job claimed exactly once");
        assert_eq!(h.count_events(id, "claimed").await, 1);
    }
    h.finish().await;
}

#[tokio::test]
async fn a_claim_paused_on_the_only_job_leaves_the_other_claimer_empty_handed() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::ClaimAfterScan);
    let a = spawn_claim(&h, "worker-a", 1).await;
    gate.reached().await;
    assert!(h.claim(Q, "worker-b", 1).await.is_empty());
    gate.release();
    let a = a.await.unwrap().unwrap().into_inner().jobs;
    assert_eq!(a[0].job.as_ref().unwrap().job_id, job.job_id);
    assert_eq!(a[0].job.as_ref().unwrap().attempt, 1);
    h.finish().await;
}

#[tokio::test]
async fn two_racing_takeovers_exactly_one_wins() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let first = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(job.job_id).await;

    // B holds the row lock with the lease seen expired...
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::TakeoverAfterLock);
    let mut b_client = h.another_client().await;
    let b = tokio::spawn(async move { b_client.takeover(takeover(job.job_id, "worker-b")).await });
    gate.reached().await;
    // ...C asks for the same job and has to wait for B's lock.
    let mut c_client = h.another_client().await;
    let c = tokio::spawn(async move { c_client.takeover(takeover(job.job_id, "worker-c")).await });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();

    let b = b.await.unwrap();
    let c = c.await.unwrap();
    let won = b.expect("B took over first").into_inner().claimed.unwrap();
    assert_eq!(won.job.as_ref().unwrap().attempt, first.attempt + 1);
    let lost = c.expect_err("C must lose");
    assert_eq!(lost.code(), Code::FailedPrecondition);
    assert_eq!(reason(&lost), "LEASE_NOT_EXPIRED");
    assert_eq!(
        meta(&lost, "current_attempt"),
        (first.attempt + 1).to_string()
    );

    let row = h.row(job.job_id).await;
    assert_eq!(row.attempt, first.attempt + 1);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-b"));
    assert_eq!(h.count_events(job.job_id, "taken_over").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn complete_holding_the_lock_beats_a_takeover() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(job.job_id).await;

    let mut gate = h.pauses.arm(jobfence_store::PausePoint::WriteAfterLock);
    let mut a_client = h.another_client().await;
    let complete = tokio::spawn(async move {
        a_client
            .complete(CompleteRequest {
                job_id: job.job_id,
                attempt: a.attempt,
                provider_reference: "re_A".into(),
                result: String::new(),
                next: None,
            })
            .await
    });
    gate.reached().await;
    let mut b_client = h.another_client().await;
    let take =
        tokio::spawn(async move { b_client.takeover(takeover(job.job_id, "worker-b")).await });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();

    complete.await.unwrap().expect("A completes first");
    let refused = take.await.unwrap().expect_err("B sees the job finished");
    assert_eq!(reason(&refused), "JOB_FINISHED");
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.attempt, a.attempt);
    h.finish().await;
}

#[tokio::test]
async fn takeover_holding_the_lock_beats_a_late_complete() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(job.job_id).await;

    let mut gate = h.pauses.arm(jobfence_store::PausePoint::TakeoverAfterLock);
    let mut b_client = h.another_client().await;
    let take =
        tokio::spawn(async move { b_client.takeover(takeover(job.job_id, "worker-b")).await });
    gate.reached().await;
    let mut a_client = h.another_client().await;
    let complete = tokio::spawn(async move {
        a_client
            .complete(CompleteRequest {
                job_id: job.job_id,
                attempt: a.attempt,
                provider_reference: "re_A".into(),
                result: String::new(),
                next: None,
            })
            .await
    });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();

    take.await.unwrap().expect("B takes over first");
    let refused = complete.await.unwrap().expect_err("A was superseded");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(reason(&refused), "ATTEMPT_SUPERSEDED");
    assert_eq!(meta(&refused, "current_state"), "running");
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.attempt, a.attempt + 1);
    assert_eq!(row.provider_reference, None);
    h.finish().await;
}

#[tokio::test]
async fn a_claim_whose_commit_is_lost_is_reported_unknown_and_hands_out_nothing() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit);
    let mut a_client = h.another_client().await;
    let claim = tokio::spawn(async move {
        a_client
            .claim(jobfence_api::v1::ClaimRequest {
                queue: Q.into(),
                worker_id: "worker-a".into(),
                max_jobs: 1,
                lease: secs(30),
                wait: None,
            })
            .await
    });
    gate.reached().await;
    // The connection dies just before COMMIT.
    kit::kill_the_paused_session(&h, &gate).await;
    gate.release();

    let status = claim.await.unwrap().expect_err("no claim may be reported");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(reason(&status), "COMMIT_OUTCOME_UNKNOWN");
    // Here the server rolled back: the job is still claimable, with a
    // fresh attempt, by whoever asks next.
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    assert_eq!(row.attempt, 0);
    // The killed session's rollback may still hold the row (a loaded
    // machine takes its time), and a Claim skips locked rows: wait for
    // the lock itself to be free.
    let mut tx = h.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = ? FOR UPDATE")
        .bind(job.job_id)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let next = h.claim_one(Q, "worker-b").await;
    assert_eq!(next.attempt, 1);
    h.finish().await;
}

/// Now, in microseconds since the Unix epoch: where a test stops the
/// coordinator's database clock.
fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// Runs `sql` on a session of the test's pool whose clock reads `at`
/// (the coordinator's frozen instant), then gives the clock back.
async fn at_clock(h: &Harness, at: i64, sql: &str, job_id: u64) -> i64 {
    let mut conn = h.pool.acquire().await.unwrap();
    let set = format!(
        "SET SESSION timestamp = {}.{:06}",
        at.div_euclid(1_000_000),
        at.rem_euclid(1_000_000)
    );
    sqlx::query(&set).execute(&mut *conn).await.unwrap();
    let r = sqlx::query(sql).bind(job_id).execute(&mut *conn).await;
    sqlx::query("SET SESSION timestamp = DEFAULT")
        .execute(&mut *conn)
        .await
        .unwrap();
    r.unwrap().rows_affected() as i64
}

/// Where the job's lease ends relative to the frozen clock `at`, in
/// microseconds (`lease_until - UTC_TIMESTAMP(6)`).
async fn lease_left_us(h: &Harness, at: i64, job_id: u64) -> i64 {
    let mut conn = h.pool.acquire().await.unwrap();
    let set = format!(
        "SET SESSION timestamp = {}.{:06}",
        at.div_euclid(1_000_000),
        at.rem_euclid(1_000_000)
    );
    sqlx::query(&set).execute(&mut *conn).await.unwrap();
    let left: i64 = sqlx::query_scalar(
        "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), lease_until) AS SIGNED) FROM jobs WHERE id = ?",
    )
    .bind(job_id)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    sqlx::query("SET SESSION timestamp = DEFAULT")
        .execute(&mut *conn)
        .await
        .unwrap();
    left
}

/// Claim's inline takeover (its expired-lease scan) at the lease's exact
/// boundary on the database clock: the coordinator's clock is stopped at
/// T, so a lease ending at T + 1 µs is live for every claim and one ending
/// at T has expired (`lease_until <= UTC_TIMESTAMP(6)`, docs/design.md rules 1
/// and 2).
#[tokio::test]
async fn a_claim_never_takes_a_lease_one_microsecond_from_its_end_and_takes_it_at_the_end() {
    let t = now_micros();
    let h = Harness::start_frozen_at(t).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    assert_eq!(a.attempt, 1);

    let set_end =
        "UPDATE jobs SET lease_until = UTC_TIMESTAMP(6) + INTERVAL 1 MICROSECOND WHERE id = ?";
    assert_eq!(at_clock(&h, t, set_end, job.job_id).await, 1);
    assert_eq!(lease_left_us(&h, t, job.job_id).await, 1);
    for worker in ["worker-b", "worker-c"] {
        let got = h.claim(Q, worker, 5).await;
        assert!(
            got.is_empty(),
            "a claim took a lease that is live by 1 µs: {got:?}"
        );
    }
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.attempt, 1);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-a"));
    assert_eq!(lease_left_us(&h, t, job.job_id).await, 1, "lease untouched");
    assert_eq!(h.count_events(job.job_id, "taken_over").await, 0);

    let set_end = "UPDATE jobs SET lease_until = UTC_TIMESTAMP(6) WHERE id = ?";
    assert_eq!(at_clock(&h, t, set_end, job.job_id).await, 1);
    let mut got = h.claim(Q, "worker-b", 5).await;
    assert_eq!(got.len(), 1, "a lease that ends now has expired");
    let b = got.remove(0);
    assert!(b.takeover);
    let b_job = b.job.unwrap();
    assert_eq!(b_job.attempt, 2);
    assert_eq!(
        b_job.next_action,
        jobfence_api::v1::NextAction::Reconcile as i32
    );
    let row = h.row(job.job_id).await;
    assert_eq!(row.attempt, 2);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-b"));
    assert_eq!(h.count_events(job.job_id, "taken_over").await, 1);
    h.finish().await;
}

/// A claim racing a renewal of a lease that just ended: while the
/// renewal holds the row (paused after its lock), the claim skips the row;
/// once it committed the lease is live again and no claim takes it. The
/// clock is stopped, so the lease ends exactly at the claims' instant.
#[tokio::test]
async fn a_claim_racing_a_renewal_never_hands_out_the_renewed_job() {
    let t = now_micros();
    let h = Harness::start_frozen_at(t).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let set_end = "UPDATE jobs SET lease_until = UTC_TIMESTAMP(6) WHERE id = ?";
    assert_eq!(at_clock(&h, t, set_end, job.job_id).await, 1);

    let mut gate = h.pauses.arm(jobfence_store::PausePoint::WriteAfterLock);
    let mut a_client = h.another_client().await;
    let renew = tokio::spawn(async move {
        a_client
            .renew_lease(jobfence_api::v1::RenewLeaseRequest {
                job_id: job.job_id,
                attempt: a.attempt,
                lease: secs(30),
            })
            .await
    });
    gate.reached().await;
    assert!(
        h.claim(Q, "worker-b", 5).await.is_empty(),
        "the renewal holds the row"
    );
    gate.release();
    renew.await.unwrap().expect("the renewal applies");
    assert_eq!(lease_left_us(&h, t, job.job_id).await, 30_000_000);
    assert!(
        h.claim(Q, "worker-c", 5).await.is_empty(),
        "the renewed lease is live"
    );
    let row = h.row(job.job_id).await;
    assert_eq!(row.attempt, a.attempt);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-a"));
    assert_eq!(h.count_events(job.job_id, "taken_over").await, 0);
    h.finish().await;
}

/// A claim of a queue without a provider sends its expired-lease scan in a
/// round trip of its own, after its ready scan, when the queue's row said a
/// lease ran out. An operator giving the queue a provider between the two
/// must not let the newer ready job go out before the expired lease: the
/// claim acts on the rules it read (as one begun a moment earlier would)
/// and takes the lease over first (expired leases before ready jobs:
/// docs/architecture.md, "Coalesced Claims").
#[tokio::test]
async fn a_provider_given_between_a_claims_scans_does_not_reorder_the_takeover() {
    let h = Harness::start().await;
    let expired = h.enqueue(Q, "refund-expired", "{}").await.job_id;
    assert_eq!(h.claim(Q, "gone", 1).await.len(), 1);
    h.force_lease_expired(expired).await;
    let newer = h.enqueue(Q, "refund-newer", "{}").await.job_id;

    let mut gate = h.pauses.arm(jobfence_store::PausePoint::ClaimBetweenScans);
    let claim = spawn_claim(&h, "worker-a", 1).await;
    gate.reached().await;
    h.put_budget("stripe", Q, 1000.0, 100).await;
    gate.release();
    let got = claim.await.unwrap().unwrap().into_inner().jobs;
    let ids: Vec<(u64, bool)> = got
        .iter()
        .map(|c| (c.job.as_ref().unwrap().job_id, c.takeover))
        .collect();
    assert_eq!(ids, [(expired, true)], "the expired lease first");
    assert_eq!(h.row(newer).await.state, JobState::Ready);
    h.finish().await;
}
