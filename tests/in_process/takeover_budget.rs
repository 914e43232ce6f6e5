//! A named Takeover spends its provider's budget like any hand-out
//! (docs/design.md rule 11): the units it takes are gone for the next
//! Claim, on the same COMMIT as the takeover.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{ProviderBudget, PutProviderRequest, TakeoverRequest};
use kit::{secs, Harness};

const Q: &str = "refunds";

#[tokio::test]
async fn a_named_takeover_spends_the_unit_the_next_claim_would_have_had() {
    let h = Harness::start().await;
    for key in ["refund-1", "refund-2", "refund-3"] {
        h.enqueue(Q, key, "{}").await;
    }
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
        .put_provider(PutProviderRequest {
            name: "stripe".into(),
            budget: Some(ProviderBudget {
                rate_per_second: 0.01,
                burst: 2,
                max_in_flight: None,
                execute_cost: None,
                reconcile_cost: None,
            }),
            queues: vec![Q.into()],
            operator: "alice".into(),
            reason: "two units, then one every 100 s".into(),
        })
        .await
        .expect("put provider");
    let held = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(held.job_id).await;
    let taken = h
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: held.job_id,
            worker_id: "worker-b".into(),
            lease: secs(30),
        })
        .await
        .expect("the second unit pays for the takeover's reconcile")
        .into_inner();
    assert_eq!(taken.claimed.unwrap().job.unwrap().attempt, 2);
    assert!(
        h.claim(Q, "worker-c", 2).await.is_empty(),
        "both units are spent: one by the claim, one by the takeover"
    );
    h.finish().await;
}
