//! Trying a failed refund again as a new operation (RetryAsNewOperation):
//! a new job with a new operation key in the old one's queue and payload,
//! the old job unchanged, both stories naming each other; asked again,
//! the same new job; another key for a job already tried again, and a job
//! that is not failed or cancelled, refused with a field violation; two
//! operators at once make one new job; a lock wait on the old job's row is
//! run again and counted. The CLI (`jobfence jobs retry`) as printed in
//! docs/operating.md.

use jobfence_testkit as kit;

use clap::Parser;
use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{FailDisposition, FailRequest, RetryAsNewOperationRequest};
use jobfence_domain::JobState;
use jobfence_operator::{Cli, Operation};
use jobfence_store::PausePoint;
use kit::{reason, Harness};
use tonic::transport::Channel;
use tonic::Code;

const Q: &str = "refunds";

async fn admin(h: &Harness) -> JobAdminClient<Channel> {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
}

/// Enqueues, claims and fails one job for good; returns its id.
async fn failed(h: &Harness, key: &str) -> u64 {
    let job = h.enqueue(Q, key, r#"{"amount": 500}"#).await;
    let claimed = h.claim_one(Q, "worker-a").await;
    assert_eq!(claimed.job_id, job.job_id, "the only ready job");
    h.client
        .clone()
        .fail(FailRequest {
            job_id: job.job_id,
            attempt: claimed.attempt,
            disposition: FailDisposition::Failed as i32,
            error: "card expired".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .unwrap();
    job.job_id
}

fn retry(job_id: u64, key: &str, operator: &str) -> RetryAsNewOperationRequest {
    RetryAsNewOperationRequest {
        job_id,
        new_operation_key: key.into(),
        operator: operator.into(),
        reason: "the customer updated the card".into(),
    }
}

async fn event_details(h: &Harness, job_id: u64, kind: &str) -> Vec<serde_json::Value> {
    let rows: Vec<(String,)> = sqlx::query_as(
        "SELECT CAST(detail AS CHAR) FROM job_events WHERE job_id = ? AND kind = ? ORDER BY id",
    )
    .bind(job_id)
    .bind(kind)
    .fetch_all(&h.db.pool())
    .await
    .unwrap();
    rows.into_iter()
        .map(|(d,)| serde_json::from_str(&d).unwrap())
        .collect()
}

#[tokio::test]
async fn a_failed_job_is_tried_again_as_one_new_operation_and_both_stories_say_so() {
    let h = Harness::start().await;
    let old = failed(&h, "refund-1").await;
    let mut admin = admin(&h).await;
    let first = admin
        .retry_as_new_operation(retry(old, "", "alice"))
        .await
        .unwrap()
        .into_inner();
    assert!(first.created);
    let new = first.new_job.unwrap();
    assert_eq!(new.operation_key, format!("refund-1:retry:{old}"));
    assert_eq!(new.queue, Q);
    assert_eq!(new.payload, r#"{"amount": 500}"#);
    assert_eq!(h.row(new.job_id).await.state, JobState::Ready);
    assert_eq!(
        h.row(old).await.state,
        JobState::Failed,
        "the old job stays"
    );
    // Asked again (the derived key again): the same new job, no second.
    let again = admin
        .retry_as_new_operation(retry(old, "", "bob"))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.new_job.unwrap().job_id, new.job_id);
    // Both stories, once each.
    let on_old = event_details(&h, old, "retried_as_new_operation").await;
    assert_eq!(on_old.len(), 1);
    assert_eq!(on_old[0]["new_operation_key"], new.operation_key);
    assert_eq!(on_old[0]["operator"], "alice");
    let on_new = event_details(&h, new.job_id, "retry_of").await;
    assert_eq!(on_new.len(), 1);
    assert_eq!(on_new[0]["old_job_id"], old);
    // Another key for a job already tried again is refused, naming the first.
    let other = admin
        .retry_as_new_operation(retry(old, "refund-1-second", "bob"))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::InvalidArgument);
    assert!(
        other.message().contains("refund-1:retry:"),
        "{}",
        other.message()
    );
    h.finish().await;
}

#[tokio::test]
async fn only_a_failed_or_cancelled_job_is_tried_again_and_bad_input_is_refused() {
    let h = Harness::start().await;
    let old = failed(&h, "refund-3").await;
    let ready = h.enqueue(Q, "refund-2", "{}").await;
    let mut admin = admin(&h).await;
    let refused = admin
        .retry_as_new_operation(retry(ready.job_id, "", "alice"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(reason(&refused), "INVALID_REQUEST");
    assert!(
        refused.message().contains("is ready"),
        "the refusal names the state: {}",
        refused.message()
    );
    let own_key = admin
        .retry_as_new_operation(retry(old, "refund-3", "alice"))
        .await
        .unwrap_err();
    assert_eq!(own_key.code(), Code::InvalidArgument);
    let no_reason = admin
        .retry_as_new_operation(RetryAsNewOperationRequest {
            reason: " ".into(),
            ..retry(old, "", "alice")
        })
        .await
        .unwrap_err();
    assert_eq!(no_reason.code(), Code::InvalidArgument);
    let missing = admin
        .retry_as_new_operation(retry(999_999, "", "alice"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    // Nothing was written: no new job, no link.
    assert_eq!(h.count_events(old, "retried_as_new_operation").await, 0);
    let jobs: (i64,) = sqlx::query_as("SELECT COUNT(*) FROM jobs")
        .fetch_one(&h.db.pool())
        .await
        .unwrap();
    assert_eq!(jobs.0, 2);
    h.finish().await;
}

/// Two operators at once, one paused holding the old job's row lock: the
/// other waits, its lock wait times out and is run again (counted), and
/// both end with the one new job.
#[tokio::test]
async fn two_operators_at_once_make_one_new_job_through_a_lock_wait_run_again() {
    let h = Harness::start_with_lock_wait(1).await;
    let old = failed(&h, "refund-4").await;
    let mut gate = h.pauses.arm(PausePoint::RetryAfterLock);
    let mut a = admin(&h).await;
    let alice =
        tokio::spawn(async move { a.retry_as_new_operation(retry(old, "", "alice")).await });
    gate.reached().await;
    let mut b = admin(&h).await;
    let bob = tokio::spawn(async move { b.retry_as_new_operation(retry(old, "", "bob")).await });
    let store = h.coordinator.store().clone();
    kit::until("bob's lock wait timed out and was run again", || {
        store.conflicts().0 >= 1
    })
    .await;
    gate.release();
    let alice = alice.await.unwrap().unwrap().into_inner();
    let bob = bob.await.unwrap().unwrap().into_inner();
    assert_eq!(
        alice.new_job.unwrap().job_id,
        bob.new_job.unwrap().job_id,
        "one new job"
    );
    assert!(alice.created ^ bob.created, "made once");
    assert_eq!(h.count_events(old, "retried_as_new_operation").await, 1);
    let (retried, reported) = store.conflicts();
    assert!(retried >= 1, "retried {retried}");
    assert_eq!(reported, 0);
    h.finish().await;
}

#[tokio::test]
async fn the_cli_tries_a_failed_job_again() {
    let h = Harness::start().await;
    let old = failed(&h, "refund-5").await;
    let endpoint = format!("http://{}", h.addr);
    let id = old.to_string();
    let argv = [
        "jobfence",
        "jobs",
        "retry",
        &id,
        "--operator",
        "alice",
        "--reason",
        "new card",
        "--endpoint",
        &endpoint,
    ];
    let Operation::Jobs(args) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not a jobs command");
    };
    let mut out = Vec::new();
    jobfence_operator::run(Operation::Jobs(args), &mut out)
        .await
        .unwrap();
    let printed = String::from_utf8(out).unwrap();
    assert!(
        printed.starts_with(&format!("job {old} (refund-5) tried again as job ")),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("refund-5:retry:{old} (ready)")),
        "{printed}"
    );
    assert!(
        printed.ends_with(&format!("job {old} stays failed\n")),
        "{printed}"
    );
    h.finish().await;
}
