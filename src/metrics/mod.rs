//! Prometheus metrics of one coordinator process.
//!
//! Each [`Metrics`] owns its own registry (no process-global state), so two
//! coordinators in one test binary never mix their numbers. Counters are
//! bumped by the coordinator at each decision; the pending-age gauges are
//! computed from the database by [`refresh_pending`] on an interval; the
//! pool gauges are read at scrape time. `docs/operating.md` says what each
//! one means and the alert to set on it.
//!
//! - [`layer`]: the RPC latency histogram, as a tower layer on the server.
//! - [`http`]: the `/metrics` HTTP endpoint.

pub mod http;
pub mod layer;
mod providers;

use crate::domain::admin::PendingAges;
use crate::domain::CoordinatorError;
use crate::store::shards::Shards;
use crate::store::JobStore;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use sqlx::mysql::MySqlPool;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// Label values of the pending-age gauge's `state`, in the order shown.
pub const PENDING_STATES: [&str; 3] = ["ready", "running", "manual_review"];

/// Upper bounds of the RPC latency histogram, in seconds: every call is a
/// few short transactions, so 1 ms to 10 s (the lock wait timeout).
const RPC_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the batch-size histogram, in calls.
const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

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
    takeovers: IntCounterVec,
    stale_rejections: IntCounterVec,
    claimed_jobs: IntCounterVec,
    empty_claims: IntCounterVec,
    commit_unknown: IntCounterVec,
    observations: IntCounterVec,
    manual_review_entered: IntCounterVec,
    resends: IntCounterVec,
    resolutions: IntCounterVec,
    cancellations: IntCounterVec,
    rpc_duration: HistogramVec,
    pending_age: GaugeVec,
    unfinished_age: GaugeVec,
    pending_refreshes: IntCounterVec,
    pool_connections: IntGaugeVec,
    pool_max: IntGauge,
    conflicts: IntCounterVec,
    database_node: IntGaugeVec,
    batch_size: HistogramVec,
    overloaded: IntCounterVec,
    claim_waiters: IntGauge,
    auth_refusals: IntCounterVec,
    admission_refusals: IntCounterVec,
    connections_refused: IntCounterVec,
    /// No label; absent until the settings were first read.
    database_durable: IntGaugeVec,
    providers: providers::ProviderMetrics,
    /// Every queue the gauges were ever set for: a queue whose pending jobs
    /// are all gone reads 0 instead of keeping its last value.
    seen_queues: Mutex<BTreeSet<String>>,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(Box::new(c.clone())).expect("unique metric name");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric name");
    g
}

