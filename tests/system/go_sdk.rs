//! The Go client (`sdk/go`), built the way scripts/test builds it: offline,
//! in GOPATH mode against Debian's packages (`scripts/go-env` installs
//! them; `sdk/go/tools/go` runs the go command that way; sdk/go/README.md
//! says why). `go vet` and `go test` of the module pass, its files are
//! gofmt-clean, and the checked-in `jobfencepb` is what
//! `sdk/go/tools/generate` makes of `proto/` now.
//!
//! And the Go refund worker rides through a 10-second database outage
//! (the coordinator's connections cut, as the demo cuts them): its
//! handler sees no error, no refund is made twice, the retries are
//! counted.
//!
//! The go binary is `$JOBFENCE_GO` (scripts/test: `scripts/go-env`), or
//! `go`. A missing toolchain fails the test; it never skips.

use jobfence_domain::JobState;
use jobfence_fake_provider::{
    self as provider, FaultConfig, Ledger, ProviderClient, ProviderConfig,
};
use jobfence_testkit as kit;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a command to completion; panics with its output if it fails.
fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `sdk/go/tools/go ARGS`: the go command on the module, offline.
fn go(args: &[&str]) -> Command {
    let mut cmd = Command::new(repo().join("sdk/go/tools/go"));
    cmd.args(args);
    cmd
}

/// Builds a Go program (a package path of the module, or a file by its
/// absolute path) into `out` and returns `out`. Used by the conformance
/// suite (the agent), the worker of docs/workers.md and the demo's tests.
pub fn build(what: &str, out: &Path) -> PathBuf {
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    run(
        &format!("go build {what}"),
        &mut go(&["build", "-o", out.to_str().unwrap(), what]),
    );
    out.to_owned()
}

#[test]
fn go_vet_and_go_test_of_the_go_client_pass_offline() {
    run("go vet ./...", &mut go(&["vet", "./..."]));
    let test = run("go test ./...", &mut go(&["test", "-count=1", "./..."]));
    assert!(
        test.contains("ok  \tgithub.com/jobfence/jobfence/sdk/go\t"),
        "{test}"
    );
    let listed = run(
        "gofmt -l",
        Command::new("gofmt")
            .arg("-l")
            .arg(repo().join("sdk/go"))
            .arg(repo().join("tests/conformance/agent.go")),
    );
    assert_eq!(listed, "", "files gofmt would change");
}

#[test]
fn the_checked_in_go_stubs_match_a_fresh_generation() {
    let fresh = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-stubs");
    let _ = std::fs::remove_dir_all(&fresh);
    run(
        "sdk/go/tools/generate",
        Command::new(repo().join("sdk/go/tools/generate")).arg(&fresh),
    );
    let names = |dir: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let checked_in = repo().join("sdk/go/jobfencepb");
    assert_eq!(names(&checked_in), names(&fresh), "the generated files");
    for name in names(&fresh) {
        assert!(
            std::fs::read(checked_in.join(&name)).unwrap()
                == std::fs::read(fresh.join(&name)).unwrap(),
            "sdk/go/jobfencepb/{name} differs from what proto/ generates now: \
             run sdk/go/tools/generate and commit the result"
        );
    }
}

