//! A Python worker (sdk/python/src/jobfence_worker) against the coordinator served
//! in-process: it claims and completes a job, then holds one that the Rust
//! side takes over at an exact point of its script, and must be refused
//! with ATTEMPT_SUPERSEDED (asserted in Python) and keep its late result as
//! an observation (asserted here too). The two sides step each other over
//! the script's stdin/stdout; nothing waits on a clock.
//!
//! Then the package's run loop (`WorkerClient.run`, and
//! `AsyncWorkerClient.run`), with three slots, over jobs whose handlers
//! complete, leave without a write or raise: every job ends succeeded, the
//! ones its handler left are released to reconcile and completed by the
//! next attempt, and no more than three are handled at once.
//!
//! The interpreter is `$JOBFENCE_PYTHON` (scripts/test points it at
//! .local/venv), else `python3`. Without grpcio this test fails; it never
//! skips.

use jobfence_testkit as kit;

use jobfence_api::v1::TakeoverRequest;
use jobfence_domain::{JobState, ObservationOutcome, ObservationSource};
use jobfence_store::JobStore;
use jobfence_worker::observation_dedup_key;
use kit::Harness;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const Q: &str = "refunds";
const WORKER: &str = "py-worker";
/// Longest wait for one line of the script.
const LINE_TIMEOUT: Duration = Duration::from_secs(120);

