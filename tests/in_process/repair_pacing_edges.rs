//! Edge cases of BulkRepair, the paced settlement import and waiters
//! taking turns at a provider's budget, each held to what docs/api.md,
//! docs/operating.md or docs/design.md promise: three once failed (the
//! regression each guards is named in its comment), the others guard a
//! case nothing else tests.

use jobfence_testkit as kit;

use crate::settlement_pacing::{metric, workers_move, Streamed};
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{self as proto, bulk_repair_result, BulkRepairRequest, CountedJob};
use jobfence_domain::Enqueue;
use jobfence_store::PausePoint;
use kit::Harness;
use std::time::Duration;
use tonic::transport::Channel;

const Q: &str = "refunds";

async fn admin(h: &Harness) -> JobAdminClient<Channel> {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

/// `n` ready jobs of `Q` (EnqueueBatch through the store); their ids.
async fn seed(h: &Harness, n: u64) -> Vec<u64> {
    let store = h.coordinator.store();
    let mut ids = Vec::new();
    for start in (0..n).step_by(1000) {
        let items: Vec<Enqueue> = (start..(start + 1000).min(n))
            .map(|k| Enqueue {
                queue: Q.into(),
                operation_key: format!("refund-{k}"),
                payload: "{}".into(),
                delay: Duration::ZERO,
                fairness_key: None,
                priority: Default::default(),
            })
            .collect();
        for r in store.enqueue_batch(&items).await.unwrap() {
            ids.push(r.unwrap().job.id);
        }
    }
    ids
}

fn cancel_of(ids: &[u64], operator: &str, reason: &str) -> BulkRepairRequest {
    BulkRepairRequest {
        action: proto::BulkAction::Cancel as i32,
        jobs: ids
            .iter()
            .map(|&job_id| CountedJob { job_id, attempt: 0 })
            .collect(),
        operator: operator.into(),
        reason: reason.into(),
    }
}

async fn count(h: &Harness, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&h.pool).await.unwrap()
}

/// docs/api.md and admin.proto: a BulkRepair names 1..=1000 jobs and a
/// reason of 1..=4096 bytes, "recorded in every job's event". The same
/// reason on one CancelJob is taken. So 1000 jobs with a 4096-byte reason
/// are a valid call and must be applied.
///
/// Regression: the events of a batch above 8 jobs go to the database as a
/// JSON array parameter (crates/store/src/events.rs `append_all`), and
/// each job's `detail` carries the whole reason JSON-escaped twice. A
/// reason of control characters (`\u0001` → 7 bytes each) made that one
/// parameter ~28 MiB, over the server's default `max_allowed_packet` (16
/// MiB): the whole batch failed as DATABASE_UNAVAILABLE and no job was
/// cancelled. The events now go in arrays of at most 4 MiB each.
#[tokio::test]
async fn a_bulk_of_1000_jobs_with_a_4096_byte_reason_is_applied() {
    let h = Harness::start().await;
    let ids = seed(&h, 1000).await;
    let reason = "\u{1}".repeat(4096);
    let mut a = admin(&h).await;
    let answer = a.bulk_repair(cancel_of(&ids, "alice", &reason)).await;
    let answer = match answer {
        Ok(r) => r.into_inner(),
        Err(s) => panic!("a valid BulkRepair refused as a whole: {s:?}"),
    };
    let first_error = answer.results.iter().find_map(|r| match &r.result {
        Some(bulk_repair_result::Result::Error(e)) => Some(e.clone()),
        _ => None,
    });
    assert_eq!(answer.applied, 1000, "first error: {first_error:?}");
    let cancelled = count(&h, "SELECT COUNT(*) FROM jobs WHERE state = 'cancelled'").await;
    assert_eq!(cancelled, 1000);
    h.finish().await;
}

