//! Queues spread over two databases (two private databases on the test
//! MariaDB): each queue's jobs live on the database its placement names,
//! job and event ids name their database, and every call by id (Complete,
//! Fail, GetJob, the operator's) reaches it without a lookup; ListJobs,
//! QueueStats and the events feed cover both.

use jobfence_testkit as kit;

use jobfence_api::v1::job_admin_client::JobAdminClient;
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::job_events_client::JobEventsClient;
use jobfence_api::v1::{
    self as proto, ClaimRequest, CompleteRequest, EnqueueBatchRequest, EnqueueRequest,
    FailDisposition, FailRequest, GetJobDetailRequest, GetJobRequest, ListEventsRequest,
    ListJobsRequest, QueueStatsRequest,
};
use jobfence_core::Coordinator;
use jobfence_store::shards::{range_start, shard_of, Placement, Shards, ShardsConfig};
use jobfence_store::JobStore;
use kit::{reason, TestDb};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

mod identity;

/// Two databases: `refunds` on database 0, every `payouts-…` queue on
/// database 1, nothing else placed.
pub(crate) struct TwoShards {
    dbs: [TestDb; 2],
    coordinator: Coordinator,
    channel: Channel,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub(crate) async fn two_shards() -> TwoShards {
    let dbs = [TestDb::new().await, TestDb::new().await];
    let config = ShardsConfig::parse(&format!(
        "database 0 {}\ndatabase 1 {}\nqueue refunds 0\nprefix payouts- 1\n",
        dbs[0].url, dbs[1].url
    ))
    .unwrap();
    let stores: BTreeMap<u32, JobStore> = config
        .databases
        .iter()
        .map(|(n, urls)| (*n, JobStore::open(urls, &Default::default()).unwrap()))
        .collect();
    let shards = Shards::new(stores, config.placement);
    shards
        .prepare()
        .await
        .expect("the databases take their numbers");
    let coordinator = Coordinator::over_shards(shards, kit::test_config());
    let served = kit::serve_in_process(coordinator.clone(), Duration::from_millis(100)).await;
    TwoShards {
        dbs,
        coordinator,
        channel: served.channel,
        _stop: served.stop,
    }
}

/// A refunds job enqueued straight through `c`, without gRPC.
async fn enqueue_alone(c: &Coordinator, key: &str) -> jobfence_domain::EnqueueOutcome {
    c.enqueue(
        jobfence_domain::Enqueue {
            queue: "refunds".into(),
            operation_key: key.into(),
            payload: "{}".into(),
            delay: Duration::ZERO,
            fairness_key: None,
            priority: Default::default(),
        },
        &jobfence_domain::scope::ANY_QUEUE,
    )
    .await
    .unwrap()
}

impl TwoShards {
    pub(crate) fn client(&self) -> JobCoordinatorClient<Channel> {
        JobCoordinatorClient::new(self.channel.clone())
    }

    pub(crate) async fn enqueue(&self, queue: &str, key: &str) -> proto::Job {
        self.client()
            .enqueue(EnqueueRequest {
                queue: queue.into(),
                operation_key: key.into(),
                payload: "{}".into(),
                delay: None,
                fairness_key: String::new(),
                priority: 0,
            })
            .await
            .expect("enqueue")
            .into_inner()
            .job
            .unwrap()
    }

    pub(crate) async fn claim(&self, queue: &str, max: u32) -> Vec<proto::Job> {
        self.client()
            .claim(ClaimRequest {
                queue: queue.into(),
                worker_id: "worker".into(),
                max_jobs: max,
                lease: None,
                wait: None,
            })
            .await
            .expect("claim")
            .into_inner()
            .jobs
            .into_iter()
            .map(|c| c.job.unwrap())
            .collect()
    }

