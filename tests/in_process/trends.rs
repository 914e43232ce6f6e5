//! The queue trends' source (the console's sparklines): the state changes
//! of the last minutes, read from the stored events, so a coordinator
//! started afterwards (a restart, another replica) sees the same past.

use jobfence_testkit as kit;

use jobfence_api::v1::CompleteRequest;
use jobfence_domain::JobState;
use kit::Harness;
use std::time::Duration;

const Q: &str = "refunds";

#[tokio::test]
async fn a_coordinator_started_later_reads_the_queues_recent_state_changes() {
    let h = Harness::start().await;
    for n in 0..3 {
        h.enqueue(Q, &format!("refund-{n}"), "{}").await;
    }
    for _ in 0..2 {
        let job = h.claim_one(Q, "w-1").await;
        h.client
            .clone()
            .complete(CompleteRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                provider_reference: format!("re_{}", job.job_id),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // Another coordinator, started after all of it.
    let later = h.replica(Default::default()).await;
    let changes = later
        .coordinator
        .state_changes(Duration::from_secs(600))
        .await
        .unwrap();
    let count = |from: Option<JobState>, to: JobState| -> u64 {
        changes
            .iter()
            .filter(|c| c.queue == Q && c.from == from && c.to == Some(to))
            .map(|c| c.jobs)
            .sum()
    };
    assert_eq!(count(None, JobState::Ready), 3, "{changes:?}");
    assert_eq!(count(Some(JobState::Ready), JobState::Running), 2);
    assert_eq!(count(Some(JobState::Running), JobState::Succeeded), 2);
    assert!(changes.iter().all(|c| c.bucket < 120), "{changes:?}");
    // Outside the window, nothing.
    let none = later
        .coordinator
        .state_changes(Duration::from_micros(1))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    h.finish().await;
}
