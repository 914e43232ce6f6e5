//! What the rolling-upgrade test (upgrade.rs) runs: coordinators of two
//! releases as processes, HAProxy in front of them, a producer, and a Rust
//! and a Python refund worker.

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueBatchRequest, EnqueueRequest, ObservationOutcome,
    ObservationSource, RecordObservationRequest,
};
use jobfence_testkit as kit;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// What a worker logs for a call that failed after its retries (as the
/// demo's worker_logs.rs counts them).
const FAILURE_MARKERS: &[&str] = &[
    "claim failed",
    "write back failed",
    "could not release",
    "could not record",
];

/// One coordinator's name and ports, fixed before it starts (HAProxy's
/// configuration names them).
pub struct Node {
    pub name: String,
    pub grpc: u16,
    pub metrics: u16,
}

impl Node {
    pub fn ports(name: &str) -> Node {
        Node {
            name: name.to_owned(),
            grpc: kit::process::free_port(),
            metrics: kit::process::free_port(),
        }
    }
}

/// A child process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The coordinators of the test, old and new, and their logs.
pub struct Fleet {
    pub url: String,
    dir: PathBuf,
    old_bin: String,
    running: Vec<(String, Running)>,
}

impl Fleet {
    pub fn new(url: &str, dir: PathBuf, old_bin: String) -> Fleet {
        Fleet {
            url: url.to_owned(),
            dir,
            old_bin,
            running: Vec::new(),
        }
    }

    /// Runs the old binary to its end: (success, stdout and stderr).
    pub async fn try_old(&self, args: &[&str]) -> (bool, String) {
        run(Path::new(&self.old_bin), args).await
    }

    /// Runs the old binary, which must succeed.
    pub async fn run_old(&self, args: &[&str]) -> String {
        let (ok, text) = self.try_old(args).await;
        assert!(ok, "{} {args:?}: {text}", self.old_bin);
        text
    }

    /// Runs today's binary, which must succeed.
    pub async fn run_new(&self, args: &[&str]) -> String {
        let (ok, text) = run(&kit::process::jobfence_bin(), args).await;
        assert!(ok, "jobfence {args:?}: {text}");
        text
    }

