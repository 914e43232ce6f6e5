//! The Rust worker SDK against the real coordinator and MariaDB: handles,
//! typed refusals, replays, unclear claims and the runner. Every race is
//! scheduled by pause points, a proxy that loses answers on demand, or a
//! barrier; never by a sleep.

use jobfence_testkit as kit;

use jobfence_domain::{JobState, NextAction as DomainAction};
use jobfence_worker::proto::{self, NextAction, ObservationOutcome, ObservationSource};
use jobfence_worker::{
    observation_dedup_key, ClaimError, ClaimedJob, Disposition, Enqueue, Handler, HandlerError,
    Worker, WorkerClient, WriteError,
};
use kit::sdk::{config, observations, sdk, Proxy};
use kit::Harness;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Barrier, Notify};

mod runner;

const Q: &str = "refunds";

async fn claim_one(client: &WorkerClient) -> ClaimedJob {
    let mut jobs = client.claim(1).await.expect("claim");
    assert_eq!(jobs.len(), 1, "expected one claimable job");
    jobs.remove(0)
}

#[tokio::test]
async fn a_handle_completes_the_job_it_holds() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-pay_1-500-TWD", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let mut job = claim_one(&a).await;
    assert_eq!(job.job_id(), enqueued.job_id);
    assert_eq!(job.attempt(), 1);
    assert_eq!(job.operation_key(), "refund-pay_1-500-TWD");
    assert_eq!(job.next_action(), NextAction::Execute);
    assert!(!job.is_takeover() && !job.is_settled());

    let written = job
        .complete("re_1", r#"{"status":"succeeded"}"#)
        .await
        .expect("the holder completes");
    assert!(!written.replayed);
    assert_eq!(written.job.state(), proto::JobState::Succeeded);
    assert!(job.is_settled());
    let row = h.row(enqueued.job_id).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.attempt, 1);
    assert_eq!(row.provider_reference.as_deref(), Some("re_1"));
    assert_eq!(row.lease_owner.as_deref(), Some("worker-a"));
    assert!(observations(&h, enqueued.job_id).await.is_empty());
    h.finish().await;
}

