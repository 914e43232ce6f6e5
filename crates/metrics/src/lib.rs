//! Prometheus metrics of one coordinator process: the registry and every
//! series, without a database or a server (this crate knows neither sqlx
//! nor tonic: the coordinator records its decisions here, the server its
//! calls, and what is read from the databases is handed in).
//!
//! Each [`Metrics`] owns its own registry (no process-global state), so two
//! coordinators in one test binary never mix their numbers. Counters are
//! bumped by the coordinator at each decision; the pending-age gauges are
//! set from the database on an interval ([`Metrics::set_pending`]); the
//! pool gauges are read at scrape time ([`Metrics::set_stores`]).
//! `docs/operating.md` says what each one means and the alert to set on it.

mod families;
mod pacing;
mod providers;
mod retention;
mod settlement;
mod upgrades;
mod workers;

use families::{DatabaseGauges, JobCounters, ServingMetrics};
pub use pacing::PACED_WORK;
pub use retention::PRUNED_TABLES;
pub use settlement::SettlementReading;

use jobfence_domain::admin::PendingAges;
use jobfence_domain::CoordinatorError;
use prometheus::{Encoder, Registry, TextEncoder};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Label values of the pending-age gauge's `state`, in the order shown.
pub const PENDING_STATES: [&str; 3] = ["ready", "running", "manual_review"];

/// The metrics of one coordinator. Cheap to clone (shared).
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

struct Inner {
    registry: Registry,
    jobs: JobCounters,
    serving: ServingMetrics,
    database: DatabaseGauges,
    providers: providers::ProviderMetrics,
    pacing: pacing::PacingMetrics,
    retention: retention::RetentionMetrics,
    settlement: settlement::SettlementMetrics,
    workers: workers::WorkerMetrics,
    upgrades: upgrades::UpgradeMetrics,
    /// Every queue the gauges were ever set for: a queue whose pending jobs
    /// are all gone reads 0 instead of keeping its last value.
    seen_queues: Mutex<BTreeSet<String>>,
}

/// The RPCs whose commit can be lost (`jobfence_commit_outcome_unknown_total{rpc}`).
const COMMIT_RPCS: [&str; 11] = [
    "Claim",
    "Takeover",
    "Complete",
    "Fail",
    "RenewLease",
    "RecordObservation",
    "Enqueue",
    "EnqueueBatch",
    "ResolveManualReview",
    "CancelJob",
    "BulkRepair",
];