fn python() -> String {
    std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Fails, with what to do, when the interpreter cannot import grpcio.
fn require_grpc(python: &str) {
    let out = Command::new(python)
        .args([
            "-c",
            "import grpc, grpc_status, google.rpc.error_details_pb2",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run the Python interpreter {python:?}: {e}"));
    assert!(
        out.status.success(),
        "the Python interpreter {python:?} cannot import grpcio \
         (grpcio, grpcio-status, googleapis-common-protos): \
         install the dependencies of sdk/python/pyproject.toml into it, or set JOBFENCE_PYTHON \
         to one that has them (scripts/python-env does both with .local/venv).\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The running script: its stdin, its stdout lines, and its stderr.
struct Script {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Script {
    /// Runs `tests/polyglot/<script>` with `args`.
    fn start(script: &str, args: &[String]) -> Script {
        let python = python();
        require_grpc(&python);
        let mut child = Command::new(&python)
            .arg(repo().join("tests/polyglot").join(script))
            .args(args)
            .env("PYTHONPATH", repo().join("sdk/python/src"))
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the Python worker");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Script {
            child,
            stdin,
            lines,
            stderr,
        }
    }

    /// The next line, which must start with `word`; its other words.
    async fn expect(&mut self, word: &str) -> Vec<String> {
        // The reader is a thread; wait for it off the runtime so the
        // in-process coordinator keeps serving the script meanwhile.
        let line = tokio::task::block_in_place(|| self.lines.recv_timeout(LINE_TIMEOUT));
        let line = match line {
            Ok(line) => line,
            Err(_) => self.fail(&format!("no {word} line")),
        };
        let mut words = line.split_whitespace().map(str::to_owned);
        if words.next().as_deref() != Some(word) {
            self.fail(&format!("expected {word}, got {line:?}"));
        }
        words.collect()
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to the Python worker");
        self.stdin.flush().unwrap();
    }

    fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let stderr = std::mem::replace(&mut self.stderr, std::thread::spawn(String::new));
        panic!(
            "Python worker: {what}\n--- its stderr ---\n{}",
            stderr.join().unwrap_or_default()
        );
    }

    fn finish(mut self) {
        let status = tokio::task::block_in_place(|| self.child.wait()).unwrap();
        if !status.success() {
            self.fail(&format!("exited with {status}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_worker_is_fenced_like_a_rust_one() {
    let h = Harness::start().await;
    let first = h.enqueue(Q, "refund-py-1", "{}").await;
    let second = h.enqueue(Q, "refund-py-2", "{}").await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut py = Script::start(
        "python_worker.py",
        &[
            h.addr.to_string(),
            WORKER.to_owned(),
            Q.to_owned(),
            closed.to_string(),
        ],
    );

    // 1. Claim, complete, replay.
    let claimed = py.expect("CLAIMED").await;
    let done: u64 = claimed[0].parse().unwrap();
    assert_eq!(claimed[1], "1", "first attempt");
    py.expect("COMPLETED").await;
    py.expect("REPLAYED").await;
    let row = h.row(done).await;
    assert_eq!(row.state, JobState::Succeeded);
    assert_eq!(row.provider_reference.as_deref(), Some("re_py_1"));
    assert_eq!(row.lease_owner.as_deref(), Some(WORKER));
    assert_eq!(h.count_events(done, "completed").await, 1);

    // 2. The script holds the other job; its lease runs out and Rust takes over.
    let holding = py.expect("HOLDING").await;
    let held: u64 = holding[0].parse().unwrap();
    assert_eq!(
        [done, held]
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [first.job_id, second.job_id].into_iter().collect()
    );
    h.force_lease_expired(held).await;
    let taken = h
        .client
        .clone()
        .takeover(TakeoverRequest {
            job_id: held,
            worker_id: "rust-b".into(),
            lease: None,
        })
        .await
        .expect("Rust takes over")
        .into_inner()
        .claimed
        .unwrap()
        .job
        .unwrap();
    py.send(&format!("TAKEN_OVER {}", taken.attempt));

    // 3. Python was refused (asserted there), and left its evidence.
    let superseded = py.expect("SUPERSEDED").await;
    assert_eq!(superseded[1], taken.attempt.to_string());
    let dedup = py.expect("DEDUP").await;
    assert_eq!(
        dedup[0],
        observation_dedup_key(WORKER, &"r".repeat(250)),
        "both SDKs derive the same dedup key"
    );
    py.expect("DONE").await;
    py.finish();

    let row = h.row(held).await;
    assert_eq!(row.state, JobState::Running);
    assert_eq!(row.attempt, taken.attempt);
    assert_eq!(row.lease_owner.as_deref(), Some("rust-b"));
    assert_eq!(row.provider_reference, None);
    let (_, observations) = JobStore::new(h.pool.clone()).get_job(held).await.unwrap();
    assert_eq!(observations.len(), 1);
    let o = &observations[0];
    assert_eq!(o.attempt, taken.attempt - 1);
    assert_eq!(o.source, ObservationSource::Worker);
    assert_eq!(o.outcome, ObservationOutcome::Succeeded);
    assert_eq!(o.provider_reference.as_deref(), Some("re_py_late"));
    assert_eq!(o.dedup_key, observation_dedup_key(WORKER, "re_py_late"));
    assert_eq!(h.count_events(held, "stale_write_rejected").await, 2);
    h.finish().await;
}

/// The package's run loop over six jobs of one queue: `ok` jobs complete
/// on their first attempt; the `leave` job's handler returns without a
/// write and the `raise` job's raises, so the loop releases both with
/// RETRY_RECONCILE and the next attempt completes them.
async fn the_run_loop_handles_and_releases(aio: bool) {
    let h = Harness::start().await;
    let queue = if aio { "py-run-aio" } else { "py-run" };
    let worker = format!("{queue}-1");
    let mut jobs = Vec::new();
    for (i, payload) in ["ok", "leave", "ok", "raise", "ok", "ok"]
        .iter()
        .enumerate()
    {
        let key = format!("refund-{queue}-{i}");
        jobs.push((h.enqueue(queue, &key, payload).await.job_id, *payload));
    }
    let mut args: Vec<String> = aio.then(|| "--aio".to_owned()).into_iter().collect();
    args.extend([
        h.addr.to_string(),
        worker.clone(),
        queue.to_owned(),
        jobs.len().to_string(),
    ]);
    let mut py = Script::start("python_run_loop.py", &args);
    let report: std::collections::BTreeMap<String, u64> = py
        .expect("REPORT")
        .await
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
        .collect();
    py.expect("DONE").await;
    py.finish();

    let count = |k: &str| {
        report
            .get(k)
            .copied()
            .unwrap_or_else(|| panic!("{k}: {report:?}"))
    };
    assert_eq!(
        count("claimed"),
        8,
        "six jobs, two of them twice: {report:?}"
    );
    assert_eq!(count("handled"), 8, "{report:?}");
    assert_eq!(count("handler_errors"), 1, "{report:?}");
    assert_eq!(count("released"), 2, "{report:?}");
    assert_eq!(count("unclear_claims"), 0, "{report:?}");
    let peak = count("peak");
    assert!((1..=3).contains(&peak), "at most three at once: {report:?}");
    for (id, payload) in jobs {
        let row = h.row(id).await;
        let attempts = if payload == "ok" { 1 } else { 2 };
        assert_eq!(row.state, JobState::Succeeded, "job {id} ({payload})");
        assert_eq!(row.attempt, attempts, "job {id} ({payload})");
        assert_eq!(row.lease_owner.as_deref(), Some(worker.as_str()));
        assert_eq!(
            row.provider_reference,
            Some(format!("re_py_run_{id}")),
            "job {id} ({payload})"
        );
        assert_eq!(h.count_events(id, "completed").await, 1);
        assert_eq!(
            h.count_events(id, "retry_scheduled").await,
            usize::from(payload != "ok"),
            "job {id} ({payload}) released once"
        );
    }
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_run_loop_handles_and_releases_jobs() {
    the_run_loop_handles_and_releases(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_asyncio_run_loop_handles_and_releases_jobs() {
    the_run_loop_handles_and_releases(true).await;
}
