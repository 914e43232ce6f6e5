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

/// An operator's pause: everything, or sends only while reconciles (a
/// takeover, a retry to reconcile) go on; stored, so a coordinator started
/// later holds too; a resume lets the sends through.
#[tokio::test]
async fn pause_everything_or_only_sends_and_resume() {
    let h = Harness::start().await;
    put(&h, P, budget(1000.0, 100), &[Q]).await;
    enqueue_n(&h, Q, 3).await;
    let running = h.claim_one(Q, "w").await;
    let reconcile = h.claim_one(Q, "w").await;
    h.client
        .clone()
        .fail(fail(&reconcile, FailDisposition::RetryReconcile, None))
        .await
        .unwrap();
    h.force_lease_expired(running.job_id).await;
    let pause = |mode: ProviderPause| PauseProviderRequest {
        name: P.into(),
        pause: mode as i32,
        operator: "alice".into(),
        reason: "provider incident".into(),
    };
    admin(&h)
        .await
        .pause_provider(pause(ProviderPause::All))
        .await
        .unwrap();
    let later = h.replica(test_config()).await;
    assert!(claim_on(&later.client, Q, 5, None).await.is_empty());
    let held = later
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: running.job_id,
            worker_id: "w".into(),
            lease: secs(30),
        })
        .await
        .expect_err("paused");
    assert_eq!(reason(&held), "PROVIDER_PAUSED");
    admin(&h)
        .await
        .pause_provider(pause(ProviderPause::Sends))
        .await
        .unwrap();
    let got = claim_on(&later.client, Q, 5, None).await;
    let mut ids: Vec<u64> = got.iter().map(|c| c.job.as_ref().unwrap().job_id).collect();
    ids.sort();
    let mut want = vec![running.job_id, reconcile.job_id];
    want.sort();
    assert_eq!(ids, want, "the takeover and the reconcile, not the send");
    assert!(got
        .iter()
        .all(|c| c.job.as_ref().unwrap().next_action == proto::NextAction::Reconcile as i32));
    admin(&h)
        .await
        .resume_provider(ResumeProviderRequest {
            name: P.into(),
            operator: "alice".into(),
            reason: "over".into(),
        })
        .await
        .unwrap();
    let send = claim_on(&later.client, Q, 5, None).await;
    assert_eq!(send.len(), 1);
    assert_eq!(
        send[0].job.as_ref().unwrap().next_action,
        proto::NextAction::Execute as i32
    );
    h.finish().await;
}