/// What the Go refund worker and client log for a call that still failed
/// after the client's retries (the demo's report counts the same lines).
/// A claim whose COMMIT the cut left unknown ("claim outcome unknown") is
/// not one: the worker holds nothing and claims again, and what the claim
/// took comes back after its lease, reconciled (docs/design.md rule 4);
/// the checks of one refund per key below still catch a double send.
const FAILED_AFTER_RETRIES: [&str; 4] = [
    "claim failed",
    "write back failed",
    "could not release",
    "could not record",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_refund_worker_rides_through_a_10_second_database_outage() {
    let worker_bin = build(
        "github.com/jobfence/jobfence/sdk/go/cmd/refund-worker",
        &Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-bin/refund-worker"),
    );
    let (h, db) = kit::Harness::start_behind_proxy(kit::test_options()).await;
    // Every provider call takes 300 ms, so refunds are in flight when the
    // database goes.
    let provider = provider::spawn(ProviderConfig {
        pending_ratio: 0.0,
        faults: FaultConfig {
            latency: 1.0,
            latency_ms: 300,
            ..FaultConfig::default()
        },
        ..ProviderConfig::default()
    })
    .await
    .unwrap();
    let queue = "go-outage";
    let mut jobs = Vec::new();
    for i in 0..40 {
        let payload = format!(r#"{{"payment_id":"pay_go_{i}","amount":100,"currency":"TWD"}}"#);
        let key = format!("refund-pay_go_{i}-100-TWD");
        jobs.push((h.enqueue(queue, &key, &payload).await.job_id, key));
    }
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-outage-worker.log");
    let provider_url = format!("http://{}/", provider.addr());
    let mut worker = start_worker(&worker_bin, &h, &provider_url, queue, &log);

    let ids: Vec<u64> = jobs.iter().map(|(id, _)| *id).collect();
    // Some refunds done, others in flight: the database goes for 10 s.
    let deadline = Instant::now() + Duration::from_secs(120);
    while succeeded(&h, &ids).await < 4 {
        assert!(Instant::now() < deadline, "no refund done in 120 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = succeeded(&h, &ids).await;
    db.cut();
    tokio::time::sleep(Duration::from_secs(10)).await;
    db.restore();
    while succeeded(&h, &ids).await < jobs.len() {
        if let Ok(Some(status)) = worker.try_wait() {
            panic!("the worker exited ({status})");
        }
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "not every refund done after the outage"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = stop_worker(&mut worker, &log).await;
    println!(
        "go worker: {before} of {} refunds done when the database went; log:\n{text}",
        jobs.len()
    );
    assert!(before < jobs.len(), "the outage came after the work");

    // No error reached the handler, and no call failed after the retries.
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| FAILED_AFTER_RETRIES.iter().any(|m| l.contains(m)))
        .collect();
    assert!(failed.is_empty(), "calls failed after retries: {failed:?}");
    // The retries are counted, by reason.
    let retries = text
        .lines()
        .find(|l| l.contains("retries by reason"))
        .unwrap_or_else(|| panic!("no retry count in the log\n{text}"));
    assert!(retries.contains("DATABASE_UNAVAILABLE:"), "{retries}");
    let ledger = ProviderClient::for_addr(provider.addr())
        .ledger()
        .await
        .unwrap();
    nothing_handled_twice(&h, &jobs, &ledger, &text).await;
    drop(db);
    h.finish().await;
}

/// The Go refund worker `bin` on `queue` (4 jobs at once, 30 s leases),
/// logging to `log`; killed when dropped.
fn start_worker(
    bin: &Path,
    h: &kit::Harness,
    provider_url: &str,
    queue: &str,
    log: &Path,
) -> tokio::process::Child {
    let log_file = std::fs::File::create(log).unwrap();
    tokio::process::Command::new(bin)
        .args(["-coordinator", &h.addr.to_string()])
        .args(["-provider", provider_url])
        .args(["-worker-id", "go-outage-1", "-queue", queue])
        .args(["-concurrency", "4", "-lease", "30s"])
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .expect("start the Go refund worker")
}

/// Stops `worker` with SIGTERM, checks that it exited cleanly, and returns
/// its log.
async fn stop_worker(worker: &mut tokio::process::Child, log: &Path) -> String {
    let pid = nix::unistd::Pid::from_raw(worker.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the worker stops on SIGTERM")
        .unwrap();
    let text = std::fs::read_to_string(log).unwrap();
    assert!(status.success(), "{status}\n{text}");
    text
}

/// Nothing handled twice: every job of `jobs` (id, operation key) ends
/// succeeded with one completion, and the provider made one refund per
/// operation key. A job handed out again (an attempt above 1) came back
/// only through a takeover or a retry the worker scheduled, never to a
/// second sender: a Complete whose COMMIT was cut leaves the job it
/// claimed for the worker to its lease, and the next holder reconciles
/// (docs/design.md rule 4); a provider call that timed out on a loaded
/// machine is reconciled too. `text` is the worker's log, for the message.
async fn nothing_handled_twice(
    h: &kit::Harness,
    jobs: &[(u64, String)],
    ledger: &Ledger,
    text: &str,
) {
    let mut again = Vec::new();
    for (id, key) in jobs {
        let row = h.row(*id).await;
        let events = h.events(*id).await;
        let count =
            |kinds: &[&str]| events.iter().filter(|e| kinds.contains(&&*e.0)).count() as u64;
        assert_eq!(row.state, JobState::Succeeded, "job {id}: {events:?}");
        assert_eq!(count(&["completed"]), 1, "job {id}: {events:?}");
        assert_eq!(
            count(&["claimed", "taken_over"]),
            row.attempt,
            "job {id}: {events:?}"
        );
        assert!(
            count(&["taken_over", "retry_scheduled"]) >= row.attempt - 1,
            "job {id} was handed out again with no takeover or retry: {events:?}\n{text}"
        );
        assert_eq!(ledger.by_merchant_reference(key).refunds, 1, "{key}");
        if row.attempt > 1 {
            again.push((*id, events));
        }
    }
    println!("handed out again (through a takeover or a retry): {again:?}");
}

/// How many of `ids` are succeeded (one query: polled while the worker
/// runs, it must see the first refunds before the work is all done).
async fn succeeded(h: &kit::Harness, ids: &[u64]) -> usize {
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let (n,): (i64,) = sqlx::query_as(&format!(
        "SELECT COUNT(*) FROM jobs WHERE state = 'succeeded' AND id IN ({list})"
    ))
    .fetch_one(&h.pool)
    .await
    .unwrap();
    n as usize
}
