//! Two coordinators (real `jobfence serve` processes) behind a real HAProxy
//! configured from `deploy/haproxy/jobfence.cfg`: calls are spread over
//! both; a SIGTERM of one loses no call (it turns NOT_SERVING, HAProxy
//! stops sending it calls, it finishes what it has); a SIGKILL of one is
//! noticed by HAProxy's health checks; a database outage turns both
//! NOT_SERVING within 2 s and back within 2 s of recovery. The database is
//! reached through a proxy the test can cut. Delays are printed.

use jobfence_testkit as kit;

use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    ClaimRequest, CompleteRequest, EnqueueBatchRequest, EnqueueRequest, GetJobRequest,
};
use jobfence_fake_provider::netcut::NetCut as Proxy;
use jobfence_tools::demo::coordinators::haproxy_config;
use kit::process::{addr_in_file, free_port, SERVING_GRPC, SERVING_METRICS};
use kit::{url_host_port, TestDb};
use sqlx::Row;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const Q: &str = "refunds";

fn haproxy_bin() -> PathBuf {
    if let Ok(p) = std::env::var("JOBFENCE_HAPROXY") {
        return p.into();
    }
    for p in [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("haproxy not found; run scripts/test (it installs it with scripts/cluster install)");
}

/// A child process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), sig).unwrap();
    }
}

struct Coordinator {
    name: &'static str,
    grpc: u16,
    metrics: u16,
    process: Option<Running>,
}

impl Coordinator {
    async fn start(name: &'static str, database_url: &str, dir: &Path) -> Coordinator {
        Self::start_with(name, database_url, dir, &["--insecure".into()]).await
    }

