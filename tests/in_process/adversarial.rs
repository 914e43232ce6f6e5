//! Adversarial tests: each one pins a defect found while trying to break the
//! fencing, and the fix that closes it. Deterministic: no sleeps decide a
//! schedule.

use jobfence_testkit as kit;

use jobfence_api::v1::{
    ClaimRequest, EnqueueRequest, ObservationOutcome, ObservationSource, RecordObservationRequest,
    RenewLeaseRequest,
};
use kit::{reason, secs, Harness};
use tonic::Code;
use tonic_types::StatusExt;

const Q: &str = "refunds";

/// Claims the only job of `Q` with a lease of `lease_secs`.
async fn claim_with_lease(h: &Harness, worker: &str, lease_secs: i64) -> jobfence_api::v1::Job {
    h.client
        .clone()
        .claim(ClaimRequest {
            queue: Q.into(),
            worker_id: worker.into(),
            max_jobs: 1,
            lease: secs(lease_secs),
            wait: None,
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

/// The fields named by an INVALID_ARGUMENT's BadRequest detail.
fn bad_fields(status: &tonic::Status) -> Vec<String> {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(reason(status), "INVALID_REQUEST");
    status
        .get_details_bad_request()
        .expect("BadRequest detail")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect()
}

fn enqueue(key: &str, payload: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: Q.into(),
        operation_key: key.into(),
        payload: payload.into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    }
}

/// `utf8mb4_bin` is a PAD SPACE collation (MariaDB 10.11 and MySQL 8.4
/// alike): `'k' = 'k '`, and the unique keys on operation_key and dedup_key
/// compare that way. A provider does not: `k` and `k ` are two idempotency
/// keys. So `k ` was silently answered with the job of `k` (created=false,
/// another operation_key: the operation the caller asked for is never
/// sent), or refused as a conflict with a job it is not; an observation
/// with dedup key `d ` was dropped as a repeat of `d`. Such keys are refused
/// up front.
#[tokio::test]
async fn keys_equal_only_under_pad_space_are_refused_not_merged() {
    let h = Harness::start().await;
    let first = h.enqueue(Q, "refund-pay_1", r#"{"amount":500}"#).await;
    for payload in [r#"{"amount":500}"#, r#"{"amount":700}"#] {
        let out = h
            .client
            .clone()
            .enqueue(enqueue("refund-pay_1 ", payload))
            .await;
        match out {
            Ok(r) => panic!(
                "enqueue of 'refund-pay_1 ' answered with job {:?} (created={})",
                r.get_ref().job.as_ref().map(|j| &j.operation_key),
                r.get_ref().created
            ),
            Err(status) => assert_eq!(bad_fields(&status), ["operation_key"]),
        }
    }
    let obs = |dedup_key: &str, body: &str| RecordObservationRequest {
        job_id: first.job_id,
        attempt: 0,
        source: ObservationSource::Webhook as i32,
        outcome: ObservationOutcome::Succeeded as i32,
        provider_reference: "re_1".into(),
        body: body.into(),
        dedup_key: dedup_key.into(),
    };
    h.client
        .clone()
        .record_observation(obs("evt_1", "first"))
        .await
        .unwrap();
    let status = h
        .client
        .clone()
        .record_observation(obs("evt_1 ", "second"))
        .await
        .expect_err("a dedup key equal to another only under PAD SPACE is refused");
    assert_eq!(bad_fields(&status), ["dedup_key"]);
    h.finish().await;
}
