//! Complete and Fail that hand their caller its next job in the same
//! transaction (docs/design.md rule 16), over gRPC against MariaDB: the two
//! halves answer for themselves (a stale write still gets its next job, an
//! empty claim still has its write applied), a replay hands out nothing,
//! the claim half is a Claim in everything (scope, budget across
//! coordinators), and a lock wait on the combined transaction is run again
//! and counted. The lost-COMMIT cases are in `commit_unknown.rs`; the
//! calls refused whole (bad fields, a queue outside the caller's scope) in
//! `next_job_refusals.rs`.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    self as proto, CompleteRequest, EnqueueBatchRequest, EnqueueRequest, FailDisposition,
    FailRequest, NextAction, NextJobsRequest, TakeoverRequest,
};
use jobfence_domain::JobState;
use kit::{secs, test_config, Harness};
use sqlx::Row;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

pub(crate) const Q: &str = "refunds";

pub(crate) fn next(queue: &str, worker: &str) -> Option<NextJobsRequest> {
    Some(NextJobsRequest {
        queue: queue.into(),
        worker_id: worker.into(),
        max_jobs: 1,
        lease: secs(30),
        wait: None,
    })
}

pub(crate) fn complete_next(job: &proto::Job, worker: &str) -> CompleteRequest {
    CompleteRequest {
        job_id: job.job_id,
        attempt: job.attempt,
        provider_reference: format!("re_{}", job.job_id),
        result: String::new(),
        next: next(Q, worker),
    }
}

/// Sends [`complete_next`] of `job` for `worker` and expects an answer
/// (`why`: what the call being answered OK means).
async fn complete_with_next(
    h: &Harness,
    job: &proto::Job,
    worker: &str,
    why: &str,
) -> proto::CompleteResponse {
    h.client
        .clone()
        .complete(complete_next(job, worker))
        .await
        .expect(why)
        .into_inner()
}

/// The jobs a Complete-with-next answered with, and its write refusal's
/// reason ("" when the write was applied or replayed).
fn handed(r: &proto::CompleteResponse) -> (Vec<proto::Job>, String) {
    let next = r.next.clone().expect("a next-jobs answer");
    let refused = next.write_refused.map(|w| w.reason).unwrap_or_default();
    (
        next.jobs.into_iter().filter_map(|c| c.job).collect(),
        refused,
    )
}

#[tokio::test]
async fn a_complete_applies_and_hands_out_the_next_job() {
    let h = Harness::start().await;
    let a = {
        h.enqueue(Q, "refund-1", "{}").await;
        h.claim_one(Q, "worker-a").await
    };
    let b = h.enqueue(Q, "refund-2", "{}").await;
    let r = complete_with_next(&h, &a, "worker-a", "applied").await;
    assert!(!r.replayed);
    assert_eq!(h.row(a.job_id).await.state, JobState::Succeeded);
    let (jobs, refused) = handed(&r);
    assert_eq!(refused, "");
    assert_eq!(jobs.len(), 1);
    assert_eq!((jobs[0].job_id, jobs[0].attempt), (b.job_id, 1));
    let row = h.row(b.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 1));
    assert_eq!(row.lease_owner.as_deref(), Some("worker-a"));
    // Nothing left: the write still applies, with no job and no error.
    let (jobs, _) = handed(&complete_with_next(&h, &jobs[0], "worker-a", "applied").await);
    assert!(jobs.is_empty());
    assert_eq!(h.row(b.job_id).await.state, JobState::Succeeded);
    h.finish().await;
}

