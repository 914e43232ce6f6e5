//! The flags of `jobfence bench`.

use clap::Args;
use std::path::PathBuf;

/// Flags of `jobfence bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The database server; the benchmark creates (and drops at the end)
    /// its own database on it, named by --database.
    #[arg(
        long,
        env = "JOBFENCE_BENCH_DATABASE_URL",
        default_value = "mysql://jobfence:jobfence@127.0.0.1:3307/jobfence_bench"
    )]
    pub database_url: String,
    /// Jobs per lifecycle phase.
    #[arg(long, default_value_t = 5000)]
    pub jobs: u64,
    /// Worker counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub workers: Vec<usize>,
    /// max_jobs of the batching clients' Claims (phase 3).
    #[arg(long, default_value_t = 16)]
    pub claim_batch: u32,
    /// Jobs per transaction of the batched direct ceiling.
    #[arg(long, default_value_t = 32)]
    pub ceiling_batch: u32,
    /// Connections of the batched direct ceiling.
    #[arg(long, default_value_t = 4)]
    pub ceiling_connections: usize,
    /// Jobs of each enqueue phase.
    #[arg(long, default_value_t = 20_000)]
    pub enqueue_jobs: u64,
    /// Concurrent callers of the single-row insert and Enqueue phases.
    #[arg(long, default_value_t = 16)]
    pub enqueue_callers: usize,
    /// Items per EnqueueBatch call.
    #[arg(long, default_value_t = 500)]
    pub enqueue_batch: u64,
    /// Fairness keys of the keyed next-job phase: at the largest worker
    /// count, the next-job loop again over jobs enqueued round-robin across
    /// this many keys, beside the same loop over jobs with none (0: skip).
    #[arg(long, default_value_t = 1000)]
    pub fairness_keys: u64,
    /// Ready jobs of one fairness key in the backlog phase: the database
    /// work of one claim with 1,000 of them ready, then with this many
    /// (enqueued at about 5,000 a second; 0: skip).
    #[arg(long, default_value_t = 0)]
    pub key_backlog: u64,
    /// Also run the next-job loop (at every worker count) and the Enqueue
    /// RPC with the provider reference's index dropped (migration
    /// 20261215000001), each right after the same phase with it: what the
    /// index costs the write that records a reference, and an insert.
    #[arg(long)]
    pub compare_reference_index: bool,
    /// Load this many finished (succeeded) jobs and run the coordinator
    /// phase at the largest worker count again, to see whether claims slow
    /// down as finished rows pile up (0: skip).
    #[arg(long, default_value_t = 0)]
    pub finished_rows: u64,
    /// Load this many finished jobs past their retention and prune them
    /// while the coordinator phase runs at the largest worker count,
    /// against the same phase with them held and nobody pruning (0: skip).
    #[arg(long, default_value_t = 0)]
    pub prune_rows: u64,
    /// Lifecycle rounds (of --jobs each) of the no-pruning side of the
    /// pruning phase; the pruning side runs rounds until pruning ends.
    #[arg(long, default_value_t = 10)]
    pub prune_rounds: usize,
    /// The pruner's rest after each batch, times the batch's duration (as
    /// `jobfence serve --prune-rest`; 0: flat out).
    #[arg(long, default_value_t = jobfence_store::retention::DEFAULT_PRUNE_REST)]
    pub prune_rest: f64,
    /// Units per second of the provider budget below the load (the paced
    /// phase: how close the hand-out rate comes to it); 0 skips both
    /// budget phases.
    #[arg(long, default_value_t = 200.0)]
    pub budget_rate: f64,
    /// How long the paced phase runs, in seconds.
    #[arg(long, default_value_t = 30)]
    pub budget_seconds: u64,
    /// Report lines (and as many finished jobs) of the settlement phase,
    /// imported with `jobfence settlement import` while the workers run;
    /// 0 skips it.
    #[arg(long, default_value_t = 0)]
    pub settle_lines: u64,
    /// The settlement import's `--max-rate` (lines a second; 0: flat out).
    #[arg(long, default_value_t = 0)]
    pub settle_max_rate: u32,
    /// Ready jobs of the bulk repair phase, cancelled with `jobfence jobs
    /// bulk cancel` while --bulk-workers workers run the lifecycle on
    /// another queue, beside the same rounds with no bulk (0: skip).
    #[arg(long, default_value_t = 0)]
    pub bulk_jobs: u64,
    /// The bulk's `--batch-size`: one run of the bulk phase for each
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "500")]
    pub bulk_batch: Vec<u16>,
    /// The bulk's `--max-rate` (jobs a second; 0: flat out): one run for
    /// each, at each --bulk-batch (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub bulk_max_rate: Vec<u32>,
    /// Workers running the lifecycle beside the bulk.
    #[arg(long, default_value_t = 20)]
    pub bulk_workers: usize,
    /// Wait at most this long, in seconds, before the large-table phases
    /// for InnoDB to write back and purge what their bulk load left (the
    /// server's dirty pages and purge history, server-wide figures); 0
    /// skips the wait (a smoke run on a shared test server, whose other
    /// clients keep those figures up whatever the wait).
    #[arg(long, default_value_t = 120)]
    pub settle_seconds: u64,
    /// Run every phase this many times, interleaved (direct, coordinator,
    /// batching, direct, …), and report the median run of each.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Write the report (Markdown) to this file, e.g. docs/benchmarks.md.
    #[arg(long)]
    pub write: Option<PathBuf>,
    /// Where the coordinator's log goes.
    #[arg(long, default_value = ".local/bench")]
    pub log_dir: PathBuf,
    /// The coordinator binary (default: this one).
    #[arg(long)]
    pub coordinator_bin: Option<PathBuf>,
    /// Extra flags for `jobfence serve` (repeat, e.g.
    /// `--serve-flag=--batch-concurrency=2`).
    #[arg(long = "serve-flag", allow_hyphen_values = true)]
    pub serve_flags: Vec<String>,
}
