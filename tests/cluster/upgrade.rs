//! A rolling upgrade from the previous release, under load, with no SQL by
//! hand (docs/operating.md "Upgrading", docs/releases.md).
//!
//! The previous release's binary (`$JOBFENCE_PREVIOUS_RELEASE_BIN`, built
//! from its commit in git history by `scripts/release-binary`, which
//! `scripts/test` runs) serves as two coordinators behind a real HAProxy,
//! with a Rust and a Python refund worker and a producer under load. Then,
//! as a platform team would: today's `jobfence migrate` runs while they
//! serve; today's two coordinators start; the old ones stop one at a time
//! (SIGTERM). Checked: every job succeeded and the fake provider refunded
//! each exactly once; no coordinator answered INTERNAL; no worker call
//! failed after its retries; an observation recorded through an old
//! coordinator is handed out by a takeover through a new one (before the
//! backfill, with the job's flag still 0, and after it); the backfill ran
//! once. Then the rollback rule: the old binary refuses `serve --migrate`
//! naming the migration it does not know, and serves correctly without
//! it; a new coordinator beside it sees it and keeps the older behaviour.

use super::upgrade_kit::{
    count_in, enqueue_load, haproxy, metric_sum, observe_old, Fleet, Load, Node,
};
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{CompleteRequest, TakeoverRequest};
use jobfence_testkit as kit;
use kit::TestDb;
use sqlx::Row;
use std::time::{Duration, Instant};

/// The quiet period of today's coordinators in this test.
pub(crate) const QUIET: &str = "3s";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_from_the_previous_release_under_load() {
    let old_bin = std::env::var("JOBFENCE_PREVIOUS_RELEASE_BIN").expect(
        "JOBFENCE_PREVIOUS_RELEASE_BIN: the previous release's binary; scripts/test builds it \
         with scripts/release-binary (or run that and export its path)",
    );
    let db = TestDb::empty().await;
    let dir = tempdir("upgrade");
    let mut fleet = Fleet::new(&db.url, dir.clone(), old_bin.clone());
    fleet.run_old(&["migrate", "--database-url", &db.url]).await;

    // Two old coordinators behind HAProxy, which already lists the new ones
    // (down until they start), as a deployment's load balancer would.
    let names = ["old-1", "old-2", "new-1", "new-2"];
    let nodes: Vec<Node> = names.iter().map(|n| Node::ports(n)).collect();
    fleet.start(&nodes[0], true).await;
    fleet.start(&nodes[1], true).await;
    let (_haproxy, lb) = haproxy(&nodes, &dir).await;
    let provider = jobfence_fake_provider::spawn(Default::default())
        .await
        .unwrap();
    let load = Load::start(lb, &provider.base_url(), &dir);
    let producer = tokio::spawn(enqueue_load(lb, load.stop.clone()));
    tokio::time::sleep(Duration::from_secs(4)).await;

    let migrated = fleet.run_new(&["migrate", "--database-url", &db.url]).await;
    assert!(migrated.contains("applied"), "{migrated}");
    // An observation through an old coordinator on the new schema (it
    // does not set the flag), on jobs no worker takes.
    let observed = observe_old(nodes[0].grpc).await;
    fleet.start(&nodes[2], false).await;
    fleet.start(&nodes[3], false).await;
    let pool = check_pool(&db.url);
    tokio::time::sleep(Duration::from_secs(4)).await;

    // Mixed fleet: the job's flag is still 0 (an old coordinator recorded
    // the observation), and a takeover through a new one hands it out.
    assert_eq!(flag(&pool, observed[0]).await, 0);
    let seen = takeover(nodes[2].grpc, observed[0]).await;
    assert_eq!(seen, 1, "the observation recorded through 0.1.0");

    stop_the_old_ones(&mut fleet, &nodes, &pool, observed[1]).await;

    tokio::time::sleep(Duration::from_secs(3)).await;
    load.stop.notify_waiters();
    let enqueued = producer.await.unwrap();
    let drained = wait_for(Duration::from_secs(120), || async {
        unfinished(&pool).await == 0
    })
    .await;
    let workers = load.stop_workers().await;
    assert!(drained, "jobs left unfinished:\n{}", fleet.logs());
    check_every_job_once(&pool, &provider, enqueued).await;
    no_internal_answers(&fleet, &nodes[2..]).await;
    assert_eq!(
        workers.failed_calls, 0,
        "worker calls failed after retries:\n{}",
        workers.text
    );
    assert!(
        workers.completed >= 2,
        "both clients completed jobs:\n{}",
        workers.text
    );
    assert_eq!(backfills(&pool).await, 1);
    assert_eq!(
        count_in(&fleet.log_text(), "backfill: no older coordinator"),
        1
    );
    let counted = metric_sum(nodes[2].metrics, "jobfence_schema_backfills_total", "").await
        + metric_sum(nodes[3].metrics, "jobfence_schema_backfills_total", "").await;
    assert_eq!(counted, 1.0);
    eprintln!(
        "upgrade: {enqueued} jobs enqueued and each refunded once; {} workers of two clients completed jobs",
        workers.completed
    );
    rollback(&mut fleet, &nodes, &pool).await;
    pool.close().await;
}