#[tokio::test]
async fn a_stale_complete_writes_nothing_and_still_hands_out_a_job() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(a.job_id).await;
    h.client
        .clone()
        .takeover(TakeoverRequest {
            job_id: a.job_id,
            worker_id: "worker-b".into(),
            lease: secs(30),
        })
        .await
        .unwrap();
    let b = h.enqueue(Q, "refund-2", "{}").await;
    let r = complete_with_next(
        &h,
        &a,
        "worker-a",
        "answered OK: the refusal is the write half's",
    )
    .await;
    assert!(r.job.is_none() && !r.replayed);
    let next = r.next.clone().unwrap();
    let refusal = next.write_refused.clone().expect("the write was refused");
    assert_eq!(refusal.reason, "ATTEMPT_SUPERSEDED");
    assert_eq!(refusal.code, Code::FailedPrecondition as i32);
    assert_eq!(refusal.metadata["current_attempt"], "2");
    let (jobs, _) = handed(&r);
    assert_eq!(
        jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        [b.job_id]
    );
    let row = h.row(a.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Running, 2));
    assert_eq!(h.count_events(a.job_id, "completed").await, 0);
    assert_eq!(h.count_events(a.job_id, "stale_write_rejected").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_replayed_complete_hands_out_no_second_job() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let b = h.enqueue(Q, "refund-2", "{}").await;
    let c = h.enqueue(Q, "refund-3", "{}").await;
    let req = complete_next(&a, "worker-a");
    let first = h.client.clone().complete(req.clone()).await.unwrap();
    let (jobs, _) = handed(first.get_ref());
    assert_eq!(
        jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        [b.job_id]
    );
    // The response was lost; the worker sends the very same call again.
    let again = h.client.clone().complete(req).await.unwrap().into_inner();
    assert!(again.replayed);
    let (jobs, refused) = handed(&again);
    assert!(jobs.is_empty(), "a replay claims nothing: {jobs:?}");
    assert_eq!(refused, "");
    let row = h.row(c.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Ready, 0));
    assert_eq!(h.count_events(b.job_id, "claimed").await, 1);
    h.finish().await;
}

#[tokio::test]
async fn a_fail_with_a_next_job_applies_its_disposition_and_hands_one_out() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let b = h.enqueue(Q, "refund-2", "{}").await;
    let r = h
        .client
        .clone()
        .fail(FailRequest {
            job_id: a.job_id,
            attempt: a.attempt,
            disposition: FailDisposition::RetryReconcile as i32,
            error: "provider timed out".into(),
            retry_delay: secs(60),
            provider_retry_after: None,
            next: next(Q, "worker-a"),
        })
        .await
        .expect("applied")
        .into_inner();
    assert_eq!(r.applied, FailDisposition::RetryReconcile as i32);
    let next = r.next.unwrap();
    assert!(next.write_refused.is_none());
    let jobs: Vec<proto::Job> = next.jobs.into_iter().filter_map(|c| c.job).collect();
    assert_eq!(
        jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        [b.job_id]
    );
    let row = h.row(a.job_id).await;
    assert_eq!(row.state, JobState::Ready);
    h.finish().await;
}

async fn put_budget(h: &Harness, rate: f64, burst: u32) {
    h.put_budget("stripe", Q, rate, burst).await;
}

async fn enqueue_n(h: &Harness, n: usize) {
    h.client
        .clone()
        .enqueue_batch(EnqueueBatchRequest {
            items: (0..n)
                .map(|i| EnqueueRequest {
                    queue: Q.into(),
                    operation_key: format!("{Q}-{i}"),
                    payload: "{}".into(),
                    delay: None,
                    fairness_key: String::new(),
                    priority: 0,
                })
                .collect(),
        })
        .await
        .unwrap();
}

/// A spent budget leaves the claim half empty; the write is applied.
#[tokio::test]
async fn a_spent_budget_hands_out_nothing_and_the_write_still_applies() {
    let h = Harness::start().await;
    put_budget(&h, 0.01, 1).await;
    enqueue_n(&h, 3).await;
    let a = h.claim_one(Q, "worker-a").await;
    let r = complete_with_next(&h, &a, "worker-a", "applied").await;
    let (jobs, refused) = handed(&r);
    assert!(jobs.is_empty() && refused.is_empty(), "{r:?}");
    assert_eq!(h.row(a.job_id).await.state, JobState::Succeeded);
    h.finish().await;
}

