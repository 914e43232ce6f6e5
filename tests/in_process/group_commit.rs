//! Group commit: concurrent fenced writes share one transaction, and each
//! is still decided on its own row (docs/design.md rule 8). A stale write in a
//! batch gets its own refusal while the rest apply; a replay inside a batch
//! is recognised; a lost commit is unknown for every write in it. The
//! batches are formed deterministically: at the store by handing it the
//! batch, and through gRPC by holding the only write slot at a pause point
//! until the next calls are queued behind it.

use jobfence_testkit as kit;

use jobfence_api::v1::{self as proto, TakeoverRequest};
use jobfence_domain::{
    Complete, CoordinatorError, Fail, FailDisposition, FencedWrite, JobState, QueuePolicies,
    RenewLease,
};
use jobfence_server::ServeOptions;
use jobfence_store::JobStore;
use kit::{reason, until, waiting, Harness};
use std::time::Duration;
use tonic::Code;

const Q: &str = "refunds";

fn complete(job_id: u64, attempt: u64, reference: &str) -> FencedWrite {
    FencedWrite::Complete(Complete {
        job_id,
        attempt,
        provider_reference: Some(reference.into()),
        result: None,
    })
}

/// Takes the job over (its lease forced expired): the holder's attempt is
/// superseded.
async fn take_over(h: &Harness, job_id: u64) -> u64 {
    h.force_lease_expired(job_id).await;
    h.client
        .clone()
        .takeover(TakeoverRequest {
            job_id,
            worker_id: "worker-b".into(),
            lease: None,
        })
        .await
        .unwrap()
        .into_inner()
        .claimed
        .unwrap()
        .job
        .unwrap()
        .attempt
}