    /// Starts `node` (the old binary with `old`) and waits until its
    /// `/healthz` answers 200.
    pub async fn start(&mut self, node: &Node, old: bool) {
        let bin = if old {
            PathBuf::from(&self.old_bin)
        } else {
            kit::process::jobfence_bin()
        };
        let log = std::fs::File::create(self.dir.join(format!("{}.log", node.name))).unwrap();
        let mut cmd = Command::new(bin);
        cmd.args([
            "serve",
            "--insecure",
            "--prune-off",
            "--database-url",
            &self.url,
        ])
        .args(["--listen", &format!("127.0.0.1:{}", node.grpc)])
        .args(["--metrics-listen", &format!("127.0.0.1:{}", node.metrics)])
        .args(["--health-interval", "1s", "--health-timeout", "1s"])
        .args(["--drain-delay", "2s", "--shutdown-timeout", "10s"])
        .env("JOBFENCE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
        if !old {
            cmd.args(["--coordinator-name", &node.name])
                .args(["--upgrade-quiet-period", super::upgrade::QUIET]);
        }
        self.running
            .push((node.name.clone(), Running(cmd.spawn().unwrap())));
        for _ in 0..240 {
            if http_ok(node.metrics).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("{} did not turn healthy:\n{}", node.name, self.logs());
    }

    /// SIGTERM to `node`, then waits for it to drain and exit (status 0).
    pub async fn stop(&mut self, node: &Node) {
        let i = self
            .running
            .iter()
            .position(|(n, _)| *n == node.name)
            .expect("a running node");
        let (_, mut p) = self.running.remove(i);
        let pid = nix::unistd::Pid::from_raw(p.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let child = &mut p.0;
        for _ in 0..120 {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "{} exited {status}:\n{}",
                    node.name,
                    self.logs()
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("{} did not stop within 30 s of SIGTERM", node.name);
    }

    /// Every coordinator log of the test, one after the other.
    pub fn log_text(&self) -> String {
        let mut all = String::new();
        let mut files: Vec<_> = std::fs::read_dir(&self.dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        files.sort();
        for f in files {
            all.push_str(&format!("== {}\n", f.display()));
            all.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
        }
        all
    }

    /// The logs' last lines, for a failure's message.
    pub fn logs(&self) -> String {
        let all = self.log_text();
        let lines: Vec<&str> = all.lines().collect();
        lines[lines.len().saturating_sub(120)..].join("\n")
    }
}

async fn run(bin: &Path, args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .env("JOBFENCE_LOG", "info")
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `GET /healthz` answered 200.
pub async fn http_ok(port: u16) -> bool {
    matches!(reqwest::get(format!("http://127.0.0.1:{port}/healthz")).await, Ok(r) if r.status() == reqwest::StatusCode::OK)
}

/// The sum of `name`'s series whose labels contain `labels`.
pub async fn metric_sum(port: u16, name: &str, labels: &str) -> f64 {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

pub fn count_in(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

/// HAProxy from the project's configuration in front of `nodes`; returns
/// it and the port it listens on.
pub async fn haproxy(nodes: &[Node], dir: &Path) -> (impl Drop, u16) {
    use jobfence_tools::demo::coordinators::{haproxy_bin, haproxy_config};
    let listen = kit::process::free_port();
    let servers: Vec<(String, String, u16)> = nodes
        .iter()
        .map(|n| (n.name.clone(), format!("127.0.0.1:{}", n.grpc), n.metrics))
        .collect();
    let errorfile =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy/grpc-unavailable.http");
    let config = haproxy_config(
        &format!("127.0.0.1:{listen}"),
        &dir.join("haproxy.sock"),
        &errorfile,
        &servers,
        None,
    );
    std::fs::write(dir.join("haproxy.cfg"), config).unwrap();
    let running = Running(
        Command::new(haproxy_bin().unwrap())
            .args(["-db", "-f"])
            .arg(dir.join("haproxy.cfg"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("haproxy.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", listen))
            .await
            .is_ok()
        {
            return (running, listen);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("HAProxy does not listen on {listen}");
}

/// The workers of two clients, through the load balancer.
pub struct Load {
    pub stop: Arc<Notify>,
    workers: Vec<(PathBuf, Running)>,
}

/// What the workers said when they stopped.
pub struct WorkerReport {
    pub failed_calls: usize,
    /// Workers that completed at least one job.
    pub completed: usize,
    pub text: String,
}

impl Load {
    pub fn start(lb: u16, provider: &str, dir: &Path) -> Load {
        let rust_log = dir.join("rust-1.worker");
        let rust = Command::new(kit::process::jobfence_bin())
            .args([
                "refund-worker",
                "--coordinator",
                &format!("http://127.0.0.1:{lb}"),
            ])
            .args([
                "--provider",
                provider,
                "--worker-id",
                "rust-1",
                "--lease",
                "5s",
            ])
            .env("JOBFENCE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&rust_log).unwrap())
            .spawn()
            .unwrap();
        let python = std::env::var("JOBFENCE_PYTHON").unwrap_or_else(|_| "python3".into());
        let py_log = dir.join("python-1.worker");
        let py = Command::new(python)
            .args(["-m", "jobfence_worker.refund_worker"])
            .args([
                "--coordinator",
                &format!("127.0.0.1:{lb}"),
                "--provider",
                provider,
            ])
            .args(["--worker-id", "python-1", "--lease-seconds", "5"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("PYTHONPATH", "sdk/python/src")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&py_log).unwrap())
            .spawn()
            .unwrap();
        Load {
            stop: Arc::new(Notify::new()),
            workers: vec![(rust_log, Running(rust)), (py_log, Running(py))],
        }
    }

    /// SIGTERM to each worker (they finish what they hold), then what
    /// their logs say.
    pub async fn stop_workers(mut self) -> WorkerReport {
        let mut text = String::new();
        let mut failed_calls = 0;
        let mut completed = 0;
        for (log, mut p) in self.workers.drain(..) {
            let pid = nix::unistd::Pid::from_raw(p.0.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            for _ in 0..80 {
                if p.0.try_wait().unwrap().is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            let body = std::fs::read_to_string(&log).unwrap_or_default();
            failed_calls += FAILURE_MARKERS
                .iter()
                .map(|m| body.matches(m).count())
                .sum::<usize>();
            if worked(&body) {
                completed += 1;
            }
            text.push_str(&format!("== {}\n{body}", log.display()));
        }
        WorkerReport {
            failed_calls,
            completed,
            text,
        }
    }
}

/// Whether a worker's log says it handled a job: the Rust worker's
/// closing report (`handled: N`), the Python worker's per-job lines.
fn worked(log: &str) -> bool {
    log.contains(" completed with re_")
        || log.split("handled: ").skip(1).any(|rest| {
            rest.chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() && c != '0')
        })
}

/// Enqueues refunds through the load balancer, 10 every 100 ms, until
/// `stop`; a call the load balancer could not place is sent again (the
/// same keys answer the same jobs). Returns how many keys it enqueued.
pub async fn enqueue_load(lb: u16, stop: Arc<Notify>) -> usize {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{lb}"))
        .unwrap()
        .connect_lazy();
    let mut client = JobCoordinatorClient::new(channel);
    let stopped = stop.notified();
    tokio::pin!(stopped);
    let mut n = 0;
    loop {
        let items: Vec<EnqueueRequest> = (n..n + 10)
            .map(|i| EnqueueRequest {
                queue: "refunds".into(),
                operation_key: format!("upgrade-{i}"),
                payload: format!(
                    r#"{{"payment_id":"pay_up_{i}","amount":{},"currency":"TWD"}}"#,
                    100 + i
                ),
                delay: None,
                fairness_key: String::new(),
                priority: 0,
            })
            .collect();
        let mut tries = 0;
        loop {
            match client
                .enqueue_batch(EnqueueBatchRequest {
                    items: items.clone(),
                })
                .await
            {
                Ok(_) => break,
                Err(s) if s.code() == tonic::Code::Unavailable && tries < 20 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(s) => panic!("enqueue failed after {tries} retries: {s:?}"),
            }
        }
        n += 10;
        tokio::select! {
            _ = &mut stopped => return n,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Two jobs on a queue no worker takes, claimed through the old
/// coordinator at `grpc` with a one-second lease, each with an
/// observation recorded through it: the late result of a stale worker.
pub async fn observe_old(grpc: u16) -> Vec<u64> {
    let mut c = JobCoordinatorClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..2 {
        let job = c
            .enqueue(EnqueueRequest {
                queue: "upgrade-observed".into(),
                operation_key: format!("observed-{i}"),
                payload: "{}".into(),
                delay: None,
                fairness_key: String::new(),
                priority: 0,
            })
            .await
            .unwrap()
            .into_inner()
            .job
            .unwrap();
        ids.push(job.job_id);
    }
    let claimed = c
        .claim(ClaimRequest {
            queue: "upgrade-observed".into(),
            worker_id: "stale-worker".into(),
            max_jobs: 2,
            lease: kit::secs(1),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(claimed.len(), 2);
    for j in claimed {
        let job = j.job.unwrap();
        c.record_observation(RecordObservationRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            source: ObservationSource::Worker as i32,
            outcome: ObservationOutcome::Succeeded as i32,
            provider_reference: format!("re_late_{}", job.job_id),
            body: "{}".into(),
            dedup_key: format!("late-{}", job.job_id),
        })
        .await
        .unwrap();
    }
    ids
}

/// One job enqueued, claimed and completed through the coordinator at
/// `grpc`; its state afterwards.
pub async fn one_job_through(grpc: u16) -> String {
    let mut c = JobCoordinatorClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    c.enqueue(EnqueueRequest {
        queue: "after-rollback".into(),
        operation_key: "after-rollback-1".into(),
        payload: "{}".into(),
        delay: None,
        fairness_key: String::new(),
        priority: 0,
    })
    .await
    .unwrap();
    let job = c
        .claim(ClaimRequest {
            queue: "after-rollback".into(),
            worker_id: "rollback-worker".into(),
            max_jobs: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs
        .remove(0)
        .job
        .unwrap();
    let done = c
        .complete(CompleteRequest {
            job_id: job.job_id,
            attempt: job.attempt,
            provider_reference: "re_after_rollback".into(),
            result: "{}".into(),
            next: None,
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    format!("{:?}", done.state()).to_lowercase()
}