    /// The number of jobs with `id` in database `db`, read directly.
    pub(crate) async fn stored(&self, db: usize, id: u64) -> i64 {
        let pool = self.dbs[db].pool();
        let n = sqlx::query_scalar("SELECT COUNT(*) FROM jobs WHERE id = ?")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        n
    }
}

#[tokio::test]
async fn each_queue_lives_on_its_database_and_ids_route_the_writes() {
    let s = two_shards().await;
    let refund = s.enqueue("refunds", "refund-1").await;
    let payout = s.enqueue("payouts-eu", "payout-1").await;
    assert_eq!(shard_of(refund.job_id), 0);
    assert_eq!(shard_of(payout.job_id), 1);
    assert_eq!(
        payout.job_id,
        range_start(1) + 1,
        "database 1's ids start at 2^48"
    );
    assert_eq!(
        (
            s.stored(0, refund.job_id).await,
            s.stored(1, refund.job_id).await
        ),
        (1, 0)
    );
    assert_eq!(
        (
            s.stored(0, payout.job_id).await,
            s.stored(1, payout.job_id).await
        ),
        (0, 1)
    );

    // A queue the placement does not name is refused before anything is
    // written.
    let status = s
        .client()
        .enqueue(EnqueueRequest {
            queue: "emails".into(),
            operation_key: "e-1".into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    // Claims go to the queue's database.
    let r = s.claim("refunds", 5).await;
    let p = s.claim("payouts-eu", 5).await;
    assert_eq!((r.len(), p.len()), (1, 1));
    assert_eq!((r[0].job_id, p[0].job_id), (refund.job_id, payout.job_id));

    // Complete and Fail are routed by the job id.
    let done = s
        .client()
        .complete(CompleteRequest {
            job_id: payout.job_id,
            attempt: 1,
            provider_reference: "po_1".into(),
            result: String::new(),
            next: None,
        })
        .await
        .expect("complete on database 1")
        .into_inner()
        .job
        .unwrap();
    assert_eq!(done.state, proto::JobState::Succeeded as i32);
    let failed = s
        .client()
        .fail(FailRequest {
            job_id: refund.job_id,
            attempt: 1,
            disposition: FailDisposition::Failed as i32,
            error: "card closed".into(),
            retry_delay: None,
            provider_retry_after: None,
            next: None,
        })
        .await
        .expect("fail on database 0")
        .into_inner()
        .job
        .unwrap();
    assert_eq!(failed.state, proto::JobState::Failed as i32);
    // The fence holds per database: a stale write by id is refused there.
    let stale = s
        .client()
        .complete(CompleteRequest {
            job_id: payout.job_id,
            attempt: 1,
            provider_reference: "po_other".into(),
            result: String::new(),
            next: None,
        })
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert_eq!(reason(&stale), "JOB_NOT_RUNNING");

    // GetJob of a job on either database, and of an id no database has.
    for (id, state) in [
        (refund.job_id, proto::JobState::Failed),
        (payout.job_id, proto::JobState::Succeeded),
    ] {
        let got = s
            .client()
            .get_job(GetJobRequest { job_id: id })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        assert_eq!((got.job_id, got.state), (id, state as i32));
    }
    let nowhere = s
        .client()
        .get_job(GetJobRequest {
            job_id: range_start(7) + 1,
        })
        .await
        .unwrap_err();
    assert_eq!(nowhere.code(), Code::NotFound);
    let admin = JobAdminClient::new(s.channel.clone());
    let detail = admin
        .clone()
        .get_job(GetJobDetailRequest {
            job_id: payout.job_id,
        })
        .await
        .unwrap()
        .into_inner();
    let kinds: Vec<String> = detail.events.iter().map(|e| e.kind.clone()).collect();
    assert_eq!(
        kinds,
        ["enqueued", "claimed", "completed", "stale_write_rejected"]
    );
}

#[tokio::test]
async fn an_enqueue_batch_over_both_databases_answers_every_item() {
    let s = two_shards().await;
    let items = ["refunds", "payouts-eu", "refunds", "payouts-us"]
        .iter()
        .enumerate()
        .map(|(i, q)| EnqueueRequest {
            queue: (*q).into(),
            operation_key: format!("k-{i}"),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .collect();
    let results = s
        .client()
        .enqueue_batch(EnqueueBatchRequest { items })
        .await
        .unwrap()
        .into_inner()
        .results;
    let shards: Vec<u32> = results
        .iter()
        .map(|r| match &r.result {
            Some(proto::enqueue_batch_result::Result::Enqueued(e)) => {
                shard_of(e.job.as_ref().unwrap().job_id)
            }
            other => panic!("not enqueued: {other:?}"),
        })
        .collect();
    assert_eq!(shards, [0, 1, 0, 1], "in the order of the items");
}

#[tokio::test]
async fn listing_stats_and_events_cover_both_databases() {
    let s = two_shards().await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(s.enqueue("refunds", &format!("r-{i}")).await.job_id);
        ids.push(s.enqueue("payouts-eu", &format!("p-{i}")).await.job_id);
    }
    let claimed = s.claim("payouts-eu", 1).await;
    assert_eq!(claimed.len(), 1);
    let admin = JobAdminClient::new(s.channel.clone());

    // ListJobs pages through both databases (database 0's jobs first),
    // the page token carrying on into database 1.
    let mut listed = Vec::new();
    let mut token = String::new();
    loop {
        let page = admin
            .clone()
            .list_jobs(ListJobsRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        listed.extend(page.jobs.iter().map(|j| j.job_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut want = ids.clone();
    want.sort_unstable();
    assert_eq!(listed, want);
    let only_payouts = admin
        .clone()
        .list_jobs(ListJobsRequest {
            queue: "payouts-eu".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert!(only_payouts.iter().all(|j| shard_of(j.job_id) == 1));
    assert_eq!(only_payouts.len(), 3);

    // QueueStats: one entry per queue, from its database.
    let stats = admin
        .clone()
        .queue_stats(QueueStatsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .queues;
    let queues: Vec<&str> = stats.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(queues, ["payouts-eu", "refunds"]);
    let total = |q: &proto::QueueStats| q.counts.iter().map(|c| c.jobs).sum::<u64>();
    assert_eq!((total(&stats[0]), total(&stats[1])), (3, 3));

    // The events feed: one feed per database, each from its start.
    let mut events = JobEventsClient::new(s.channel.clone());
    let first = events
        .list_events(ListEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.feed_starts, [0, range_start(1)]);
    let mut by_feed = Vec::new();
    for start in first.feed_starts {
        let page = events
            .list_events(ListEventsRequest {
                after_event_id: start,
                limit: 100,
                queue: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page
            .events
            .iter()
            .all(|e| shard_of(e.event_id) == shard_of(start)));
        assert!(page.next_after_event_id >= start);
        by_feed.push(
            page.events
                .iter()
                .map(|e| (e.job_id, e.kind.clone()))
                .collect::<Vec<_>>(),
        );
    }
    let enqueued = |feed: &Vec<(u64, String)>| -> HashSet<u64> {
        feed.iter()
            .filter(|(_, k)| k == "enqueued")
            .map(|(j, _)| *j)
            .collect()
    };
    let want0: HashSet<u64> = ids.iter().copied().filter(|i| shard_of(*i) == 0).collect();
    let want1: HashSet<u64> = ids.iter().copied().filter(|i| shard_of(*i) == 1).collect();
    assert_eq!(enqueued(&by_feed[0]), want0);
    assert_eq!(enqueued(&by_feed[1]), want1);
    assert!(by_feed[1].contains(&(claimed[0].job_id, "claimed".into())));
    // A cursor naming a database the coordinator does not have.
    let bad = events
        .list_events(ListEventsRequest {
            after_event_id: range_start(5),
            limit: 10,
            queue: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
}

/// The console's Events page over two databases: one feed per database,
/// each with its own cursor, shown together; the live read follows both.
#[tokio::test]
async fn the_consoles_events_page_shows_and_follows_both_databases() {
    let s = two_shards().await;
    let refund = s.enqueue("refunds", "r-1").await.job_id;
    let payout = s.enqueue("payouts-eu", "p-1").await.job_id;
    assert_ne!(shard_of(refund), shard_of(payout));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(jobfence_console::serve(
        listener,
        s.coordinator.clone(),
        jobfence_console::operator::Identity::Typed,
        std::future::pending(),
    ));
    let http = reqwest::Client::new();
    let page = http
        .get(format!("{base}/events"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for id in [refund, payout] {
        assert!(
            page.contains(&format!("/jobs/{id}")),
            "job {id} missing: {page}"
        );
    }
    // The page's cursor names both feeds; what is written after it, in
    // either database, comes with the next live read.
    let after = page
        .split("data-after=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the table carries its cursors")
        .to_owned();
    assert_eq!(
        after.split(',').count(),
        2,
        "one cursor per database: {after}"
    );
    let later = s.enqueue("payouts-eu", "p-2").await.job_id;
    let live: serde_json::Value = http
        .get(format!("{base}/events/live?after={after}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rows = live["rows"].as_str().unwrap();
    assert!(rows.contains(&format!("/jobs/{later}")), "{rows}");
    assert!(
        !rows.contains(&format!("/jobs/{refund}\"")),
        "seen once: {rows}"
    );
}

#[tokio::test]
async fn the_demo_over_two_databases_refunds_nothing_twice() {
    let db = format!("jf_test_{}_demo_shards", std::process::id());
    let (server, _) = kit::base_url()
        .rsplit_once('/')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap();
    let url = format!("{server}/{db}");
    let run = kit::run_short_demo("shards", &["--database-url", &url, "--shards", "2"]).await;
    // Both databases did work, each for its own queue, with ids in its
    // own range.
    for (k, (name, queue)) in [(&db, "refunds"), (&format!("{db}_s1"), "refunds-1")]
        .into_iter()
        .enumerate()
    {
        let pool = sqlx::mysql::MySqlPool::connect(&format!("{server}/{name}"))
            .await
            .unwrap();
        let rows: Vec<(String, u64, i64)> = sqlx::query_as(
            "SELECT CAST(queue AS CHAR), MIN(id), COUNT(*) FROM jobs WHERE state = 'succeeded' GROUP BY queue",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), 1, "database {k}: {rows:?}\n{}", run.context());
        assert_eq!(rows[0].0, queue, "{}", run.context());
        assert_eq!(shard_of(rows[0].1), k as u32);
        assert!(rows[0].2 > 0);
        println!(
            "database {k}: {} refunds of queue {queue} succeeded",
            rows[0].2
        );
        pool.close().await;
        let _ = sqlx::query(&format!("DROP DATABASE `{name}`"))
            .execute(
                &sqlx::mysql::MySqlPool::connect(&kit::base_url())
                    .await
                    .unwrap(),
            )
            .await;
    }
}