/// Runs a worker's loop on `client` until `run_for` ends: one Claim, then
/// every Complete asks for the next job. Returns the jobs it completed and
/// how many of them its Completes handed it.
async fn next_job_loop(client: JobCoordinatorClient<Channel>, run_for: Duration) -> (usize, usize) {
    let started = std::time::Instant::now();
    let (mut done, mut on_complete, mut held) = (0, 0, None::<proto::Job>);
    while started.elapsed() < run_for {
        let Some(job) = held.take() else {
            let mut jobs = client
                .clone()
                .claim(proto::ClaimRequest {
                    queue: Q.into(),
                    worker_id: "w".into(),
                    max_jobs: 1,
                    lease: secs(30),
                    wait: Some(prost_types::Duration {
                        seconds: 0,
                        nanos: 300_000_000,
                    }),
                })
                .await
                .expect("claim")
                .into_inner()
                .jobs;
            held = jobs.pop().and_then(|c| c.job);
            continue;
        };
        // Under a budget the claim half finds the units spent more often
        // than not (long-polling Claims take each as it frees): the
        // Complete long-polls too, like a worker's run loop.
        let mut req = complete_next(&job, "w");
        if let Some(n) = req.next.as_mut() {
            n.wait = Some(prost_types::Duration {
                seconds: 0,
                nanos: 300_000_000,
            });
        }
        let r = client
            .clone()
            .complete(req)
            .await
            .expect("complete")
            .into_inner();
        done += 1;
        held = handed(&r).0.pop();
        on_complete += usize::from(held.is_some());
    }
    if let Some(job) = held {
        let mut req = complete_next(&job, "w");
        req.next = None;
        client.clone().complete(req).await.expect("complete");
        done += 1;
    }
    (done, on_complete)
}

/// The next-job half spends the provider's budget like a Claim: two
/// coordinators, eight workers on the new loop, and over any window the
/// hand-outs (the `claimed` events, stamped with the claim's DB clock)
/// stay within `rate × window + burst`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_half_spends_the_budget_across_two_coordinators() {
    let h = Harness::start().await;
    let replica = h.replica(test_config()).await;
    let (rate, burst) = (20.0, 5);
    put_budget(&h, rate, burst).await;
    enqueue_n(&h, 400).await;
    let run_for = Duration::from_millis(2500);
    let mut workers = Vec::new();
    for i in 0..8 {
        let client = if i % 2 == 0 {
            h.another_client().await
        } else {
            replica.client.clone()
        };
        workers.push(tokio::spawn(next_job_loop(client, run_for)));
    }
    let (mut done, mut on_complete) = (0, 0);
    for w in workers {
        let (d, c) = w.await.unwrap();
        done += d;
        on_complete += c;
    }
    let times: Vec<i64> = sqlx::query(
        "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, '2000-01-01', created_at) AS SIGNED) AS us \
         FROM job_events WHERE kind = 'claimed' ORDER BY created_at",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get("us"))
    .collect();
    assert_eq!(times.len(), done, "every job handed out was completed");
    assert!(on_complete > 0, "the workers ran on Complete-with-next");
    assert!(done > burst as usize, "the workers ran: {done} jobs");
    for window_ms in [100_i64, 250, 500, 1000, 2000] {
        let w = window_ms * 1000;
        let worst = (0..times.len())
            .map(|i| times[i..].iter().take_while(|&&t| t < times[i] + w).count())
            .max()
            .unwrap_or(0);
        let limit = (f64::from(burst) + rate * (window_ms + 1) as f64 / 1000.0).floor() as usize;
        println!("window {window_ms} ms: worst {worst}, limit {limit}");
        assert!(
            worst <= limit,
            "{worst} hand-outs in {window_ms} ms, limit {limit}"
        );
    }
    h.finish().await;
}

/// The combined transaction waiting on the job's row lock (held here by
/// another transaction on the default MariaDB, lock waits of 1 s) times
/// out, is run again and counted, and applies both halves once the row is
/// free. A lone call of a queue without a provider: the lock that waits
/// is the one sent with the claim's reads, in their round trip.
#[tokio::test]
async fn a_handoff_behind_a_row_lock_is_run_again_counted_and_applied() {
    handoff_behind_a_row_lock(Harness::start_with_lock_wait(1).await).await;
}

/// The same on a queue with a provider: the job's lock waits in the round
/// trip that also locks the provider's row and reads its rules.
#[tokio::test]
async fn a_handoff_under_a_budget_behind_a_row_lock_is_run_again_and_applied() {
    let h = Harness::start_with_lock_wait(1).await;
    put_budget(&h, 1000.0, 100).await;
    handoff_behind_a_row_lock(h).await;
}

