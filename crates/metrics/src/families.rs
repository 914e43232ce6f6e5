//! The metric families, registered by group: the coordinator's decisions
//! on jobs, the serving side, and what is read from the databases. Names
//! and help texts are the exposition's (docs/operating.md lists them).

use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Upper bounds of the RPC latency histogram, in seconds: every call is a
/// few short transactions, so 1 ms to 10 s (the lock wait timeout).
const RPC_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the batch-size histogram, in calls.
const BATCH_BUCKETS: [f64; 9] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
    r.register(Box::new(c.clone())).expect("unique metric name");
    c
}

/// Registers `m` in `r`.
fn registered<M: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: M) -> M {
    r.register(Box::new(m.clone())).expect("unique metric name");
    m
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.register(Box::new(g.clone())).expect("unique metric name");
    g
}

/// Counters of the coordinator's decisions on jobs (the seed's four metrics among them).
pub(crate) struct JobCounters {
    pub(crate) takeovers: IntCounterVec,
    pub(crate) stale_rejections: IntCounterVec,
    pub(crate) claimed_jobs: IntCounterVec,
    pub(crate) empty_claims: IntCounterVec,
    pub(crate) handed_on_write: IntCounterVec,
    pub(crate) commit_unknown: IntCounterVec,
    pub(crate) observations: IntCounterVec,
    pub(crate) manual_review_entered: IntCounterVec,
    pub(crate) resends: IntCounterVec,
    pub(crate) resolutions: IntCounterVec,
    pub(crate) cancellations: IntCounterVec,
}

impl JobCounters {
    pub(crate) fn register(r: &Registry) -> Self {
        JobCounters {
            takeovers: counter(
                r,
                "jobfence_takeovers_total",
                "Expired leases taken over (a new attempt fenced out the old holder), by queue and how: via=claim (inline, by a Claim scan) or via=takeover (the Takeover RPC).",
                &["queue", "via"],
            ),
            stale_rejections: counter(
                r,
                "jobfence_stale_attempt_rejections_total",
                "Writes refused because the presented attempt no longer holds the job (ATTEMPT_SUPERSEDED or JOB_NOT_RUNNING), by queue and RPC.",
                &["queue", "rpc"],
            ),
            claimed_jobs: counter(
                r,
                "jobfence_claimed_jobs_total",
                "Jobs handed out with a new attempt (Claim or Takeover), by queue and next_action (execute or reconcile). The reconcile share is reconcile / all.",
                &["queue", "next_action"],
            ),
            empty_claims: counter(
                r,
                "jobfence_empty_claims_total",
                "Claim calls that found no due job, by queue.",
                &["queue"],
            ),
            handed_on_write: counter(
                r,
                "jobfence_jobs_handed_on_write_total",
                "Jobs handed out by a Complete or Fail that asked for the worker's next job, in the write's own transaction (docs/design.md rule 16), by queue; also counted in jobfence_claimed_jobs_total.",
                &["queue"],
            ),
            commit_unknown: counter(
                r,
                "jobfence_commit_outcome_unknown_total",
                "Calls whose COMMIT outcome is unknown (connection lost during COMMIT), by RPC.",
                &["rpc"],
            ),
            observations: counter(
                r,
                "jobfence_observations_recorded_total",
                "RecordObservation calls answered, by source, outcome and duplicate (true when the dedup_key was already recorded).",
                &["source", "outcome", "duplicate"],
            ),
            manual_review_entered: counter(
                r,
                "jobfence_manual_review_entered_total",
                "Jobs moved to manual_review by Fail, by queue and reason (REQUESTED by the worker, RESEND_WINDOW_CLOSED, MAX_DISPATCHES_REACHED).",
                &["queue", "reason"],
            ),
            resends: counter(
                r,
                "jobfence_resend_decisions_total",
                "Fail with RETRY_EXECUTE, by queue and decision (allowed, or refused and moved to manual_review).",
                &["queue", "decision"],
            ),
            resolutions: counter(
                r,
                "jobfence_manual_review_resolutions_total",
                "Manual-review jobs resolved by an operator, by queue and resolution.",
                &["queue", "resolution"],
            ),
            cancellations: counter(
                r,
                "jobfence_cancellations_total",
                "Never-dispatched jobs cancelled by an operator, by queue.",
                &["queue"],
            ),
        }
    }
}

/// The serving side: call latency, calls refused before a handler ran, connections, the batching pipelines.
pub(crate) struct ServingMetrics {
    pub(crate) rpc_duration: HistogramVec,
    pub(crate) overloaded: IntCounterVec,
    pub(crate) conflict_calls: IntCounterVec,
    pub(crate) auth_refusals: IntCounterVec,
    pub(crate) admission_refusals: IntCounterVec,
    pub(crate) connections_refused: IntCounterVec,
    pub(crate) batch_size: HistogramVec,
    pub(crate) claim_waiters: IntGauge,
}