/// Guard: a batch of more than 8 jobs writes its events through a JSON
/// array read by JSON_TABLE, a single call through plain VALUES. The
/// operator's name and reason must come out byte for byte the same on
/// both paths (quotes, backslashes, newlines, tabs, control characters,
/// non-ASCII and a character outside the BMP), in each job's event and
/// in its state_reason.
#[tokio::test]
async fn a_bulk_records_any_operator_and_reason_byte_for_byte_as_a_single_call() {
    let h = Harness::start().await;
    let ids = seed(&h, 21).await;
    let operator = "O'Brien \"ops\" \\ ü";
    let reason = "incident \"12\"\n\tC:\\path \u{1} é 🦀 '; DROP TABLE jobs; --";
    let mut a = admin(&h).await;
    let done = a
        .bulk_repair(cancel_of(&ids[..20], operator, reason))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.applied, 20);
    a.cancel_job(proto::CancelJobRequest {
        job_id: ids[20],
        attempt: 0,
        operator: operator.into(),
        reason: reason.into(),
    })
    .await
    .unwrap();
    let rows: Vec<(u64, String, String)> = sqlx::query_as(
        "SELECT job_id, CAST(JSON_VALUE(detail, '$.operator') AS CHAR), \
         CAST(JSON_VALUE(detail, '$.reason') AS CHAR) FROM job_events \
         WHERE kind = 'cancelled' ORDER BY job_id",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 21);
    for (job, op, why) in &rows {
        assert_eq!((op.as_str(), why.as_str()), (operator, reason), "job {job}");
    }
    let reasons: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT CAST(state_reason AS CHAR) FROM jobs WHERE state = 'cancelled'",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap();
    assert_eq!(reasons, [format!("cancelled by {operator}: {reason}")]);
    h.finish().await;
}

/// Guard: two operators' bulk cancels over overlapping jobs at once. Alice's
/// batch holds the row locks of jobs 1–6 (paused after locking); Bob's,
/// over jobs 4–9, waits for them. Once Alice commits, Bob's batch cancels
/// 7–9 and skips 4–6 as moved (JOB_NOT_CANCELLABLE): no job cancelled
/// twice, each cancel under the name of the operator who applied it, each
/// of Bob's refusals recorded under his name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bulk_cancels_over_the_same_jobs_at_once_cancel_each_job_once() {
    let h = Harness::start().await;
    let ids = seed(&h, 9).await;
    let mut held = h.pauses.arm(PausePoint::CancelAfterLock);
    let mut a = admin(&h).await;
    let alices = ids[..6].to_vec();
    let alice = tokio::spawn(async move {
        a.bulk_repair(cancel_of(&alices, "alice", "incident 12"))
            .await
            .unwrap()
            .into_inner()
    });
    held.reached().await;
    let mut b = admin(&h).await;
    let bobs = ids[3..].to_vec();
    let bob = tokio::spawn(async move {
        b.bulk_repair(cancel_of(&bobs, "bob", "incident 13"))
            .await
            .unwrap()
            .into_inner()
    });
    kit::locks::until_lock_wait(&h.pool, &h.db.name).await;
    held.release();
    let alice = alice.await.unwrap();
    let bob = bob.await.unwrap();
    assert_eq!((alice.applied, alice.skipped), (6, 0));
    assert_eq!((bob.applied, bob.skipped), (3, 3), "{bob:?}");
    for r in &bob.results[..3] {
        let Some(bulk_repair_result::Result::Error(e)) = &r.result else {
            panic!("{r:?}");
        };
        assert_eq!(e.reason, "JOB_NOT_CANCELLABLE", "{r:?}");
    }
    let by: Vec<(u64, String)> = sqlx::query_as(
        "SELECT job_id, CAST(JSON_VALUE(detail, '$.operator') AS CHAR) FROM job_events \
         WHERE kind = 'cancelled' ORDER BY job_id",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap();
    let expected: Vec<(u64, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, if i < 6 { "alice" } else { "bob" }.to_string()))
        .collect();
    assert_eq!(by, expected);
    let bob_refused = count(
        &h,
        "SELECT COUNT(*) FROM job_events WHERE kind = 'cancel_rejected' \
         AND JSON_VALUE(detail, '$.operator') = 'bob'",
    )
    .await;
    assert_eq!(bob_refused, 3);
    h.finish().await;
}

/// The yielding gauge of the settlement import.
fn yielding_gauge(h: &Harness) -> f64 {
    metric(
        h,
        "jobfence_background_yielding{work=\"settlement_import\"}",
    )
}

