//! A connection the server closed while it rested fails no call: every
//! session of the store runs with `wait_timeout = 1`, so MariaDB itself
//! closes each connection that rests longer than a second, as a server's
//! `wait_timeout` or a proxy's idle timeout does in production. The calls
//! after the rest — a claim and a Complete on the batch pool's warm
//! connection, reads and an Enqueue on the other pool's idle one — all
//! succeed: a connection that rested a second or longer is pinged before
//! it is used, and replaced when the ping fails (crates/store/src/tx.rs,
//! and the pools' `before_acquire` in crates/store/src/lib.rs).
//!
//! The one wait here is the rest itself (2.5 s: longer than both the
//! server's timeout and the coordinator's check); nothing races.

use jobfence_testkit as kit;

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{self as proto, CompleteRequest, GetJobRequest};
use kit::Harness;
use sqlx::MySqlPool;
use std::collections::HashSet;
use std::time::Duration;
use tonic::transport::Channel;

const Q: &str = "refunds";

/// The ids of the sessions connected to this test's database, but the
/// one asking.
async fn sessions(pool: &MySqlPool) -> HashSet<i64> {
    sqlx::query_scalar(
        "SELECT ID FROM information_schema.PROCESSLIST \
         WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
    )
    .fetch_all(pool)
    .await
    .expect("list the sessions")
    .into_iter()
    .collect()
}

/// The job's state, as GetJob (the pool of autocommit sessions) reads it.
async fn read(client: &mut JobCoordinatorClient<Channel>, job_id: u64) -> proto::JobState {
    let job = client
        .get_job(GetJobRequest { job_id })
        .await
        .expect("GetJob answers")
        .into_inner()
        .job
        .expect("the job");
    proto::JobState::try_from(job.state).expect("a known state")
}

fn complete(job_id: u64, attempt: u64) -> CompleteRequest {
    CompleteRequest {
        job_id,
        attempt,
        provider_reference: format!("re_{job_id}"),
        result: String::new(),
        next: None,
    }
}

#[tokio::test]
async fn connections_the_server_closed_while_they_rested_fail_no_call() {
    let h = Harness::start_with_session_sql("; SET SESSION wait_timeout = 1").await;
    let mut client = h.client.clone();
    let first = h.enqueue(Q, "refund-1", "{}").await;
    h.enqueue(Q, "refund-2", "{}").await;
    let a = h.claim_one(Q, "worker-a").await;
    assert_eq!(a.job_id, first.job_id);
    client
        .complete(complete(a.job_id, a.attempt))
        .await
        .expect("the first Complete applies");
    read(&mut client, a.job_id).await;
    let before = sessions(&h.pool).await;

    tokio::time::sleep(Duration::from_millis(2500)).await;

    let after = sessions(&h.pool).await;
    let closed = before.difference(&after).count();
    assert!(
        closed >= 2,
        "the server closed the store's resting sessions ({closed} of {} closed)",
        before.len()
    );
    // A claim and a Complete: the batch pool's warm connections.
    let b = h.claim_one(Q, "worker-b").await;
    client
        .complete(complete(b.job_id, b.attempt))
        .await
        .expect("a Complete after the rest applies");
    // A read and an Enqueue: the other pool's idle connection.
    assert_eq!(
        read(&mut client, b.job_id).await,
        proto::JobState::Succeeded
    );
    let third = h.enqueue(Q, "refund-3", "{}").await;
    assert_eq!(
        read(&mut client, third.job_id).await,
        proto::JobState::Ready
    );
    h.finish().await;
}
