//! Waiters take turns at a provider's budget (docs/design.md rule 11,
//! "Waiters take turns"): a long-polling Claim on one coordinator is not
//! starved by the claims of other coordinators spending the same budget.
//! The bound is checked in hand-outs (the `claimed` events between the
//! Claim and its job), not in time; the time is reported beside.

use jobfence_testkit as kit;

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{ClaimRequest, CompleteRequest, EnqueueBatchRequest, EnqueueRequest};
use kit::{secs, Harness};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const Q: &str = "refunds";
/// The provider's budget: jobs a second, with a burst of one.
const RATE: f64 = 30.0;
/// Long-polling workers on each of the two busy coordinators.
const POLLERS: usize = 3;
/// Rounds of the third coordinator's waiter.
const ROUNDS: usize = 20;

async fn enqueue(h: &Harness, n: usize) {
    for first in (0..n).step_by(1000) {
        let items = (first..(first + 1000).min(n))
            .map(|i| EnqueueRequest {
                queue: Q.into(),
                operation_key: format!("refund-{i}"),
                payload: "{}".into(),
                ..Default::default()
            })
            .collect();
        h.client
            .clone()
            .enqueue_batch(EnqueueBatchRequest { items })
            .await
            .expect("enqueue batch");
    }
}

fn claim(worker: &str, wait_secs: i64) -> ClaimRequest {
    ClaimRequest {
        queue: Q.into(),
        worker_id: worker.into(),
        max_jobs: 1,
        lease: secs(60),
        wait: secs(wait_secs),
    }
}

async fn complete(
    client: &mut JobCoordinatorClient<Channel>,
    job: &jobfence_api::v1::Job,
) -> Result<(), tonic::Status> {
    client
        .complete(CompleteRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            provider_reference: format!("re_{}", job.job_id),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// A worker until `stop`: Claim one job (a long poll of 1 s, or, when
/// `impatient`, no wait and at once again), Complete it.
fn worker(
    mut client: JobCoordinatorClient<Channel>,
    id: String,
    impatient: bool,
    stop: Arc<AtomicBool>,
) {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let wait = if impatient { 0 } else { 1 };
            let Ok(claimed) = client.claim(claim(&id, wait)).await else {
                continue;
            };
            for c in claimed.into_inner().jobs {
                // At the end the coordinators stop under the workers.
                let _ = complete(&mut client, &c.job.expect("a claimed job")).await;
            }
        }
    });
}

async fn last_event(h: &Harness) -> u64 {
    sqlx::query_scalar("SELECT CAST(COALESCE(MAX(id), 0) AS UNSIGNED) FROM job_events")
        .fetch_one(&h.pool)
        .await
        .unwrap()
}

