//! The main job end to end, with real worker processes: the seed's zombie
//! story step by step, a shortened `jobfence demo` with every fault kind
//! enabled, checked against the fake provider's ledger, and the same short
//! flood with and without the provider budget (docs/design.md rule 11).

use jobfence_testkit as kit;

use jobfence_domain::JobState;
use jobfence_fake_provider::{self as provider, ProviderConfig};
use kit::{base_url, Harness};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_jobfence");

fn worker(h: &Harness, provider_url: &str, id: &str, freeze_after_send: Option<&str>) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "refund-worker",
        "--coordinator",
        &format!("http://{}", h.addr),
        "--provider",
        provider_url,
        "--worker-id",
        id,
        "--queue",
        "refunds",
        "--concurrency",
        "1",
        "--lease",
        "30s",
        // No provider fault here: a lookup slowed by a loaded machine must
        // not be taken for an unknown outcome (retried, one attempt more).
        "--provider-timeout",
        "30s",
    ])
    .env("JOBFENCE_LOG", "warn")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
    if let Some(key) = freeze_after_send {
        cmd.env("JOBFENCE_TEST_FREEZE_AFTER_SEND", key);
    }
    cmd.spawn().expect("start a refund worker")
}

/// The process state letter from /proc (`T` = stopped).
fn proc_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or('?')
}

async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, sig).unwrap();
}