/// Holds the row lock of a claimed job from a transaction of its own while
/// that job's Complete asks for its next job; releases it once the
/// coordinator counted the lock wait as retried, then checks both halves.
async fn handoff_behind_a_row_lock(h: Harness) {
    h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let b = h.enqueue(Q, "refund-2", "{}").await;
    let mut holder = h.db.pool().begin().await.unwrap();
    sqlx::query("SELECT id FROM jobs WHERE id = ? FOR UPDATE")
        .bind(a.job_id)
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let store = h.coordinator.store().clone();
    let before = store.conflicts();
    let mut client = h.another_client().await;
    let req = complete_next(&a, "worker-a");
    let running = tokio::spawn(async move { client.complete(req).await });
    kit::until(
        "the handoff's lock wait timed out and was run again",
        || store.conflicts().0 > before.0,
    )
    .await;
    holder.rollback().await.unwrap();
    let r = running
        .await
        .unwrap()
        .expect("applied after its conflict")
        .into_inner();
    let (jobs, _) = handed(&r);
    assert_eq!(
        jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        [b.job_id]
    );
    assert_eq!(jobs[0].next_action, NextAction::Execute as i32);
    let (retried, reported) = store.conflicts();
    assert!(retried > before.0, "retried {retried}");
    assert_eq!(reported, before.1, "no conflict reached the caller");
    assert_eq!(h.row(a.job_id).await.state, JobState::Succeeded);
    h.finish().await;
}

/// A claim of a queue with no provider reads only the queue's own row;
/// once an operator gives the queue a provider, the very next claim (on
/// the same coordinator, whose claims read the light rules so far) is
/// held to the budget, and once the provider is gone, to nothing.
#[tokio::test]
async fn a_queue_given_a_provider_is_held_to_its_budget_at_the_next_claim() {
    let h = Harness::start().await;
    enqueue_n(&h, 6).await;
    let first = h.claim(Q, "worker-a", 1).await;
    assert_eq!(first.len(), 1, "no provider yet: light rules");
    put_budget(&h, 0.01, 1).await;
    let held = h.claim(Q, "worker-a", 3).await;
    assert_eq!(held.len(), 1, "the burst of 1, not 3");
    assert!(
        h.claim(Q, "worker-a", 3).await.is_empty(),
        "the budget is spent"
    );
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
        .delete_provider(proto::DeleteProviderRequest {
            name: "stripe".into(),
            operator: "alice".into(),
            reason: "no limit any more".into(),
        })
        .await
        .expect("delete provider");
    assert_eq!(
        h.claim(Q, "worker-a", 3).await.len(),
        3,
        "no budget any more"
    );
    h.finish().await;
}

/// The same through a Complete that claims the next job: its light reads,
/// sent with its job's lock, find the provider named since, and the claim
/// half scans again with the full rules and spends the budget (the next
/// handoff gets nothing: the burst of 1 is gone).
#[tokio::test]
async fn a_handoff_of_a_queue_given_a_provider_since_spends_its_budget() {
    let h = Harness::start().await;
    enqueue_n(&h, 6).await;
    let a = h.claim_one(Q, "worker-a").await;
    put_budget(&h, 0.01, 1).await;
    let r = complete_with_next(&h, &a, "worker-a", "applied, one job handed out").await;
    let (jobs, refused) = handed(&r);
    assert_eq!((jobs.len(), refused.as_str()), (1, ""));
    let r = complete_with_next(&h, &jobs[0], "worker-a", "applied, nothing handed out").await;
    let (more, refused) = handed(&r);
    assert_eq!(refused, "");
    assert!(more.is_empty(), "the budget is spent: {more:?}");
    assert_eq!(h.row(jobs[0].job_id).await.state, JobState::Succeeded);
    h.finish().await;
}

