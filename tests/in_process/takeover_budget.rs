//! A named Takeover spends its provider's budget like any hand-out
//! (docs/design.md rule 11): the units it takes are gone for the next
//! Claim, on the same COMMIT as the takeover; it takes no turns with the
//! other queues of the provider; and a refusal for a throttle says until
//! when.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{
    FailDisposition, FailRequest, ProviderBudget, PutProviderRequest, TakeoverRequest,
};
use kit::{meta, reason, secs, Harness};

const Q: &str = "refunds";

#[tokio::test]
async fn a_named_takeover_spends_the_unit_the_next_claim_would_have_had() {
    let h = Harness::start().await;
    for key in ["refund-1", "refund-2", "refund-3"] {
        h.enqueue(Q, key, "{}").await;
    }
    // Two units, then one every 100 s.
    h.put_budget("stripe", Q, 0.01, 2).await;
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

fn costs(burst: u32) -> ProviderBudget {
    ProviderBudget {
        rate_per_second: 0.01,
        burst,
        max_in_flight: None,
        execute_cost: Some(1),
        reconcile_cost: Some(2),
        key_share: None,
        max_in_flight_per_key: None,
    }
}

async fn put(h: &Harness, burst: u32, queues: &[&str]) {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
        .put_provider(PutProviderRequest {
            name: "stripe".into(),
            budget: Some(costs(burst)),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            operator: "alice".into(),
            reason: "sends cost 1, reconciles 2; one unit every 100 s".into(),
        })
        .await
        .expect("put provider");
}

fn takeover(job_id: u64) -> TakeoverRequest {
    TakeoverRequest {
        job_id,
        worker_id: "worker-b".into(),
        lease: secs(30),
    }
}

/// A named takeover is one job someone asked for by name: it takes no
/// turns with the other queues of its provider. Queue `payouts` was cut
/// short by the budget before `refunds` was last served, so a Claim of
/// `refunds` would leave it one reconcile's worth (2 of the 2 units
/// left): its fair share is none. The takeover spends the 2 units anyway.
#[tokio::test]
async fn a_named_takeover_takes_no_turns_with_the_other_queues_of_its_provider() {
    const OTHER: &str = "payouts";
    let h = Harness::start().await;
    put(&h, 4, &[Q, OTHER]).await;
    for i in 0..5 {
        h.enqueue(OTHER, &format!("payout-{i}"), "{}").await;
    }
    // payouts takes the 4 units and is cut short (a fifth job waits).
    assert_eq!(h.claim(OTHER, "worker-p", 5).await.len(), 4);
    // Three more units now (the burst raised), and refunds is served one.
    put(&h, 7, &[Q, OTHER]).await;
    h.enqueue(Q, "refund-1", "{}").await;
    let held = h.claim_one(Q, "worker-a").await;
    h.force_lease_expired(held.job_id).await;
    let taken = h
        .client
        .clone()
        .takeover(takeover(held.job_id))
        .await
        .expect("a named takeover spends the units left, whatever the turns")
        .into_inner();
    assert_eq!(taken.claimed.unwrap().job.unwrap().attempt, 2);
    h.finish().await;
}

/// A takeover held back by a worker's throttle report says until when the
/// provider is throttled, as a Claim's refusal does.
#[tokio::test]
async fn a_takeover_refused_for_a_throttle_says_until_when() {
    let h = Harness::start().await;
    put(&h, 10, &[Q]).await;
    h.enqueue(Q, "refund-1", "{}").await;
    h.enqueue(Q, "refund-2", "{}").await;
    let throttled = h.claim_one(Q, "worker-a").await;
    let held = h.claim_one(Q, "worker-a").await;
    h.client
        .clone()
        .fail(FailRequest {
            job_id: throttled.job_id,
            attempt: throttled.attempt,
            disposition: FailDisposition::RetryExecute as i32,
            error: "429 Too Many Requests".into(),
            retry_delay: secs(0),
            provider_retry_after: secs(60),
            next: None,
        })
        .await
        .expect("the throttle report applies");
    h.force_lease_expired(held.job_id).await;
    let refused = h
        .client
        .clone()
        .takeover(takeover(held.job_id))
        .await
        .expect_err("the provider is throttled for a minute");
    assert_eq!(reason(&refused), "PROVIDER_THROTTLED");
    let until = meta(&refused, "throttled_until");
    chrono::DateTime::parse_from_rfc3339(&until)
        .unwrap_or_else(|e| panic!("throttled_until {until:?}: {e}"));
    assert_eq!(
        h.row(held.job_id).await.attempt,
        held.attempt,
        "nothing written"
    );
    h.finish().await;
}
