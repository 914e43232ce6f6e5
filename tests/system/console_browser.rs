//! The operator console in a real browser: Debian's chromium, driven
//! through chromedriver by selenium (tests/console/browser.py), against a
//! coordinator served in-process with its console, after traffic shaped
//! like the demo's: refunds completed and failed, a worker frozen past its
//! lease and taken over, the zombie's refused write and its late success
//! kept as an observation, a resend allowed and then refused, parked jobs,
//! and a payload and an observation body holding `<script>`.
//!
//! The script loads every page, follows a job from the list to its
//! timeline, checks bad input gets a message, resolves a parked job,
//! posts a form with a forged token, and races two browser sessions on one
//! parked job: both load it, then the first posts and the second posts, in
//! that order; and on the Providers page, pauses a provider for sends
//! only during an "incident". Here the database is checked after it: one
//! resolution by the first, one recorded refusal of the second, nothing
//! from the forged post, the provider paused under the typed name. It saves a screenshot of each page into target/console-screenshots/
//! (`JOBFENCE_SCREENSHOTS=docs/console` refreshes the documentation's).
//!
//! Chromium and chromedriver: `$JOBFENCE_CHROMIUM` / `$JOBFENCE_CHROMEDRIVER`
//! (scripts/test sets them with scripts/browser, which installs both),
//! else `chromium` / `chromedriver` on the PATH. The interpreter is
//! `$JOBFENCE_PYTHON` (with selenium), else `python3`. Never skipped.

use jobfence_testkit as kit;

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    self as proto, ClaimRequest, CompleteRequest, EnqueueRequest, FailDisposition, FailRequest,
    ObservationOutcome, ObservationSource, RecordObservationRequest, TakeoverRequest,
};
use jobfence_core::Coordinator;
use jobfence_domain::budget::{Budget, Pause};
use jobfence_domain::providers::{ChangeBy, PutProvider};
use jobfence_domain::{JobState, QueuePolicy};
use jobfence_server::{self as server, OpsOptions, ServeOptions};
use jobfence_store::JobStore;
use kit::{secs, TestDb};
use sqlx::mysql::MySqlPool;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tonic::transport::Channel;

const Q: &str = "refunds";
const Q2: &str = "payouts";
/// The payload of the job whose `<script>` must be shown as text.
const SCRIPT_PAYLOAD: &str =
    r#"{"payment":"pay_evil","amount":100,"note":"<script>window.__xss = 1</script>"}"#;
/// Longest the browser script may run.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn tool(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A worker's view of the coordinator: the generated client, nothing more.
struct Worker {
    client: JobCoordinatorClient<Channel>,
    id: &'static str,
}

impl Worker {
    async fn enqueue(&mut self, queue: &str, key: &str, payload: &str) -> u64 {
        self.client
            .enqueue(EnqueueRequest {
                queue: queue.into(),
                operation_key: key.into(),
                payload: payload.into(),
                delay: None,
                fairness_key: String::new(),
                priority: 0,
            })
            .await
            .expect("enqueue")
            .into_inner()
            .job
            .unwrap()
            .job_id
    }

    /// Claims up to `n` jobs with a lease of `lease_secs`: `(id, attempt)`.
    async fn claim(&mut self, queue: &str, n: u32, lease_secs: i64) -> Vec<(u64, u64)> {
        self.client
            .claim(ClaimRequest {
                queue: queue.into(),
                worker_id: self.id.into(),
                max_jobs: n,
                lease: secs(lease_secs),
                wait: None,
            })
            .await
            .expect("claim")
            .into_inner()
            .jobs
            .into_iter()
            .map(|c| {
                let j = c.job.unwrap();
                (j.job_id, j.attempt)
            })
            .collect()
    }

    async fn claim_one(&mut self, queue: &str) -> (u64, u64) {
        let got = self.claim(queue, 1, 60).await;
        assert_eq!(got.len(), 1, "one claimable job in {queue}");
        got[0]
    }