/// The RPCs whose commit can be lost (`jobfence_commit_outcome_unknown_total{rpc}`).
const COMMIT_RPCS: [&str; 10] = [
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
    /// A fresh set of metrics in a registry of its own.
    pub fn new() -> Self {
        let r = Registry::new();
        let rpc_duration = HistogramVec::new(
            HistogramOpts::new(
                "jobfence_rpc_duration_seconds",
                "Time to answer a gRPC call, in seconds, by service, method and gRPC status code (for WatchEvents: the life of the stream).",
            )
            .buckets(RPC_BUCKETS.to_vec()),
            &["service", "method", "code"],
        )
        .expect("valid histogram");
        r.register(Box::new(rpc_duration.clone()))
            .expect("unique metric name");
        let pool_connections = IntGaugeVec::new(
            Opts::new(
                "jobfence_db_pool_connections",
                "Database connections of this coordinator's pool, by state (idle or in_use), read at scrape time.",
            ),
            &["state"],
        )
        .expect("valid gauge");
        r.register(Box::new(pool_connections.clone()))
            .expect("unique metric name");
        let pool_max = IntGauge::new(
            "jobfence_db_pool_max_connections",
            "Most connections the pool may open (--db-max-connections).",
        )
        .expect("valid gauge");
        r.register(Box::new(pool_max.clone()))
            .expect("unique metric name");
        let batch_size = HistogramVec::new(
            HistogramOpts::new(
                "jobfence_batch_size",
                "Calls per database transaction of the coordinator's batching pipelines, by pipeline (write: Complete/Fail/RenewLease group commits; claim: coalesced Claims; enqueue: coalesced Enqueues).",
            )
            .buckets(BATCH_BUCKETS.to_vec()),
            &["pipeline"],
        )
        .expect("valid histogram");
        r.register(Box::new(batch_size.clone()))
            .expect("unique metric name");
        let claim_waiters = IntGauge::new(
            "jobfence_claim_waiters",
            "Long-polling Claims waiting for work on this coordinator, read at scrape time.",
        )
        .expect("valid gauge");
        r.register(Box::new(claim_waiters.clone()))
            .expect("unique metric name");
        let database_durable = IntGaugeVec::new(
            Opts::new(
                "jobfence_database_durable",
                "1 when the database's settings keep every acknowledged commit through a crash (DESIGN.md rule 9), 0 when one of them can lose it (the log warns which) or they cannot be read. Absent until first read; read at start, then on every health check.",
            ),
            &[],
        )
        .expect("valid gauge");
        r.register(Box::new(database_durable.clone()))
            .expect("unique metric name");
        let inner = Inner {
            overloaded: counter(
                &r,
                "jobfence_overloaded_calls_total",
                "Calls refused at once with RESOURCE_EXHAUSTED / OVERLOADED because too many calls of their pipeline already waited for the database, by pipeline.",
                &["pipeline"],
            ),
            batch_size,
            claim_waiters,
            auth_refusals: counter(
                &r,
                "jobfence_auth_refusals_total",
                "Calls refused for who their caller is, by ErrorInfo reason: UNAUTHENTICATED (CREDENTIAL_MISSING, CREDENTIAL_INVALID, CREDENTIAL_EXPIRED) or PERMISSION_DENIED (ROLE_NOT_ALLOWED, QUEUE_NOT_ALLOWED, OPERATOR_MISMATCH). Nothing of a refused call was written.",
                &["reason"],
            ),
            admission_refusals: counter(
                &r,
                "jobfence_admission_refusals_total",
                "Calls refused by a limit of the listener, by the limit they hit: global (--max-concurrent-calls) or caller (--max-calls-per-caller), refused at once with RESOURCE_EXHAUSTED / OVERLOADED before their request was read; request_size (--max-request-size), refused INVALID_ARGUMENT / INVALID_REQUEST.",
                &["limit"],
            ),
            connections_refused: counter(
                &r,
                "jobfence_connections_refused_total",
                "gRPC connections closed at accept, during their TLS handshake, or for want of an authenticated call, by reason: max_connections (--max-connections reached), tls_handshake (failed, e.g. no client certificate under mutual TLS), tls_handshake_timeout, unauthenticated_timeout (no authenticated call within --unauthenticated-connection-timeout).",
                &["reason"],
            ),
            takeovers: counter(
                &r,
                "jobfence_takeovers_total",
                "Expired leases taken over (a new attempt fenced out the old holder), by queue and how: via=claim (inline, by a Claim scan) or via=takeover (the Takeover RPC).",
                &["queue", "via"],
            ),
            stale_rejections: counter(
                &r,
                "jobfence_stale_attempt_rejections_total",
                "Writes refused because the presented attempt no longer holds the job (ATTEMPT_SUPERSEDED or JOB_NOT_RUNNING), by queue and RPC.",
                &["queue", "rpc"],
            ),
            claimed_jobs: counter(
                &r,
                "jobfence_claimed_jobs_total",
                "Jobs handed out with a new attempt (Claim or Takeover), by queue and next_action (execute or reconcile). The reconcile share is reconcile / all.",
                &["queue", "next_action"],
            ),
            empty_claims: counter(
                &r,
                "jobfence_empty_claims_total",
                "Claim calls that found no due job, by queue.",
                &["queue"],
            ),
            commit_unknown: counter(
                &r,
                "jobfence_commit_outcome_unknown_total",
                "Calls whose COMMIT outcome is unknown (connection lost during COMMIT), by RPC.",
                &["rpc"],
            ),
            observations: counter(
                &r,
                "jobfence_observations_recorded_total",
                "RecordObservation calls answered, by source, outcome and duplicate (true when the dedup_key was already recorded).",
                &["source", "outcome", "duplicate"],
            ),
            manual_review_entered: counter(
                &r,
                "jobfence_manual_review_entered_total",
                "Jobs moved to manual_review by Fail, by queue and reason (REQUESTED by the worker, RESEND_WINDOW_CLOSED, MAX_DISPATCHES_REACHED).",
                &["queue", "reason"],
            ),
            resends: counter(
                &r,
                "jobfence_resend_decisions_total",
                "Fail with RETRY_EXECUTE, by queue and decision (allowed, or refused and moved to manual_review).",
                &["queue", "decision"],
            ),
            resolutions: counter(
                &r,
                "jobfence_manual_review_resolutions_total",
                "Manual-review jobs resolved by an operator, by queue and resolution.",
                &["queue", "resolution"],
            ),
            cancellations: counter(
                &r,
                "jobfence_cancellations_total",
                "Never-dispatched jobs cancelled by an operator, by queue.",
                &["queue"],
            ),
            pending_age: gauge(
                &r,
                "jobfence_oldest_pending_age_seconds",
                "Whole seconds the oldest job of a pending state has waited in it, by queue and state: ready = since it became due (jobs not yet due are left out), running = since its claim or takeover, manual_review = since it was parked. 0 when none. DB clock, refreshed on an interval.",
                &["queue", "state"],
            ),
            unfinished_age: gauge(
                &r,
                "jobfence_oldest_unfinished_age_seconds",
                "Whole seconds since the creation of the oldest job of the queue not yet succeeded, failed or cancelled. 0 when none. DB clock, refreshed on an interval.",
                &["queue"],
            ),
            database_node: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "jobfence_database_node",
                        "Which node of its --database-url list each database is reached through now (0 = the first), by database number; read at scrape time. It changes when the node in use stops answering or leaves the Galera primary component, and back when an earlier node is synced again.",
                    ),
                    &["database"],
                )
                .expect("valid gauge");
                r.register(Box::new(g.clone())).expect("unique metric name");
                g
            },
            conflicts: counter(
                &r,
                "jobfence_transaction_conflicts_total",
                "Transactions the database rolled back as conflicts (deadlock, lock wait timeout, Galera certification failure), by outcome: retried inside, or reported to the caller as ABORTED / TRANSACTION_CONFLICT after the retries. Read from the stores at scrape time.",
                &["outcome"],
            ),
            pending_refreshes: counter(
                &r,
                "jobfence_pending_age_refreshes_total",
                "Refreshes of the pending-age gauges from the database, by result (ok or error). The gauges keep their last value while refreshes fail.",
                &["result"],
            ),
            rpc_duration,
            pool_connections,
            pool_max,
            database_durable,
            providers: providers::ProviderMetrics::new(&r),
            registry: r,
            seen_queues: Mutex::new(BTreeSet::new()),
        };
        // Series an alert watches for any increase exist from the start, at
        // 0: increase() then sees the first lost commit or failed refresh,
        // and a dashboard shows 0 rather than "no data".
        for rpc in COMMIT_RPCS {
            inner.commit_unknown.with_label_values(&[rpc]);
        }
        for result in ["ok", "error"] {
            inner.pending_refreshes.with_label_values(&[result]);
        }
        for reason in AUTH_REFUSAL_REASONS {
            inner.auth_refusals.with_label_values(&[reason]);
        }
        Metrics {
            inner: Arc::new(inner),
        }
    }

    /// A takeover of an expired lease; `via` is `claim` or `takeover`.
    pub fn takeover(&self, queue: &str, via: &str) {
        self.inner.takeovers.with_label_values(&[queue, via]).inc();
    }

    /// A write refused for a stale attempt; `rpc` is the gRPC method name.
    pub fn stale_rejection(&self, queue: &str, rpc: &str) {
        self.inner
            .stale_rejections
            .with_label_values(&[queue, rpc])
            .inc();
    }

    /// A job handed out with `next_action` (`execute` or `reconcile`).
    pub fn claimed(&self, queue: &str, next_action: &str) {
        self.inner
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
    pub fn provider_claim(&self, report: &crate::domain::budget::BudgetReport) {
        let p = &self.inner.providers;
        for (cause, n) in &report.deferred {
            p.deferred(&report.provider, *cause, *n);
        }
        p.set_units(&report.provider, report.units_left, report.in_flight);
    }

    /// A Takeover refused for the provider's budget.
    pub fn provider_deferred(&self, provider: &str, cause: crate::domain::budget::Holdback) {
        self.inner.providers.deferred(provider, cause, 1);
    }

    /// A worker's report of the provider's 429 / Retry-After, applied.
    pub fn provider_throttle_report(&self, provider: &str) {
        self.inner.providers.throttle_report(provider);
    }

    /// Sets the provider gauges from one read of every provider.
    pub fn set_providers(&self, records: &[crate::domain::providers::ProviderRecord]) {
        self.inner.providers.set_all(records);
    }

    /// A Claim that found nothing due.
    pub fn empty_claim(&self, queue: &str) {
        self.inner.empty_claims.with_label_values(&[queue]).inc();
    }

    /// Counts `err` if it is a commit whose outcome is unknown, or a call
    /// refused as overloaded.
    pub fn commit_outcome(&self, rpc: &str, err: &CoordinatorError) {
        match err {
            CoordinatorError::CommitOutcomeUnknown(_) => {
                self.inner.commit_unknown.with_label_values(&[rpc]).inc()
            }
            CoordinatorError::Overloaded { what, .. } => {
                self.inner.overloaded.with_label_values(&[what]).inc()
            }
            _ => {}
        }
    }

    /// The batch-size histogram of one pipeline (`write`, `claim`, `enqueue`).
    pub fn batch_sizes(&self, pipeline: &str) -> prometheus::Histogram {
        self.inner.batch_size.with_label_values(&[pipeline])
    }

    /// Sets the number of long-polling Claims waiting now.
    pub fn set_claim_waiters(&self, n: usize) {
        self.inner
            .claim_waiters
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A call refused for who its caller is; `reason` is the ErrorInfo
    /// reason.
    pub fn auth_refusal(&self, reason: &str) {
        self.inner.auth_refusals.with_label_values(&[reason]).inc();
    }

    /// A call refused by a limit of the listener (`global`, `caller`, or
    /// `request_size`).
    pub fn overload_refusal(&self, limit: &str) {
        self.inner
            .admission_refusals
            .with_label_values(&[limit])
            .inc();
    }

    /// A connection closed at accept or during its handshake.
    pub fn connection_refused(&self, reason: &str) {
        self.inner
            .connections_refused
            .with_label_values(&[reason])
            .inc();
    }

    /// An answered RecordObservation.
    pub fn observation(&self, source: &str, outcome: &str, duplicate: bool) {
        let dup = if duplicate { "true" } else { "false" };
        self.inner
            .observations
            .with_label_values(&[source, outcome, dup])
            .inc();
    }

    /// A job moved to manual review; `reason` is `REQUESTED` or the override reason.
    pub fn manual_review_entered(&self, queue: &str, reason: &str) {
        self.inner
            .manual_review_entered
            .with_label_values(&[queue, reason])
            .inc();
    }

    /// A RETRY_EXECUTE decision: `allowed` or `refused`.
    pub fn resend_decision(&self, queue: &str, decision: &str) {
        self.inner
            .resends
            .with_label_values(&[queue, decision])
            .inc();
    }

    /// An operator's manual-review resolution.
    pub fn resolution(&self, queue: &str, resolution: &str) {
        self.inner
            .resolutions
            .with_label_values(&[queue, resolution])
            .inc();
    }

    /// An operator's cancellation.
    pub fn cancellation(&self, queue: &str) {
        self.inner.cancellations.with_label_values(&[queue]).inc();
    }

    /// One answered RPC and its latency in seconds.
    pub fn rpc(&self, service: &str, method: &str, code: &str, seconds: f64) {
        self.inner
            .rpc_duration
            .with_label_values(&[service, method, code])
            .observe(seconds);
    }

    /// Whether the database's settings keep every acknowledged commit
    /// through a crash (see `domain::durability`).
    pub fn set_database_durable(&self, durable: bool) {
        self.inner
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
                    .pending_age
                    .with_label_values(&[queue.as_str(), state])
                    .set(secs as f64);
            }
            let unfinished = q.and_then(|q| q.unfinished).map_or(0, |d| d.as_secs());
            self.inner
                .unfinished_age
                .with_label_values(&[queue.as_str()])
                .set(unfinished as f64);
        }
    }

    /// Reads what the stores count themselves, now: the pool gauges
    /// (summed over the databases, each on its current node) and the
    /// conflict counters.
    pub fn read_stores(&self, shards: &Shards) {
        let (mut size, mut idle, mut max, mut retried, mut reported) = (0i64, 0i64, 0i64, 0, 0);
        for (n, store) in shards.all() {
            self.inner
                .database_node
                .with_label_values(&[n.to_string().as_str()])
                .set(store.current_node() as i64);
            let pool = store.pool();
            size += i64::from(pool.size());
            idle += i64::try_from(pool.num_idle()).unwrap_or(i64::MAX);
            max += i64::from(pool.options().get_max_connections());
            let (r, p) = store.conflicts();
            retried += r;
            reported += p;
        }
        let i = &self.inner;
        i.pool_connections.with_label_values(&["idle"]).set(idle);
        i.pool_connections
            .with_label_values(&["in_use"])
            .set((size - idle).max(0));
        i.pool_max.set(max);
        for (outcome, total) in [("retried", retried), ("reported", reported)] {
            let c = i.conflicts.with_label_values(&[outcome]);
            c.inc_by(total.saturating_sub(c.get()));
        }
    }

    /// The exposition text (Prometheus text format 0.0.4), with the pool
    /// gauges read from `pool` now.
    pub fn render(&self, pool: Option<&MySqlPool>) -> String {
        if let Some(pool) = pool {
            let size = i64::from(pool.size());
            let idle = i64::try_from(pool.num_idle()).unwrap_or(i64::MAX);
            let i = &self.inner;
            i.pool_connections.with_label_values(&["idle"]).set(idle);
            i.pool_connections
                .with_label_values(&["in_use"])
                .set((size - idle).max(0));
            i.pool_max
                .set(i64::from(pool.options().get_max_connections()));
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.inner.registry.gather(), &mut out)
            .expect("text encoding into memory cannot fail");
        String::from_utf8(out).expect("the text encoder writes UTF-8")
    }
}

/// Reads the pending ages from the database and sets the gauges. An error
/// is counted and logged; the gauges keep their last values.
pub async fn refresh_pending(store: &JobStore, metrics: &Metrics) -> Result<(), CoordinatorError> {
    record_pending(store.pending_ages().await, metrics)
}

/// [`refresh_pending`] over every database of a coordinator (the oldest of
/// each queue wins).
pub async fn refresh_pending_all(
    shards: &Shards,
    metrics: &Metrics,
) -> Result<(), CoordinatorError> {
    record_pending(shards.pending_ages().await, metrics)
}

fn record_pending(
    ages: Result<PendingAges, CoordinatorError>,
    metrics: &Metrics,
) -> Result<(), CoordinatorError> {
    match ages {
        Ok(ages) => {
            metrics.set_pending(&ages);
            metrics
                .inner
                .pending_refreshes
                .with_label_values(&["ok"])
                .inc();
            Ok(())
        }
        Err(e) => {
            metrics
                .inner
                .pending_refreshes
                .with_label_values(&["error"])
                .inc();
            tracing::warn!(error = %e, "pending-age gauges not refreshed");
            Err(e)
        }
    }
}