/// docs/operating.md, Metrics: `jobfence_background_yielding` is "1 while
/// this coordinator's background work rests after each batch to leave the
/// database to the workers, 0 while it runs flat out or not at all".
///
/// Import A is made to yield (the schedule of settlement_pacing.rs: the
/// workers move only while it rests) and is held inside its yield rest.
/// Import B starts beside it, on the same coordinator, and runs its first
/// batch with nothing moving (flat out). A is still resting to leave the
/// database to the workers, so the gauge must stay 1.
///
/// Regression: each import once set the one gauge of the work after each
/// of its batches, so the last import to finish a batch won and a
/// yielding import was hidden by a flat-out one beside it. The gauges are
/// now set from every running import's pace
/// (crates/core/src/settlement/running.rs).
#[tokio::test]
async fn the_yielding_gauge_stays_1_while_one_of_two_imports_yields() {
    let h = Harness::start().await;
    crate::settlement::provider(&h).await;
    let replica = h.replica(kit::test_config()).await;
    let mut first_rest = h.pauses.arm(PausePoint::PacedRest);
    let mut a = Streamed::start(&h, "import-a", "a").await;
    a.batch().await;
    first_rest.reached().await;
    workers_move(&replica, 0).await;
    let mut yield_rest = h.pauses.arm(PausePoint::PacedRest);
    first_rest.release();
    a.batch().await;
    yield_rest.reached().await;
    assert_eq!(yielding_gauge(&h), 1.0, "import A yields");
    // B's first batch, with nothing moving: it probes once, flat out.
    let mut b_probe = h.pauses.arm(PausePoint::PacedRest);
    let mut b = Streamed::start(&h, "import-b", "b").await;
    b.batch().await;
    b_probe.reached().await;
    let during = yielding_gauge(&h);
    b_probe.release();
    yield_rest.release();
    let (a, b) = (a.finish().await, b.finish().await);
    assert_eq!(
        a.pace.unwrap().state(),
        proto::PaceState::Yielding,
        "A yielded"
    );
    assert_eq!(b.lines_new, 5);
    assert_eq!(
        during, 1.0,
        "import A was resting to leave the database to the workers"
    );
}

/// Live rows of `budget_waiters` that are not the test's 256 stand-ins
/// (ids 1..=256): the real long-polling Claim's registration.
async fn real_waiters(h: &Harness) -> i64 {
    count(
        h,
        "SELECT COUNT(*) FROM budget_waiters WHERE provider = 'stripe' AND waiter > 256 \
         AND expires_at > UTC_TIMESTAMP(6)",
    )
    .await
}

/// docs/design.md rule 11 ("Waiters take turns") and
/// crates/store/src/waiters.rs: a waiter's registration is "taken off once
/// it no longer waits for the budget"; only a crashed coordinator's
/// waiters are left to lapse (they "hold their turn for at most" their
/// TTL).
///
/// 256 live waiters of another coordinator stand ahead (rows written as a
/// claim writes them), so a new long-polling Claim is the 257th: past the
/// `MAX_WAITERS_READ` (256) a claim reads. Once the budget is raised the
/// Claim is handed its job and returns; its registration must be gone.
///
/// Regression: `statements` (crates/store/src/waiters.rs) once took a
/// slot's ticket off only when it was among the waiters read, and a
/// waiter past the 256th never is: the handed Claim's row kept its place
/// in the turn order, and once among the first ones a job's worth of
/// units was left for a Claim that was gone. A cut read now takes the
/// ticket off all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_past_the_256_read_is_taken_off_once_handed_its_job() {
    let h = Harness::start().await;
    h.put_budget("stripe", Q, 0.01, 1).await;
    h.enqueue(Q, "refund-1", "{}").await;
    h.enqueue(Q, "refund-2", "{}").await;
    // The burst's one unit goes to the first job.
    h.claim_one(Q, "worker-a").await;
    let stand_ins: Vec<String> = (1..=256)
        .map(|i| {
            format!(
                "('stripe', {i}, '{Q}', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, \
                 UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)"
            )
        })
        .collect();
    sqlx::query(&format!(
        "INSERT INTO budget_waiters (provider, waiter, queue, since, expires_at) VALUES {}",
        stand_ins.join(", ")
    ))
    .execute(&h.pool)
    .await
    .unwrap();
    sqlx::query(
        "UPDATE providers SET waiters_until = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR \
         WHERE name = 'stripe'",
    )
    .execute(&h.pool)
    .await
    .unwrap();
    let mut w = h.another_client().await;
    let waiter = tokio::spawn(async move {
        w.claim(proto::ClaimRequest {
            queue: Q.into(),
            worker_id: "worker-w".into(),
            max_jobs: 1,
            lease: kit::secs(60),
            wait: kit::secs(30),
        })
        .await
        .unwrap()
        .into_inner()
    });
    // Held back by the budget: written down as the 257th waiter.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while real_waiters(&h).await == 0 {
        assert!(std::time::Instant::now() < deadline, "never registered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Enough units for every waiter ahead and this one.
    h.put_budget("stripe", Q, 1000.0, 1000).await;
    let claimed = waiter.await.unwrap();
    assert_eq!(claimed.jobs.len(), 1, "handed its job");
    assert_eq!(
        real_waiters(&h).await,
        0,
        "the Claim that was handed its job no longer waits: its registration is taken off"
    );
    h.finish().await;
}
