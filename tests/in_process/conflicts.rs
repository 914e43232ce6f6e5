//! A conflict on the default database is a conflict: a lock wait timeout
//! (1205) or a deadlock (1213) on the project's own MariaDB, which is built
//! with wsrep support but runs with `wsrep_on=OFF`, is run again by the
//! coordinator and counted, then answered ABORTED / TRANSACTION_CONFLICT;
//! never UNAVAILABLE / DATABASE_UNAVAILABLE, which is for a Galera node
//! outside the primary component (tests/cluster/galera/outage.rs). The
//! conflicts are made with pause points: a call paused holding a row lock,
//! a competitor stuck behind it until its lock wait times out.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    CompleteRequest, ObservationOutcome, ObservationSource, RecordObservationRequest,
    TakeoverRequest,
};
use jobfence_domain::{JobState, PruneCounts, Retention};
use jobfence_store::retention::PruneRun;
use jobfence_store::PausePoint;
use kit::{reason, until, Harness};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const Q: &str = "refunds";

fn observation(job_id: u64, key: &str) -> RecordObservationRequest {
    RecordObservationRequest {
        job_id,
        attempt: 1,
        source: ObservationSource::Webhook as i32,
        outcome: ObservationOutcome::Succeeded as i32,
        provider_reference: "re_webhook".into(),
        body: "{\"status\":\"succeeded\"}".into(),
        dedup_key: key.into(),
    }
}

fn complete(job_id: u64, attempt: u64) -> CompleteRequest {
    CompleteRequest {
        job_id,
        attempt,
        provider_reference: "re_A".into(),
        result: String::new(),
        next: None,
    }
}

async fn serving(h: &Harness) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let answer = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("the health service answers")
        .into_inner();
    ServingStatus::try_from(answer.status).unwrap()
}

/// A Complete paused holding job `job_id`'s row lock (`WriteAfterLock`).
async fn complete_holding_the_lock(
    h: &Harness,
    job_id: u64,
    attempt: u64,
) -> (
    jobfence_store::Armed,
    tokio::task::JoinHandle<
        Result<tonic::Response<jobfence_api::v1::CompleteResponse>, tonic::Status>,
    >,
) {
    let mut gate = h.pauses.arm(PausePoint::WriteAfterLock);
    let mut a = h.another_client().await;
    let done = tokio::spawn(async move { a.complete(complete(job_id, attempt)).await });
    gate.reached().await;
    (gate, done)
}

#[tokio::test]
async fn a_lock_wait_timeout_is_run_again_counted_and_then_succeeds() {
    let h = Harness::start_with_lock_wait(1).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let (mut gate, completed) = complete_holding_the_lock(&h, job.job_id, a.attempt).await;
    // A webhook's observation of the same job waits for the row lock
    // until its lock wait times out (1205), and is run again.
    let mut webhook = h.another_client().await;
    let observed = tokio::spawn(async move {
        webhook
            .record_observation(observation(job.job_id, "webhook-1"))
            .await
    });
    let store = h.coordinator.store().clone();
    until("the lock wait timed out and was run again", || {
        store.conflicts().0 >= 1
    })
    .await;
    assert_eq!(serving(&h).await, ServingStatus::Serving);
    gate.release();
    completed
        .await
        .unwrap()
        .expect("the Complete holding the lock applies");
    let recorded = observed
        .await
        .unwrap()
        .expect("the observation, run again after its conflict, is recorded")
        .into_inner();
    assert!(!recorded.duplicate);
    assert_eq!(recorded.observation.unwrap().job_id, job.job_id);
    let (retried, reported) = store.conflicts();
    assert!(retried >= 1, "retried {retried}");
    assert_eq!(reported, 0, "no conflict reached a caller");
    assert_eq!(h.row(job.job_id).await.state, JobState::Succeeded);
    assert_eq!(h.count_events(job.job_id, "observation_recorded").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_lock_held_past_every_retry_is_answered_transaction_conflict_not_unavailable() {
    let h = Harness::start_with_lock_wait(1).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(job.job_id).await;
    let (mut gate, completed) = complete_holding_the_lock(&h, job.job_id, a.attempt).await;
    // A takeover of the expired lease waits for the row lock on every try.
    let refused = h
        .another_client()
        .await
        .takeover(TakeoverRequest {
            job_id: job.job_id,
            worker_id: "worker-b".into(),
            lease: None,
        })
        .await
        .expect_err("the row lock is held across every try");
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    assert_eq!(reason(&refused), "TRANSACTION_CONFLICT");
    let (retried, reported) = h.coordinator.store().conflicts();
    assert_eq!(
        (retried, reported),
        (3, 1),
        "three runs again, then reported"
    );
    assert_eq!(serving(&h).await, ServingStatus::Serving);
    gate.release();
    completed
        .await
        .unwrap()
        .expect("the Complete holding the lock applies");
    let row = h.row(job.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Succeeded, a.attempt));
    h.finish().await;
}

fn thirty_days() -> Retention {
    Retention {
        jobs: std::time::Duration::from_secs(30 * 86_400),
        keys: None,
    }
}

/// A webhook's observation racing the pruner over the same finished job:
/// the pruner holds the job's row and deletes its observations; the
/// observation must not be inside the table waiting for that row (a
/// deadlock): it locks the job's row first, so it waits before writing,
/// and finds the job pruned.
///
/// Six finished jobs with an observation each: the pruner's DELETE then
/// scans the whole (small) observations table rather than its job index,
/// as it does with a full batch of 500 on a real one, and meets any row a
/// webhook inserted before waiting for the job.
#[tokio::test]
async fn an_observation_racing_the_pruner_finds_the_job_pruned_without_a_deadlock() {
    let h = Harness::start().await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let job = h.enqueue(Q, &format!("refund-{i}"), "{}").await;
        let a = h.claim_one(Q, "worker-a").await;
        let mut c = h.client.clone();
        c.record_observation(observation(job.job_id, "worker-saw"))
            .await
            .unwrap();
        c.complete(complete(job.job_id, a.attempt)).await.unwrap();
        ids.push(job.job_id);
    }
    sqlx::query("UPDATE jobs SET finished_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 31 DAY)")
        .execute(&h.pool)
        .await
        .unwrap();
    let mut gate = h.pauses.arm(PausePoint::PruneAfterLock);
    let store = h.coordinator.store().clone();
    let pruner =
        tokio::spawn(async move { store.prune(&thirty_days(), 500, |_: &PruneCounts| {}).await });
    gate.reached().await;
    let target = ids[2];
    let mut webhook = h.another_client().await;
    let observed = tokio::spawn(async move {
        webhook
            .record_observation(observation(target, "late-webhook"))
            .await
    });
    kit::until_lock_wait(&h.pool, &h.db.name).await;
    gate.release();
    let pruned = pruner.await.unwrap().expect("the pruning run ends");
    assert!(
        matches!(pruned, PruneRun::Done(c) if c.jobs == 6 && c.observations == 6),
        "{pruned:?}"
    );
    let refused = observed
        .await
        .unwrap()
        .expect_err("the job was pruned under the webhook's feet");
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    assert_eq!(reason(&refused), "JOB_PRUNED");
    let (retried, reported) = h.coordinator.store().conflicts();
    assert_eq!(
        (retried, reported),
        (0, 0),
        "no deadlock, no lock wait timeout"
    );
    h.finish().await;
}
