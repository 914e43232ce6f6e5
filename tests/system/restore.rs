//! Backup and restore that keep the fence (docs/design.md rule 17;
//! docs/operating.md "Backup and restore"), through the real binary, a
//! real `mariadb-dump --single-transaction` and the `mariadb` client.
//!
//! Worker A holds attempt 1 of a job when the backup is taken; its lease
//! runs out and B takes over (attempt 2); the database is then restored
//! from the backup, which holds attempt 1. Without the fence the next
//! takeover hands out attempt 2 a second time and B's Complete is
//! accepted for a job B no longer holds: the test shows it on a second
//! copy of the same backup, served as restored. After `jobfence restore
//! fence --yes` both A's and B's writes are refused ATTEMPT_SUPERSEDED,
//! the next takeover gets an attempt above any handed out before
//! (2^32 + 2), the moved jobs carry a `restore_fenced` event, and a job
//! enqueued after the backup (lost by the restore) is not answered by a
//! new job that reused its id.
//!
//! The mechanism removed (the fence's step bound as 0 instead of 2^32 in
//! `crates/store/src/restore.rs`), this test fails: the held job's
//! attempt is still 1 after `restore fence`, below B's 2, and the control
//! copy shows what follows from that.

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    self as proto, ClaimRequest, CompleteRequest, EnqueueRequest, FailDisposition, FailRequest,
    NextAction, TakeoverRequest,
};
use jobfence_testkit::process::ServeLog;
use jobfence_testkit::{connect_admin, reason, secs, TestDb};
use std::process::{Output, Stdio};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

type Client = JobCoordinatorClient<Channel>;

/// One restore epoch (`crates/store/src/restore.rs`).
const EPOCH: u64 = 1 << 32;

/// A `jobfence serve` child over one database (killed when dropped).
struct Served {
    child: tokio::process::Child,
    addr: String,
}