/// A Complete of a job whose lease ran out (nobody took it over yet) is
/// applied, and its own claim half never takes that very job over: it
/// hands out the next one.
#[tokio::test]
async fn a_complete_after_its_lease_ran_out_never_claims_its_own_job() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(a.job_id).await;
    let b = h.enqueue(Q, "refund-2", "{}").await;
    let r = complete_with_next(
        &h,
        &a,
        "worker-a",
        "applied: a lease running out does not end the write right",
    )
    .await;
    let (jobs, refused) = handed(&r);
    assert_eq!(refused, "");
    assert_eq!(
        jobs.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        [b.job_id]
    );
    let row = h.row(a.job_id).await;
    assert_eq!((row.state, row.attempt), (JobState::Succeeded, 1));
    assert_eq!(h.count_events(a.job_id, "taken_over").await, 0);
    h.finish().await;
}

/// The same late Complete while another job of the queue also has a lease
/// that ran out: leaving its own job out of the claim half does not hide
/// the other one, which is taken over first (as a reconcile), before the
/// ready job enqueued after it.
#[tokio::test]
async fn a_late_complete_still_takes_over_another_expired_lease_first() {
    late_complete_takes_over_the_other_expired_lease(Harness::start().await).await;
}

/// The same under a provider's budget: the lone Complete's reads lock the
/// provider's row and find the other expired lease, which is taken over
/// first and spends the budget as a reconcile, and never the caller's own
/// job.
#[tokio::test]
async fn a_late_complete_under_a_budget_takes_over_the_other_expired_lease() {
    let h = Harness::start().await;
    put_budget(&h, 1000.0, 100).await;
    late_complete_takes_over_the_other_expired_lease(h).await;
}

/// Two leases of the queue ran out, a third job is ready: the late
/// Complete of one of them is applied and its next job is the other
/// expired lease, taken over as a reconcile.
async fn late_complete_takes_over_the_other_expired_lease(h: Harness) {
    h.enqueue(Q, "refund-1", "{}").await;
    h.enqueue(Q, "refund-2", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    let x = h.claim_one(Q, "worker-x").await;
    h.force_lease_expired(a.job_id).await;
    h.force_lease_expired(x.job_id).await;
    h.enqueue(Q, "refund-3", "{}").await;
    let r = complete_with_next(&h, &a, "worker-a", "applied").await;
    let (jobs, refused) = handed(&r);
    assert_eq!(refused, "");
    let taken: Vec<(u64, u64, i32)> = jobs
        .iter()
        .map(|j| (j.job_id, j.attempt, j.next_action))
        .collect();
    assert_eq!(
        taken,
        [(x.job_id, x.attempt + 1, NextAction::Reconcile as i32)],
        "the other expired lease, taken over as a reconcile"
    );
    assert_eq!(h.row(a.job_id).await.state, JobState::Succeeded);
    h.finish().await;
}

/// Under an in-flight cap the caller's own job, which its Complete
/// finishes in the same transaction, does not count as in flight for the
/// next-job half: at a cap of one, a lone worker's Complete hands it the
/// next job, as a Complete and then a Claim would. A stale Complete (the
/// job is another worker's now) finishes nothing: that job still counts,
/// and nothing is handed out.
#[tokio::test]
async fn the_callers_own_finished_job_leaves_room_under_an_in_flight_cap() {
    let h = Harness::start().await;
    h.put_budget_capped("stripe", Q, (1000.0, 100), Some(1))
        .await;
    enqueue_n(&h, 3).await;
    let a = h.claim_one(Q, "worker-a").await;
    let r = complete_with_next(&h, &a, "worker-a", "applied").await;
    let (jobs, refused) = handed(&r);
    assert_eq!((jobs.len(), refused.as_str()), (1, ""), "{r:?}");
    let b = jobs[0].clone();
    h.force_lease_expired(b.job_id).await;
    let taken = h
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: b.job_id,
            worker_id: "worker-x".into(),
            lease: secs(30),
        })
        .await
        .expect("taken over")
        .into_inner();
    assert!(taken.claimed.is_some());
    let r = complete_with_next(&h, &b, "worker-a", "a stale write still answers").await;
    let (jobs, refused) = handed(&r);
    assert_eq!(refused, "ATTEMPT_SUPERSEDED");
    assert!(jobs.is_empty(), "the taken-over job is in flight: {jobs:?}");
    h.finish().await;
}
