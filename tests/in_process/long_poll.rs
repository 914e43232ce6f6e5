//! Long-poll Claim: a Claim with a `wait` that finds nothing holds the call
//! until work arrives (an Enqueue, a lease running out, a delayed job
//! becoming due), through this coordinator or another one, and answers
//! empty when the wait ends or the coordinator drains. Each test waits until the coordinator reports the
//! Claim as waiting before it makes the work appear, so the wake-up is what
//! is measured. What each test asserts is an event (which mechanism could
//! have answered, in which order on the database clock), never a wall-clock
//! bound a loaded machine could miss; the delays are printed.

use jobfence_testkit as kit;

use jobfence_api::v1::{self as proto, ClaimRequest, EnqueueRequest};
use jobfence_core::long_poll::LongPollSettings;
use jobfence_server::ServeOptions;
use kit::{test_config, until, waiting, Harness};
use std::time::{Duration, Instant};
use tonic::Request;

const Q: &str = "refunds";

fn claim(worker: &str, wait_secs: i64, lease_ms: Option<i64>) -> ClaimRequest {
    ClaimRequest {
        queue: Q.into(),
        worker_id: worker.into(),
        max_jobs: 1,
        lease: lease_ms.map(|ms| prost_types::Duration {
            seconds: ms / 1000,
            nanos: ((ms % 1000) * 1_000_000) as i32,
        }),
        wait: kit::secs(wait_secs),
    }
}

fn enqueue(key: &str) -> EnqueueRequest {
    EnqueueRequest {
        queue: Q.into(),
        operation_key: key.into(),
        payload: "{}".into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    }
}

#[tokio::test]
async fn an_enqueue_wakes_a_waiting_claim_at_once() {
    // The poll interval is longer than the wait, so the job reaches this
    // Claim through the enqueue's wake-up (or its own first look, which
    // may still be running when it counts as waiting).
    let mut config = test_config();
    config.long_poll = LongPollSettings {
        poll_interval: Duration::from_secs(120),
        ..LongPollSettings::default()
    };
    let h = Harness::start_with(config, ServeOptions::default()).await;
    let mut worker = h.another_client().await;
    let asked = Instant::now();
    let waiting_claim = tokio::spawn(async move { worker.claim(claim("w", 20, None)).await });
    until("the claim waits", || {
        waiting(&h.coordinator, "long_poll") == 1
    })
    .await;
    let waited = asked.elapsed();
    let enqueued = Instant::now();
    let job = h.enqueue(Q, "refund-1", "{}").await;
    let got = waiting_claim.await.unwrap().unwrap().into_inner().jobs;
    let delay = enqueued.elapsed();
    println!(
        "long poll: waited {waited:?} with nothing due; handed out {delay:?} after the enqueue"
    );
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job.as_ref().unwrap().job_id, job.job_id);
    assert_eq!(waiting(&h.coordinator, "long_poll"), 0);
    h.finish().await;
}

#[tokio::test]
async fn a_crashed_workers_job_goes_to_a_waiting_claim_when_its_lease_ends() {
    let h = Harness::start().await;
    h.enqueue(Q, "refund-1", "{}").await;
    // A worker claims with a 2 s lease, then dies (its connection drops
    // and it never writes again).
    let lease = Duration::from_secs(2);
    let claimed_at;
    let held = {
        let mut doomed = h.another_client().await;
        let got = doomed
            .claim(claim("doomed", 0, Some(lease.as_millis() as i64)))
            .await
            .unwrap()
            .into_inner()
            .jobs;
        claimed_at = Instant::now();
        got[0].job.clone().unwrap()
    };
    // Another worker long-polls meanwhile.
    let mut survivor = h.another_client().await;
    let waiting_claim =
        tokio::spawn(async move { survivor.claim(claim("survivor", 20, None)).await });
    until("the claim waits", || {
        waiting(&h.coordinator, "long_poll") == 1
    })
    .await;
    let got = waiting_claim.await.unwrap().unwrap().into_inner().jobs;
    let after = claimed_at.elapsed();
    println!(
        "long poll: a crashed worker's job (lease {lease:?}) was handed out {after:?} after its claim"
    );
    let taken = got[0].job.as_ref().unwrap();
    assert_eq!(taken.job_id, held.job_id);
    assert_eq!(taken.attempt, held.attempt + 1);
    assert!(got[0].takeover);
    assert_eq!(taken.next_action, proto::NextAction::Reconcile as i32);
    // Never before the lease ends, on the database clock (rule 2): the
    // takeover's event is written at or after the old lease_until.
    let old_until = held.lease_until.expect("a running job's lease");
    let old_until_us = old_until.seconds * 1_000_000 + i64::from(old_until.nanos) / 1000;
    let written: Vec<i64> = sqlx::query_scalar(
        "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at) \
         FROM job_events WHERE job_id = ? AND attempt = ?",
    )
    .bind(held.job_id)
    .bind(taken.attempt)
    .fetch_all(&h.pool)
    .await
    .unwrap();
    assert!(!written.is_empty(), "the takeover wrote its event");
    assert!(
        written.iter().all(|&at| at >= old_until_us),
        "taken over before the lease ended: events at {written:?} µs, lease until {old_until_us} µs"
    );
    h.finish().await;
}