/// The reasons of `jobfence_auth_refusals_total`, present from the start:
/// every reason of a refusal for who the caller is (UNAUTHENTICATED or
/// PERMISSION_DENIED in errors.proto).
const AUTH_REFUSAL_REASONS: &[&str] = jobfence_api::reason::DENIALS;

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics in a registry of its own, for a build of
    /// no named release (tests).
    pub fn new() -> Self {
        Self::for_build(env!("CARGO_PKG_VERSION"), 0)
    }

    /// A fresh set of metrics in a registry of its own, for the build of
    /// `release` carrying migrations up to `schema_version`
    /// (`jobfence_build_info`).
    pub fn for_build(release: &str, schema_version: i64) -> Self {
        let r = Registry::new();
        let inner = Inner {
            jobs: JobCounters::register(&r),
            serving: ServingMetrics::register(&r),
            database: DatabaseGauges::register(&r),
            providers: providers::ProviderMetrics::new(&r),
            pacing: pacing::PacingMetrics::new(&r),
            retention: retention::RetentionMetrics::new(&r),
            settlement: settlement::SettlementMetrics::new(&r),
            workers: workers::WorkerMetrics::new(&r),
            upgrades: upgrades::UpgradeMetrics::new(&r, release, schema_version),
            registry: r,
            seen_queues: Mutex::new(BTreeSet::new()),
        };
        // Series an alert watches for any increase exist from the start, at
        // 0: increase() then sees the first lost commit or failed refresh,
        // and a dashboard shows 0 rather than "no data".
        for rpc in COMMIT_RPCS {
            inner.jobs.commit_unknown.with_label_values(&[rpc]);
        }
        for result in ["ok", "error"] {
            inner
                .database
                .pending_refreshes
                .with_label_values(&[result]);
        }
        for reason in AUTH_REFUSAL_REASONS {
            inner.serving.auth_refusals.with_label_values(&[reason]);
        }
        Metrics {
            inner: Arc::new(inner),
        }
    }

    /// A takeover of an expired lease; `via` is `claim` or `takeover`.
    pub fn takeover(&self, queue: &str, via: &str) {
        self.inner
            .jobs
            .takeovers
            .with_label_values(&[queue, via])
            .inc();
    }

    /// A write refused for a stale attempt; `rpc` is the gRPC method name.
    pub fn stale_rejection(&self, queue: &str, rpc: &str) {
        self.inner
            .jobs
            .stale_rejections
            .with_label_values(&[queue, rpc])
            .inc();
    }

    /// A job handed out with `next_action` (`execute` or `reconcile`).
    pub fn claimed(&self, queue: &str, next_action: &str) {
        self.inner
            .jobs
            .claimed_jobs
            .with_label_values(&[queue, next_action])
            .inc();
    }

    /// A job handed out for `provider` (its budget paid for it).
    pub fn provider_handout(&self, provider: &str, next_action: &str) {
        self.inner.providers.handout(provider, next_action);
    }

    /// What one claim transaction did against its provider's budget: the
    /// due jobs it held back, by cause, and the units left after it.
    pub fn provider_claim(&self, report: &jobfence_domain::budget::BudgetReport) {
        let p = &self.inner.providers;
        for (cause, n) in &report.deferred {
            p.deferred(&report.provider, *cause, *n);
        }
        p.set_units(&report.provider, report.units_left, report.in_flight);
    }

    /// A Takeover refused for the provider's budget.
    pub fn provider_deferred(&self, provider: &str, cause: jobfence_domain::budget::Holdback) {
        self.inner.providers.deferred(provider, cause, 1);
    }

    /// A worker's report of the provider's 429 / Retry-After, applied.
    pub fn provider_throttle_report(&self, provider: &str) {
        self.inner.providers.throttle_report(provider);
    }

    /// Sets the provider gauges from one read of every provider.
    pub fn set_providers(&self, records: &[jobfence_domain::providers::ProviderRecord]) {
        self.inner.providers.set_all(records);
    }

    /// A job a Complete or Fail handed out with its write (docs/design.md
    /// rule 16).
    pub fn handed_on_write(&self, queue: &str) {
        self.inner
            .jobs
            .handed_on_write
            .with_label_values(&[queue])
            .inc();
    }

    /// A Claim that found nothing due.
    pub fn empty_claim(&self, queue: &str) {
        self.inner
            .jobs
            .empty_claims
            .with_label_values(&[queue])
            .inc();
    }

    /// Counts `err` if it is a commit whose outcome is unknown, or a call
    /// refused as overloaded.
    pub fn commit_outcome(&self, rpc: &str, err: &CoordinatorError) {
        match err {
            CoordinatorError::CommitOutcomeUnknown(_) => self
                .inner
                .jobs
                .commit_unknown
                .with_label_values(&[rpc])
                .inc(),
            CoordinatorError::Overloaded { what, .. } => self
                .inner
                .serving
                .overloaded
                .with_label_values(&[what])
                .inc(),
            _ => {}
        }
    }

    /// The batch-size histogram of one pipeline (`write`, `claim`, `enqueue`).
    pub fn batch_sizes(&self, pipeline: &str) -> prometheus::Histogram {
        self.inner.serving.batch_size.with_label_values(&[pipeline])
    }

    /// Sets the number of long-polling Claims waiting now.
    pub fn set_claim_waiters(&self, n: usize) {
        self.inner
            .serving
            .claim_waiters
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A call refused for who its caller is; `reason` is the ErrorInfo
    /// reason.
    pub fn auth_refusal(&self, reason: &str) {
        self.inner
            .serving
            .auth_refusals
            .with_label_values(&[reason])
            .inc();
    }

    /// A call refused by a limit of the listener (`global`, `caller`, or
    /// `request_size`).
    pub fn overload_refusal(&self, limit: &str) {
        self.inner
            .serving
            .admission_refusals
            .with_label_values(&[limit])
            .inc();
    }

    /// A connection closed at accept or during its handshake.
    pub fn connection_refused(&self, reason: &str) {
        self.inner
            .serving
            .connections_refused
            .with_label_values(&[reason])
            .inc();
    }

    /// An answered RecordObservation.
    pub fn observation(&self, source: &str, outcome: &str, duplicate: bool) {
        let dup = if duplicate { "true" } else { "false" };
        self.inner
            .jobs
            .observations
            .with_label_values(&[source, outcome, dup])
            .inc();
    }

    /// A job moved to manual review; `reason` is `REQUESTED` or the override reason.
    pub fn manual_review_entered(&self, queue: &str, reason: &str) {
        self.inner
            .jobs
            .manual_review_entered
            .with_label_values(&[queue, reason])
            .inc();
    }

    /// A RETRY_EXECUTE decision: `allowed` or `refused`.
    pub fn resend_decision(&self, queue: &str, decision: &str) {
        self.inner
            .jobs
            .resends
            .with_label_values(&[queue, decision])
            .inc();
    }

    /// An operator's manual-review resolution.
    pub fn resolution(&self, queue: &str, resolution: &str) {
        self.inner
            .jobs
            .resolutions
            .with_label_values(&[queue, resolution])
            .inc();
    }

    /// An operator's cancellation.
    pub fn cancellation(&self, queue: &str) {
        self.inner
            .jobs
            .cancellations
            .with_label_values(&[queue])
            .inc();
    }

    /// One answered RPC and its latency in seconds.
    pub fn rpc(&self, service: &str, method: &str, code: &str, seconds: f64) {
        self.inner
            .serving
            .rpc_duration
            .with_label_values(&[service, method, code])
            .observe(seconds);
    }

    /// One call answered ABORTED / TRANSACTION_CONFLICT (the only reason
    /// with that code), by method.
    pub fn conflict_call(&self, method: &str) {
        self.inner
            .serving
            .conflict_calls
            .with_label_values(&[method])
            .inc();
    }

    /// Counts the rows one pruning run deleted (see
    /// [`retention::PRUNED_TABLES`](crate::PRUNED_TABLES)) and the jobs and
    /// bytes it archived first.
    pub fn pruned(&self, counts: &jobfence_domain::PruneCounts) {
        let r = &self.inner.retention;
        for (table, n) in [
            ("jobs", counts.jobs),
            ("job_observations", counts.observations),
            ("job_events", counts.events),
            ("operation_keys", counts.keys_pruned),
        ] {
            r.pruned.with_label_values(&[table]).inc_by(n);
        }
        r.archived_jobs.inc_by(counts.archived_jobs);
        r.archived_bytes.inc_by(counts.archived_bytes);
    }

    /// Counts a settlement batch's lines: written new, updated, left
    /// unchanged, and refused.
    pub fn settlement_lines(
        &self,
        provider: &str,
        counts: jobfence_domain::settlement::records::LineCounts,
        refused: u64,
    ) {
        let c = &self.inner.settlement.lines;
        for (result, n) in [
            ("new", counts.new),
            ("updated", counts.updated),
            ("unchanged", counts.unchanged),
            ("refused", refused),
        ] {
            c.with_label_values(&[provider, result]).inc_by(n);
        }
    }

    /// Counts manual reviews a settlement import resolved.
    pub fn settlement_resolved(&self, provider: &str, n: u64) {
        self.inner
            .settlement
            .resolved
            .with_label_values(&[provider])
            .inc_by(n);
    }

    /// Sets the settlement gauges from the databases' readings.
    pub fn set_settlement(&self, readings: &[SettlementReading]) {
        self.inner.settlement.set(readings);
    }

    /// Sets the retention gauges from a read after a run: the last
    /// successful run (Unix seconds; `None`: never), the oldest finished
    /// job's age in seconds (`None`: none held), the key records held.
    pub fn set_retention(&self, last_run: Option<f64>, oldest_finished: Option<f64>, keys: u64) {
        let r = &self.inner.retention;
        r.last_success.set(last_run.unwrap_or(0.0));
        r.oldest_finished_age.set(oldest_finished.unwrap_or(0.0));
        r.key_records.set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// Whether the database's settings keep every acknowledged commit
    /// through a crash (see `domain::durability`).
    pub fn set_database_durable(&self, durable: bool) {
        self.inner
            .database
            .database_durable
            .with_label_values(&[] as &[&str])
            .set(i64::from(durable));
    }

    /// Sets the pending-age gauges from one database read. Queues seen
    /// before but absent now read 0.
    pub fn set_pending(&self, ages: &PendingAges) {
        let mut seen = self.inner.seen_queues.lock().expect("metrics poisoned");
        seen.extend(ages.queues.keys().cloned());
        for queue in seen.iter() {
            let q = ages.queues.get(queue);
            for (i, state) in PENDING_STATES.iter().enumerate() {
                let secs = q.and_then(|q| q.oldest[i]).map_or(0, |o| o.age.as_secs());
                self.inner
                    .database
                    .pending_age
                    .with_label_values(&[queue.as_str(), state])
                    .set(secs as f64);
            }
            let unfinished = q.and_then(|q| q.unfinished).map_or(0, |d| d.as_secs());
            self.inner
                .database
                .unfinished_age
                .with_label_values(&[queue.as_str()])
                .set(unfinished as f64);
        }
    }

    /// Sets what the stores count themselves, read now by the caller (the
    /// coordinator's `gauges::read_stores`): the node each database is
    /// reached through, the pool gauges and the conflict counters.
    pub fn set_stores(&self, read: &StoreReadings) {
        let i = &self.inner;
        for (database, node) in &read.nodes {
            i.database
                .database_node
                .with_label_values(&[database.to_string().as_str()])
                .set(i64::try_from(*node).unwrap_or(i64::MAX));
        }
        let (size, idle) = (read.connections as i64, read.idle as i64);
        i.database
            .pool_connections
            .with_label_values(&["idle"])
            .set(idle);
        i.database
            .pool_connections
            .with_label_values(&["in_use"])
            .set((size - idle).max(0));
        i.database.pool_max.set(read.max_connections as i64);
        for (outcome, total) in [("retried", read.retried), ("reported", read.reported)] {
            let c = i.database.conflicts.with_label_values(&[outcome]);
            c.inc_by(total.saturating_sub(c.get()));
        }
    }

    /// Counts one refresh of the pending-age gauges (`ok` or not).
    pub fn pending_refreshed(&self, ok: bool) {
        self.inner
            .database
            .pending_refreshes
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// The exposition text (Prometheus text format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.inner.registry.gather(), &mut out)
            .expect("text encoding into memory cannot fail");
        String::from_utf8(out).expect("the text encoder writes UTF-8")
    }
}

/// What the stores count themselves, summed over the databases (each on
/// its current node), for [`Metrics::set_stores`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreReadings {
    /// `(database number, node index)`: the node of its URL list each
    /// database is reached through now (0 = the first).
    pub nodes: Vec<(u32, usize)>,
    /// Connections open in the pools.
    pub connections: u64,
    /// Of them, idle.
    pub idle: u64,
    /// Most connections the pools may open.
    pub max_connections: u64,
    /// Transactions rolled back as conflicts and run again.
    pub retried: u64,
    /// Transactions rolled back as conflicts and reported to the caller.
    pub reported: u64,
}
