//! A Complete that asks for its worker's next job of a queue on another
//! database (docs/design.md rule 16): the write and the claim cannot share
//! a transaction, so they run one after the other, and the call still
//! answers with the next job.

use crate::shards::two_shards;
use jobfence_api::v1::{CompleteRequest, NextJobsRequest};

#[tokio::test]
async fn a_complete_on_one_database_hands_out_the_next_job_of_the_other() {
    let s = two_shards().await;
    s.enqueue("refunds", "refund-1").await;
    let done = s.claim("refunds", 1).await.remove(0);
    let next = s.enqueue("payouts-eu", "payout-1").await;
    let r = s
        .client()
        .complete(CompleteRequest {
            job_id: done.job_id,
            attempt: done.attempt,
            provider_reference: "re_1".into(),
            result: String::new(),
            next: Some(NextJobsRequest {
                queue: "payouts-eu".into(),
                worker_id: "worker".into(),
                max_jobs: 1,
                lease: None,
                wait: None,
            }),
        })
        .await
        .expect("applied")
        .into_inner();
    assert!(r.job.is_some() && !r.replayed, "{r:?}");
    let handed = r.next.expect("a next-jobs answer");
    assert!(handed.write_refused.is_none(), "{handed:?}");
    let jobs: Vec<(u64, u64)> = handed
        .jobs
        .iter()
        .filter_map(|c| c.job.as_ref().map(|j| (j.job_id, j.attempt)))
        .collect();
    assert_eq!(
        jobs,
        [(next.job_id, 1)],
        "the other database's job, claimed"
    );
    assert_eq!(s.stored(0, done.job_id).await, 1);
    assert_eq!(s.stored(1, next.job_id).await, 1);
}