#[tokio::test]
async fn a_stale_handle_is_superseded_and_its_provider_result_becomes_an_observation() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-stale", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let b = sdk(&h, config("worker-b", Q)).await;
    let mut stale = claim_one(&a).await;

    // A stalls at the provider; its lease runs out (forced) and B takes over.
    h.force_lease_expired(enqueued.job_id).await;
    let mut current = b.takeover(enqueued.job_id).await.expect("B takes over");
    assert_eq!(current.attempt(), 2);
    assert!(current.is_takeover());
    assert_eq!(current.next_action(), NextAction::Reconcile);
    assert_eq!(current.operation_key(), stale.operation_key());

    // A finally hears "refund succeeded": the write is refused, the
    // evidence is kept.
    let body = r#"{"id":"re_A","status":"succeeded"}"#;
    match stale.complete("re_A", body).await {
        Err(WriteError::Superseded {
            current_attempt: 2,
            current_state: proto::JobState::Running,
            observation_recorded: true,
        }) => {}
        other => panic!("expected Superseded with the observation recorded, got {other:?}"),
    }
    assert!(stale.is_settled());
    let seen = observations(&h, enqueued.job_id).await;
    assert_eq!(seen.len(), 1);
    let o = &seen[0];
    assert_eq!(o.attempt, 1);
    assert_eq!(o.source, ObservationSource::Worker as i32);
    assert_eq!(o.outcome, ObservationOutcome::Succeeded as i32);
    assert_eq!(o.provider_reference, "re_A");
    assert_eq!(o.body, body);
    assert_eq!(o.dedup_key, observation_dedup_key("worker-a", "re_A"));

    // Every other write of A is refused the same way, and records nothing.
    for refusal in [
        stale
            .fail(
                Disposition::RetryReconcile,
                "socket timeout",
                Duration::ZERO,
            )
            .await
            .unwrap_err(),
        stale
            .renew_lease(Duration::from_secs(30))
            .await
            .unwrap_err(),
    ] {
        assert!(
            matches!(
                refusal,
                WriteError::Superseded {
                    current_attempt: 2,
                    observation_recorded: false,
                    ..
                }
            ),
            "{refusal:?}"
        );
    }
    let row = h.row(enqueued.job_id).await;
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.attempt, 2);
    assert_eq!(row.lease_owner.as_deref(), Some("worker-b"));
    assert_eq!(row.provider_reference, None);

    // B reconciles, sees the evidence, and completes with its attempt.
    current
        .complete("re_A", body)
        .await
        .expect("the holder completes");
    // A repeats its late result: still refused, the observation not doubled.
    match stale.complete("re_A", body).await {
        Err(WriteError::Superseded {
            current_state: proto::JobState::Succeeded,
            observation_recorded: true,
            ..
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(observations(&h, enqueued.job_id).await.len(), 1);
    assert_eq!(h.count_events(enqueued.job_id, "completed").await, 1);
    assert_eq!(
        h.count_events(enqueued.job_id, "stale_write_rejected")
            .await,
        4
    );
    h.finish().await;
}

#[tokio::test]
async fn an_identical_write_again_is_reported_as_a_replay() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-replay", "{}").await;
    h.enqueue(Q, "refund-replay-fail", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let mut job = claim_one(&a).await;
    assert!(!job.complete("re_r", "ok").await.unwrap().replayed);
    let again = job.complete("re_r", "ok").await.expect("a replay is OK");
    assert!(again.replayed);
    assert_eq!(again.job.provider_reference, "re_r");
    // A different write by the same attempt is not a replay: the job is
    // done, and the new provider result is kept as evidence.
    match job.complete("re_other", "ok").await {
        Err(WriteError::NotRunning {
            state: proto::JobState::Succeeded,
            observation_recorded: true,
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.count_events(job.job_id(), "completed").await, 1);

    let mut other = claim_one(&a).await;
    let first = other
        .fail(
            Disposition::RetryReconcile,
            "timeout",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(first.applied, Disposition::RetryReconcile);
    assert_eq!(first.override_reason, None);
    assert_eq!(first.job.state(), proto::JobState::Ready);
    let replay = other
        .fail(
            Disposition::RetryReconcile,
            "timeout",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(replay.replayed && !first.replayed);
    // An invalid write is refused with its field violations; nothing changes.
    let mut third = {
        h.enqueue(Q, "refund-invalid", "{}").await;
        claim_one(&a).await
    };
    match third.fail(Disposition::Failed, "", Duration::ZERO).await {
        Err(WriteError::Invalid(bad)) => {
            assert!(bad.field_violations.iter().any(|v| v.field == "error"))
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(!third.is_settled());
    assert_eq!(h.row(third.job_id()).await.state, JobState::Running);
    h.finish().await;
}

#[tokio::test]
async fn a_complete_whose_answer_was_lost_is_retried_and_reported_as_a_replay() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-lost-answer", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let a = WorkerClient::connect(format!("http://{}", proxy.addr), config("worker-a", Q))
        .await
        .unwrap();
    let mut job = claim_one(&a).await;

    // The coordinator commits the Complete, but its answer never arrives.
    proxy.swallow_responses(true);
    let call = tokio::spawn(async move {
        let out = job.complete("re_L", "ok").await;
        (job, out)
    });
    kit::sdk::wait_for_row(&h, enqueued.job_id, "succeeded", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    // Cut first: the answer may still be on its way, and must be lost.
    proxy.cut();
    proxy.swallow_responses(false);

    // The SDK sends the same call again and is told it had been applied.
    let (job, out) = call.await.unwrap();
    let written = out.expect("the retried Complete is answered as a replay");
    assert!(written.replayed);
    assert!(job.is_settled());
    assert_eq!(h.count_events(enqueued.job_id, "completed").await, 1);
    assert_eq!(
        h.row(enqueued.job_id).await.provider_reference.as_deref(),
        Some("re_L")
    );
    h.finish().await;
}

#[tokio::test]
async fn a_claim_whose_commit_was_lost_hands_out_nothing() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-lost-commit", "{}").await;
    let a = sdk(&h, config("worker-a", Q)).await;
    let mut paused = h.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit);
    let claim = tokio::spawn(async move { a.claim(1).await });
    paused.reached().await;
    // The claim's connection dies just before its COMMIT.
    kit::sdk::kill_the_paused_session(&h, &paused).await;
    paused.release();
    match claim.await.unwrap() {
        Err(ClaimError::OutcomeUnknown(status)) => {
            assert_eq!(kit::reason(&status), "COMMIT_OUTCOME_UNKNOWN")
        }
        other => panic!("expected an unknown outcome and no handle, got {other:?}"),
    }
    // The kill rolled the claim back; nobody must have assumed otherwise.
    let row = h.row(enqueued.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    assert_eq!(row.attempt, 0);
    h.finish().await;
}

#[tokio::test]
async fn a_claim_committed_but_unanswered_hands_out_nothing_and_comes_back_to_reconcile() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-unanswered-claim", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let a = WorkerClient::connect(format!("http://{}", proxy.addr), config("worker-a", Q))
        .await
        .unwrap();
    proxy.swallow_responses(true);
    let claim = tokio::spawn(async move { a.claim(1).await });
    kit::sdk::wait_for_row(&h, enqueued.job_id, "claimed", |j| {
        j.state == JobState::Running
    })
    .await;
    proxy.cut();
    assert!(
        matches!(claim.await.unwrap(), Err(ClaimError::OutcomeUnknown(_))),
        "no handle for a claim nobody heard back from"
    );
    // It did commit: attempt 1 is held by nobody. It is not retried or
    // inferred from this row; it comes back once its lease runs out, and
    // the takeover starts by reconciling.
    let row = h.row(enqueued.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    let b = sdk(&h, config("worker-b", Q)).await;
    assert!(b.claim(1).await.unwrap().is_empty(), "the lease is live");
    h.force_lease_expired(enqueued.job_id).await;
    let job = claim_one(&b).await;
    assert_eq!(job.attempt(), 2);
    assert!(job.is_takeover());
    assert_eq!(job.next_action(), NextAction::Reconcile);
    assert_eq!(
        h.row(enqueued.job_id).await.next_action,
        DomainAction::Reconcile
    );
    h.finish().await;
}

#[tokio::test]
async fn a_coordinator_that_cannot_be_reached_hands_out_nothing() {
    // A port that was just free: nothing listens there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{closed}"))
        .unwrap()
        .connect_lazy();
    let client = WorkerClient::new(channel, config("worker-a", Q)).unwrap();
    assert!(matches!(
        client.claim(1).await,
        Err(ClaimError::OutcomeUnknown(_))
    ));
}

#[tokio::test]
async fn complete_or_observe_keeps_the_evidence_when_the_outcome_is_unknown() {
    let h = Harness::start().await;
    let enqueued = h.enqueue(Q, "refund-or-observe", "{}").await;
    let proxy = Proxy::start(h.addr).await;
    let mut cfg = config("worker-a", Q);
    cfg.retry.budget = Duration::ZERO; // so the lost answer stays unknown
    let a = WorkerClient::connect(format!("http://{}", proxy.addr), cfg)
        .await
        .unwrap();
    let mut job = claim_one(&a).await;
    assert!(matches!(
        job.complete_or_observe("", "ok").await,
        Err(WriteError::Invalid(_))
    ));

    proxy.swallow_responses(true);
    let call = tokio::spawn(async move {
        let out = job.complete_or_observe("re_O", "ok").await;
        (job, out)
    });
    kit::sdk::wait_for_row(&h, enqueued.job_id, "succeeded", |j| {
        j.state == JobState::Succeeded
    })
    .await;
    proxy.cut();
    proxy.swallow_responses(false);
    let (job, out) = call.await.unwrap();
    assert!(matches!(out, Err(WriteError::OutcomeUnknown(_))), "{out:?}");
    assert!(!job.is_settled(), "the handle cannot know it is done");
    // It landed after all, and the evidence is on record either way.
    let seen = observations(&h, enqueued.job_id).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].dedup_key, observation_dedup_key("worker-a", "re_O"));
    assert_eq!(h.row(enqueued.job_id).await.state, JobState::Succeeded);
    h.finish().await;
}

/// The SDK's reason names (from the API crate, never the coordinator's
/// code) must be exactly the coordinator's.
#[test]
fn the_sdk_reason_names_are_the_coordinators() {
    use jobfence_server::grpc::status::{reason as server, ERROR_DOMAIN};
    use jobfence_worker::reason as sdk;
    assert_eq!(sdk::ERROR_DOMAIN, ERROR_DOMAIN);
    let pairs = [
        (sdk::INVALID_REQUEST, server::INVALID_REQUEST),
        (sdk::JOB_NOT_FOUND, server::JOB_NOT_FOUND),
        (sdk::ATTEMPT_SUPERSEDED, server::ATTEMPT_SUPERSEDED),
        (sdk::ATTEMPT_NOT_ISSUED, server::ATTEMPT_NOT_ISSUED),
        (sdk::JOB_NOT_RUNNING, server::JOB_NOT_RUNNING),
        (sdk::JOB_FINISHED, server::JOB_FINISHED),
        (sdk::LEASE_NOT_EXPIRED, server::LEASE_NOT_EXPIRED),
        (sdk::OPERATION_KEY_CONFLICT, server::OPERATION_KEY_CONFLICT),
        (
            sdk::JOB_NOT_IN_MANUAL_REVIEW,
            server::JOB_NOT_IN_MANUAL_REVIEW,
        ),
        (sdk::JOB_NOT_CANCELLABLE, server::JOB_NOT_CANCELLABLE),
        (sdk::COMMIT_OUTCOME_UNKNOWN, server::COMMIT_OUTCOME_UNKNOWN),
        (sdk::DATABASE_UNAVAILABLE, server::DATABASE_UNAVAILABLE),
        (sdk::TRANSACTION_CONFLICT, server::TRANSACTION_CONFLICT),
        (sdk::INTERNAL, server::INTERNAL),
        (sdk::OVERLOADED, server::OVERLOADED),
        (sdk::SERVER_SHUTTING_DOWN, server::SERVER_SHUTTING_DOWN),
        (sdk::NO_COORDINATOR_SERVING, server::NO_COORDINATOR_SERVING),
        (sdk::CREDENTIAL_MISSING, server::CREDENTIAL_MISSING),
        (sdk::CREDENTIAL_INVALID, server::CREDENTIAL_INVALID),
        (sdk::CREDENTIAL_EXPIRED, server::CREDENTIAL_EXPIRED),
        (sdk::ROLE_NOT_ALLOWED, server::ROLE_NOT_ALLOWED),
        (sdk::QUEUE_NOT_ALLOWED, server::QUEUE_NOT_ALLOWED),
        (sdk::OPERATOR_MISMATCH, server::OPERATOR_MISMATCH),
        (
            sdk::PROVIDER_BUDGET_EXHAUSTED,
            server::PROVIDER_BUDGET_EXHAUSTED,
        ),
        (sdk::PROVIDER_PAUSED, server::PROVIDER_PAUSED),
        (sdk::PROVIDER_THROTTLED, server::PROVIDER_THROTTLED),
        (sdk::JOB_PRUNED, server::JOB_PRUNED),
        (sdk::EVENTS_CURSOR_PRUNED, server::EVENTS_CURSOR_PRUNED),
        (
            sdk::SETTLEMENT_EXCEPTION_NOT_FOUND,
            server::SETTLEMENT_EXCEPTION_NOT_FOUND,
        ),
        (
            sdk::SETTLEMENT_EXCEPTION_MOVED,
            server::SETTLEMENT_EXCEPTION_MOVED,
        ),
    ];
    for (mine, theirs) in pairs {
        assert_eq!(mine, theirs);
    }
    // And no reason the coordinator sends is missing from the SDK: the
    // values of the enum ErrorReason (errors.proto), which the server's
    // status mapping names, are exactly these.
    let mut declared: Vec<&str> = jobfence_api::v1::ErrorReason::ALL
        .iter()
        .map(|r| r.as_str_name())
        .collect();
    declared.sort_unstable();
    let mut all = sdk::ALL.to_vec();
    all.sort_unstable();
    assert_eq!(all, declared, "jobfence_worker::reason::ALL");
    assert_eq!(pairs.len(), declared.len());
}

/// `enqueue_batch` sends each job with its own fairness key and priority
/// (docs/design.md rule 18); a bad one refuses the batch with the item's
/// field named, and adds nothing.
#[tokio::test]
async fn a_batch_carries_each_jobs_fairness_key_and_priority() {
    let h = Harness::start().await;
    let a = sdk(&h, config("producer", Q)).await;
    let results = a
        .enqueue_batch([
            Enqueue::new(Q, "refund-b1", "{}")
                .fairness_key("merchant-7")
                .priority(9),
            Enqueue::new(Q, "refund-b2", "{}"),
        ])
        .await
        .expect("the batch is applied");
    let jobs: Vec<(String, u32, String)> = results
        .into_iter()
        .map(|r| match r.result {
            Some(proto::enqueue_batch_result::Result::Enqueued(e)) => {
                let j = e.job.unwrap();
                (j.operation_key, j.priority, j.fairness_key)
            }
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(
        jobs,
        [
            ("refund-b1".to_owned(), 9, "merchant-7".to_owned()),
            ("refund-b2".to_owned(), 5, String::new()),
        ]
    );
    let refused = a
        .enqueue_batch([
            Enqueue::new(Q, "refund-b3", "{}"),
            Enqueue::new(Q, "refund-b4", "{}").priority(10),
        ])
        .await;
    match refused {
        Err(WriteError::Invalid(bad)) => assert!(
            bad.field_violations
                .iter()
                .any(|v| v.field == "items[1].priority"),
            "{bad:?}"
        ),
        other => panic!("unexpected {other:?}"),
    }
    let added: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM jobs WHERE operation_key IN ('refund-b3', 'refund-b4')",
    )
    .fetch_one(&h.pool)
    .await
    .unwrap();
    assert_eq!(added, 0);
    h.finish().await;
}
