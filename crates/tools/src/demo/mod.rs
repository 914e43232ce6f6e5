//! `jobfence demo`: the main job. Starts a coordinator and a fake payment
//! provider, enqueues refunds, runs Rust, Python, Node and Go workers on one
//! queue (one per database with --shards), and
//! makes the seed article's failures happen for real: a worker frozen past
//! its lease and resumed after the takeover, a worker killed mid-request,
//! responses cut after the refund was made, read-after-write lag, 503s, a
//! coordinator restart, and with --galera the database node the
//! coordinators write through killed, and a takeover storm: every
//! coordinator stopped for longer than the lease; and halfway through the
//! arrivals one merchant's bulk refund, thousands at once, whose wait the
//! report sets against the other merchants'. The provider has a rate
//! limit, and the queue a provider budget under it (`budget.rs`), so the
//! storm's flood reaches the provider at the budget's pace (`--no-budget`:
//! as fast as the workers go, and the provider answers 429). It ends with a
//! report whose last line is `invariant: OK` or `invariant: VIOLATED (…)`,
//! checked against the provider's own ledger.

mod archive;
mod args;
pub use args::DemoArgs;
mod arrivals;
pub mod budget;
mod calls;
mod chaos;
mod cluster;
pub mod coordinators;
pub mod credentials;
mod databases;
mod fairness;
pub mod report;
mod seen;
mod settle;
mod worker_logs;

pub use crate::procs::wait_coordinator;
use crate::procs::Proc;
use anyhow::{bail, Result};
use arrivals::Arrivals;
use chaos::{chaos_step, Chaos};
use cluster::{Cluster, Setup};
use sqlx::mysql::MySqlPool;
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The demo's queue (the first of them, with --shards).
const QUEUE: &str = "refunds";

/// The Rust workers the demo starts: `--workers`, or with several
/// databases enough for every queue to have one and the first two.
fn rust_workers(args: &DemoArgs, queues: usize) -> u32 {
    if queues > 1 {
        let others = args.python_workers + args.node_workers + args.go_workers;
        args.workers
            .max((queues as u32 + 1).saturating_sub(others))
            .max(2)
    } else {
        args.workers
    }
}