#[tokio::test]
async fn a_worker_frozen_after_sending_its_refund_is_fenced_out_and_its_result_kept() {
    let h = Harness::start().await;
    let provider = provider::spawn(ProviderConfig::default()).await.unwrap();
    let key = "refund-pay_1-500-TWD";
    let job = h
        .enqueue(
            "refunds",
            key,
            r#"{"payment_id":"pay_1","amount":500,"currency":"TWD"}"#,
        )
        .await;

    // A claims, sends the refund, and freezes before writing back.
    let a = worker(&h, &provider.base_url(), "worker-a", Some(key));
    let a_pid = a.id().unwrap();
    until("worker A is frozen", || async { proc_state(a_pid) == 'T' }).await;
    let ledger = provider.client().ledger().await.unwrap();
    assert_eq!(
        ledger.by_merchant_reference(key).refunds,
        1,
        "A's refund was made"
    );
    let held = h.row(job.job_id).await;
    assert_eq!((held.state, held.attempt), (JobState::Running, 1));

    // Its lease runs out (forced on test data); B takes over, reconciles
    // with the same operation_key, finds the refund and completes.
    h.force_lease_expired(job.job_id).await;
    let mut b = worker(&h, &provider.base_url(), "worker-b", None);
    until("B completed the job", || async {
        h.row(job.job_id).await.state == JobState::Succeeded
    })
    .await;
    let done = h.row(job.job_id).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(done.lease_owner.as_deref(), Some("worker-b"));
    let refunds = provider
        .client()
        .find_by_merchant_reference(key, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(refunds.len(), 1);
    assert_eq!(
        done.provider_reference.as_deref(),
        Some(refunds[0].id.as_str())
    );

    // A wakes up: its Complete with attempt 1 is refused, and the refund it
    // saw lands as an observation.
    signal(&a, nix::sys::signal::Signal::SIGCONT);
    until("A's late result is recorded", || async {
        h.client
            .clone()
            .get_job(jobfence_api::v1::GetJobRequest { job_id: job.job_id })
            .await
            .unwrap()
            .into_inner()
            .observations
            .iter()
            .any(|o| o.attempt == 1)
    })
    .await;
    let obs = h
        .client
        .clone()
        .get_job(jobfence_api::v1::GetJobRequest { job_id: job.job_id })
        .await
        .unwrap()
        .into_inner()
        .observations;
    assert_eq!(obs.len(), 1);
    assert_eq!(obs[0].provider_reference, refunds[0].id);
    assert_eq!(
        obs[0].outcome,
        jobfence_api::v1::ObservationOutcome::Succeeded as i32
    );
    assert_eq!(h.count_events(job.job_id, "stale_write_rejected").await, 1);
    assert_eq!(h.row(job.job_id).await, done, "the job is untouched");
    let ledger = provider.client().ledger().await.unwrap();
    assert_eq!(
        ledger.by_merchant_reference(key).refunds,
        1,
        "one refund, ever"
    );

    let mut a = a;
    for w in [&mut a, &mut b] {
        signal(w, nix::sys::signal::Signal::SIGTERM);
        let status = tokio::time::timeout(Duration::from_secs(20), w.wait())
            .await
            .expect("worker stops on SIGTERM")
            .unwrap();
        assert!(status.success(), "{status:?}");
    }
    h.finish().await;
}

#[tokio::test]
async fn the_demo_with_every_fault_kind_refunds_nothing_twice() {
    let python = std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| "python3".into());
    // sdk/node's packages come from scripts/node-env (npm ci).
    let node = std::env::var("JOBFENCE_NODE").unwrap_or_else(|_| "node".into());
    // The Go worker is built by the demo with sdk/go/tools/go (scripts/go-env).
    let go = std::env::var("JOBFENCE_GO").unwrap_or_else(|_| "go".into());
    let db = format!("jf_test_{}_demo", std::process::id());
    let (server, _) = base_url()
        .rsplit_once('/')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap();
    let work = std::env::temp_dir().join(format!("jobfence-demo-{}", std::process::id()));
    let out = Command::new(BIN)
        .args([
            "demo",
            "--database-url",
            &format!("{server}/{db}"),
            "--jobs",
            "300",
            "--workers",
            "3",
            "--python-workers",
            "1",
            "--node-workers",
            "1",
            "--go-workers",
            "1",
            "--fault-cut-response",
            "0.05",
            "--fault-lag",
            "0.3",
            "--fault-error-5xx",
            "0.05",
            "--fault-latency",
            "0.02",
            "--fault-hang",
            "0.01",
            "--pending-ratio",
            "0.2",
            "--max-duration",
            "150s",
            // Refunds arrive for 45 s (30 by default): the last fault of
            // the schedule (the database cut, at about 30-35 s after the
            // restarts and the storm) must land while jobs are open, also
            // on a machine that makes every restart slower.
            "--arrival",
            "45s",
            "--seed",
            "7",
            "--work-dir",
            work.to_str().unwrap(),
        ])
        .env("JOBFENCE_PYTHON", &python)
        .env("JOBFENCE_NODE", &node)
        .env("JOBFENCE_GO", &go)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run jobfence demo");
    let report = String::from_utf8_lossy(&out.stdout);
    let progress = String::from_utf8_lossy(&out.stderr);
    let context = format!("report:\n{report}\nprogress:\n{progress}");
    assert!(out.status.success(), "demo failed\n{context}");
    assert_eq!(
        report.trim_end().lines().last(),
        Some("invariant: OK"),
        "{context}"
    );
    // With TLS and authentication on (the default): every worker, the
    // producer and HAProxy went through them and still ended `invariant: OK`.
    assert!(
        progress.contains("TLS and authentication on"),
        "the demo ran without TLS and authentication\n{context}"
    );
    // The failures really happened, the coordinators' too: two behind
    // HAProxy (the default), restarted in turn, all killed for longer than
    // the lease, one killed, the database cut off.
    for what in [
        "frozen (SIGSTOP)",
        "killed mid-request",
        "rolling restart of 2 coordinators",
        "takeover storm: every coordinator killed (SIGKILL)",
        "coordinator-2 killed (SIGKILL), restarted; HAProxy took it out after",
        "database unreachable for 8 s",
    ] {
        assert!(report.contains(what), "{what} missing\n{context}");
    }
    // The clients' retry budget (30 s) outlasts the 8 s database outage:
    // no worker call failed for it, in any language.
    let outage = report
        .lines()
        .find(|l| l.contains("database unreachable for 8 s"))
        .unwrap_or_else(|| panic!("no database outage\n{context}"));
    let (_, failed) = outage
        .split_once("worker calls failed after retries: ")
        .unwrap_or_else(|| panic!("no failed calls: {outage}"));
    assert_eq!(
        kit::numbers(failed).first(),
        Some(&0),
        "{outage}\n{context}"
    );
    // A coordinator stopped with SIGTERM drains behind HAProxy: a rolling
    // restart costs the workers no call.
    // Read as numbers: each stop took at least the drain delay (1 s, so it
    // drained rather than died) and ended before the stop timeout (15 s,
    // past which it is killed); how long exactly is the machine's business.
    let rolling = report
        .lines()
        .find(|l| l.contains("rolling restart of 2 coordinators"))
        .unwrap_or_else(|| panic!("no rolling restart\n{context}"));
    let (_, stops) = rolling
        .split_once("stopped in ")
        .unwrap_or_else(|| panic!("no stop times: {rolling}"));
    let (stops, failed) = stops
        .split_once(" s); worker calls failed after retries: ")
        .unwrap_or_else(|| panic!("no failed calls: {rolling}"));
    let stops: Vec<f64> = stops
        .split(" / ")
        .map(|t| t.parse().unwrap_or_else(|_| panic!("{t:?} in {rolling}")))
        .collect();
    println!("main job: the rolling restart stopped the coordinators in {stops:?} s");
    assert_eq!(stops.len(), 2, "{rolling}");
    assert!(
        stops.iter().all(|&t| (1.0..15.0).contains(&t)),
        "{rolling}\n{context}"
    );
    assert_eq!(
        kit::numbers(failed).first(),
        Some(&0),
        "{rolling}\n{context}"
    );
    let line = |name: &str| {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} line\n{context}"))
            .to_owned()
    };
    assert!(
        !line("stale writes rejected").ends_with("none"),
        "{context}"
    );
    // Rust, Python, Node and Go workers shared the queue.
    for worker in ["rust-", "python-1", "node-1", "go-1"] {
        assert!(line("completed by").contains(worker), "{worker}\n{context}");
    }
    // The coordinators saw every worker, each naming its client in its
    // user-agent (docs/operating.md "Workers").
    let seen = line("workers seen");
    for client in [
        "python-1 (jobfence-python/",
        "node-1 (jobfence-node/",
        "go-1 (jobfence-go/",
        "rust-3 (jobfence-rust/",
    ] {
        assert!(seen.contains(client), "{client}\n{context}");
    }
    assert!(seen.contains("coordinator-"), "{context}");
    // The product's own settlement of the provider's report found every
    // refund matched: no exception (docs/design.md rule 15).
    assert!(line("settlement  ").contains("report lines"), "{context}");
    assert!(line("settlement  ").contains(" 0 refused"), "{context}");
    assert!(line("settlement exceptions").ends_with("none"), "{context}");
    // scripts/mariadb runs the database durably (docs/design.md rule 9).
    assert!(
        line("database durable").contains("yes (innodb_flush_log_at_trx_commit=1"),
        "{context}"
    );
    assert!(line("by final state").contains("succeeded"), "{context}");
    // The budget was on (the default), and the provider refused nothing,
    // the storm's flood included.
    let number = |name: &str| {
        kit::numbers(
            &kit::report_line(&report, name).unwrap_or_else(|| panic!("no {name} line\n{context}")),
        )
    };
    assert_eq!(number("provider 429s")[0], 0, "{context}");
    // Pruning ran during the demo (a 20 s retention), and the producer's
    // Enqueues of pruned keys each answered the pruned job, created=false
    // (a wrong answer would be a violation above).
    let pruned = number("pruned");
    println!("main job: {pruned:?} (pruned jobs, re-enqueues of pruned keys, answered)");
    assert!(pruned[0] > 0, "nothing was pruned\n{context}");
    assert!(pruned[1] > 0, "no pruned key was enqueued again\n{context}");
    assert_eq!(pruned[1], pruned[2], "{context}");
    // The coordinators archived what they pruned (--prune-archive-dir):
    // every pruned job is in the archive (a missing one is a violation).
    let archived = number("archived");
    assert!(archived[0] >= pruned[0], "{archived:?}\n{context}");
    assert!(
        line("archived").contains("every pruned job is in the archive"),
        "{context}"
    );
    assert!(number("provider 429s")[1] > 0, "{context}");
    assert!(line("provider budget").contains("160 units/s"), "{context}");
    // Halfway through, one merchant's bulk refund went in at once (as many
    // refunds as --jobs): every refund of it and of the other merchants
    // was handed out, and the report sets their waits side by side (how
    // long they are is the machine's business, and the benchmark's).
    assert_eq!(number("bulk refund")[0], 300, "{context}");
    let waits = line("first hand-out p99");
    assert!(
        waits.contains(" 300 of its own, median "),
        "{waits}\n{context}"
    );
    assert!(
        waits.contains(" (300 refunds, median "),
        "{waits}\n{context}"
    );
    let storm = number("takeover storm");
    assert!(storm[0] > 0, "no lease expired in the storm\n{context}");
    assert!(
        storm[1] > 0,
        "nothing taken over after the storm\n{context}"
    );
    if let Ok(admin) = sqlx::mysql::MySqlPool::connect(&base_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
            .execute(&admin)
            .await;
    }
    let _ = std::fs::remove_dir_all(work);
}