/// The database clock now (`UTC_TIMESTAMP(6)`).
async fn db_now(h: &Harness) -> chrono::NaiveDateTime {
    sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// Asserts that a lease of `secs` was given between the database
/// instants `from` and `to`: `lease_until` lies in `[from + secs, to +
/// secs]` (all on the DB clock; nothing measured by this process).
fn assert_lease_given(
    lease_until: Option<chrono::NaiveDateTime>,
    from: chrono::NaiveDateTime,
    to: chrono::NaiveDateTime,
    secs: i64,
) {
    let until = lease_until.expect("a running job has a lease");
    let lease = chrono::Duration::seconds(secs);
    assert!(
        from + lease <= until && until <= to + lease,
        "lease until {until}, given between {from} and {to} for {secs} s"
    );
}

#[tokio::test]
async fn a_stale_write_in_a_batch_is_refused_alone_and_the_others_apply() {
    let h = Harness::start().await;
    let mut jobs = Vec::new();
    for i in 0..4 {
        h.enqueue(Q, &format!("refund-{i}"), "{}").await;
    }
    for _ in 0..4 {
        jobs.push(h.claim_one(Q, "worker-a").await);
    }
    // Job 2's holder was superseded by a takeover; job 3 was already
    // completed by its holder (the same attempt writing again).
    let current = take_over(&h, jobs[2].job_id).await;
    let store = JobStore::new(h.pool.clone());
    store
        .complete(&Complete {
            job_id: jobs[3].job_id,
            attempt: jobs[3].attempt,
            provider_reference: Some("re_first".into()),
            result: None,
        })
        .await
        .unwrap();

    let batch = vec![
        complete(jobs[0].job_id, jobs[0].attempt, "re_0"),
        FencedWrite::Fail(Fail {
            job_id: jobs[1].job_id,
            attempt: jobs[1].attempt,
            disposition: FailDisposition::RetryReconcile,
            error: "timeout".into(),
            retry_delay: Duration::from_secs(60),
            provider_retry_after: None,
            expected_lease: Duration::from_secs(30),
        }),
        complete(jobs[2].job_id, jobs[2].attempt, "re_zombie"),
        complete(jobs[3].job_id, jobs[3].attempt, "re_other"),
    ];
    let answers = store.write_batch(&batch, &QueuePolicies::default()).await;
    assert_eq!(answers.len(), 4);
    let done = answers[0].as_ref().expect("job 0 applies");
    assert_eq!(
        (done.job.state, done.replayed),
        (JobState::Succeeded, false)
    );
    let retried = answers[1].as_ref().expect("job 1 applies");
    assert_eq!(retried.job.state, JobState::Ready);
    assert!(
        matches!(
            answers[2],
            Err(CoordinatorError::AttemptSuperseded { presented, current: c, .. })
                if presented == jobs[2].attempt && c == current
        ),
        "{:?}",
        answers[2]
    );
    assert!(
        matches!(answers[3], Err(CoordinatorError::JobNotRunning { .. })),
        "{:?}",
        answers[3]
    );

    // Each answer is the row as committed.
    for (answer, job) in answers.iter().zip(&jobs).take(2) {
        assert_eq!(answer.as_ref().unwrap().job, h.row(job.job_id).await);
    }
    let zombie = h.row(jobs[2].job_id).await;
    assert_eq!((zombie.state, zombie.attempt), (JobState::Running, current));
    assert_eq!(
        zombie.provider_reference, None,
        "the stale write changed nothing"
    );
    let other = h.row(jobs[3].job_id).await;
    assert_eq!(other.provider_reference.as_deref(), Some("re_first"));
    // One event per call.
    assert_eq!(h.count_events(jobs[0].job_id, "completed").await, 1);
    assert_eq!(h.count_events(jobs[1].job_id, "retry_scheduled").await, 1);
    assert_eq!(
        h.count_events(jobs[2].job_id, "stale_write_rejected").await,
        1
    );
    assert_eq!(
        h.count_events(jobs[3].job_id, "stale_write_rejected").await,
        1
    );
    assert_eq!(h.count_events(jobs[3].job_id, "completed").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_replay_inside_a_batch_is_answered_as_one_and_writes_nothing() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-a", "{}").await;
    h.enqueue(Q, "refund-b", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let b = h.claim_one(Q, "worker-b").await;
    let store = JobStore::new(h.pool.clone());
    let first = store
        .write_batch(
            &[complete(a.job_id, a.attempt, "re_a")],
            &QueuePolicies::default(),
        )
        .await;
    assert!(!first[0].as_ref().unwrap().replayed);

    // A's answer was lost: it sends the same call again, in a batch with B's.
    let answers = store
        .write_batch(
            &[
                complete(a.job_id, a.attempt, "re_a"),
                complete(b.job_id, b.attempt, "re_b"),
            ],
            &QueuePolicies::default(),
        )
        .await;
    let replay = answers[0].as_ref().expect("a replay is OK");
    assert!(replay.replayed);
    assert_eq!(replay.job.provider_reference.as_deref(), Some("re_a"));
    let applied = answers[1].as_ref().expect("B applies");
    assert!(!applied.replayed);
    assert_eq!(h.count_events(a.job_id, "completed").await, 1);
    assert_eq!(h.count_events(a.job_id, "stale_write_rejected").await, 0);
    assert_eq!(h.count_events(b.job_id, "completed").await, 1);

    // Two calls to one job in one batch: applied in order, the second a
    // replay of the first.
    h.enqueue(Q, "refund-c", "{}").await;
    let c = h.claim_one(Q, "worker-c").await;
    let twice = store
        .write_batch(
            &[
                complete(c.job_id, c.attempt, "re_c"),
                complete(c.job_id, c.attempt, "re_c"),
            ],
            &QueuePolicies::default(),
        )
        .await;
    assert!(!twice[0].as_ref().unwrap().replayed);
    assert!(twice[1].as_ref().unwrap().replayed);
    assert_eq!(h.count_events(c.job_id, "completed").await, 1);
    h.finish().await;
}

/// A batch whose COMMIT is lost: every write it would have applied is
/// COMMIT_OUTCOME_UNKNOWN, while a stale write refused in the same round
/// keeps its refusal (nothing of it was to be written: docs/design.md
/// rules 4 and 8). With a claim half the whole round is unknown instead
/// (`commit_unknown.rs`).
#[tokio::test]
async fn a_lost_commit_of_a_batch_is_unknown_for_every_write_and_replays_answer_true() {
    let h = Harness::start().await;
    let mut jobs = Vec::new();
    for i in 0..4 {
        h.enqueue(Q, &format!("refund-{i}"), "{}").await;
    }
    for _ in 0..4 {
        jobs.push(h.claim_one(Q, "worker-a").await);
    }
    let current = take_over(&h, jobs[3].job_id).await;
    let store = JobStore::with_pause_points(h.pool.clone(), h.pauses.clone());
    let batch: Vec<FencedWrite> = jobs
        .iter()
        .map(|j| complete(j.job_id, j.attempt, "re_x"))
        .collect();
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::WriteBeforeCommit);
    let writer = {
        let (store, batch) = (store.clone(), batch.clone());
        tokio::spawn(async move { store.write_batch(&batch, &QueuePolicies::default()).await })
    };
    gate.reached().await;
    // The batch holds its rows' locks; its connection dies before COMMIT.
    kit::kill_the_paused_session(&h, &gate).await;
    gate.release();
    let answers = writer.await.unwrap();
    for a in &answers[..3] {
        assert!(
            matches!(a, Err(CoordinatorError::CommitOutcomeUnknown(_))),
            "{a:?}"
        );
    }
    assert!(
        matches!(&answers[3], Err(CoordinatorError::AttemptSuperseded { current: c, .. }) if *c == current),
        "the stale write keeps its refusal: {:?}",
        answers[3]
    );
    // The server rolled back: each replay applies now, once; the next
    // replay says so.
    let (jobs, batch) = (&jobs[..3], &batch[..3]);
    for job in jobs {
        assert_eq!(h.row(job.job_id).await.state, JobState::Running);
    }
    let again = store.write_batch(batch, &QueuePolicies::default()).await;
    for a in &again {
        assert!(!a.as_ref().unwrap().replayed);
    }
    let once_more = store.write_batch(batch, &QueuePolicies::default()).await;
    for (a, job) in once_more.iter().zip(jobs) {
        assert!(a.as_ref().unwrap().replayed);
        assert_eq!(h.count_events(job.job_id, "completed").await, 1);
    }
    h.finish().await;
}

#[tokio::test]
async fn concurrent_grpc_writes_share_a_transaction_and_each_gets_its_own_answer() {
    // One write slot, so calls queue behind a held batch.
    let mut config = kit::test_config();
    config.batching.concurrency = 1;
    let h = Harness::start_with(
        config,
        ServeOptions {
            drain_delay: Duration::ZERO,
            ..ServeOptions::default()
        },
    )
    .await;
    let mut jobs = Vec::new();
    for i in 0..4 {
        h.enqueue(Q, &format!("refund-{i}"), "{}").await;
    }
    for _ in 0..4 {
        jobs.push(h.claim_one(Q, "worker-a").await);
    }
    let stale_attempt = jobs[3].attempt;
    let current = take_over(&h, jobs[3].job_id).await;

    let lease_before = h.row(jobs[0].job_id).await.lease_until;
    // The renewal reads the clock when it has locked its row.
    let renewed_from = db_now(&h).await;
    // The first write holds the only slot, paused under its row lock.
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::WriteAfterLock);
    let mut c = h.another_client().await;
    let first = jobs[0].clone();
    let held = tokio::spawn(async move {
        c.renew_lease(proto::RenewLeaseRequest {
            job_id: first.job_id,
            attempt: first.attempt,
            lease: kit::secs(60),
        })
        .await
    });
    gate.reached().await;
    // Three more queue up behind it: two current Completes and a zombie's.
    let mut calls = Vec::new();
    for (job, attempt) in [
        (&jobs[1], jobs[1].attempt),
        (&jobs[2], jobs[2].attempt),
        (&jobs[3], stale_attempt),
    ] {
        let mut c = h.another_client().await;
        let req = proto::CompleteRequest {
            job_id: job.job_id,
            attempt,
            provider_reference: format!("re_{}", job.job_id),
            result: String::new(),
            next: None,
        };
        calls.push(tokio::spawn(async move { c.complete(req).await }));
    }
    until("three writes wait for the slot", || {
        waiting(&h.coordinator, "write") == 3
    })
    .await;
    gate.release();
    let renewed = held.await.unwrap().expect("the renewal applies");
    let renewed_to = db_now(&h).await;
    // The renewal moved the lease on the row: 60 s from its own clock
    // reading, past the claim's lease.
    let row = h.row(jobs[0].job_id).await;
    assert_eq!(
        (row.state, row.attempt),
        (JobState::Running, jobs[0].attempt)
    );
    assert_lease_given(row.lease_until, renewed_from, renewed_to, 60);
    assert!(row.lease_until > lease_before, "the lease moved");
    let answered = renewed.into_inner().job.unwrap().lease_until.unwrap();
    assert_eq!(
        answered.seconds * 1_000_000 + i64::from(answered.nanos / 1000),
        row.lease_until.unwrap().and_utc().timestamp_micros(),
        "the answer tells the stored lease"
    );
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    assert!(answers[0].is_ok() && answers[1].is_ok());
    let refused = answers[2].as_ref().unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(reason(refused), "ATTEMPT_SUPERSEDED");
    assert_eq!(kit::meta(refused, "current_attempt"), current.to_string());
    // The three shared one transaction: one batch of 3 in the metrics.
    let text = h.coordinator.metrics().render();
    let batches_of = |le: &str| -> u64 {
        let line = format!("jobfence_batch_size_bucket{{pipeline=\"write\",le=\"{le}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in {text}"))
            .parse()
            .unwrap()
    };
    // Every earlier write was a batch of one; this one was a batch of three.
    assert_eq!(batches_of("4") - batches_of("2"), 1, "{text}");
    for job in &jobs[1..3] {
        assert_eq!(h.row(job.job_id).await.state, JobState::Succeeded);
    }
    let zombie = h.row(jobs[3].job_id).await;
    assert_eq!((zombie.state, zombie.attempt), (JobState::Running, current));
    h.finish().await;
}