    /// [`Coordinator::start`] with `security` instead of `--insecure`.
    /// It listens on port 0; its ports are read from its log.
    async fn start_with(
        name: &'static str,
        database_url: &str,
        dir: &Path,
        security: &[String],
    ) -> Coordinator {
        let path = dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&path).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_jobfence"))
            .args(["serve", "--database-url", database_url])
            .args(security)
            .args(["--listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            // A health ping may take 2 s before the coordinator calls the
            // database unreachable: on a loaded CI machine a 500 ms ping
            // timeout flapped a healthy coordinator to NOT_SERVING, and
            // HAProxy took it out between two calls of one test. The
            // timeout is capped at the interval, so both are 2 s (an
            // outage is still seen within 4 s; the tests wait up to 30).
            .args(["--health-interval", "2s", "--health-timeout", "2s"])
            .args(["--drain-delay", "2s"])
            .env("JOBFENCE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let process = Some(Running(child));
        Coordinator {
            name,
            grpc: addr_in_file(&path, SERVING_GRPC).await.port(),
            metrics: addr_in_file(&path, SERVING_METRICS).await.port(),
            process,
        }
    }

    /// `GET /healthz`: true for 200, false for 503 or no answer.
    async fn healthy(&self) -> bool {
        match reqwest::get(format!("http://127.0.0.1:{}/healthz", self.metrics)).await {
            Ok(r) => r.status() == reqwest::StatusCode::OK,
            Err(_) => false,
        }
    }

    /// Long-polling Claims waiting on this coordinator now, from its
    /// metrics (`jobfence_claim_waiters`).
    async fn claim_waiters(&self) -> f64 {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("jobfence_claim_waiters "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Calls of `method` this coordinator answered, from its metrics.
    async fn answered(&self, method: &str) -> f64 {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with("jobfence_rpc_duration_seconds_count{")
                    && l.contains(&format!("method=\"{method}\""))
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }
}

/// HAProxy in front of the coordinators, from the project's config file.
fn start_haproxy(listen: u16, coordinators: &[&Coordinator], dir: &Path) -> (Running, PathBuf) {
    start_haproxy_with(listen, coordinators, dir, None)
}

/// [`start_haproxy`], with TLS on both sides when `tls` is given.
fn start_haproxy_with(
    listen: u16,
    coordinators: &[&Coordinator],
    dir: &Path,
    tls: Option<&jobfence_tools::demo::coordinators::HaproxyTls>,
) -> (Running, PathBuf) {
    let socket = dir.join("haproxy.sock");
    let servers: Vec<(String, String, u16)> = coordinators
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                format!("127.0.0.1:{}", c.grpc),
                c.metrics,
            )
        })
        .collect();
    let errorfile =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/haproxy/grpc-unavailable.http");
    let config = haproxy_config(
        &format!("127.0.0.1:{listen}"),
        &socket,
        &errorfile,
        &servers,
        tls,
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config).unwrap();
    let child = Command::new(haproxy_bin())
        .args(["-db", "-f"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("haproxy.log")).unwrap())
        .spawn()
        .unwrap();
    (Running(child), socket)
}

/// HAProxy's status of a server (`UP`, `DOWN`, …) from its runtime API.
async fn haproxy_status(socket: &Path, server: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::UnixStream::connect(socket).await else {
        return "NO SOCKET".into();
    };
    s.write_all(b"show stat\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.lines()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|f| f.len() > 17 && f[0] == "coordinators" && f[1] == server)
        .map(|f| f[17].to_owned())
        .unwrap_or_else(|| "MISSING".into())
}

/// Waits until `ready` holds, polling every 20 ms for at most `limit`;
/// returns how long it took.
async fn time_until<F, Fut>(limit: Duration, mut ready: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !ready().await {
        assert!(start.elapsed() < limit, "not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

async fn client(port: u16) -> JobCoordinatorClient<Channel> {
    JobCoordinatorClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_coordinators_behind_haproxy_balance_drain_and_follow_the_database() {
    let db = TestDb::new().await;
    let upstream = url_host_port(&db.url);
    let db_proxy = Proxy::start(upstream).await.unwrap();
    let via_proxy = db
        .url
        .replace(&upstream.to_string(), &db_proxy.addr.to_string());
    let dir = std::env::temp_dir().join(format!("jobfence-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c1 = Coordinator::start("c1", &via_proxy, &dir).await;
    let c2 = Coordinator::start("c2", &via_proxy, &dir).await;
    // HAProxy cannot bind port 0 (see kit::process::free_port).
    let listen = free_port();
    let (_haproxy, socket) = start_haproxy(listen, &[&c1, &c2], &dir);
    time_until(Duration::from_secs(20), || async {
        haproxy_status(&socket, "c1").await == "UP" && haproxy_status(&socket, "c2").await == "UP"
    })
    .await;

    // Calls spread over both.
    let lb = client(listen).await;
    for _ in 0..40 {
        let _ = lb.clone().get_job(GetJobRequest { job_id: 1 }).await;
    }
    let (a, b) = (c1.answered("GetJob").await, c2.answered("GetJob").await);
    println!("cluster: 40 GetJob calls through HAProxy: c1 answered {a}, c2 answered {b}");
    assert_eq!(a + b, 40.0);
    assert!(a >= 10.0 && b >= 10.0, "unbalanced: {a} / {b}");

    // A database outage: both coordinators turn NOT_SERVING (HAProxy then
    // takes them out), and SERVING again once the database comes back. How
    // long each took is printed; the bound only says it happened at all.
    db_proxy.cut();
    let down = time_until(Duration::from_secs(30), || async {
        !c1.healthy().await && !c2.healthy().await
    })
    .await;
    // With no coordinator up, HAProxy answers itself: a gRPC UNAVAILABLE
    // with a reason every client retries, not an HTML page it would read
    // as a protocol error (an unknown outcome).
    time_until(Duration::from_secs(30), || async {
        haproxy_status(&socket, "c1").await.starts_with("DOWN")
            && haproxy_status(&socket, "c2").await.starts_with("DOWN")
    })
    .await;
    let refused = lb
        .clone()
        .get_job(GetJobRequest { job_id: 1 })
        .await
        .unwrap_err();
    println!("cluster: no coordinator up: HAProxy answered {refused:?}");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(refused.message(), "no jobfence coordinator is serving");
    let info = tonic_types::StatusExt::get_error_details(&refused)
        .error_info()
        .cloned()
        .expect("an ErrorInfo");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        (
            jobfence_server::grpc::status::reason::NO_COORDINATOR_SERVING,
            "jobfence"
        )
    );
    db_proxy.restore();
    let up = time_until(Duration::from_secs(30), || async {
        c1.healthy().await && c2.healthy().await
    })
    .await;
    println!(
        "cluster: database cut: both NOT_SERVING after {down:?}; restored: both SERVING after {up:?}"
    );
    time_until(Duration::from_secs(30), || async {
        haproxy_status(&socket, "c1").await == "UP" && haproxy_status(&socket, "c2").await == "UP"
    })
    .await;

    // Workers run the lifecycle through HAProxy while c1 is stopped with
    // SIGTERM: no call may fail, and every job ends once.
    let jobs = 300u64;
    lb.clone()
        .enqueue_batch(EnqueueBatchRequest {
            items: (0..jobs)
                .map(|i| EnqueueRequest {
                    queue: Q.into(),
                    operation_key: format!("refund-{i}"),
                    payload: "{}".into(),
                    delay: None,
                    fairness_key: String::new(),
                    priority: 0,
                })
                .collect(),
        })
        .await
        .unwrap();
    let failures = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (failures, done, stop) = (failures.clone(), done.clone(), stop.clone());
        let mut c = client(listen).await;
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let claimed = c
                    .claim(ClaimRequest {
                        queue: Q.into(),
                        worker_id: format!("w{w}"),
                        max_jobs: 1,
                        lease: None,
                        wait: kit::secs(1),
                    })
                    .await;
                let jobs = match claimed {
                    Ok(r) => r.into_inner().jobs,
                    Err(e) => {
                        eprintln!("claim failed: {e:?}");
                        failures.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                for j in jobs {
                    let job = j.job.unwrap();
                    // Slow work, so calls are in flight when c1 drains.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    match c
                        .complete(CompleteRequest {
                            job_id: job.job_id,
                            attempt: job.attempt,
                            provider_reference: "re".into(),
                            result: String::new(),
                            next: None,
                        })
                        .await
                    {
                        Ok(_) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("complete failed: {e:?}");
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    time_until(Duration::from_secs(60), || async {
        done.load(Ordering::Relaxed) >= 40
    })
    .await;
    // A call surely in flight on c1 at SIGTERM: a long-polling Claim sent to
    // c1 directly, on a queue with no work, counted as waiting by c1 itself
    // (the workers' queue has work, so their Claims do not wait). Only the
    // drain answers it before its 20 s wait.
    let mut direct = client(c1.grpc).await;
    let probe = tokio::spawn(async move {
        direct
            .claim(ClaimRequest {
                queue: "drain-probe".into(),
                worker_id: "probe".into(),
                max_jobs: 1,
                lease: None,
                wait: kit::secs(20),
            })
            .await
    });
    time_until(Duration::from_secs(30), || async {
        c1.claim_waiters().await >= 1.0
    })
    .await;
    let term = Instant::now();
    c1.process
        .as_ref()
        .unwrap()
        .signal(nix::sys::signal::Signal::SIGTERM);
    let in_flight_at_term = !probe.is_finished();
    let marked_down = time_until(Duration::from_secs(30), || async {
        haproxy_status(&socket, "c1").await.starts_with("DOWN")
    })
    .await;
    let exited = {
        let mut p = c1.process.take().unwrap();
        loop {
            if p.0.try_wait().unwrap().is_some() {
                break term.elapsed();
            }
            assert!(term.elapsed() < Duration::from_secs(60), "c1 did not stop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    time_until(Duration::from_secs(120), || async {
        done.load(Ordering::Relaxed) >= jobs
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let probed = probe.await.unwrap();
    for w in workers {
        w.await.unwrap();
    }
    println!(
        "cluster: SIGTERM of c1: HAProxy marked it down after {marked_down:?}, it exited {exited:?} after the signal; {} jobs done, {} failed calls",
        done.load(Ordering::Relaxed),
        failures.load(Ordering::Relaxed)
    );
    assert!(
        in_flight_at_term,
        "the probe's Claim had already ended at SIGTERM"
    );
    let probed = probed.expect("the call in flight at SIGTERM is answered, not cut");
    assert!(
        probed.into_inner().jobs.is_empty(),
        "answered empty by the drain"
    );
    assert_eq!(
        failures.load(Ordering::Relaxed),
        0,
        "calls failed during the drain"
    );
    let pool = db.pool();
    let row = sqlx::query(
        "SELECT COUNT(*) AS n, CAST(SUM(state = 'succeeded') AS SIGNED) AS ok, \
         (SELECT COUNT(*) FROM job_events WHERE kind = 'completed') AS completions FROM jobs",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let (n, ok, completions): (i64, i64, i64) =
        (row.get("n"), row.get("ok"), row.get("completions"));
    assert_eq!(
        (n, ok, completions),
        (jobs as i64, jobs as i64, jobs as i64)
    );

    // A SIGKILL: HAProxy notices (its check interval is 2 × 500 ms; how long
    // it took is printed, the bound only says it happened).
    let c2 = {
        let mut c2 = c2;
        let killed = Instant::now();
        drop(c2.process.take());
        let noticed = time_until(Duration::from_secs(30), || async {
            haproxy_status(&socket, "c2").await.starts_with("DOWN")
        })
        .await;
        println!(
            "cluster: SIGKILL of c2 noticed by HAProxy after {noticed:?} ({:?} since the kill)",
            killed.elapsed()
        );
        c2
    };
    drop(c2);
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// With TLS (as scripts/demo runs it): HAProxy terminates the clients' TLS
/// and re-encrypts to the coordinator, bearer tokens pass through to be
/// checked there, and HAProxy's own answer when no coordinator is up still
/// reaches a gRPC client, over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_reencrypts_tls_and_still_answers_when_no_coordinator_is_up() {
    use jobfence_auth::pki::{self, DevCaller};
    use jobfence_worker::credentials::{BearerToken, Credentials};
    let db = TestDb::new().await;
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cluster-tls");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let worker: DevCaller = "worker:worker:refunds".parse().unwrap();
    let files = pki::dev_setup(
        &dir.join("credentials"),
        &["localhost", "127.0.0.1"],
        &[worker],
        &[],
    )
    .unwrap();
    let frontend = dir.join("haproxy.pem");
    std::fs::write(
        &frontend,
        std::fs::read_to_string(&files.server_cert).unwrap()
            + &std::fs::read_to_string(&files.server_key).unwrap(),
    )
    .unwrap();
    let security: Vec<String> = vec![
        "--tls-cert".into(),
        files.server_cert.display().to_string(),
        "--tls-key".into(),
        files.server_key.display().to_string(),
        "--callers".into(),
        files.callers.display().to_string(),
    ];
    let mut c1 = Coordinator::start_with("c1", &db.url, &dir, &security).await;
    // HAProxy cannot bind port 0 (see kit::process::free_port).
    let listen = free_port();
    let tls = jobfence_tools::demo::coordinators::HaproxyTls {
        frontend_pem: frontend,
        ca: files.ca.clone(),
    };
    let (_haproxy, socket) = start_haproxy_with(listen, &[&c1], &dir, Some(&tls));
    time_until(Duration::from_secs(30), || async {
        haproxy_status(&socket, "c1").await.starts_with("UP")
    })
    .await;
    let creds = |token: Option<&str>| Credentials {
        tls_ca_pem: Some(std::fs::read(&files.ca).unwrap()),
        token: token.map(|t| BearerToken::new(t).unwrap()),
        ..Credentials::default()
    };
    let token = std::fs::read_to_string(files.token("worker")).unwrap();
    let connect = |c: Credentials| async move {
        let channel = c
            .endpoint(format!("https://127.0.0.1:{listen}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        JobCoordinatorClient::new(tonic::service::interceptor::InterceptedService::new(
            channel,
            c.authorization(),
        ))
    };
    let mut lb = connect(creds(Some(token.trim()))).await;
    let made = lb
        .enqueue(EnqueueRequest {
            queue: Q.into(),
            operation_key: "refund-tls-1".into(),
            payload: "{}".into(),
            delay: None,
            fairness_key: String::new(),
            priority: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(made.created);
    // Without a token HAProxy forwards the call, and the coordinator refuses it.
    // A loaded machine can make c1's health check time out twice in a row,
    // and HAProxy then answers UNAVAILABLE itself for a moment: that is
    // HAProxy's answer, not the coordinator's, so wait for c1 to be up
    // again and ask again (a few times at most).
    let mut anon = connect(creds(None)).await;
    let mut flaps = 0;
    let refused = loop {
        let refused = anon.get_job(GetJobRequest { job_id: 1 }).await.unwrap_err();
        if refused.code() != tonic::Code::Unavailable || flaps == 5 {
            break refused;
        }
        flaps += 1;
        time_until(Duration::from_secs(30), || async {
            haproxy_status(&socket, "c1").await.starts_with("UP")
        })
        .await;
    };
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    // No coordinator up: HAProxy's own gRPC answer, over TLS.
    c1.process.take();
    time_until(Duration::from_secs(30), || async {
        haproxy_status(&socket, "c1").await.starts_with("DOWN")
    })
    .await;
    let refused = lb.get_job(GetJobRequest { job_id: 1 }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let info = tonic_types::StatusExt::get_error_details(&refused)
        .error_info()
        .cloned()
        .expect("an ErrorInfo");
    assert_eq!(
        info.reason,
        jobfence_server::grpc::status::reason::NO_COORDINATOR_SERVING
    );
}