impl ServingMetrics {
    pub(crate) fn register(r: &Registry) -> Self {
        ServingMetrics {
            rpc_duration: registered(r, HistogramVec::new(
                HistogramOpts::new(
                    "jobfence_rpc_duration_seconds",
                    "Time to answer a gRPC call, in seconds, by service, method and gRPC status code (for WatchEvents: the life of the stream).",
                )
                .buckets(RPC_BUCKETS.to_vec()),
                &["service", "method", "code"],
            )
            .expect("valid histogram")),
            conflict_calls: counter(
                r,
                "jobfence_transaction_conflict_calls_total",
                "Calls answered ABORTED / TRANSACTION_CONFLICT, by method. One conflicting transaction fails every call it carried (a group commit of many Completes, coalesced Claims or Enqueues), so this counts more than jobfence_transaction_conflicts_total{outcome=\"reported\"}, which counts transactions.",
                &["method"],
            ),
            overloaded: counter(
                r,
                "jobfence_overloaded_calls_total",
                "Calls refused at once with RESOURCE_EXHAUSTED / OVERLOADED because too many calls of their pipeline already waited for the database, by pipeline.",
                &["pipeline"],
            ),
            auth_refusals: counter(
                r,
                "jobfence_auth_refusals_total",
                "Calls refused for who their caller is, by ErrorInfo reason: UNAUTHENTICATED (CREDENTIAL_MISSING, CREDENTIAL_INVALID, CREDENTIAL_EXPIRED) or PERMISSION_DENIED (ROLE_NOT_ALLOWED, QUEUE_NOT_ALLOWED, OPERATOR_MISMATCH). Nothing of a refused call was written.",
                &["reason"],
            ),
            admission_refusals: counter(
                r,
                "jobfence_admission_refusals_total",
                "Calls refused by a limit of the listener, by the limit they hit: global (--max-concurrent-calls) or caller (--max-calls-per-caller), refused at once with RESOURCE_EXHAUSTED / OVERLOADED before their request was read; request_size (--max-request-size), refused INVALID_ARGUMENT / INVALID_REQUEST.",
                &["limit"],
            ),
            connections_refused: counter(
                r,
                "jobfence_connections_refused_total",
                "gRPC connections closed at accept, during their TLS handshake, or for want of an authenticated call, by reason: max_connections (--max-connections reached), tls_handshake (failed, e.g. no client certificate under mutual TLS), tls_handshake_timeout, unauthenticated_timeout (no authenticated call within --unauthenticated-connection-timeout).",
                &["reason"],
            ),
            batch_size: registered(r, HistogramVec::new(
                HistogramOpts::new(
                    "jobfence_batch_size",
                    "Calls per database transaction of the coordinator's batching pipelines, by pipeline (write: RenewLease/Complete/Fail group commits, with or without a claim of the next job in the same transaction; a batch runs one transaction per claimed queue and one for the writes that claim nothing; claim: coalesced Claims; enqueue: coalesced Enqueues).",
                )
                .buckets(BATCH_BUCKETS.to_vec()),
                &["pipeline"],
            )
            .expect("valid histogram")),
            claim_waiters: registered(r, IntGauge::new(
                "jobfence_claim_waiters",
                "Long-polling Claims waiting for work on this coordinator, read at scrape time.",
            )
            .expect("valid gauge")),
        }
    }
}

/// What is read from the databases: pending ages, the pool, conflicts, the node in use, durability.
pub(crate) struct DatabaseGauges {
    pub(crate) pending_age: GaugeVec,
    pub(crate) unfinished_age: GaugeVec,
    pub(crate) pending_refreshes: IntCounterVec,
    pub(crate) pool_connections: IntGaugeVec,
    pub(crate) pool_max: IntGauge,
    pub(crate) conflicts: IntCounterVec,
    pub(crate) database_node: IntGaugeVec,
    pub(crate) database_durable: IntGaugeVec,
}

impl DatabaseGauges {
    pub(crate) fn register(r: &Registry) -> Self {
        DatabaseGauges {
            pending_age: gauge(
                r,
                "jobfence_oldest_pending_age_seconds",
                "Whole seconds the oldest job of a pending state has waited in it, by queue and state: ready = since it became due (jobs not yet due are left out), running = since its claim or takeover, manual_review = since it was parked. 0 when none. DB clock, refreshed on an interval.",
                &["queue", "state"],
            ),
            unfinished_age: gauge(
                r,
                "jobfence_oldest_unfinished_age_seconds",
                "Whole seconds since the creation of the oldest job of the queue not yet succeeded, failed or cancelled. 0 when none. DB clock, refreshed on an interval.",
                &["queue"],
            ),
            pending_refreshes: counter(
                r,
                "jobfence_pending_age_refreshes_total",
                "Refreshes of the pending-age gauges from the database, by result (ok or error). The gauges keep their last value while refreshes fail.",
                &["result"],
            ),
            pool_connections: registered(r, IntGaugeVec::new(
                Opts::new(
                    "jobfence_db_pool_connections",
                    "Database connections of this coordinator's pool, by state (idle or in_use), read at scrape time.",
                ),
                &["state"],
            )
            .expect("valid gauge")),
            pool_max: registered(r, IntGauge::new(
                "jobfence_db_pool_max_connections",
                "Most connections the pool may open (--db-max-connections).",
            )
            .expect("valid gauge")),
            conflicts: counter(
                r,
                "jobfence_transaction_conflicts_total",
                "Transactions the database rolled back as conflicts (deadlock, lock wait timeout, Galera certification failure), by outcome: retried inside, or reported to the caller as ABORTED / TRANSACTION_CONFLICT after the retries. Read from the stores at scrape time.",
                &["outcome"],
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
            database_durable: registered(r, IntGaugeVec::new(
                Opts::new(
                    "jobfence_database_durable",
                    "1 when the database's settings keep every acknowledged commit through a crash (docs/design.md rule 9), 0 when one of them can lose it (the log warns which) or they cannot be read. Absent until first read; read at start, then on every health check.",
                ),
                &[],
            )
            .expect("valid gauge")),
        }
    }
}