#[tokio::test]
async fn work_enqueued_through_another_coordinator_wakes_a_claim_within_the_poll_interval() {
    let mut config = test_config();
    config.long_poll = LongPollSettings {
        poll_interval: Duration::from_millis(500),
        ..LongPollSettings::default()
    };
    let h = Harness::start_with(
        config.clone(),
        ServeOptions {
            drain_delay: Duration::ZERO,
            ..ServeOptions::default()
        },
    )
    .await;
    let other = h.replica(config).await;
    let mut worker = h.another_client().await;
    let waiting_claim = tokio::spawn(async move { worker.claim(claim("w", 20, None)).await });
    until("the claim waits", || {
        waiting(&h.coordinator, "long_poll") == 1
    })
    .await;
    let enqueued = Instant::now();
    other
        .client
        .clone()
        .enqueue(enqueue("refund-elsewhere"))
        .await
        .unwrap();
    let got = waiting_claim.await.unwrap().unwrap().into_inner().jobs;
    let delay = enqueued.elapsed();
    println!("long poll: work enqueued through another coordinator was handed out after {delay:?} (poll interval 500ms)");
    // Handed out at all: the 20 s wait had not ended, so the poll found it.
    assert_eq!(got.len(), 1);
    h.finish().await;
}

#[tokio::test]
async fn a_waiting_claim_answers_empty_when_its_wait_or_its_deadline_ends() {
    let h = Harness::start().await;
    let mut worker = h.another_client().await;
    let asked = Instant::now();
    let got = worker
        .claim(claim("w", 1, None))
        .await
        .unwrap()
        .into_inner()
        .jobs;
    let waited = asked.elapsed();
    println!("long poll: an empty wait of 1 s answered after {waited:?}");
    assert!(got.is_empty());
    assert!(waited >= Duration::from_secs(1), "{waited:?}");

    // A deadline shorter than the wait: an empty answer before it, not
    // DEADLINE_EXCEEDED. The coordinator answers a tenth of the deadline
    // plus 100 ms before it (1.1 s here): room for a loaded machine's
    // round trip, which a deadline of under a second did not leave.
    let mut request = Request::new(claim("w", 20, None));
    request.set_timeout(Duration::from_secs(10));
    // Past the deadline the client itself gives DEADLINE_EXCEEDED, so an
    // answer is one that came before it.
    let got = worker
        .claim(request)
        .await
        .expect("answered before the deadline");
    assert!(got.into_inner().jobs.is_empty());
    h.finish().await;
}

#[tokio::test]
async fn a_draining_coordinator_answers_waiting_claims_empty_at_once() {
    let mut h = Harness::start().await;
    let mut worker = h.another_client().await;
    let waiting_claim = tokio::spawn(async move { worker.claim(claim("w", 30, None)).await });
    until("the claim waits", || {
        waiting(&h.coordinator, "long_poll") == 1
    })
    .await;
    let stopping = Instant::now();
    h.stop().await;
    let got = waiting_claim
        .await
        .unwrap()
        .expect("an answer, not an error");
    println!(
        "long poll: a drain answered a waiting claim after {:?}",
        stopping.elapsed()
    );
    assert!(got.into_inner().jobs.is_empty());
    // The Claim asked to wait 30 s; a drain that only let the wait end would
    // answer after it. Half of it is far beyond any scheduling delay.
    assert!(
        stopping.elapsed() < Duration::from_secs(15),
        "{:?}",
        stopping.elapsed()
    );
    h.finish().await;
}

/// A job enqueued with a delay wakes the claim waiting for it when it
/// becomes due, by the due time the empty claim read from the database,
/// not by the poll: the poll interval here (60 s) is longer than the wait
/// (20 s), so only that due time can hand the job out before the wait ends.
#[tokio::test]
async fn a_delayed_job_wakes_a_waiting_claim_when_it_becomes_due() {
    let mut config = test_config();
    config.long_poll = LongPollSettings {
        poll_interval: Duration::from_secs(60),
        ..LongPollSettings::default()
    };
    let h = Harness::start_with(config, ServeOptions::default()).await;
    let delayed = h
        .client
        .clone()
        .enqueue(EnqueueRequest {
            delay: kit::secs(1),
            ..enqueue("refund-later")
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let asked = Instant::now();
    let got = h
        .another_client()
        .await
        .claim(claim("w", 20, None))
        .await
        .unwrap()
        .into_inner()
        .jobs;
    println!(
        "long poll: a job delayed 1 s was handed out {:?} after the claim",
        asked.elapsed()
    );
    assert_eq!(
        got.iter()
            .filter_map(|c| c.job.as_ref())
            .map(|j| j.job_id)
            .collect::<Vec<_>>(),
        [delayed.job_id],
        "handed out before the 20 s wait ended"
    );
    h.finish().await;
}
