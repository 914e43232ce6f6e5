//! The pruner's metrics (docs/design.md rule 14, docs/operating.md
//! "Retention"): rows pruned by table, the last successful run, the age of
//! the oldest finished job still held, and the key records held.

use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// The `table` label values of the pruned-rows counter.
pub const PRUNED_TABLES: [&str; 4] = ["jobs", "job_observations", "job_events", "operation_keys"];

pub(super) struct RetentionMetrics {
    pub(super) pruned: IntCounterVec,
    pub(super) archived_jobs: IntCounter,
    pub(super) archived_bytes: IntCounter,
    pub(super) last_success: Gauge,
    pub(super) oldest_finished_age: Gauge,
    pub(super) key_records: IntGauge,
}

impl RetentionMetrics {
    pub(super) fn new(r: &Registry) -> Self {
        let pruned = IntCounterVec::new(
            Opts::new(
                "jobfence_pruned_rows_total",
                "Rows the pruner of this coordinator deleted, by table: finished jobs past their retention with their observations and events, and key records (operation_keys) past theirs.",
            ),
            &["table"],
        )
        .expect("valid counter");
        let archived_jobs = IntCounter::new(
            "jobfence_pruned_archived_jobs_total",
            "Pruned jobs this coordinator's pruner wrote to its archive (--prune-archive-dir) before deleting them, one JSON line each with its observations and events.",
        )
        .expect("valid counter");
        let archived_bytes = IntCounter::new(
            "jobfence_prune_archive_bytes_total",
            "Bytes (gzip-compressed, on disk) this coordinator's pruner wrote to its archive files.",
        )
        .expect("valid counter");
        let last_success = Gauge::new(
            "jobfence_pruner_last_success_timestamp_seconds",
            "When a pruning run last finished without an error, on any coordinator of the database (Unix seconds, DB clock; 0: never). Read after each run of this coordinator's pruner.",
        )
        .expect("valid gauge");
        let oldest_finished_age = Gauge::new(
            "jobfence_oldest_finished_job_age_seconds",
            "Age of the oldest finished job (succeeded, failed, cancelled) still held, from its finished_at (DB clock); 0 when none. Past the job retention plus the prune interval, pruning is behind.",
        )
        .expect("valid gauge");
        let key_records = IntGauge::new(
            "jobfence_operation_key_records",
            "Key records of pruned jobs held in operation_keys (what answers a retried Enqueue of a pruned key).",
        )
        .expect("valid gauge");
        r.register(Box::new(pruned.clone()))
            .expect("unique metric name");
        r.register(Box::new(archived_jobs.clone()))
            .expect("unique metric name");
        r.register(Box::new(archived_bytes.clone()))
            .expect("unique metric name");
        r.register(Box::new(last_success.clone()))
            .expect("unique metric name");
        r.register(Box::new(oldest_finished_age.clone()))
            .expect("unique metric name");
        r.register(Box::new(key_records.clone()))
            .expect("unique metric name");
        for table in PRUNED_TABLES {
            pruned.with_label_values(&[table]);
        }
        RetentionMetrics {
            pruned,
            archived_jobs,
            archived_bytes,
            last_success,
            oldest_finished_age,
            key_records,
        }
    }
}
