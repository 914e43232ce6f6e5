//! Provider budgets (docs/design.md rules 11–13) against the real database:
//! what a claim hands out for a provider, across coordinators, and what
//! operators and workers' throttle reports do to it.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    self as proto, ClaimRequest, EnqueueBatchRequest, EnqueueRequest, FailDisposition, FailRequest,
    PauseProviderRequest, ProviderBudget, ProviderPause, PutProviderRequest, PutQueuePolicyRequest,
    ResumeProviderRequest, TakeoverRequest,
};
use jobfence_domain::JobState;
use kit::{reason, secs, test_config, Harness};
use sqlx::Row;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

mod operators;

const Q: &str = "refunds";
const P: &str = "stripe";

async fn admin(h: &Harness) -> JobAdminClient<Channel> {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

fn budget(rate: f64, burst: u32) -> ProviderBudget {
    ProviderBudget {
        rate_per_second: rate,
        burst,
        max_in_flight: None,
        execute_cost: None,
        reconcile_cost: None,
        key_share: None,
        max_in_flight_per_key: None,
    }
}

async fn put(h: &Harness, name: &str, b: ProviderBudget, queues: &[&str]) -> proto::Provider {
    admin(h)
        .await
        .put_provider(PutProviderRequest {
            name: name.into(),
            budget: Some(b),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            operator: "alice".into(),
            reason: "the provider's published limit".into(),
        })
        .await
        .expect("put provider")
        .into_inner()
        .provider
        .unwrap()
}

async fn enqueue_n(h: &Harness, queue: &str, n: usize) {
    h.client
        .clone()
        .enqueue_batch(EnqueueBatchRequest {
            items: (0..n)
                .map(|i| EnqueueRequest {
                    queue: queue.into(),
                    operation_key: format!("{queue}-{i}"),
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

async fn claim_on(
    client: &JobCoordinatorClient<Channel>,
    queue: &str,
    max: u32,
    wait: Option<Duration>,
) -> Vec<proto::ClaimedJob> {
    client
        .clone()
        .claim(ClaimRequest {
            queue: queue.into(),
            worker_id: "w".into(),
            max_jobs: max,
            lease: secs(30),
            wait: wait.map(|d| prost_types::Duration {
                seconds: d.as_secs() as i64,
                nanos: d.subsec_nanos() as i32,
            }),
        })
        .await
        .expect("claim")
        .into_inner()
        .jobs
}

fn fail(job: &proto::Job, d: FailDisposition, retry_after: Option<i64>) -> FailRequest {
    FailRequest {
        job_id: job.job_id,
        attempt: job.attempt,
        disposition: d as i32,
        error: "provider said so".into(),
        retry_delay: secs(0),
        provider_retry_after: retry_after.and_then(secs),
        next: None,
    }
}

/// The provider's stored GCRA time, as the database has it (text, exact).
async fn tat(h: &Harness, name: &str) -> String {
    sqlx::query("SELECT CAST(tat AS CHAR) AS t FROM providers WHERE name = ?")
        .bind(name)
        .fetch_one(&h.pool)
        .await
        .unwrap()
        .get("t")
}

/// Gives the provider its whole burst back, on test data (the DB clock is
/// not touched).
async fn refill(h: &Harness, name: &str) {
    sqlx::query(
        "UPDATE providers SET tat = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 DAY) WHERE name = ?",
    )
    .bind(name)
    .execute(&h.pool)
    .await
    .unwrap();
}

fn retry_delay(status: &tonic::Status) -> Duration {
    status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("a RetryInfo")
}

fn metric(h: &Harness, series: &str) -> f64 {
    h.coordinator
        .metrics()
        .render()
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Two coordinators share one provider: over any window, what was handed
/// out (the `claimed` events, stamped with the claim's DB clock) stays
/// within `rate × window + burst`, however the eight claimers race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_coordinators_hand_out_within_one_budget_over_any_window() {
    let h = Harness::start().await;
    let replica = h.replica(test_config()).await;
    let (rate, burst) = (20.0, 5);
    put(&h, P, budget(rate, burst), &[Q]).await;
    enqueue_n(&h, Q, 400).await;
    let run_for = Duration::from_millis(2500);
    let started = std::time::Instant::now();
    let mut claimers = Vec::new();
    for i in 0..8 {
        let client = if i % 2 == 0 {
            h.another_client().await
        } else {
            replica.client.clone()
        };
        claimers.push(tokio::spawn(async move {
            let mut n = 0;
            while started.elapsed() < run_for {
                for c in claim_on(&client, Q, 4, Some(Duration::from_millis(300))).await {
                    let job = c.job.unwrap();
                    client
                        .clone()
                        .complete(proto::CompleteRequest {
                            job_id: job.job_id,
                            attempt: job.attempt,
                            provider_reference: format!("re_{}", job.job_id),
                            result: String::new(),
                            next: None,
                        })
                        .await
                        .unwrap();
                    n += 1;
                }
            }
            n
        }));
    }
    let mut handed = 0;
    for c in claimers {
        handed += c.await.unwrap();
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
    assert_eq!(times.len(), handed);
    assert!(
        handed > burst as usize,
        "the claimers ran: {handed} jobs handed out"
    );
    for window_ms in [100_i64, 250, 500, 1000, 2000] {
        let w = window_ms * 1000;
        let worst = (0..times.len())
            .map(|i| times[i..].iter().take_while(|&&t| t < times[i] + w).count())
            .max()
            .unwrap_or(0);
        // The events carry the claim's clock, read a few microseconds
        // after the provider row's: allow 1 ms of that.
        let limit = (f64::from(burst) + rate * (window_ms + 1) as f64 / 1000.0).floor() as usize;
        println!(
            "window {window_ms} ms: worst {worst} hand-outs, limit rate × window + burst = {limit}"
        );
        assert!(
            worst <= limit,
            "{worst} hand-outs in {window_ms} ms, limit {limit}"
        );
    }
    println!("{handed} jobs handed out in {:?}", started.elapsed());
    h.finish().await;
}

/// A first send, a resend and a takeover's reconcile each spend one unit;
/// once they are spent a Claim hands out nothing (never an error) and a
/// named Takeover is refused with when to ask again.
#[tokio::test]
async fn sends_resends_and_reconciles_spend_the_same_budget() {
    let h = Harness::start().await;
    put(&h, P, budget(0.001, 3), &[Q]).await;
    h.enqueue(Q, "refund-1", "{}").await;
    let first = h.claim_one(Q, "w").await;
    assert_eq!(first.next_action, proto::NextAction::Execute as i32);
    h.client
        .clone()
        .fail(fail(&first, FailDisposition::RetryExecute, None))
        .await
        .unwrap();
    let resend = h.claim_one(Q, "w").await;
    assert_eq!(resend.job_id, first.job_id);
    assert_eq!(resend.dispatch_count, 2, "a resend");
    h.force_lease_expired(resend.job_id).await;
    let taken = h.claim(Q, "w", 1).await;
    assert_eq!(taken.len(), 1);
    assert!(taken[0].takeover);
    assert_eq!(
        taken[0].job.as_ref().unwrap().next_action,
        proto::NextAction::Reconcile as i32
    );
    // Three units spent: two more jobs are due and nothing is handed out.
    h.enqueue(Q, "refund-2", "{}").await;
    h.enqueue(Q, "refund-3", "{}").await;
    assert!(h.claim(Q, "w", 5).await.is_empty());
    let taken = taken[0].job.clone().unwrap();
    h.force_lease_expired(taken.job_id).await;
    let refused = h
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: taken.job_id,
            worker_id: "w".into(),
            lease: secs(30),
        })
        .await
        .expect_err("no unit left for the reconcile");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(reason(&refused), "PROVIDER_BUDGET_EXHAUSTED");
    assert_eq!(kit::meta(&refused, "provider"), P);
    assert_eq!(kit::meta(&refused, "limit"), "rate");
    let wait = retry_delay(&refused);
    assert!(
        wait > Duration::from_secs(900) && wait <= Duration::from_secs(1000),
        "one unit every 1000 s: {wait:?}"
    );
    assert_eq!(
        h.row(taken.job_id).await.attempt,
        taken.attempt,
        "nothing written"
    );
    let series = |action: &str| {
        metric(
            &h,
            &format!(
                "jobfence_provider_handouts_total{{next_action=\"{action}\",provider=\"{P}\"}}"
            ),
        )
    };
    assert_eq!(series("execute"), 2.0);
    assert_eq!(series("reconcile"), 1.0);
    assert!(
        metric(
            &h,
            &format!("jobfence_provider_deferred_total{{cause=\"rate\",provider=\"{P}\"}}")
        ) >= 2.0
    );
    h.finish().await;
}

/// A claim that does not commit spends nothing: the budget's time is as
/// before, and the unit goes to the next claim.
#[tokio::test]
async fn a_claim_that_does_not_commit_spends_nothing() {
    let h = Harness::start().await;
    put(&h, P, budget(0.001, 1), &[Q]).await;
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let before = tat(&h, P).await;
    let mut gate = h.pauses.arm(jobfence_store::PausePoint::ClaimBeforeCommit);
    let client = h.another_client().await;
    let claim = tokio::spawn(async move { claim_on(&client, Q, 1, None).await });
    gate.reached().await;
    kit::kill_the_paused_session(&h, &gate).await;
    gate.release();
    assert!(
        claim.await.is_err(),
        "the lost claim is not reported as a hand-out"
    );
    assert_eq!(tat(&h, P).await, before, "the unit was not spent");
    let next = h.claim_one(Q, "w").await;
    assert_eq!(next.job_id, job.job_id);
    assert_ne!(tat(&h, P).await, before, "the committed claim spent it");
    h.finish().await;
}

/// A resend that waits for the budget until its window would close within
/// its lease is not handed out: it goes to manual review as
/// RESEND_WINDOW_CLOSED, and spends nothing. The window is the queue's
/// stored policy (1 h), not this coordinator's flag (24 h).
#[tokio::test]
async fn a_resend_held_back_by_the_budget_past_its_window_goes_to_manual_review() {
    let h = Harness::start().await;
    put(&h, P, budget(0.001, 1), &[Q]).await;
    admin(&h)
        .await
        .put_queue_policy(PutQueuePolicyRequest {
            queue: Q.into(),
            resend_window: secs(3600),
            max_dispatches: Some(3),
            job_retention: None,
            operator: "alice".into(),
            reason: "Stripe keeps keys 1 h in this account".into(),
        })
        .await
        .unwrap();
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "w").await;
    let out = h
        .client
        .clone()
        .fail(fail(&a, FailDisposition::RetryExecute, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::RetryExecute as i32);
    // The budget is spent: the resend waits.
    assert!(h.claim(Q, "w", 1).await.is_empty());
    // It waited 59 min 45 s; the lease is 30 s: the key could be gone
    // before the worker sends. The budget comes back.
    sqlx::query("UPDATE jobs SET first_dispatched_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 3585 SECOND) WHERE id = ?")
        .bind(job.job_id)
        .execute(&h.pool)
        .await
        .unwrap();
    refill(&h, P).await;
    let spent_before = tat(&h, P).await;
    assert!(h.claim(Q, "w", 1).await.is_empty(), "never handed out");
    let row = h.row(job.job_id).await;
    assert_eq!(row.state, JobState::ManualReview);
    assert_eq!(row.state_reason.as_deref(), Some("RESEND_WINDOW_CLOSED"));
    assert_eq!(row.attempt, a.attempt);
    assert_eq!(
        tat(&h, P).await,
        spent_before,
        "a parked job spends nothing"
    );
    h.finish().await;
}

/// A long-polling Claim cut short by the budget wakes when the next unit
/// is due, not at the next poll: here the poll is an hour away.
#[tokio::test]
async fn a_long_polling_claim_gets_a_job_when_the_next_unit_is_due() {
    let mut config = test_config();
    config.long_poll.poll_interval = Duration::from_secs(3600);
    let h = Harness::start_with(config, Default::default()).await;
    put(&h, P, budget(4.0, 1), &[Q]).await;
    enqueue_n(&h, Q, 2).await;
    let first = h.claim_one(Q, "w").await;
    // The unit the second job needs is due at the stored arrival time.
    let due = tat(&h, P).await;
    let started = std::time::Instant::now();
    let jobs = claim_on(&h.client, Q, 1, Some(Duration::from_secs(10))).await;
    let waited = started.elapsed();
    assert_eq!(jobs.len(), 1, "the waiting claim got the job");
    let second = jobs[0].job.clone().unwrap();
    assert_ne!(second.job_id, first.job_id);
    let late: i64 = sqlx::query(
        "SELECT CAST(TIMESTAMPDIFF(MICROSECOND, ?, created_at) AS SIGNED) AS late \
         FROM job_events WHERE job_id = ? AND kind = 'claimed'",
    )
    .bind(&due)
    .bind(second.job_id)
    .fetch_one(&h.pool)
    .await
    .unwrap()
    .get("late");
    println!(
        "handed out {:.1} ms after its unit was due (DB clock); the claim waited {waited:?}",
        late as f64 / 1000.0
    );
    assert!(late >= 0, "never before its unit is due");
    // Woken by the unit, not by the hourly poll: that is the job reaching
    // this 10 s Claim at all (asserted above). How late is printed; the
    // bound here is only the Claim's wait, which no load can stretch.
    assert!(
        late < 10_000_000,
        "woken by the unit (due in 250 ms), not by the hourly poll: {late} µs late"
    );
    h.finish().await;
}

/// A worker's report of the provider's 429 holds hand-outs on every
/// coordinator until its Retry-After; a refused (stale) Fail reports
/// nothing; a resume ends it.
#[tokio::test]
async fn a_throttle_report_holds_hand_outs_on_every_coordinator() {
    let h = Harness::start().await;
    let replica = h.replica(test_config()).await;
    put(&h, P, budget(1000.0, 100), &[Q]).await;
    enqueue_n(&h, Q, 4).await;
    let a = h.claim_one(Q, "w").await;
    let b = h.claim_one(Q, "w").await;
    // A stale Fail carrying a throttle is refused and writes nothing.
    let stale = proto::Job {
        attempt: b.attempt + 1,
        ..b.clone()
    };
    let refused = h
        .client
        .clone()
        .fail(fail(&stale, FailDisposition::RetryExecute, Some(30)))
        .await
        .expect_err("not this attempt");
    assert_eq!(reason(&refused), "ATTEMPT_NOT_ISSUED");
    assert_eq!(
        claim_on(&replica.client, Q, 1, None).await.len(),
        1,
        "not throttled"
    );
    // The applied one holds the provider.
    let out = h
        .client
        .clone()
        .fail(fail(&a, FailDisposition::RetryExecute, Some(30)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::RetryExecute as i32);
    assert_eq!(
        h.row(a.job_id).await.state,
        JobState::Ready,
        "the job as asked"
    );
    assert!(claim_on(&replica.client, Q, 5, None).await.is_empty());
    assert!(h.claim(Q, "w", 5).await.is_empty());
    h.force_lease_expired(b.job_id).await;
    let held = replica
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: b.job_id,
            worker_id: "w".into(),
            lease: secs(30),
        })
        .await
        .expect_err("throttled");
    assert_eq!(held.code(), Code::ResourceExhausted);
    assert_eq!(reason(&held), "PROVIDER_THROTTLED");
    let wait = retry_delay(&held);
    assert!(
        wait > Duration::from_secs(15) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
    assert_eq!(
        metric(
            &h,
            &format!("jobfence_provider_throttle_reports_total{{provider=\"{P}\"}}")
        ),
        1.0
    );
    admin(&h)
        .await
        .resume_provider(ResumeProviderRequest {
            name: P.into(),
            operator: "alice".into(),
            reason: "the provider's incident is over".into(),
        })
        .await
        .unwrap();
    assert!(!claim_on(&replica.client, Q, 5, None).await.is_empty());
    h.finish().await;
}
