//! Concurrent Claims of one queue share one claim transaction (the
//! coordinator's claim pipeline gives each caller a slot). Each slot gets
//! at most its own `max_jobs`, the slots filled in order, expired leases
//! first (taken over, as reconciles) and then due ready jobs, oldest first.
//! Called on the store directly with three slots: the coordinator forms
//! such a batch only when its claim transactions are all busy, which a
//! test would have to arrange with pause points for no gain here.

use jobfence_domain::{ClaimSlot, JobState, NextAction, QueuePolicy};
use jobfence_store::JobStore;
use jobfence_testkit::Harness;
use std::time::Duration;

const Q: &str = "refunds";

fn slot(worker: &str, max_jobs: u32) -> ClaimSlot {
    ClaimSlot {
        worker_id: worker.into(),
        max_jobs,
        lease: Duration::from_secs(30),
        waiter: None,
    }
}

#[tokio::test]
async fn a_coalesced_claim_fills_each_callers_slot_to_its_own_max_jobs_in_order() {
    let h = Harness::start().await;
    // One running job whose lease ran out, then four due ready jobs.
    let expired = h.enqueue(Q, "refund-expired", "{}").await.job_id;
    assert_eq!(h.claim(Q, "gone", 1).await.len(), 1);
    h.force_lease_expired(expired).await;
    let mut ready = Vec::new();
    for i in 0..4 {
        ready.push(h.enqueue(Q, &format!("refund-{i}"), "{}").await.job_id);
    }

    let store = JobStore::new(h.pool.clone());
    let slots = [slot("first", 1), slot("second", 2), slot("third", 1)];
    let out = store
        .claim_batch(Q, QueuePolicy::default(), &slots, false)
        .await
        .unwrap();

    let handed: Vec<Vec<(u64, bool)>> = out
        .jobs
        .iter()
        .map(|jobs| jobs.iter().map(|c| (c.job.id, c.takeover)).collect())
        .collect();
    assert_eq!(
        handed,
        vec![
            vec![(expired, true)],
            vec![(ready[0], false), (ready[1], false)],
            vec![(ready[2], false)],
        ],
        "each slot up to its own max_jobs, in order, the expired lease first"
    );
    // The rows say the same: each job held by its slot's worker.
    for (id, owner, attempt, action) in [
        (expired, "first", 2, NextAction::Reconcile),
        (ready[0], "second", 1, NextAction::Execute),
        (ready[1], "second", 1, NextAction::Execute),
        (ready[2], "third", 1, NextAction::Execute),
    ] {
        let row = h.row(id).await;
        assert_eq!(
            (
                row.state,
                row.lease_owner.as_deref(),
                row.attempt,
                row.next_action
            ),
            (JobState::Running, Some(owner), attempt, action),
            "job {id}"
        );
    }
    // More than the slots asked for stays ready.
    let last = h.row(ready[3]).await;
    assert_eq!((last.state, last.attempt), (JobState::Ready, 0));
    h.finish().await;
}