fn default_python() -> PathBuf {
    let venv = PathBuf::from(".local/venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// Runs the demo and prints its report: true when the invariant holds.
/// `interrupted` (Ctrl-C, SIGTERM) stops it early, every child resumed and
/// stopped (a frozen worker would otherwise stay stopped for ever).
pub async fn run(args: DemoArgs, interrupted: impl Future<Output = ()>) -> Result<bool> {
    let started = Instant::now();
    let setup = Setup::prepare(&args).await?;
    let fleet = budget::Fleet {
        rust: rust_workers(&args, setup.queues.len()),
        python: args.python_workers,
        node: args.node_workers,
        go: args.go_workers,
        concurrency: args.concurrency,
    };
    let plan = budget::Plan::new(
        args.provider_rate_limit,
        !args.no_budget,
        setup.queues.len() as u32,
        fleet,
    )?;
    let mut cluster = Cluster::start(&args, &setup, &plan, fleet.slots() as usize).await?;
    // The budget goes on before any worker starts: every hand-out is under
    // it from the first.
    plan.put(
        &cluster.coordinators.addr,
        &cluster.client(credentials::CONSOLE)?,
        credentials::CONSOLE,
        &cluster.queues,
    )
    .await?;
    say(&format!(
        "fake provider limit {}; provider budget {}",
        plan.limit_text(),
        plan.budget_text()
    ));
    let python_cmd = args.python.clone().unwrap_or_else(default_python);
    tokio::pin!(interrupted);
    let outcome = tokio::select! {
        r = run_workload(&mut cluster, &setup.pools, &args, started, &python_cmd) => r,
        _ = &mut interrupted => Err(anyhow::anyhow!("interrupted; stopping the demo's processes")),
    };
    for w in &mut cluster.workers {
        let _ = w.stop(Duration::from_secs(5)).await;
    }
    let (happened, pruned, bulk) = match outcome {
        Ok(done) => done,
        Err(e) => {
            cluster.coordinators.stop().await;
            let _ = cluster.provider.stop(Duration::from_secs(5)).await;
            return Err(e);
        }
    };
    let mut report = cluster
        .report(&setup, &args, &plan, &happened, bulk)
        .await?;
    report.add_pruned_retries(&pruned);
    println!("{}", report.render());
    if let Some(console) = &cluster.console {
        println!(
            "console: http://{console}/ shows this run (the coordinator stays up for it; \
             Ctrl-C stops it)"
        );
        let _ = std::io::stdout().flush();
        interrupted.await;
        cluster.coordinators.stop().await;
    }
    Ok(report.ok())
}

/// Enqueues the refunds, starts the workers, and drives the run.
async fn run_workload(
    cluster: &mut Cluster,
    pool: &[MySqlPool],
    args: &DemoArgs,
    started: Instant,
    python_cmd: &std::path::Path,
) -> Result<(
    Vec<chaos::Happened>,
    std::sync::Arc<arrivals::PrunedRetries>,
    Option<arrivals::BulkSent>,
)> {
    // Every worker starts first and says so, then the refunds arrive: the
    // workers that boot fastest (or long-poll) would otherwise take them all
    // before the slower ones (Python and Node load their stubs) are up.
    start_workers(cluster, args, python_cmd).await?;
    wait_workers_started(&mut cluster.workers).await?;
    let bulk = arrivals::Bulk {
        count: args.bulk_refunds.unwrap_or(args.jobs),
        at: args.arrival / 2,
    };
    let mut arrivals = Arrivals::start(
        &cluster.coordinators.addr,
        &cluster.client(credentials::PRODUCER)?,
        (args.jobs, args.arrival),
        bulk,
        cluster.queues.clone(),
        pool.to_vec(),
    )?;
    say(&format!(
        "{} refunds arriving over {}, and {} of {} at once after {}",
        args.jobs,
        humantime::format_duration(args.arrival),
        bulk.count,
        arrivals::BULK_MERCHANT,
        humantime::format_duration(bulk.at)
    ));
    let happened = drive(cluster, pool, args, started, &mut arrivals).await?;
    Ok((happened, arrivals.pruned.clone(), arrivals.bulk_sent()))
}

/// Starts the Rust, Python, Node and Go workers, in that order. Spread
/// over several databases, every queue gets a worker, and the first queue
/// two (see `Cluster::queue_for_worker`): each worker takes the next queue
/// in turn, so each is pushed before the next one is made.
async fn start_workers(
    cluster: &mut Cluster,
    args: &DemoArgs,
    python_cmd: &std::path::Path,
) -> Result<()> {
    let rust_workers = rust_workers(args, cluster.queues.len());
    for i in 1..=rust_workers {
        let w = cluster.rust_worker(&format!("rust-{i}"), args.concurrency)?;
        cluster.workers.push(w);
    }
    for i in 1..=args.python_workers {
        let w = python_worker(cluster, args, python_cmd, &format!("python-{i}"))?;
        cluster.workers.push(w);
    }
    for i in 1..=args.node_workers {
        let w = node_worker(cluster, args, &format!("node-{i}"))?;
        cluster.workers.push(w);
    }
    if args.go_workers > 0 {
        let go_worker = build_go_worker(args).await?;
        for i in 1..=args.go_workers {
            let w = go_worker_proc(cluster, args, &go_worker, &format!("go-{i}"))?;
            cluster.workers.push(w);
        }
    }
    Ok(())
}

/// The Python refund worker `name` on the next queue.
fn python_worker(
    cluster: &Cluster,
    args: &DemoArgs,
    python: &std::path::Path,
    name: &str,
) -> Result<Proc> {
    let script: Vec<String> = vec![
        "-m".into(),
        "jobfence_worker.refund_worker".into(),
        "--coordinator".into(),
        cluster.coordinators.addr.clone(),
        "--provider".into(),
        cluster.provider_url.clone(),
        "--worker-id".into(),
        name.into(),
        "--queue".into(),
        cluster.next_queue(),
        "--lease-seconds".into(),
        args.lease.as_secs().max(1).to_string(),
        "--batch".into(),
        budget::PYTHON_BATCH.to_string(),
    ];
    // The package from its source tree (its dependencies are in the venv
    // scripts/python-env made).
    let mut env = vec![("PYTHONPATH", "sdk/python/src".to_owned())];
    env.extend(cluster.client_env(credentials::PYTHON_WORKERS));
    Proc::spawn(name, python, &script, &env, &cluster.logs)
}

/// The Node refund worker `name` on the next queue.
fn node_worker(cluster: &Cluster, args: &DemoArgs, name: &str) -> Result<Proc> {
    let script: Vec<String> = vec![
        "sdk/node/src/refund_worker.js".into(),
        "--coordinator".into(),
        cluster.coordinators.addr.clone(),
        "--provider".into(),
        cluster.provider_url.clone(),
        "--worker-id".into(),
        name.into(),
        "--queue".into(),
        cluster.next_queue(),
        "--lease-seconds".into(),
        args.lease.as_secs().max(1).to_string(),
        "--concurrency".into(),
        args.concurrency.to_string(),
    ];
    let env = cluster.client_env(credentials::NODE_WORKERS);
    Proc::spawn(name, &args.node, &script, &env, &cluster.logs)
}

/// The Go refund worker `name` (the program `go_worker`, built by
/// [`build_go_worker`]) on the next queue.
fn go_worker_proc(
    cluster: &Cluster,
    args: &DemoArgs,
    go_worker: &std::path::Path,
    name: &str,
) -> Result<Proc> {
    let flags: Vec<String> = vec![
        "-coordinator".into(),
        cluster.coordinators.addr.clone(),
        "-provider".into(),
        cluster.provider_url.clone(),
        "-worker-id".into(),
        name.into(),
        "-queue".into(),
        cluster.next_queue(),
        "-lease".into(),
        format!("{}s", args.lease.as_secs().max(1)),
        "-concurrency".into(),
        args.concurrency.to_string(),
    ];
    let env = cluster.client_env(credentials::GO_WORKERS);
    Proc::spawn(name, go_worker, &flags, &env, &cluster.logs)
}

/// Builds sdk/go's refund worker into the work directory with
/// `sdk/go/tools/go` (GOPATH mode, offline, against Debian's packages;
/// `args.go` is the toolchain) and returns its path.
async fn build_go_worker(args: &DemoArgs) -> Result<PathBuf> {
    std::fs::create_dir_all(&args.work_dir)?;
    let out = std::fs::canonicalize(&args.work_dir)?.join("go-refund-worker");
    say("building the Go refund worker (sdk/go/tools/go build)");
    let built = tokio::process::Command::new("sdk/go/tools/go")
        .args(["build", "-o"])
        .arg(&out)
        .arg("github.com/jobfence/jobfence/sdk/go/cmd/refund-worker")
        .env("JOBFENCE_GO", &args.go)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| {
            anyhow::anyhow!("starting sdk/go/tools/go: {e} (run the demo from the checkout)")
        })?;
    if !built.status.success() {
        bail!(
            "building the Go refund worker failed ({}; scripts/go-env installs the toolchain, \
             --go-workers 0 runs without it):\n{}",
            built.status,
            String::from_utf8_lossy(&built.stderr)
        );
    }
    Ok(out)
}

/// Waits (up to 30 s) until every worker's log says it started.
async fn wait_workers_started(workers: &mut [Proc]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    for w in workers {
        loop {
            if let Some(status) = w.exited() {
                let log = std::fs::read_to_string(&w.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                bail!(
                    "{} exited at start ({status}); the end of its log ({}):\n{}",
                    w.name,
                    w.log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            let log = std::fs::read_to_string(&w.log).unwrap_or_default();
            if log.contains("refund worker started")
                || log.contains("python refund worker")
                || log.contains("node refund worker")
                || log.contains("go refund worker")
            {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not start within 30 s; its log is {}",
                    w.name,
                    w.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

/// Runs the failure schedule and prints progress until every job is
/// finished (or the time is up).
async fn drive(
    cluster: &mut Cluster,
    pool: &[MySqlPool],
    args: &DemoArgs,
    started: Instant,
    arrivals: &mut Arrivals,
) -> Result<Vec<chaos::Happened>> {
    let mut run = Drive {
        chaos: schedule(args, cluster),
        t0: Instant::now(),
        started,
        tty: std::io::stderr().is_terminal(),
        last_line: Instant::now() - Duration::from_secs(10),
        note: String::new(),
        injected: Vec::new(),
        arrived: false,
        bulk_noted: false,
    };
    loop {
        run.check_processes(cluster)?;
        run.chaos_steps(cluster, pool).await?;
        run.check_arrivals(arrivals).await?;
        let open = run.progress(pool, arrivals).await?;
        if open == 0 && run.chaos.is_empty() {
            if run.tty {
                eprintln!();
            }
            return Ok(run.injected);
        }
        if run.t0.elapsed() > args.max_duration {
            if run.tty {
                eprintln!();
            }
            if run.chaos.iter().any(|c| matches!(c, Chaos::Resume(_))) {
                let _ = cluster.workers[0].resume();
            }
            say(&format!(
                "stopping after {}: jobs still open",
                humantime::format_duration(args.max_duration)
            ));
            return Ok(run.injected);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The failures to inject, first steps first (each may lead to others).
fn schedule(args: &DemoArgs, cluster: &Cluster) -> Vec<Chaos> {
    match (args.chaos, cluster.coordinators.balanced()) {
        (false, _) => Vec::new(),
        (true, false) if cluster.galera.is_some() => vec![
            Chaos::Pause,
            Chaos::Kill,
            Chaos::KillNode(Duration::from_secs(4)),
        ],
        (true, false) => vec![Chaos::Pause, Chaos::Kill, Chaos::Restart],
        // The rolling restart leads to a coordinator's kill, then to the
        // database outage: one disturbance of the coordinators at a time.
        (true, true) => vec![Chaos::Pause, Chaos::Kill, Chaos::RollingRestart],
    }
}

/// Where [`drive`] is: the failures still to come, and what the progress
/// line shows.
struct Drive {
    chaos: Vec<Chaos>,
    /// When the schedule started: its steps are timed from here.
    t0: Instant,
    /// When the demo started: the progress lines' clock.
    started: Instant,
    tty: bool,
    last_line: Instant,
    /// The last thing that happened, shown after the counts.
    note: String,
    injected: Vec<chaos::Happened>,
    /// Every refund has been enqueued.
    arrived: bool,
    /// The bulk refund's arrival was said.
    bulk_noted: bool,
}

impl Drive {
    /// Fails if the provider or a coordinator exited on its own; notes a
    /// worker that failed.
    fn check_processes(&mut self, cluster: &mut Cluster) -> Result<()> {
        if let Some(status) = cluster.provider.exited() {
            bail!(
                "the provider exited unexpectedly ({status}); see {}",
                cluster.provider.log.display()
            );
        }
        if let Some((name, status, log)) = cluster.coordinators.exited() {
            bail!(
                "{name} exited unexpectedly ({status}); see {}",
                log.display()
            );
        }
        for w in &mut cluster.workers {
            if let Some(status) = w.exited() {
                if !status.success() && !self.note.contains(&w.name) {
                    self.note = format!("{} exited ({status}); see {}", w.name, w.log.display());
                }
            }
        }
        Ok(())
    }

    /// Takes every step of the schedule that is due, and says what
    /// happened.
    async fn chaos_steps(&mut self, cluster: &mut Cluster, pool: &[MySqlPool]) -> Result<()> {
        let mut i = 0;
        while i < self.chaos.len() {
            match chaos_step(cluster, pool, self.chaos[i].clone(), self.t0.elapsed()).await? {
                None => i += 1,
                Some(happened) => {
                    if self.tty {
                        eprintln!();
                    }
                    say(&format!(
                        "[{:>4}s] {}",
                        self.started.elapsed().as_secs(),
                        happened.what
                    ));
                    self.note = happened.what.clone();
                    self.chaos.remove(i);
                    self.chaos.extend(happened.next.clone());
                    self.injected.push(happened);
                }
            }
        }
        Ok(())
    }

    /// Says once when the bulk refund is in, and once when every refund
    /// has been enqueued.
    async fn check_arrivals(&mut self, arrivals: &mut Arrivals) -> Result<()> {
        if arrivals.bulk_sent().is_some() && !self.bulk_noted {
            self.bulk_noted = true;
            if self.tty {
                eprintln!();
            }
            self.note = format!(
                "{} sent {} refunds at once",
                arrivals::BULK_MERCHANT,
                arrivals.bulk_count()
            );
            say(&format!(
                "[{:>4}s] {}",
                self.started.elapsed().as_secs(),
                self.note
            ));
        }
        if !self.arrived && arrivals.done().await? {
            self.arrived = true;
            if self.tty {
                eprintln!();
            }
            say(&format!(
                "[{:>4}s] all {} refunds enqueued in {:.1} s ({} EnqueueBatch calls retried)",
                self.started.elapsed().as_secs(),
                arrivals.total,
                arrivals.took.unwrap_or_default().as_secs_f64(),
                arrivals.retried()
            ));
        }
        Ok(())
    }

    /// Prints the jobs by state (on a terminal in place, else every 2 s)
    /// and returns how many are still open (one more while refunds are
    /// still arriving).
    async fn progress(&mut self, pool: &[MySqlPool], arrivals: &Arrivals) -> Result<i64> {
        let states = report::states_all(pool).await?;
        let mut open =
            states.get("ready").copied().unwrap_or(0) + states.get("running").copied().unwrap_or(0);
        if !self.arrived {
            open += 1;
        }
        let line = format!(
            "[{:>4}s] {}{}",
            self.started.elapsed().as_secs(),
            if self.arrived {
                String::new()
            } else {
                format!("arrived {}/{}  ", arrivals.arrived(), arrivals.total)
            },
            ["ready", "running", "succeeded", "failed", "manual_review"]
                .iter()
                .map(|s| format!("{s} {}", states.get(*s).copied().unwrap_or(0)))
                .collect::<Vec<_>>()
                .join("  ")
        );
        if open == 0 {
            // Nothing left to disturb; a frozen worker still gets resumed
            // by its own step on the next turn, and a storm's end is still
            // measured.
            self.chaos
                .retain(|c| matches!(c, Chaos::Resume(_) | Chaos::StormDrain(_)));
        }
        let note = &self.note;
        if self.tty {
            eprint!("\r{line}  {note:<60}");
        } else if self.last_line.elapsed() >= Duration::from_secs(2) || open == 0 {
            eprintln!("{line}  {note}");
            self.last_line = Instant::now();
        }
        let _ = std::io::stderr().flush();
        Ok(open)
    }
}

fn say(msg: &str) {
    eprintln!("demo: {msg}");
}
