//! Workers over the cluster while nodes go: writing through every node keeps
//! the fence and costs conflicts, counted; a node that leaves the primary
//! component is left for the next node of the list (and taken back); a node
//! killed under load loses nothing acknowledged, its commits in flight
//! reported COMMIT_OUTCOME_UNKNOWN; the demo survives its writer node
//! killed.

use super::*;

/// What the workers of a load test were told.
#[derive(Default)]
struct Told {
    /// (job, attempt) of every claim answered with the job.
    claims: Vec<(u64, u64)>,
    /// (job, attempt) of every Complete answered OK (replays included).
    completes: Vec<(u64, u64)>,
    /// Calls answered COMMIT_OUTCOME_UNKNOWN, by RPC.
    unknown: HashMap<&'static str, usize>,
    /// Other refusals and errors, by reason or code.
    errors: HashMap<String, usize>,
}

/// Every refusal the workers saw was a typed one: no INTERNAL, UNKNOWN or
/// status without a reason.
fn assert_typed(told: &Told) {
    for what in told.errors.keys() {
        let reason = what.split_once(' ').map_or(what.as_str(), |(_, r)| r);
        assert!(
            reason.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !["INTERNAL", "UNKNOWN"].contains(&reason),
            "an untyped error reached a worker: {what}"
        );
    }
}