    async fn complete(&mut self, (job_id, attempt): (u64, u64), reference: &str) {
        self.client
            .complete(CompleteRequest {
                job_id,
                attempt,
                provider_reference: reference.into(),
                result: format!(r#"{{"refund":"{reference}","status":"succeeded"}}"#),
                next: None,
            })
            .await
            .expect("complete");
    }

    async fn fail(
        &mut self,
        (job_id, attempt): (u64, u64),
        disposition: FailDisposition,
        error: &str,
    ) -> Result<proto::FailResponse, tonic::Status> {
        self.client
            .fail(FailRequest {
                job_id,
                attempt,
                disposition: disposition as i32,
                error: error.into(),
                retry_delay: secs(0),
                provider_retry_after: None,
                next: None,
            })
            .await
            .map(|r| r.into_inner())
    }

    async fn observe(
        &mut self,
        (job_id, attempt): (u64, u64),
        source: ObservationSource,
        outcome: ObservationOutcome,
        reference: &str,
        body: &str,
    ) {
        self.client
            .record_observation(RecordObservationRequest {
                job_id,
                attempt,
                source: source as i32,
                outcome: outcome as i32,
                provider_reference: reference.into(),
                body: body.into(),
                dedup_key: format!("{}-{job_id}-{attempt}-{reference}", self.id),
            })
            .await
            .expect("record observation");
    }
}

/// The lease of a running job runs out now (test data edited; the DB
/// clock is not touched), so the takeover below happens without a sleep.
async fn expire_lease(pool: &MySqlPool, job_id: u64) {
    let done = sqlx::query(
        "UPDATE jobs SET lease_until = DATE_SUB(UTC_TIMESTAMP(6), INTERVAL 1 SECOND) \
         WHERE id = ? AND state = 'running'",
    )
    .bind(job_id)
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(done.rows_affected(), 1);
}

/// The jobs the browser script looks at.
struct Story {
    zombie: u64,
    zombie_key: String,
    resolve: u64,
    race: u64,
    script: u64,
}

/// Demo-like traffic: every kind of event the console tells.
async fn traffic(addr: std::net::SocketAddr, pool: &MySqlPool) -> Story {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = JobCoordinatorClient::new(channel);
    let mut rust1 = Worker {
        client: client.clone(),
        id: "rust-1",
    };
    let mut rust2 = Worker {
        client: client.clone(),
        id: "rust-2",
    };
    let mut py = Worker {
        client,
        id: "python-1",
    };
    let payload = |n: u32, amount: u32| {
        format!(r#"{{"payment":"pay_{n}","amount":{amount},"currency":"TWD"}}"#)
    };

    // The seed's story: rust-1 freezes holding the job, its lease runs out,
    // rust-2 takes over and reconciles; rust-1 wakes, its write is refused,
    // and its late success is kept as evidence.
    let zombie_key = "refund-pay_1001-500-TWD".to_owned();
    let zombie = rust1.enqueue(Q, &zombie_key, &payload(1001, 500)).await;
    let first = rust1.claim_one(Q).await;
    assert_eq!(first, (zombie, 1));
    expire_lease(pool, zombie).await;
    let taken = rust2
        .client
        .takeover(TakeoverRequest {
            job_id: zombie,
            worker_id: "rust-2".into(),
            lease: secs(60),
        })
        .await
        .expect("takeover")
        .into_inner()
        .claimed
        .and_then(|c| c.job)
        .unwrap();
    assert_eq!(taken.attempt, 2);
    let refused = rust1
        .fail(first, FailDisposition::RetryReconcile, "provider timeout")
        .await
        .expect_err("the zombie's write is refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    rust1
        .observe(
            first,
            ObservationSource::Worker,
            ObservationOutcome::Succeeded,
            "re_1001",
            r#"{"id":"re_1001","status":"succeeded"}"#,
        )
        .await;
    rust2.complete((zombie, 2), "re_1001").await;

    // A resend allowed inside the window, then refused: dispatches used up.
    let resend = rust1
        .enqueue(Q, "refund-pay_1002-1200-TWD", &payload(1002, 1200))
        .await;
    let a1 = rust1.claim_one(Q).await;
    let out = rust1
        .fail(a1, FailDisposition::RetryExecute, "connection reset")
        .await
        .unwrap();
    assert!(out.override_reason.is_empty());
    let a2 = rust2.claim_one(Q).await;
    assert_eq!(a2, (resend, 2));
    let out = rust2
        .fail(a2, FailDisposition::RetryExecute, "connection reset again")
        .await
        .unwrap();
    assert_eq!(out.override_reason, "MAX_DISPATCHES_REACHED");

    // Parked by workers that could not tell, with evidence.
    let mut parked = vec![];
    for (n, amount) in [(1003, 300), (1004, 780)] {
        let id = py
            .enqueue(
                Q,
                &format!("refund-pay_{n}-{amount}-TWD"),
                &payload(n, amount),
            )
            .await;
        let held = py.claim_one(Q).await;
        py.observe(
            held,
            ObservationSource::Webhook,
            ObservationOutcome::Pending,
            &format!("re_{n}"),
            &format!(r#"{{"type":"refund.updated","refund":"re_{n}","status":"pending"}}"#),
        )
        .await;
        py.fail(
            held,
            FailDisposition::ManualReview,
            "refund pending for 3 days",
        )
        .await
        .unwrap();
        parked.push(id);
    }

    // A payload and an observation body holding markup.
    let script = py
        .enqueue(Q, "refund-pay_evil-100-TWD", SCRIPT_PAYLOAD)
        .await;
    let held = py.claim_one(Q).await;
    py.observe(
        held,
        ObservationSource::Worker,
        ObservationOutcome::Unknown,
        "re_evil",
        "<script>window.__xss = 2</script><b>provider answered HTML</b>",
    )
    .await;
    py.fail(
        held,
        FailDisposition::ManualReview,
        "<img src=x onerror=alert(1)>",
    )
    .await
    .unwrap();

    // The bulk: most refunds done, one failed for good, some in flight,
    // some waiting; and a second queue.
    for n in 0..24 {
        rust1
            .enqueue(
                Q,
                &format!("refund-pay_{n}-{}-TWD", 100 + n * 10),
                &payload(n, 100 + n * 10),
            )
            .await;
    }
    let batch = rust1.claim(Q, 16, 60).await;
    for (i, held) in batch.iter().enumerate() {
        match i {
            0 => {
                rust1
                    .fail(*held, FailDisposition::Failed, "card account closed")
                    .await
                    .unwrap();
            }
            1 | 2 => {} // still running
            _ => rust1.complete(*held, &format!("re_{}", held.0)).await,
        }
    }
    // Matches the zombie's key if '_' were a LIKE wildcard in the filter.
    rust1
        .enqueue(Q, "refund-payX1001-500-TWD", &payload(1001, 500))
        .await;
    for n in 0..6 {
        py.enqueue(Q2, &format!("payout-acct_{n}"), &payload(n, 5000))
            .await;
    }
    for held in py.claim(Q2, 4, 60).await {
        py.complete(held, &format!("po_{}", held.0)).await;
    }
    Story {
        zombie,
        zombie_key,
        resolve: parked[0],
        race: parked[1],
        script,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser() {
    let chromium = tool("JOBFENCE_CHROMIUM", "chromium");
    let chromedriver = tool("JOBFENCE_CHROMEDRIVER", "chromedriver");
    let python = tool("JOBFENCE_PYTHON", "python3");
    let has_selenium = Command::new(&python)
        .args(["-c", "import selenium"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_selenium,
        "the Python interpreter {python:?} cannot import selenium: install \
         tests/requirements.txt into it (scripts/python-env does, into .local/venv)"
    );
    for bin in [&chromium, &chromedriver] {
        assert!(
            Command::new(bin).arg("--version").output().is_ok(),
            "{bin} not found: run scripts/browser (scripts/test does), which installs \
             Debian's chromium and chromium-driver"
        );
    }

    let db = TestDb::new().await;
    let pool = db.pool();
    let mut config = kit::test_config();
    config.policies.by_queue.insert(
        Q.into(),
        QueuePolicy {
            resend_window: Duration::from_secs(24 * 3600),
            max_dispatches: 2,
        },
    );
    let coordinator = Coordinator::new(JobStore::new(db.pool()), config);
    let operator = coordinator.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let console_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let console = console_listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server::serve_with(
        coordinator,
        listener,
        ServeOptions {
            health_interval: Duration::from_millis(200),
            health_timeout: Duration::from_millis(200),
            drain_delay: Duration::ZERO,
            shutdown_timeout: Duration::from_secs(5),
        },
        OpsOptions {
            companions: vec![jobfence_console::companion(
                console_listener,
                jobfence_console::operator::Identity::Typed,
            )
            .unwrap()],
            ..OpsOptions::default()
        },
        async {
            let _ = stopped.await;
        },
    ));
    let story = traffic(addr, &pool).await;
    // Providers, stored once the traffic is done (it is not budgeted).
    for (name, rate, burst, queues) in [
        ("stripe", 80.0, 10, vec![Q.to_owned(), Q2.to_owned()]),
        ("acquirer", 5.0, 5, vec!["chargebacks".to_owned()]),
    ] {
        operator
            .put_provider(PutProvider {
                name: name.into(),
                budget: Budget {
                    rate_per_second: rate,
                    burst,
                    max_in_flight: Some(50),
                    execute_cost: 1,
                    reconcile_cost: 2,
                    per_key: Default::default(),
                },
                queues,
                by: ChangeBy {
                    operator: "dana".into(),
                    reason: format!("{name}'s published limit, with headroom"),
                },
            })
            .await
            .unwrap();
    }

    crate::console_workers::scene(addr, &pool, &operator).await;
    let twice = crate::console_settlement::scene(&pool, &operator).await;

    // Screenshots go to target/console-screenshots, so that a test run
    // leaves the checkout as it was; JOBFENCE_SCREENSHOTS=docs/console
    // refreshes the documentation's.
    let shots = match std::env::var_os("JOBFENCE_SCREENSHOTS") {
        Some(dir) => repo().join(dir),
        None => repo().join("target/console-screenshots"),
    };
    std::fs::create_dir_all(&shots).unwrap();
    let args = serde_json::json!({
        "url": format!("http://{console}"),
        "zombie": story.zombie,
        "zombie_key": story.zombie_key,
        "resolve": story.resolve,
        "race": story.race,
        "script": story.script,
        "script_payload": SCRIPT_PAYLOAD,
        "chromium": chromium,
        "chromedriver": chromedriver,
        "shots": shots,
        "refunded_twice": twice,
    });
    let script = repo().join("tests/console/browser.py");
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&python)
            .arg(script)
            .arg(args.to_string())
            .env("PYTHONUNBUFFERED", "1")
            // Selenium must not look for (or download) a driver of its own.
            .env("SE_OFFLINE", "true")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the browser script");
        let deadline = std::time::Instant::now() + SCRIPT_TIMEOUT;
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the browser script failed ({}):\n{stdout}\n{stderr}",
        out.status
    );

    // What the pages claimed, in the database.
    let store = JobStore::new(pool.clone());
    let state = |id| {
        let store = store.clone();
        async move { store.get_job(id).await.unwrap().0 }
    };
    let events = |id| {
        let store = store.clone();
        async move { store.job_events(id).await.unwrap() }
    };
    let race = state(story.race).await;
    assert_eq!(race.state, JobState::Succeeded, "alice (first) resolved it");
    assert_eq!(race.provider_reference.as_deref(), Some("re_race"));
    let race_events = events(story.race).await;
    let resolved: Vec<_> = race_events
        .iter()
        .filter(|e| e.kind == "manual_review_resolved")
        .collect();
    let refused: Vec<_> = race_events
        .iter()
        .filter(|e| e.kind == "resolve_rejected")
        .collect();
    assert_eq!(resolved.len(), 1, "one resolution: {race_events:?}");
    assert!(resolved[0].detail.as_deref().unwrap().contains("alice"));
    assert_eq!(
        refused.len(),
        1,
        "bob's refusal only (the forged post wrote nothing)"
    );
    assert!(refused[0].detail.as_deref().unwrap().contains("bob"));
    let resolved_alone = state(story.resolve).await;
    assert_eq!(resolved_alone.state, JobState::Failed);
    assert!(resolved_alone
        .state_reason
        .unwrap()
        .starts_with("resolved by carol"));
    assert_eq!(
        state(story.script).await.state,
        JobState::ManualReview,
        "the script job is only looked at"
    );
    // The bulk cancel from the console: the one job, fenced, under erin.
    let (cancelled, why): (String, String) = sqlx::query_as(
        "SELECT CAST(state AS CHAR), CAST(state_reason AS CHAR) FROM jobs \
         WHERE operation_key = 'refund-payX1001-500-TWD'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(cancelled, "cancelled");
    assert!(why.contains("by erin:") && why.contains("INC-42"), "{why}");
    // The double refund acknowledged from its row, under frank.
    let acted: (String, String) = sqlx::query_as(
        "SELECT CAST(a.action AS CHAR), CAST(a.operator AS CHAR) FROM settlement_exceptions e \
         JOIN settlement_exception_actions a ON a.exception_id = e.id \
         WHERE e.kind = 'DOUBLE_REFUND' ORDER BY a.id DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(acted, ("acknowledged".to_owned(), "frank".to_owned()));
    let providers = operator.list_providers().await.unwrap();
    let pause = |name: &str| {
        let p = providers.iter().find(|p| p.name == name).unwrap();
        (p.pause, p.pause_reason.clone())
    };
    assert_eq!(
        pause("stripe"),
        (
            Pause::Sends,
            Some("INC-42: refunds API answers 5xx".to_owned())
        )
    );
    assert_eq!(pause("acquirer"), (Pause::None, None));
    let last = &operator.list_policy_changes(None, None, 1).await.unwrap()[0];
    assert_eq!(
        (
            last.operator.as_str(),
            last.action.as_str(),
            last.subject.as_str()
        ),
        ("carol", "pause_provider", "provider:stripe")
    );

    let _ = stop.send(());
    served.await.unwrap().unwrap();
    pool.close().await;
    if let Ok(admin) = MySqlPool::connect(&kit::base_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE `{}`", db.name))
            .execute(&admin)
            .await;
    }
}