/// Hand-outs of other jobs after event `after` and before `job`'s.
async fn others_before(h: &Harness, after: u64, job: u64) -> u64 {
    sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS UNSIGNED) FROM job_events e \
         WHERE e.kind = 'claimed' AND e.id > ? AND e.job_id <> ? AND e.id < \
           (SELECT MIN(id) FROM job_events WHERE job_id = ? AND kind = 'claimed' AND id > ?)",
    )
    .bind(after)
    .bind(job)
    .bind(job)
    .bind(after)
    .fetch_one(&h.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_waiter_on_a_third_coordinator_gets_its_turn_at_a_shared_budget() {
    let h = Harness::start().await;
    h.put_budget("stripe", Q, RATE, 1).await;
    enqueue(&h, 3000).await;
    let b = h.replica(kit::test_config()).await;
    let c = h.replica(kit::test_config()).await;
    let stop = Arc::new(AtomicBool::new(false));
    for w in 0..POLLERS {
        worker(
            h.another_client().await,
            format!("a{w}"),
            false,
            stop.clone(),
        );
        worker(b.client.clone(), format!("b{w}"), false, stop.clone());
    }
    // And one worker on each that never waits and asks again at once.
    worker(
        h.another_client().await,
        "a-eager".into(),
        true,
        stop.clone(),
    );
    worker(b.client.clone(), "b-eager".into(), true, stop.clone());
    // Every other waiter may be ahead of it, and a claim of each busy
    // coordinator may have passed the budget before it was written down.
    let bound = (2 * POLLERS + 1 + 2) as u64;
    let mut waiter = c.client.clone();
    let mut worst = (0, Duration::ZERO);
    let (started, mut handed) = (Instant::now(), 0);
    for round in 0..ROUNDS {
        let from = last_event(&h).await;
        let asked = Instant::now();
        let jobs = waiter
            .claim(claim("c-waiter", 3))
            .await
            .expect("claim")
            .into_inner()
            .jobs;
        let took = asked.elapsed();
        let job = jobs
            .first()
            .and_then(|j| j.job.clone())
            .unwrap_or_else(|| panic!("round {round}: the waiter got nothing in 3 s"));
        let others = others_before(&h, from, job.job_id).await;
        assert!(
            others <= bound,
            "round {round}: {others} other hand-outs before the waiter's (bound {bound})"
        );
        worst = worst.max((others, took));
        handed += others + 1;
        complete(&mut waiter, &job).await.expect("complete");
    }
    stop.store(true, Ordering::Relaxed);
    let rate = handed as f64 / started.elapsed().as_secs_f64();
    eprintln!(
        "waiters: the third coordinator's waiter got a job in each of {ROUNDS} rounds, at worst after {} other hand-outs (bound {bound}) and {:?}; {rate:.1} hand-outs a second under a budget of {RATE}",
        worst.0,
        worst.1,
    );
    drop((b, c));
    h.finish().await;
}

/// The statements that write a waiter down also take the provider's
/// lapsed waiters off: behind a transaction holding a lapsed row, the
/// claim waits, times out (1205), is run again and counted, and its
/// Claim is handed a job once the row is free; the lapsed row is gone and
/// the waiter left with its job.
#[tokio::test]
async fn a_held_waiter_row_is_a_conflict_run_again_and_counted() {
    let h = Harness::start_with_lock_wait(1).await;
    h.put_budget("stripe", Q, 2.0, 1).await;
    enqueue(&h, 3).await;
    let store = h.coordinator.store().clone();
    sqlx::query(
        "INSERT INTO budget_waiters (provider, waiter, queue, since, expires_at) \
         VALUES ('stripe', 42, ?, UTC_TIMESTAMP(6) - INTERVAL 10 SECOND, \
                 UTC_TIMESTAMP(6) - INTERVAL 5 SECOND)",
    )
    .bind(Q)
    .execute(&h.pool)
    .await
    .unwrap();
    // The burst's one unit: the next Claim is held back by the budget.
    assert_eq!(h.claim(Q, "first", 1).await.len(), 1);
    let mut tx = h.pool.begin().await.unwrap();
    sqlx::query(
        "SELECT waiter FROM budget_waiters WHERE provider = 'stripe' AND waiter = 42 FOR UPDATE",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let mut client = h.another_client().await;
    let waiting = tokio::spawn(async move { client.claim(claim("waiter", 10)).await });
    kit::until("the waiter's write timed out and was run again", || {
        store.conflicts().0 >= 1
    })
    .await;
    tx.commit().await.unwrap();
    let jobs = waiting.await.unwrap().expect("claim").into_inner().jobs;
    assert_eq!(jobs.len(), 1, "handed a job once its turn came");
    let (retried, reported) = store.conflicts();
    assert!(retried >= 1, "retried {retried}");
    assert_eq!(reported, 0, "no conflict reached a caller");
    // Served, it is no waiter any more; the lapsed row holds no turn.
    let live: Vec<u64> = sqlx::query_scalar(
        "SELECT waiter FROM budget_waiters WHERE provider = 'stripe' AND expires_at > UTC_TIMESTAMP(6)",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap();
    assert!(live.is_empty(), "no live waiter left: {live:?}");
    h.finish().await;
}