/// The cap on jobs in flight: a claim hands out only the room left, a
/// finished job makes room, an expired lease is not in flight.
#[tokio::test]
async fn the_in_flight_cap_limits_what_is_handed_out() {
    let h = Harness::start().await;
    put(
        &h,
        P,
        ProviderBudget {
            max_in_flight: Some(2),
            ..budget(1000.0, 100)
        },
        &[Q],
    )
    .await;
    enqueue_n(&h, Q, 5).await;
    let got = h.claim(Q, "w", 5).await;
    assert_eq!(got.len(), 2);
    assert!(h.claim(Q, "w", 5).await.is_empty());
    let done = got[0].job.clone().unwrap();
    h.client
        .clone()
        .complete(proto::CompleteRequest {
            job_id: done.job_id,
            attempt: done.attempt,
            provider_reference: "re_1".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    assert_eq!(h.claim(Q, "w", 5).await.len(), 1);
    assert!(
        metric(
            &h,
            &format!("jobfence_provider_deferred_total{{cause=\"in_flight\",provider=\"{P}\"}}")
        ) >= 1.0
    );
    h.finish().await;
}

/// A budget changed through one coordinator applies to the next claim on
/// another, without a restart; a queue without a provider is unlimited.
#[tokio::test]
async fn a_budget_change_applies_everywhere_without_a_restart() {
    let h = Harness::start().await;
    let replica = h.replica(test_config()).await;
    put(&h, P, budget(0.001, 1), &[Q]).await;
    enqueue_n(&h, Q, 10).await;
    enqueue_n(&h, "payouts", 10).await;
    assert_eq!(claim_on(&replica.client, Q, 5, None).await.len(), 1);
    assert!(claim_on(&replica.client, Q, 5, None).await.is_empty());
    assert_eq!(
        claim_on(&replica.client, "payouts", 10, None).await.len(),
        10
    );
    // A burst of 4 at the same slow rate: the one unit spent still
    // counts, three are there at once (the rate is so slow that the
    // milliseconds of the test add nothing).
    put(&h, P, budget(0.001, 4), &[Q]).await;
    assert_eq!(claim_on(&replica.client, Q, 9, None).await.len(), 3);
    assert!(claim_on(&replica.client, Q, 9, None).await.is_empty());
    h.finish().await;
}

/// Two queues of one provider take turns when the budget is short: the
/// queue served more recently leaves the units to the one that waited.
#[tokio::test]
async fn queues_sharing_a_provider_take_turns() {
    let h = Harness::start().await;
    put(&h, P, budget(0.001, 2), &["a", "b"]).await;
    enqueue_n(&h, "a", 10).await;
    enqueue_n(&h, "b", 10).await;
    // a takes the whole burst while b has not asked.
    assert_eq!(h.claim("a", "w", 5).await.len(), 2);
    // b asks, finds nothing left, and is now waiting.
    assert!(h.claim("b", "w", 5).await.is_empty());
    refill(&h, P).await;
    // a was served last: it leaves b one job's worth.
    assert_eq!(h.claim("a", "w", 5).await.len(), 1);
    assert_eq!(h.claim("b", "w", 5).await.len(), 1);
    refill(&h, P).await;
    // Now b was served last: a goes first, b gets the rest.
    assert_eq!(h.claim("b", "w", 5).await.len(), 1);
    assert_eq!(h.claim("a", "w", 5).await.len(), 1);
    h.finish().await;
}

/// Bad budgets and assignments are refused with a field violation each,
/// and nothing is written.
#[tokio::test]
async fn bad_budget_input_is_refused_field_by_field_and_writes_nothing() {
    let h = Harness::start().await;
    put(&h, P, budget(10.0, 5), &[Q]).await;
    let counts = || async {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM providers) AS p, (SELECT COUNT(*) FROM queue_policies) AS q, \
             (SELECT COUNT(*) FROM policy_changes) AS c, (SELECT CAST(rate_per_second AS CHAR) FROM providers WHERE name = 'stripe') AS r",
        )
        .fetch_one(&h.pool)
        .await
        .unwrap();
        (
            row.get::<i64, _>("p"),
            row.get::<i64, _>("q"),
            row.get::<i64, _>("c"),
            row.get::<String, _>("r"),
        )
    };
    let before = counts().await;
    let cases: Vec<(ProviderBudget, Vec<&str>, &str, &str)> = vec![
        (budget(-1.0, 5), vec![], "adyen", "budget.rate_per_second"),
        (
            budget(f64::NAN, 5),
            vec![],
            "adyen",
            "budget.rate_per_second",
        ),
        (
            budget(f64::INFINITY, 5),
            vec![],
            "adyen",
            "budget.rate_per_second",
        ),
        (budget(10.0, 0), vec![], "adyen", "budget.burst"),
        (
            ProviderBudget {
                execute_cost: Some(0),
                ..budget(10.0, 5)
            },
            vec![],
            "adyen",
            "budget.execute_cost",
        ),
        (
            ProviderBudget {
                reconcile_cost: Some(0),
                ..budget(10.0, 5)
            },
            vec![],
            "adyen",
            "budget.reconcile_cost",
        ),
        (budget(10.0, 5), vec![Q], "adyen", "queues[0]"),
        (budget(10.0, 5), vec!["x", "x"], "adyen", "queues[1]"),
        (budget(10.0, 5), vec![], "bad name", "name"),
        (budget(-3.0, 5), vec![Q], P, "budget.rate_per_second"),
    ];
    for (b, queues, name, field) in cases {
        let status = admin(&h)
            .await
            .put_provider(PutProviderRequest {
                name: name.into(),
                budget: Some(b),
                queues: queues.iter().map(|q| q.to_string()).collect(),
                operator: "alice".into(),
                reason: "typo".into(),
            })
            .await
            .expect_err(field);
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert_eq!(reason(&status), "INVALID_REQUEST");
        let fields: Vec<String> = status
            .get_details_bad_request()
            .unwrap()
            .field_violations
            .into_iter()
            .map(|v| v.field)
            .collect();
        assert!(fields.contains(&field.to_string()), "{field}: {fields:?}");
    }
    let unknown = admin(&h)
        .await
        .pause_provider(PauseProviderRequest {
            name: "nobody".into(),
            pause: ProviderPause::All as i32,
            operator: "alice".into(),
            reason: "typo".into(),
        })
        .await
        .expect_err("unknown provider");
    assert_eq!(unknown.code(), Code::InvalidArgument);
    assert_eq!(
        unknown.get_details_bad_request().unwrap().field_violations[0].field,
        "name"
    );
    assert_eq!(counts().await, before, "nothing written");
    h.finish().await;
}

/// Two coordinators with different flags decide a resend alike once the
/// queue's policy is stored, and the one whose flags differ says so.
#[tokio::test]
async fn a_stored_policy_wins_over_every_coordinators_flags() {
    let h = Harness::start().await;
    let mut other = test_config();
    other.policies.default.resend_window = Duration::from_secs(60);
    let replica = h.replica(other).await;
    admin(&h)
        .await
        .put_queue_policy(PutQueuePolicyRequest {
            queue: Q.into(),
            resend_window: secs(3600),
            max_dispatches: Some(3),
            job_retention: None,
            operator: "alice".into(),
            reason: "one truth".into(),
        })
        .await
        .unwrap();
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let a = h.claim_one(Q, "w").await;
    sqlx::query("UPDATE jobs SET first_dispatched_at = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 30 MINUTE) WHERE id = ?")
        .bind(job.job_id)
        .execute(&h.pool)
        .await
        .unwrap();
    // Through the coordinator whose flag says 1 min: the stored 1 h decides.
    let out = replica
        .client
        .clone()
        .fail(fail(&a, FailDisposition::RetryExecute, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.applied, FailDisposition::RetryExecute as i32);
    assert_eq!(
        replica
            .coordinator
            .warn_flags_differ_from_stored()
            .await
            .unwrap(),
        vec![Q.to_string()]
    );
    assert!(h.coordinator.warn_flags_differ_from_stored().await.unwrap() == vec![Q.to_string()]);
    h.finish().await;
}
