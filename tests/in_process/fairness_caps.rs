//! Caps per fairness key of a provider's budget (docs/design.md rule 18):
//! a key at its share of the rate, or at its jobs in flight, is skipped
//! while other keys' jobs go out; alone, a key takes the whole budget.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueBatchRequest, EnqueueRequest, ProviderBudget,
    PutProviderRequest,
};
use kit::{secs, Harness};
use sqlx::Row;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const Q: &str = "refunds";

/// Gives [`Q`] (and `also`) to provider "stripe" with these caps.
async fn put_caps(
    h: &Harness,
    (rate, burst): (f64, u32),
    share: Option<f64>,
    per_key: Option<u32>,
) {
    JobAdminClient::connect(format!("http://{}", h.addr))
        .await
        .unwrap()
        .put_provider(PutProviderRequest {
            name: "stripe".into(),
            budget: Some(ProviderBudget {
                rate_per_second: rate,
                burst,
                max_in_flight: None,
                execute_cost: None,
                reconcile_cost: None,
                key_share: share,
                max_in_flight_per_key: per_key,
            }),
            queues: vec![Q.into()],
            operator: "alice".into(),
            reason: "no merchant takes more than its share".into(),
        })
        .await
        .expect("put provider");
}

async fn enqueue(h: &Harness, key: &str, n: usize) {
    let items = (0..n)
        .map(|i| EnqueueRequest {
            queue: Q.into(),
            operation_key: format!("{key}-{i}"),
            payload: "{}".into(),
            delay: None,
            fairness_key: key.into(),
            priority: 0,
        })
        .collect();
    h.client
        .clone()
        .enqueue_batch(EnqueueBatchRequest { items })
        .await
        .unwrap();
}

/// Claims up to `max`; how many jobs of each key came out.
async fn claim_by_key(h: &Harness, max: u32) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for c in h.claim(Q, "worker-a", max).await {
        *out.entry(c.job.unwrap().fairness_key).or_default() += 1;
    }
    out
}

#[tokio::test]
async fn a_key_at_its_share_is_skipped_while_others_wait_and_alone_takes_everything() {
    let h = Harness::start().await;
    // 10 units of burst, refilled slowly; a key may take 30 % of it (3)
    // while another key's jobs are due.
    put_caps(&h, (0.2, 10), Some(0.3), None).await;
    for key in ["a", "b", "c"] {
        enqueue(&h, key, 20).await;
    }
    let got = claim_by_key(&h, 10).await;
    assert_eq!(
        got,
        HashMap::from([("a".into(), 3), ("b".into(), 3), ("c".into(), 3)]),
        "each key its 30 %, the claim skipping a capped key"
    );
    assert!(
        claim_by_key(&h, 10).await.is_empty(),
        "every key is at its share"
    );
    h.finish().await;

    // Nobody else due: one key takes the whole burst.
    let h = Harness::start().await;
    put_caps(&h, (0.2, 10), Some(0.3), None).await;
    enqueue(&h, "a", 20).await;
    assert_eq!(
        claim_by_key(&h, 10).await,
        HashMap::from([("a".into(), 10)])
    );
    h.finish().await;
}

#[tokio::test]
async fn a_key_at_its_jobs_in_flight_is_skipped_until_one_finishes() {
    let h = Harness::start().await;
    put_caps(&h, (1000.0, 1000), None, Some(2)).await;
    enqueue(&h, "a", 10).await;
    enqueue(&h, "b", 10).await;
    let first = h.claim(Q, "worker-a", 10).await;
    let keys: Vec<&str> = first
        .iter()
        .map(|c| c.job.as_ref().unwrap().fairness_key.as_str())
        .collect();
    assert_eq!(keys.iter().filter(|k| **k == "a").count(), 2, "{keys:?}");
    assert_eq!(keys.iter().filter(|k| **k == "b").count(), 2, "{keys:?}");
    let a = first
        .iter()
        .map(|c| c.job.clone().unwrap())
        .find(|j| j.fairness_key == "a")
        .unwrap();
    h.client
        .clone()
        .complete(CompleteRequest {
            job_id: a.job_id,
            attempt: a.attempt,
            provider_reference: "re_a".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap();
    assert_eq!(claim_by_key(&h, 10).await, HashMap::from([("a".into(), 1)]));
    h.finish().await;
}

/// Under a 30 % share of 20 a second (burst 4), merchant A's hand-outs in
/// any 10 s window stay within 0.3 · 20 · 10 + its burst (2) while
/// merchant B's jobs wait (round-robin alone would give A half, about 100
/// in 10 s); counted on the database clock of the `claimed` events.
#[tokio::test]
async fn a_share_holds_in_every_ten_second_window() {
    let h = Harness::start().await;
    put_caps(&h, (20.0, 4), Some(0.3), None).await;
    enqueue(&h, "a", 1000).await;
    enqueue(&h, "b", 1000).await;
    let stop = Arc::new(AtomicBool::new(false));
    for w in 0..4 {
        let (mut client, stop) = (h.another_client().await, stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(got) = client
                    .claim(ClaimRequest {
                        queue: Q.into(),
                        worker_id: format!("w{w}"),
                        max_jobs: 1,
                        lease: secs(60),
                        wait: secs(1),
                    })
                    .await
                else {
                    continue;
                };
                for c in got.into_inner().jobs {
                    let j = c.job.unwrap();
                    let _ = client
                        .complete(CompleteRequest {
                            job_id: j.job_id,
                            attempt: j.attempt,
                            provider_reference: "re".into(),
                            result: String::new(),
                            next: None,
                        })
                        .await;
                }
            }
        });
    }
    let span = |h: &Harness| {
        let pool = h.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT CAST(COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), MAX(created_at)), 0) AS SIGNED) \
                 FROM job_events WHERE kind = 'claimed'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while span(&h).await < 10_500_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "no 10.5 s of hand-outs"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let rows = sqlx::query(
        "SELECT CAST(j.fairness_key AS CHAR) AS k, \
         CAST(TIMESTAMPDIFF(MICROSECOND, '2000-01-01', e.created_at) AS SIGNED) AS us \
         FROM job_events e JOIN jobs j ON j.id = e.job_id WHERE e.kind = 'claimed' ORDER BY e.id",
    )
    .fetch_all(&h.pool)
    .await
    .unwrap();
    let a: Vec<i64> = rows
        .iter()
        .filter(|r| r.get::<String, _>("k") == "a")
        .map(|r| r.get("us"))
        .collect();
    let others = rows.len() - a.len();
    let most = a
        .iter()
        .map(|&t| a.iter().filter(|&&u| u >= t && u < t + 10_000_000).count())
        .max()
        .unwrap_or(0);
    eprintln!(
        "share: A {} of {} hand-outs; at most {most} in a 10 s window (cap 62)",
        a.len(),
        rows.len()
    );
    assert!(most <= 62, "A took {most} in a 10 s window");
    assert!(a.len() >= 30, "A still moved: {}", a.len());
    assert!(others > 0 && others < 1000, "B still waited: {others}");
    h.finish().await;
}
