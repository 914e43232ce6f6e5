//! A coordinator whose only node leaves the primary component names the
//! outage as an outage: UNAVAILABLE / DATABASE_UNAVAILABLE, never ABORTED /
//! TRANSACTION_CONFLICT (the node's causal read fails with 1205 there,
//! which alone looks like a lock wait), and it serves again once the node
//! rejoins, without a restart.

use super::*;

/// Rejoins the isolated node when dropped, also when the test fails half
/// way, so the shared cluster is left with three nodes.
struct Rejoin(&'static str);

impl Drop for Rejoin {
    fn drop(&mut self) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/galera");
        let _ = std::process::Command::new(script)
            .args(["rejoin", self.0])
            .output();
    }
}

async fn cluster_size(url: &str) -> u64 {
    let pool = MySqlPool::connect(url).await.unwrap();
    let row = sqlx::query("SHOW GLOBAL STATUS LIKE 'wsrep_cluster_size'")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    String::from_utf8_lossy(&row.get::<Vec<u8>, _>(1))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_node_outside_the_primary_component_is_an_outage_not_a_conflict() {
    let _cluster = serial().await;
    let db = GaleraDb::new().await;
    let alone = serve(&db, &[2], 1, Duration::from_secs(30)).await;
    let job = alone.enqueue("refund-before").await;
    let claimed = alone.claim("worker", 1).await.expect("claim");
    assert_eq!(claimed.len(), 1);
    let attempt = claimed[0].attempt;

    let rejoin = Rejoin("2");
    galera_script(&["isolate", "2"]);
    // Every kind of write, and a read, from the first moment on (before the health
    // check has noticed) until well after: each one is refused, and as
    // an outage.
    let mut told: HashMap<String, usize> = HashMap::new();
    let mut note = |r: Result<(), tonic::Status>| {
        let what = match r {
            Ok(()) => "OK".to_owned(),
            Err(s) => what(&s),
        };
        *told.entry(what).or_default() += 1;
    };
    for round in 0..15 {
        note(alone.complete(job.job_id, attempt).await.map(|_| ()));
        note(alone.claim("worker", 1).await.map(|_| ()));
        note(
            alone
                .client
                .clone()
                .get_job(proto::GetJobRequest { job_id: job.job_id })
                .await
                .map(|_| ()),
        );
        note(
            alone
                .client
                .clone()
                .enqueue(EnqueueRequest {
                    queue: Q.into(),
                    operation_key: format!("refund-during-{round}"),
                    payload: "{}".into(),
                    delay: None,
                    fairness_key: String::new(),
                    priority: 0,
                })
                .await
                .map(|_| ()),
        );
    }
    let conflicts = alone.coordinator.store().conflicts();
    println!(
        "answers while node 2 was isolated: {told:?}; conflicts (retried, reported): {conflicts:?}"
    );
    // A COMMIT the node refused while it was leaving may have replicated
    // for all it can tell: COMMIT_OUTCOME_UNKNOWN is honest there.
    assert!(
        told.keys()
            .all(|r| r == "DATABASE_UNAVAILABLE" || r == "COMMIT_OUTCOME_UNKNOWN"),
        "every write answered as an outage, none TRANSACTION_CONFLICT: {told:?}"
    );
    assert!(told.get("DATABASE_UNAVAILABLE").copied().unwrap_or(0) > 0);
    assert_eq!(conflicts.1, 0, "no conflict reported");

    galera_script(&["rejoin", "2"]);
    drop(rejoin);
    alone
        .until_health(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    // The same coordinator serves again, on the same node.
    let done = alone
        .complete(job.job_id, attempt)
        .await
        .expect("served again after the rejoin");
    assert_eq!(done.state, proto::JobState::Succeeded as i32);
    alone.enqueue("refund-after").await;
    assert_eq!(alone.claim("worker", 1).await.expect("claim").len(), 1);
    assert_eq!(alone.coordinator.store().current_node(), 0);
    for url in node_urls() {
        assert_eq!(cluster_size(&url).await, 3, "{url} sees three nodes");
    }
    db.drop().await;
}