impl Served {
    async fn start(url: &str) -> Served {
        let mut child = jobfence(&["serve", "--insecure", "--database-url", url])
            .args(["--listen", "127.0.0.1:0", "--drain-delay", "0s"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run jobfence serve");
        let addr = ServeLog::follow(&mut child).grpc().await.to_string();
        Served { child, addr }
    }

    async fn client(&self) -> Client {
        Client::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    /// Stops it, as an operator stops every coordinator before a restore.
    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// `jobfence ARGS`, with no database or shards from the environment.
fn jobfence(args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_jobfence"));
    c.args(args)
        .env("JOBFENCE_LOG", "info")
        .env_remove("JOBFENCE_SHARDS")
        .env_remove("JOBFENCE_DATABASE_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

/// `jobfence ARGS` run to its end.
async fn run(args: &[&str]) -> Output {
    jobfence(args).output().await.expect("run jobfence")
}

/// `(user, password, host, port)` of a test database URL.
fn login(url: &str) -> [String; 4] {
    let rest = url.strip_prefix("mysql://").expect("a mysql:// URL");
    let (who, rest) = rest.split_once('@').unwrap();
    let (user, password) = who.split_once(':').unwrap();
    let (host, port) = rest.split('/').next().unwrap().split_once(':').unwrap();
    [user, password, host, port].map(str::to_owned)
}

/// The client tools' flags for `db`.
fn client_flags(db: &TestDb) -> Vec<String> {
    let [user, password, host, port] = login(&db.url);
    vec![
        format!("--user={user}"),
        format!("--password={password}"),
        format!("--host={host}"),
        format!("--port={port}"),
    ]
}

/// A consistent backup of `db`, as docs/operating.md takes one.
async fn dump(db: &TestDb) -> Vec<u8> {
    let out = tokio::process::Command::new("mariadb-dump")
        .args(client_flags(db))
        .args(["--single-transaction", "--no-tablespaces", &db.name])
        .output()
        .await
        .expect("run mariadb-dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `db` dropped, created again and loaded from `backup`.
async fn load(db: &TestDb, backup: &[u8]) {
    let admin = connect_admin().await;
    for sql in [
        format!("DROP DATABASE IF EXISTS `{}`", db.name),
        format!(
            "CREATE DATABASE `{}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            db.name
        ),
    ] {
        sqlx::query(&sql).execute(&admin).await.unwrap();
    }
    admin.close().await;
    let mut child = tokio::process::Command::new("mariadb")
        .args(client_flags(db))
        .arg(&db.name)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mariadb");
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(backup).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `(state, attempt)` of a job as stored.
async fn stored(db: &TestDb, job_id: u64) -> (String, u64) {
    let pool = db.pool();
    let row: (Vec<u8>, u64) =
        sqlx::query_as("SELECT CAST(state AS CHAR), attempt FROM jobs WHERE id = ?")
            .bind(job_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    (String::from_utf8(row.0).unwrap(), row.1)
}

async fn enqueue(c: &mut Client, queue: &str, key: &str) -> u64 {
    let req = EnqueueRequest {
        queue: queue.into(),
        operation_key: key.into(),
        payload: "{}".into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    };
    c.enqueue(req)
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
        .job_id
}

/// One job of `queue`, claimed by `worker` for `lease_secs`.
async fn claim(c: &mut Client, queue: &str, worker: &str, lease_secs: i64) -> proto::Job {
    let req = ClaimRequest {
        queue: queue.into(),
        worker_id: worker.into(),
        max_jobs: 1,
        lease: secs(lease_secs),
        wait: None,
    };
    let mut jobs = c.claim(req).await.unwrap().into_inner().jobs;
    assert_eq!(jobs.len(), 1, "one job of {queue} for {worker}");
    jobs.remove(0).job.unwrap()
}

/// Takes over `job_id` as `worker` once its lease ran out (by the
/// database clock): the lease is short, the wait is for it to end.
async fn take_over(c: &mut Client, job_id: u64, worker: &str) -> proto::Job {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let req = TakeoverRequest {
            job_id,
            worker_id: worker.into(),
            lease: secs(600),
        };
        match c.takeover(req).await {
            Ok(r) => return r.into_inner().claimed.unwrap().job.unwrap(),
            Err(s) if reason(&s) == "LEASE_NOT_EXPIRED" => {
                assert!(std::time::Instant::now() < deadline, "{s:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => panic!("takeover of job {job_id}: {s:?}"),
        }
    }
}

async fn complete(c: &mut Client, job_id: u64, attempt: u64) -> Result<(), tonic::Status> {
    let req = CompleteRequest {
        job_id,
        attempt,
        provider_reference: format!("re_{attempt}"),
        result: "{}".into(),
        next: None,
    };
    c.complete(req).await.map(|_| ())
}

/// The jobs of the story (ids).
struct Jobs {
    /// Running: A's attempt 1 in the backup, B's attempt 2 after it.
    held: u64,
    /// Ready in the backup.
    waiting: u64,
    /// In manual review in the backup.
    parked: u64,
    /// Enqueued after the backup and claimed (attempt 1): lost by the
    /// restore.
    lost: u64,
}

/// Everything up to the restore: the jobs, the backup taken while A
/// holds attempt 1, B's takeover after it, and a job the backup never
/// saw. The coordinator is stopped at the end.
async fn before_the_restore(db: &TestDb) -> (Jobs, Vec<u8>) {
    let served = Served::start(&db.url).await;
    let mut c = served.client().await;
    let waiting = enqueue(&mut c, "waiting", "refund-restore-waiting").await;
    let parked = enqueue(&mut c, "parked", "refund-restore-parked").await;
    let park = claim(&mut c, "parked", "worker-a", 600).await;
    let fail = FailRequest {
        job_id: parked,
        attempt: park.attempt,
        disposition: FailDisposition::ManualReview as i32,
        error: "the provider answered 500".into(),
        retry_delay: None,
        provider_retry_after: None,
        next: None,
    };
    c.fail(fail).await.unwrap();
    let held = enqueue(&mut c, "refunds", "refund-restore-held").await;
    let a = claim(&mut c, "refunds", "worker-a", 1).await;
    assert_eq!((a.job_id, a.attempt), (held, 1));

    let backup = dump(db).await;

    let b = take_over(&mut c, held, "worker-b").await;
    assert_eq!(b.attempt, 2, "B holds attempt 2 after the backup");
    let lost = enqueue(&mut c, "refunds", "refund-restore-lost").await;
    let lost_claim = claim(&mut c, "refunds", "worker-c", 600).await;
    assert_eq!((lost_claim.job_id, lost_claim.attempt), (lost, 1));
    served.stop().await;
    let jobs = Jobs {
        held,
        waiting,
        parked,
        lost,
    };
    (jobs, backup)
}

/// The same backup restored into a second database and served without
/// the fence: a takeover hands out attempt 2 again, and B's Complete with
/// attempt 2 is accepted for a job B no longer holds.
async fn without_the_fence(backup: &[u8], held: u64) {
    let control = TestDb::empty().await;
    load(&control, backup).await;
    let served = Served::start(&control.url).await;
    let mut c = served.client().await;
    let d = take_over(&mut c, held, "worker-d").await;
    assert_eq!(d.attempt, 2, "attempt 2 handed out a second time");
    complete(&mut c, held, 2)
        .await
        .expect("without the fence, B's stale Complete is accepted");
    served.stop().await;
    drop_database(&control).await;
}

async fn drop_database(db: &TestDb) {
    let admin = connect_admin().await;
    let sql = format!("DROP DATABASE IF EXISTS `{}`", db.name);
    sqlx::query(&sql).execute(&admin).await.unwrap();
    admin.close().await;
}

/// The restore, and `restore fence`: without --yes nothing changes;
/// --dry-run counts; --yes moves the three unfinished jobs.
async fn restore_and_fence(db: &TestDb, backup: &[u8], jobs: &Jobs) {
    load(db, backup).await;
    // The danger the fence removes: the restored attempt is below B's.
    assert_eq!(stored(db, jobs.held).await, ("running".into(), 1));
    let check = run(&["migrate", "--check", "--database-url", &db.url]).await;
    assert!(check.status.success(), "{check:?}");

    let url = db.url.as_str();
    let refused = run(&["restore", "fence", "--database-url", url]).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("nothing changed: add --yes"), "{stderr}");
    let dry = run(&["restore", "fence", "--dry-run", "--database-url", url]).await;
    let stdout = String::from_utf8_lossy(&dry.stdout);
    assert!(dry.status.success(), "{stdout}");
    assert!(
        stdout.contains("3 unfinished job(s) (ready 1, running 1, manual_review 1)"),
        "{stdout}"
    );
    assert_eq!(
        stored(db, jobs.held).await.1,
        1,
        "a dry run changes nothing"
    );

    let fenced = run(&["restore", "fence", "--yes", "--database-url", url]).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&fenced.stdout),
        String::from_utf8_lossy(&fenced.stderr),
    );
    assert!(fenced.status.success(), "{stdout}{stderr}");
    println!("restore fence --yes:\n{stdout}{stderr}");
    assert!(
        stdout.contains(
            "done: database 0: moved 3 job(s) to the next restore epoch (ready 1, running 1, manual_review 1) in 1 batch(es)"
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains("database 0: batch 1: 3 job(s) moved so far"),
        "{stderr}"
    );
    assert_eq!(stored(db, jobs.held).await, ("running".into(), EPOCH + 1));
}

/// After the fence: every attempt from before the restore is refused,
/// takeovers and claims start above them, and the lost job's id is not
/// handed out again.
async fn after_the_fence(db: &TestDb, jobs: &Jobs) {
    let served = Served::start(&db.url).await;
    let mut c = served.client().await;
    for (worker, attempt) in [("B", 2), ("A", 1)] {
        let refused = complete(&mut c, jobs.held, attempt).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Code::FailedPrecondition,
            "{worker}: {refused:?}"
        );
        assert_eq!(reason(&refused), "ATTEMPT_SUPERSEDED", "{worker}");
        let current = jobfence_testkit::meta(&refused, "current_attempt");
        assert_eq!(current, (EPOCH + 1).to_string(), "{worker}");
    }
    let next = take_over(&mut c, jobs.held, "worker-d").await;
    assert_eq!(
        next.attempt,
        EPOCH + 2,
        "above every attempt handed out before"
    );
    assert_eq!(next.next_action, NextAction::Reconcile as i32);
    complete(&mut c, jobs.held, EPOCH + 2).await.unwrap();

    let ready = claim(&mut c, "waiting", "worker-e", 600).await;
    assert_eq!((ready.job_id, ready.attempt), (jobs.waiting, EPOCH + 1));
    assert_eq!(
        ready.next_action,
        NextAction::Reconcile as i32,
        "it may have been sent"
    );
    assert_eq!(
        stored(db, jobs.parked).await,
        ("manual_review".into(), EPOCH + 1)
    );

    // The lost job's id names no job, before and after a new one.
    let new = enqueue(&mut c, "refunds", "refund-restore-new").await;
    assert!(
        new > EPOCH,
        "job ids moved 2^32 past the restored ones: {new}"
    );
    let refused = complete(&mut c, jobs.lost, 1).await.unwrap_err();
    assert_eq!(reason(&refused), "JOB_NOT_FOUND", "{refused:?}");

    let pool = db.pool();
    let events: Vec<(u64, u64, u64)> = sqlx::query_as(
        "SELECT job_id, attempt, current_attempt FROM job_events \
         WHERE kind = 'restore_fenced' ORDER BY job_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut want = vec![
        (jobs.held, 1, EPOCH + 1),
        (jobs.waiting, 0, EPOCH),
        (jobs.parked, 1, EPOCH + 1),
    ];
    want.sort();
    assert_eq!(events, want);
    // After every event of the lost database (a feed consumer's cursor
    // may be past the backup's last one).
    let lowest: Option<u64> =
        sqlx::query_scalar("SELECT MIN(id) FROM job_events WHERE kind = 'restore_fenced'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        lowest.unwrap() > EPOCH,
        "the fence's events come after the moved ids: {lowest:?}"
    );
    pool.close().await;
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_refuses_every_attempt_before_the_restore() {
    let db = TestDb::new().await;
    let (jobs, backup) = before_the_restore(&db).await;
    without_the_fence(&backup, jobs.held).await;
    restore_and_fence(&db, &backup, &jobs).await;
    after_the_fence(&db, &jobs).await;
    drop_database(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_refuses_while_a_coordinator_serves() {
    let db = TestDb::new().await;
    let served = Served::start(&db.url).await;
    let mut c = served.client().await;
    let job = enqueue(&mut c, "refunds", "refund-restore-served").await;
    let ran = run(&["restore", "fence", "--yes", "--database-url", &db.url]).await;
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert!(!ran.status.success(), "{stderr}");
    assert!(
        stderr.contains("refusing to fence: coordinator(s) "),
        "{stderr}"
    );
    assert!(stderr.contains("or run with --force"), "{stderr}");
    assert_eq!(stored(&db, job).await, ("ready".into(), 0), "nothing moved");
    served.stop().await;
    drop_database(&db).await;
}
