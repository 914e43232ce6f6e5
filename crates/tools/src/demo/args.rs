//! The flags of `jobfence demo`.

use clap::Args;
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `jobfence demo`. Durations are humantime (`3s`, `2m`).
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Database for the demo; it is dropped and created anew.
    #[arg(
        long,
        env = "JOBFENCE_DEMO_DATABASE_URL",
        default_value = "mysql://jobfence:jobfence@127.0.0.1:3307/jobfence_demo"
    )]
    pub database_url: String,
    /// Refunds to enqueue.
    #[arg(long, default_value_t = 2000)]
    pub jobs: u32,
    /// The refunds arrive evenly over this long (`0s`: all at once), so the
    /// failures happen while work flows. 30 s: every failure of the
    /// schedule, the takeover storm included, happens while refunds still
    /// arrive, at a pace (about 67/s) the budget carries with room to spare.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub arrival: Duration,
    /// One merchant's bulk refund, mid-run: this many refunds of
    /// `bulk-merchant` enqueued at once (EnqueueBatch calls of 500, back
    /// to back) halfway through --arrival; the report sets the other
    /// merchants' wait for a first hand-out against the bulk merchant's
    /// (docs/design.md rule 18). Default: as many as --jobs; 0: none.
    #[arg(long)]
    pub bulk_refunds: Option<u32>,
    /// Rust refund workers.
    #[arg(long, default_value_t = 3)]
    pub workers: u32,
    /// Python refund workers (need grpcio: scripts/demo installs it).
    #[arg(long, default_value_t = 1)]
    pub python_workers: u32,
    /// Node refund workers (sdk/node; need its packages: scripts/demo runs
    /// `npm ci` there).
    #[arg(long, default_value_t = 1)]
    pub node_workers: u32,
    /// Go refund workers (sdk/go's `cmd/refund-worker`, built at the start
    /// with `sdk/go/tools/go`: offline, against Debian's Go packages, which
    /// scripts/demo installs with scripts/go-env).
    #[arg(long, default_value_t = 1)]
    pub go_workers: u32,
    /// Jobs each Rust, Node and Go worker handles at once (the Python worker
    /// claims 4 and handles them in turn). 16: together the workers can
    /// send well past the provider's limit, which is what a budget is for.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u32,
    /// Lease of every claim.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub lease: Duration,
    /// Stop waiting for the jobs to finish after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3m")]
    pub max_duration: Duration,
    /// The coordinator's resend window (keep it at most the provider's
    /// idempotency retention: that is the point).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub resend_window: Duration,
    /// Finished jobs are pruned this long after they finish (each
    /// coordinator's --retention-jobs; they prune every second), so pruning
    /// happens during the run and the producer retries Enqueues of keys
    /// whose jobs are gone: each must answer the old job, created=false.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub retention: Duration,
    /// How long the provider remembers an idempotency key.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub provider_retention: Duration,
    /// Share of provider responses cut after the refund was made.
    #[arg(long, default_value_t = 0.03)]
    pub fault_cut_response: f64,
    /// Share of lookups that miss refunds younger than 2 s.
    #[arg(long, default_value_t = 0.2)]
    pub fault_lag: f64,
    /// Share of provider requests answered 503 before doing anything.
    #[arg(long, default_value_t = 0.03)]
    pub fault_error_5xx: f64,
    /// Share of provider answers delayed 5 s (past the worker's timeout).
    #[arg(long, default_value_t = 0.01)]
    pub fault_latency: f64,
    /// Share of provider requests never answered.
    #[arg(long, default_value_t = 0.005)]
    pub fault_hang: f64,
    /// Share of refunds that stay pending for a second.
    #[arg(long, default_value_t = 0.1)]
    pub pending_ratio: f64,
    /// The fake provider's rate limit: requests per second, every endpoint
    /// together, answered 429 past it (its burst: one second's worth, or
    /// more if the workers could otherwise outrun it). 200: the refunds'
    /// own pace (about 80 requests/s with their reconciles and resends,
    /// some 95 budget units/s) takes 60% of the budget of 80% of it, which
    /// leaves room to work off the backlog each failure leaves; and the
    /// workers together can go about twice as fast, so the flood after the
    /// takeover storm meets 429s without a budget.
    #[arg(long, default_value_t = 200.0)]
    pub provider_rate_limit: f64,
    /// Run without the provider budget: the queue dispatches to the
    /// provider as fast as the workers take jobs, and the report counts the
    /// 429s. By default the demo puts a budget of 80% of
    /// --provider-rate-limit on its queue (JobAdmin PutProvider; execute 1
    /// unit, reconcile 2, what the refund workers can spend per hand-out).
    #[arg(long)]
    pub no_budget: bool,
    /// Before the settlement at the end, make the fake provider refund one
    /// operation a second time and make a refund by hand in its dashboard:
    /// the settlement must then report exactly those two exceptions (a
    /// DOUBLE_REFUND and an UNKNOWN_REFERENCE), and the demo exits
    /// non-zero.
    #[arg(long)]
    pub inject_settlement_exceptions: bool,
    /// Pause, kill and restart processes during the run.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub chaos: bool,
    /// Seed for the provider's faults.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Python interpreter with grpcio (default: .local/venv/bin/python).
    #[arg(long, env = "JOBFENCE_PYTHON")]
    pub python: Option<PathBuf>,
    /// Node executable (default: `node` on the PATH).
    #[arg(long, env = "JOBFENCE_NODE", default_value = "node")]
    pub node: PathBuf,
    /// Go toolchain that builds the Go worker (default: `go` on the PATH).
    #[arg(long, env = "JOBFENCE_GO", default_value = "go")]
    pub go: PathBuf,
    /// Where logs go.
    #[arg(long, default_value = ".local/demo")]
    pub work_dir: PathBuf,
    /// Serve the coordinator's Prometheus metrics on this address
    /// (default: a free loopback port, printed at the start).
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Serve the operator web console from the coordinator and keep it up
    /// after the report, with its address printed, until Ctrl-C.
    #[arg(long)]
    pub console: bool,
    /// Coordinators to run. With more than one they sit behind HAProxy
    /// (installed by scripts/demo), the workers call HAProxy, and the
    /// failures add a rolling restart of every coordinator, a SIGKILL of
    /// one, and the database cut off for a few seconds.
    #[arg(long, default_value_t = 2)]
    pub coordinators: u32,
    /// Run the coordinators without TLS and authentication. By default the
    /// demo makes throw-away credentials (a CA, the coordinators'
    /// certificate, one token per kind of caller) in <work-dir>/credentials
    /// and runs with both on.
    #[arg(long)]
    pub insecure: bool,
    /// The database is a Galera cluster: --database-url lists its nodes,
    /// comma-separated, and the coordinators write through the first. The
    /// failures then include a SIGKILL of that node under load (with
    /// --galera-script), started again afterwards.
    #[arg(long)]
    pub galera: bool,
    /// What kills and restarts a Galera node (`SCRIPT kill 1`, `SCRIPT
    /// restart 1`).
    #[arg(long, default_value = "scripts/galera")]
    pub galera_script: PathBuf,
    /// Spread the refunds over this many databases on the server of
    /// --database-url (the demo database, then `<name>_s1`, …), one queue
    /// on each (`refunds`, `refunds-1`, …), each coordinator given all of
    /// them in a shards file.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
}