/// The same short demo (Rust workers only, 400 refunds over 20 s, a
/// provider limit of 60 requests/s) once without and once with the budget.
/// Without it the flood after the takeover storm goes past the provider's
/// limit, the provider answers 429, and still nothing is refunded twice;
/// with it the provider refuses nothing.
#[tokio::test]
async fn the_provider_budget_keeps_the_same_flood_under_the_providers_limit() {
    let (server, _) = base_url()
        .rsplit_once('/')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap();
    let mut runs = Vec::new();
    for (name, extra) in [("no-budget", Some("--no-budget")), ("budget", None)] {
        let db = format!("jf_test_{}_{}", std::process::id(), name.replace('-', "_"));
        let url = format!("{server}/{db}");
        let mut args = vec![
            "--database-url",
            &url,
            "--jobs",
            "400",
            "--arrival",
            "20s",
            "--workers",
            "3",
            "--concurrency",
            "8",
            "--provider-rate-limit",
            "60",
        ];
        args.extend(extra);
        runs.push(kit::run_short_demo(name, &args).await);
        if let Ok(admin) = sqlx::mysql::MySqlPool::connect(&base_url()).await {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
                .execute(&admin)
                .await;
        }
    }
    let (without, with) = (&runs[0], &runs[1]);
    for run in &runs {
        assert!(
            run.report
                .contains("takeover storm: every coordinator killed (SIGKILL)"),
            "{}",
            run.context()
        );
        assert_eq!(run.numbers("provider limit")[0], 60, "{}", run.context());
    }
    assert_eq!(without.line("provider budget"), "off (--no-budget)");
    let refused = without.numbers("provider 429s")[0];
    assert!(
        refused > 0,
        "without a budget the flood met no 429\n{}",
        without.context()
    );
    assert!(
        with.line("provider budget").starts_with("48 units/s"),
        "{}",
        with.context()
    );
    assert_eq!(
        with.numbers("provider 429s")[0],
        0,
        "the budget let the provider refuse requests\n{}",
        with.context()
    );
    println!(
        "provider 429s: {refused} without the budget, 0 with it; peak {} and {} requests/s",
        without.numbers("provider limit")[2],
        with.numbers("provider limit")[2]
    );
}