/// The test's own pool, once the schema is there. Its sessions register
/// (as every jobfence process's do): a test's own connections are not
/// taken for an older coordinator's.
fn check_pool(url: &str) -> sqlx::MySqlPool {
    jobfence_store::connect(
        url,
        &jobfence_store::PoolSettings {
            process: Some("upgrade test".into()),
            ..Default::default()
        },
    )
    .unwrap()
}

/// SIGTERM to the old coordinators one at a time; then the backfill runs,
/// and the second observed job, its flag brought forward, is handed out
/// with its observation through a new coordinator.
async fn stop_the_old_ones(fleet: &mut Fleet, nodes: &[Node], pool: &sqlx::MySqlPool, job: u64) {
    fleet.stop(&nodes[0]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    fleet.stop(&nodes[1]).await;
    let backfilled = wait_for(Duration::from_secs(60), || async {
        backfills(pool).await >= 1
    })
    .await;
    assert!(backfilled, "no backfill within 60 s:\n{}", fleet.logs());
    assert_eq!(flag(pool, job).await, 1, "brought forward");
    assert_eq!(takeover(nodes[3].grpc, job).await, 1);
}

/// No coordinator, old or new, answered INTERNAL: none logged one, and
/// the new ones' metrics count none.
async fn no_internal_answers(fleet: &Fleet, new: &[Node]) {
    assert_eq!(
        count_in(&fleet.log_text(), "internal error"),
        0,
        "{}",
        fleet.logs()
    );
    for node in new {
        let internal = metric_sum(
            node.metrics,
            "jobfence_rpc_duration_seconds_count",
            "code=\"INTERNAL\"",
        )
        .await;
        assert_eq!(internal, 0.0, "{} answered INTERNAL", node.name);
    }
}

/// The rollback rule of docs/releases.md for 0.2.0 → 0.1.0, with today's
/// coordinators stopped: the old binary refuses to migrate a schema it
/// does not know, serves it correctly without `--migrate`, and a new
/// coordinator started beside it keeps the older behaviour again.
async fn rollback(fleet: &mut Fleet, nodes: &[Node], pool: &sqlx::MySqlPool) {
    fleet.stop(&nodes[2]).await;
    fleet.stop(&nodes[3]).await;
    let (ok, text) = fleet
        .try_old(&[
            "serve",
            "--insecure",
            "--migrate",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &fleet.url.clone(),
        ])
        .await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("20261206000001") && text.contains("missing"),
        "{text}"
    );
    let old = Node::ports("old-again");
    fleet.start(&old, true).await;
    let job = super::upgrade_kit::one_job_through(old.grpc).await;
    assert_eq!(job, "succeeded");
    let new = Node::ports("new-again");
    fleet.start(&new, false).await;
    let reopened = wait_for(Duration::from_secs(20), || async {
        !transition_complete(pool).await
    })
    .await;
    assert!(
        reopened,
        "the transition was not reopened:\n{}",
        fleet.logs()
    );
    fleet.stop(&old).await;
    let again = wait_for(Duration::from_secs(60), || async {
        backfills(pool).await == 2
    })
    .await;
    assert!(
        again,
        "no second backfill after the rollback:\n{}",
        fleet.logs()
    );
    fleet.stop(&new).await;
}

async fn takeover(grpc: u16, job_id: u64) -> usize {
    let mut c = JobCoordinatorClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    let claimed = c
        .takeover(TakeoverRequest {
            job_id,
            worker_id: "upgrade-reconciler".into(),
            lease: kit::secs(30),
        })
        .await
        .unwrap()
        .into_inner()
        .claimed
        .unwrap();
    let job = claimed.job.unwrap();
    c.complete(CompleteRequest {
        job_id,
        attempt: job.attempt,
        provider_reference: "re_reconciled".into(),
        result: "{}".into(),
        next: None,
    })
    .await
    .unwrap();
    claimed.observations.len()
}

async fn flag(pool: &sqlx::MySqlPool, job_id: u64) -> i64 {
    sqlx::query_scalar("SELECT has_observations FROM jobs WHERE id = ?")
        .bind(job_id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn backfills(pool: &sqlx::MySqlPool) -> i64 {
    sqlx::query_scalar(
        "SELECT CAST(backfills AS SIGNED) FROM schema_transitions WHERE name = 'observations_flag'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn transition_complete(pool: &sqlx::MySqlPool) -> bool {
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM schema_transitions WHERE name = 'observations_flag' AND completed_at IS NOT NULL")
        .fetch_one(pool)
        .await
        .unwrap();
    n == 1
}

async fn unfinished(pool: &sqlx::MySqlPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE queue = 'refunds' AND state <> 'succeeded'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Every job of the load succeeded, and the provider refunded each
/// operation key exactly once.
async fn check_every_job_once(
    pool: &sqlx::MySqlPool,
    provider: &jobfence_fake_provider::ProviderHandle,
    enqueued: usize,
) {
    let rows = sqlx::query("SELECT CAST(operation_key AS CHAR) AS operation_key, CAST(state AS CHAR) AS state FROM jobs WHERE queue = 'refunds'")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(rows.len(), enqueued, "one job per key enqueued");
    let ledger = provider.client().ledger().await.unwrap();
    for row in &rows {
        let key: String = row.get("operation_key");
        let state: String = row.get("state");
        assert_eq!(state, "succeeded", "{key}");
        assert_eq!(ledger.by_merchant_reference(&key).refunds, 1, "{key}");
    }
    assert_eq!(ledger.merchant_references.len(), enqueued);
}

async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("jobfence-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