#[tokio::test]
async fn a_renewal_and_a_complete_of_one_job_in_one_batch_apply_in_order() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let job = h.claim_one(Q, "worker-a").await;
    h.enqueue(Q, "refund-2", "{}").await;
    let other = h.claim_one(Q, "worker-b").await;
    let store = JobStore::new(h.pool.clone());
    let from = db_now(&h).await;
    let answers = store
        .write_batch(
            &[
                FencedWrite::RenewLease(RenewLease {
                    job_id: job.job_id,
                    attempt: job.attempt,
                    lease: Duration::from_secs(600),
                }),
                complete(job.job_id, job.attempt, "re_1"),
                FencedWrite::RenewLease(RenewLease {
                    job_id: job.job_id,
                    attempt: job.attempt,
                    lease: Duration::from_secs(600),
                }),
                // Another job's renewal in the same batch stays running,
                // so the moved lease can be read back from its row.
                FencedWrite::RenewLease(RenewLease {
                    job_id: other.job_id,
                    attempt: other.attempt,
                    lease: Duration::from_secs(600),
                }),
            ],
            &QueuePolicies::default(),
        )
        .await;
    let to = db_now(&h).await;
    // The renewal moved the lease (600 s from the batch's clock reading)
    // before the Complete in the same transaction ended it.
    let renewed = &answers[0].as_ref().unwrap().job;
    assert_eq!(renewed.state, JobState::Running);
    assert_lease_given(renewed.lease_until, from, to, 600);
    assert_eq!(answers[1].as_ref().unwrap().job.state, JobState::Succeeded);
    assert_eq!(h.row(job.job_id).await.lease_until, None);
    let other_row = h.row(other.job_id).await;
    assert_eq!(other_row.state, JobState::Running);
    assert_lease_given(other_row.lease_until, from, to, 600);
    assert_eq!(
        other_row.lease_until,
        answers[3].as_ref().unwrap().job.lease_until
    );
    // A renewal is never a replay: after the Complete it is refused.
    assert!(
        matches!(answers[2], Err(CoordinatorError::JobNotRunning { .. })),
        "{:?}",
        answers[2]
    );
    h.finish().await;
}