/// A worker: claims one job at a time and completes it (sending the same
/// Complete again after an unknown outcome or an outage), until `done`
/// reaches `total`.
async fn worker(
    coord: JobCoordinatorClient<Channel>,
    name: String,
    total: usize,
    done: Arc<AtomicUsize>,
    told: Arc<Mutex<Told>>,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.load(Ordering::SeqCst) < total {
        assert!(Instant::now() < deadline, "{name}: the jobs did not finish");
        let claimed = coord
            .clone()
            .claim(ClaimRequest {
                queue: Q.into(),
                worker_id: name.clone(),
                max_jobs: 1,
                lease: None,
                wait: None,
            })
            .await;
        let job = match claimed {
            Ok(r) => match r.into_inner().jobs.pop() {
                Some(c) => c.job.unwrap(),
                None => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            Err(s) => {
                {
                    let mut t = told.lock().unwrap();
                    if what(&s) == "COMMIT_OUTCOME_UNKNOWN" {
                        // Holds nothing: the job comes back after its lease.
                        *t.unknown.entry("Claim").or_default() += 1;
                    } else {
                        *t.errors.entry(format!("Claim {}", what(&s))).or_default() += 1;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        told.lock().unwrap().claims.push((job.job_id, job.attempt));
        loop {
            let answer = coord
                .clone()
                .complete(CompleteRequest {
                    job_id: job.job_id,
                    attempt: job.attempt,
                    provider_reference: format!("re_{}", job.job_id),
                    result: String::new(),
                    next: None,
                })
                .await;
            let again = {
                let mut t = told.lock().unwrap();
                match answer {
                    Ok(_) => {
                        t.completes.push((job.job_id, job.attempt));
                        done.fetch_add(1, Ordering::SeqCst);
                        false
                    }
                    Err(s) => {
                        let w = what(&s);
                        if w == "COMMIT_OUTCOME_UNKNOWN" {
                            *t.unknown.entry("Complete").or_default() += 1;
                        } else {
                            *t.errors.entry(format!("Complete {w}")).or_default() += 1;
                        }
                        // Send the same call again (a replay is recognised),
                        // unless it was refused: the job is no longer ours.
                        s.code() != Code::FailedPrecondition
                    }
                }
            };
            if !again {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Enqueues `n` jobs in batches.
async fn enqueue_many(c: &Coord, n: usize, prefix: &str) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let items = chunk
            .iter()
            .map(|i| EnqueueRequest {
                queue: Q.into(),
                operation_key: format!("{prefix}-{i}"),
                payload: "{}".into(),
                delay: None,
                fairness_key: String::new(),
                priority: 0,
            })
            .collect();
        c.client
            .clone()
            .enqueue_batch(proto::EnqueueBatchRequest { items })
            .await
            .expect("enqueue batch");
    }
}

/// Every acknowledged claim handed out a distinct attempt, every
/// acknowledged Complete is what the database holds, every job succeeded
/// once.
async fn check_nothing_lost(db: &GaleraDb, told: &Told, total: usize) {
    let mut seen = HashSet::new();
    for c in &told.claims {
        assert!(seen.insert(*c), "attempt {c:?} was handed out twice");
    }
    let pool = db.direct(3);
    let rows: Vec<(u64, String, u64)> =
        sqlx::query("SELECT id, CAST(state AS CHAR) AS state, attempt FROM jobs WHERE queue = ?")
            .bind(Q)
            .fetch_all(&pool)
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get("id"), r.get("state"), r.get("attempt")))
            .collect();
    assert_eq!(rows.len(), total);
    let by_id: HashMap<u64, (String, u64)> =
        rows.into_iter().map(|(i, s, a)| (i, (s, a))).collect();
    for (job, attempt) in &told.completes {
        assert_eq!(
            by_id[job],
            ("succeeded".to_owned(), *attempt),
            "job {job}: an acknowledged Complete of attempt {attempt} is not what the database holds"
        );
    }
    for (job, (_, attempt)) in &by_id {
        assert!(
            told.claims.iter().any(|c| c == &(*job, *attempt)) || *attempt == 0,
            "job {job}: attempt {attempt} committed but never acknowledged: possible only for an unknown claim"
        );
    }
    let completed: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM job_events WHERE queue = ? AND kind = 'completed'",
    )
    .bind(Q)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(completed as usize, total, "one completion per job");
    pool.close().await;
}

/// Runs `total` jobs through `workers` workers spread over `coords`, and
/// returns (jobs per second, what they were told).
async fn run_load(db: &GaleraDb, coords: &[&Coord], workers: usize, total: usize) -> (f64, Told) {
    enqueue_many(coords[0], total, "load").await;
    let done = Arc::new(AtomicUsize::new(0));
    let told = Arc::new(Mutex::new(Told::default()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let c = coords[w % coords.len()];
        tasks.push(tokio::spawn(worker(
            c.client.clone(),
            format!("w{w}"),
            total,
            done.clone(),
            told.clone(),
        )));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    let told = Arc::try_unwrap(told).ok().unwrap().into_inner().unwrap();
    check_nothing_lost(db, &told, total).await;
    assert_typed(&told);
    (rate, told)
}

fn conflicts(coords: &[&Coord]) -> (u64, u64) {
    coords.iter().fold((0, 0), |(r, p), c| {
        let (cr, cp) = c.coordinator.store().conflicts();
        (r + cr, p + cp)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_through_every_node_keeps_the_fence_and_costs_conflicts() {
    let _cluster = serial().await;
    let total = 800;
    let workers = 16;
    let mut lines = Vec::new();
    // The baseline, one MariaDB server (not a cluster); then one writer
    // node: both coordinators on node 1, with wsrep_sync_wait 1 (the
    // default) and 0 (what the causal reads cost).
    for (what, single, sync_wait) in [
        ("one server, no Galera (2 coordinators)", true, 1),
        ("one writer node (2 coordinators on node 1)", false, 1),
        ("one writer node, wsrep_sync_wait=0", false, 0),
    ] {
        let db = if single {
            GaleraDb::single_server().await
        } else {
            GaleraDb::new().await
        };
        let a = serve(&db, &[1], sync_wait, Duration::from_secs(30)).await;
        let b = serve(&db, &[1], sync_wait, Duration::from_secs(30)).await;
        let (rate, told) = run_load(&db, &[&a, &b], workers, total).await;
        let (retried, reported) = conflicts(&[&a, &b]);
        lines.push(format!(
            "{what}: {rate:.0} jobs/s, conflicts retried {retried}, reported {reported}, \
             worker errors {:?}",
            told.errors
        ));
        drop((a, b));
        db.drop().await;
    }
    // Every node written: the coordinators on nodes 1 and 2, the same
    // queue. First with AUTO_INCREMENT stepping by 1 on both nodes (this
    // cluster's setting, made for one writer: two writers then also pick
    // the same event ids), then interleaved as Galera's
    // wsrep_auto_increment_control would (node 1 odd ids, node 2 even).
    for stride in [false, true] {
        let nodes = node_urls();
        let set = |node: usize, inc: u8, off: u8| {
            let url = nodes[node - 1].clone();
            async move {
                let p = MySqlPool::connect(&url).await.unwrap();
                sqlx::raw_sql(&format!(
                    "SET GLOBAL auto_increment_increment = {inc}; SET GLOBAL auto_increment_offset = {off}"
                ))
                .execute(&p)
                .await
                .unwrap();
                p.close().await;
            }
        };
        if stride {
            set(1, 2, 1).await;
            set(2, 2, 2).await;
        }
        let db = GaleraDb::new().await;
        let a = serve(&db, &[1], 1, Duration::from_secs(30)).await;
        let b = serve(&db, &[2], 1, Duration::from_secs(30)).await;
        let loaded = run_load(&db, &[&a, &b], workers, total).await;
        let (retried, reported) = conflicts(&[&a, &b]);
        drop((a, b));
        if stride {
            set(1, 1, 1).await;
            set(2, 1, 1).await;
        }
        let (rate, told) = loaded;
        let transactions = told.claims.len() + told.completes.len();
        lines.push(format!(
            "two writer nodes (coordinators on nodes 1 and 2{}): {rate:.0} jobs/s, conflicts retried \
             {retried}, reported {reported} ({:.1} per 100 claims and completes), worker errors {:?}",
            if stride { ", ids interleaved" } else { "" },
            100.0 * (retried + reported) as f64 / transactions as f64,
            told.errors
        ));
        assert!(
            retried > 0,
            "two nodes claiming from one queue must meet in certification"
        );
        db.drop().await;
    }
    for l in &lines {
        println!("{total} jobs, {workers} workers: {l}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_leaves_the_primary_component_is_left_for_the_next_one() {
    let _cluster = serial().await;
    let db = GaleraDb::new().await;
    // Only node 3: nowhere to go.
    let alone = serve(&db, &[3], 1, Duration::from_secs(30)).await;
    // Node 3 first, then node 1.
    let listed = serve(&db, &[3, 1], 1, Duration::from_secs(30)).await;
    listed.enqueue("refund-before").await;
    assert_eq!(listed.coordinator.store().current_node(), 0);
    let mut watch = listed
        .health
        .clone()
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let root = MySqlPool::connect(&db.urls[2]).await.unwrap();
    sqlx::query("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'")
        .execute(&root)
        .await
        .unwrap();
    // The coordinator that can only use node 3: UNAVAILABLE, NOT_SERVING.
    alone
        .until_health(ServingStatus::NotServing, Duration::from_secs(20))
        .await;
    let status = alone
        .claim("worker", 1)
        .await
        .expect_err("node 3 refuses queries outside the primary component");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(reason(&status), "DATABASE_UNAVAILABLE");
    // The coordinator with a list: NOT_SERVING, then SERVING on node 1.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(seen.contains(&ServingStatus::NotServing)
        && seen.last() == Some(&ServingStatus::Serving))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = tokio::time::timeout(left, watch.message())
            .await
            .expect("health changed in time")
            .unwrap()
            .unwrap();
        seen.push(ServingStatus::try_from(next.status).unwrap());
    }
    assert_eq!(listed.coordinator.store().current_node(), 1, "on node 1");
    let claimed = listed.claim("worker", 1).await.expect("served by node 1");
    assert_eq!(claimed.len(), 1);
    // Node 3 back in the cluster: the coordinator goes back to it.
    sqlx::query("SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'")
        .execute(&root)
        .await
        .unwrap();
    root.close().await;
    alone
        .until_health(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed.coordinator.store().current_node() != 0 {
        assert!(Instant::now() < deadline, "never moved back to node 3");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    listed
        .complete(claimed[0].job_id, 1)
        .await
        .expect("served by node 3 again");
    println!("health of the coordinator with two nodes while node 3 left: {seen:?}");
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_loses_nothing_acknowledged() {
    let _cluster = serial().await;
    let db = GaleraDb::new().await;
    // Writes through node 2 until it dies, then node 1.
    let c = serve(&db, &[2, 1, 3], 1, Duration::from_secs(2)).await;
    let total = 300;
    enqueue_many(&c, total, "kill").await;
    let done = Arc::new(AtomicUsize::new(0));
    let told = Arc::new(Mutex::new(Told::default()));
    // A group commit stops before its COMMIT ...
    let mut gate = c.pauses.arm(jobfence_store::PausePoint::WriteBeforeCommit);
    let mut tasks = Vec::new();
    for w in 0..8 {
        tasks.push(tokio::spawn(worker(
            c.client.clone(),
            format!("w{w}"),
            total,
            done.clone(),
            told.clone(),
        )));
    }
    gate.reached().await;
    // ... the node dies with that transaction open and everyone busy ...
    let killed_at = Instant::now();
    galera_script(&["kill", "2"]);
    // ... and its COMMIT meets a dead connection.
    gate.release();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.coordinator.store().current_node() != 1 {
        assert!(Instant::now() < deadline, "never moved to node 1");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.until_health(ServingStatus::Serving, Duration::from_secs(30))
        .await;
    let moved = killed_at.elapsed();
    for t in tasks {
        t.await.unwrap();
    }
    let told = Arc::try_unwrap(told).ok().unwrap().into_inner().unwrap();
    check_nothing_lost(&db, &told, total).await;
    assert_typed(&told);
    assert_eq!(c.coordinator.store().current_node(), 1, "moved to node 1");
    let unknown_completes = told.unknown.get("Complete").copied().unwrap_or(0);
    assert!(
        unknown_completes >= 1,
        "the Complete whose COMMIT was in flight is reported unknown"
    );
    // Every unknown a caller saw is counted, and none was hidden.
    let metrics = c.coordinator.metrics().render();
    let counted: usize = metrics
        .lines()
        .filter(|l| l.starts_with("jobfence_commit_outcome_unknown_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as usize)
        .sum();
    let seen: usize = told.unknown.values().sum();
    assert_eq!(
        counted, seen,
        "unknown outcomes counted = unknown outcomes told"
    );
    println!(
        "node 2 killed under load: moved to node 1 and SERVING {} ms after the kill; {total} jobs \
         done, {} claims and {} completes acknowledged, none lost; unknown outcomes told: {:?}; \
         other errors the workers saw (and retried): {:?}",
        moved.as_millis(),
        told.claims.len(),
        told.completes.len(),
        told.unknown,
        told.errors
    );
    galera_script(&["restart", "2"]);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_on_the_cluster_survives_its_writer_node_killed() {
    let _cluster = serial().await;
    let db = GaleraDb::new().await;
    let run = kit::run_short_demo(
        "galera",
        &[
            "--database-url",
            &db.urls.join(","),
            "--galera",
            "--galera-script",
            "scripts/galera",
        ],
    )
    .await;
    let line = run
        .report
        .lines()
        .find(|l| l.contains("Galera node 1 killed (SIGKILL) under load"))
        .unwrap_or_else(|| panic!("node 1 was not killed\n{}", run.context()))
        .trim()
        .to_owned();
    assert!(line.contains("every coordinator on node 2 after"), "{line}");
    println!("{line}");
    // The demo waits for node 1 to rejoin before its report.
    assert!(node_ready(&node_urls()[0]).await, "node 1 is back");
    db.drop().await;
}
