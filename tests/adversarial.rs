//! Adversarial tests: each one pins a defect found while trying to break the
//! fencing, and the fix that closes it. Deterministic: no sleeps decide a
//! schedule.

mod common;

use common::{reason, secs, Harness};
use jobfence::proto::{ClaimRequest, RenewLeaseRequest};

const Q: &str = "refunds";

/// Claims the only job of `Q` with a lease of `lease_secs`.
async fn claim_with_lease(h: &Harness, worker: &str, lease_secs: i64) -> jobfence::proto::Job {
    h.client
        .clone()
        .claim(ClaimRequest {
            queue: Q.into(),
            worker_id: worker.into(),
            max_jobs: 1,
            lease: secs(lease_secs),
        })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .remove(0)
        .job
        .unwrap()
}

fn renew(job_id: u64, attempt: u64, lease_secs: i64) -> RenewLeaseRequest {
    RenewLeaseRequest {
        job_id,
        attempt,
        lease: secs(lease_secs),
    }
}

/// A worker's heartbeat sends the very same RenewLease (same job, attempt,
/// lease) again and again, each one applied. Once a takeover supersedes it,
/// its next heartbeat must be refused: answering it OK (`replayed`) tells a
/// zombie it still holds the job.
#[tokio::test]
async fn a_superseded_heartbeat_is_refused_not_answered_as_a_replay() {
    let h = Harness::start().await;
    let job = h.enqueue(Q, "refund-heartbeat", "{}").await;
    let a = claim_with_lease(&h, "zombie", 30).await;
    // Two heartbeats of the old holder, both applied.
    for _ in 0..2 {
        let out = h
            .client
            .clone()
            .renew_lease(renew(job.job_id, a.attempt, 30))
            .await
            .expect("the holder's heartbeat is applied")
            .into_inner();
        assert!(!out.replayed);
    }
    // The zombie stalls; its lease expires and another worker takes over.
    h.force_lease_expired(job.job_id).await;
    let b = h.claim_one(Q, "rescuer").await;
    assert_eq!(b.attempt, a.attempt + 1);
    // The zombie wakes up and sends its next heartbeat, identical to the
    // ones before.
    let late = h
        .client
        .clone()
        .renew_lease(renew(job.job_id, a.attempt, 30))
        .await;
    let status = late.expect_err("a superseded attempt must not be told its lease was renewed");
    assert_eq!(reason(&status), "ATTEMPT_SUPERSEDED");
    h.finish().await;
}