/// The demo's settlement with a double refund and a refund made by hand
/// injected at the provider: the product's own settlement reports exactly
/// those two exceptions, and the demo fails (docs/design.md rule 15).
#[tokio::test]
async fn the_demos_settlement_reports_an_injected_double_refund_and_hand_made_refund() {
    let (server, _) = base_url()
        .rsplit_once('/')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap();
    let db = format!("jf_test_{}_settle", std::process::id());
    let url = format!("{server}/{db}");
    let run = kit::run_short_demo_as_is(
        "settle",
        &[
            "--database-url",
            &url,
            "--jobs",
            "100",
            "--arrival",
            "10s",
            "--chaos",
            "false",
            "--inject-settlement-exceptions",
        ],
    )
    .await;
    let context = run.context();
    assert!(!run.succeeded, "the demo must exit non-zero\n{context}");
    let exceptions = run.line("settlement exceptions");
    let listed: Vec<&str> = exceptions
        .trim_start_matches("settlement exceptions")
        .trim()
        .split(", ")
        .collect();
    assert_eq!(listed.len(), 2, "exactly two exceptions\n{context}");
    assert!(
        listed
            .iter()
            .any(|e| e.starts_with("DOUBLE_REFUND refund-")),
        "{context}"
    );
    assert!(
        listed.contains(&"UNKNOWN_REFERENCE made-by-hand-in-the-dashboard"),
        "{context}"
    );
    assert!(
        run.report.trim_end().ends_with(')') && run.report.contains("invariant: VIOLATED"),
        "{context}"
    );
    if let Ok(admin) = sqlx::mysql::MySqlPool::connect(&base_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS `{db}`"))
            .execute(&admin)
            .await;
    }
}
