//! The coordinator: validates requests, applies lease bounds and per-queue
//! policy, batches concurrent calls, calls the store, and logs and counts
//! the decisions that matter (takeover, stale write rejected, resend allowed
//! or refused, moved to manual review, operator resolution). Independent of
//! tonic and of SQL (the store crate runs it); the gRPC adapters and the
//! console call it.
//!
//! - [`batcher`]: natural batching of concurrent calls (group commit of
//!   fenced writes, coalesced Claims per queue, coalesced Enqueues).
//! - [`long_poll`]: Claims that wait for work instead of polling.
//! - `writes.rs`: RenewLease, Complete and Fail.
//! - [`admin`]: the operator calls and the events feed; `bulk.rs`, an
//!   operator's action on many counted jobs (BulkRepair).
//! - [`providers`]: provider budgets and stored queue policies.
//! - [`gauges`]: the gauges read from the databases (pending ages, pools).
//! - [`retention`]: the pruner (docs/design.md rule 14).

pub mod admin;
pub mod archive;
pub mod batcher;
mod bulk;
mod claims;
mod enqueue;
pub mod gauges;
mod handoffs;
pub mod long_poll;
pub mod providers;
pub mod queue_pause;
pub mod retention;
pub mod retry;
pub mod settlement;
pub mod upgrades;
pub mod workers;
mod writes;

use batcher::{BatchSettings, Batcher};
use claims::{run_claims, ClaimResult, QueuedClaim};
use jobfence_domain::validate::{Violations, MAX_BODY_BYTES, MAX_KEY_BYTES};
use jobfence_domain::{
    CoordinatorError, Enqueue, Job, Observation, QueuePolicies, QueueScope, RecordObservation,
};
use jobfence_metrics::Metrics;
use jobfence_store::shards::Shards;
use jobfence_store::{EnqueueResult, JobStore};
use long_poll::{LongPollSettings, Waiters};
use std::sync::Arc;
use std::time::Duration;
use writes::{run_writes, QueuedWrite};

pub use claims::{ClaimParams, TakeoverParams};
pub use handoffs::Handed;
pub use writes::{check_complete, check_fail, FailParams, RenewLeaseParams};

/// Lease bounds, batch sizes, long-poll bounds and queue policies.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Lease given when a Claim or Takeover names none.
    pub default_lease: Duration,
    /// Shortest lease a caller may ask for.
    pub min_lease: Duration,
    /// Longest lease a caller may ask for.
    pub max_lease: Duration,
    /// Most jobs one Claim may take.
    pub max_claim_batch: u32,
    /// Most items one EnqueueBatch may carry.
    pub max_enqueue_batch: usize,
    /// Resend window and max dispatches, per queue.
    pub policies: QueuePolicies,
    /// How concurrent calls are batched into transactions.
    pub batching: BatchSettings,
    /// How long Claims may wait for work.
    pub long_poll: LongPollSettings,
    /// This coordinator's name, in the workers view (`--coordinator-name`;
    /// by default the host and a number unique in the process).
    pub name: String,
}

/// A name for a coordinator nobody named: the host, the process id, and a
/// number counting the coordinators of this process.
pub fn default_name() -> String {
    static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{}-{n}", host_name(), std::process::id())
}

/// This machine's host name (Linux), or `coordinator` where none is read.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "coordinator".to_owned())
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            default_lease: Duration::from_secs(30),
            min_lease: Duration::from_secs(1),
            max_lease: Duration::from_secs(3600),
            max_claim_batch: 100,
            max_enqueue_batch: 1000,
            policies: QueuePolicies::default(),
            batching: BatchSettings {
                max_batch: 64,
                concurrency: 2,
                queue_capacity: 4096,
            },
            long_poll: LongPollSettings::default(),
            name: default_name(),
        }
    }
}

/// The batching pipelines of one database: a batch is one transaction,
/// and a transaction never spans two databases.
struct DatabasePipelines {
    /// RenewLease, Complete and Fail, with or without a claim half
    /// (docs/design.md rule 16): the one write pipeline.
    writes: Batcher<QueuedWrite, writes::WriteResult>,
    claims: Batcher<QueuedClaim, ClaimResult>,
    enqueues: Batcher<Enqueue, EnqueueResult>,
}

/// The batching pipelines (one set per database, indexed like
/// [`Shards::all`]) and the long-poll waiters of one coordinator.
struct Pipelines {
    databases: Vec<DatabasePipelines>,
    waiters: Waiters,
    /// The workers that called this coordinator.
    sightings: workers::Sightings,
    /// The settlement imports it is running.
    imports: settlement::running::Running,
}

impl DatabasePipelines {
    fn spawn(store: &JobStore, config: &CoordinatorConfig, metrics: &Metrics) -> Self {
        let batching = config.batching;
        let writes = {
            let (store, policies, m) = (store.clone(), config.policies.clone(), metrics.clone());
            Batcher::spawn(
                "write",
                batching,
                metrics.batch_sizes("write"),
                move |calls: Vec<QueuedWrite>| {
                    run_writes(store.clone(), calls, policies.clone(), m.clone())
                },
            )
        };
        let claims = {
            let (store, m) = (store.clone(), metrics.clone());
            Batcher::spawn(
                "claim",
                batching,
                metrics.batch_sizes("claim"),
                move |calls: Vec<QueuedClaim>| run_claims(store.clone(), calls, m.clone()),
            )
        };
        let enqueues = {
            let store = store.clone();
            Batcher::spawn(
                "enqueue",
                batching,
                metrics.batch_sizes("enqueue"),
                move |items: Vec<Enqueue>| {
                    let store = store.clone();
                    async move {
                        match store.enqueue_batch(&items).await {
                            Ok(answers) => answers,
                            Err(e) => items.iter().map(|_| Err(e.clone())).collect(),
                        }
                    }
                },
            )
        };
        DatabasePipelines {
            writes,
            claims,
            enqueues,
        }
    }
}

/// The coordinator. Cheap to clone. Create it inside a Tokio runtime: it
/// starts its batching pipelines at once.
#[derive(Clone)]
pub struct Coordinator {
    shards: Shards,
    config: Arc<CoordinatorConfig>,
    metrics: Metrics,
    pipelines: Arc<Pipelines>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator")
            .field("config", &self.config)
            .field("databases", &self.shards.all().len())
            .finish_non_exhaustive()
    }
}

impl Coordinator {
    /// A coordinator over one database, with a fresh set of [`Metrics`] of
    /// its own.
    pub fn new(store: JobStore, config: CoordinatorConfig) -> Self {
        Self::over_shards(Shards::single(store), config)
    }

    /// A coordinator over several databases, each queue on the one its
    /// placement names (see [`jobfence_store::shards`]); run
    /// [`Shards::prepare`] first.
    pub fn over_shards(shards: Shards, config: CoordinatorConfig) -> Self {
        let metrics = Metrics::for_build(
            jobfence_store::schema::RELEASE,
            jobfence_store::schema::schema_version(),
        );
        let databases = shards
            .all()
            .iter()
            .map(|(_, store)| DatabasePipelines::spawn(store, &config, &metrics))
            .collect();
        let waiters = Waiters::new(config.long_poll);
        let sightings = workers::Sightings::new(config.name.clone());
        Coordinator {
            shards,
            config: Arc::new(config),
            metrics,
            pipelines: Arc::new(Pipelines {
                databases,
                waiters,
                sightings,
                imports: Default::default(),
            }),
        }
    }

    /// The metrics this coordinator records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store of the first database (the only one without a shards
    /// file); see [`shards`](Self::shards) for all of them.
    pub fn store(&self) -> &JobStore {
        self.shards.at(0)
    }

    /// Every database and where queues live.
    pub fn shards(&self) -> &Shards {
        &self.shards
    }

    /// The pipelines of the database of `queue`.
    fn for_queue(&self, queue: &str) -> Result<&DatabasePipelines, CoordinatorError> {
        Ok(&self.pipelines.databases[self.shards.index_for_queue(queue)?])
    }

    /// The pipelines of the database that handed out job `job_id`.
    fn for_job(&self, job_id: u64) -> Result<&DatabasePipelines, CoordinatorError> {
        Ok(&self.pipelines.databases[self.shards.index_for_id(job_id)?])
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// Starts draining: every long-polling Claim answers empty now, and no
    /// Claim waits from now on (a load balancer is moving callers away).
    pub fn drain(&self) {
        self.pipelines.waiters.drain();
    }

    /// Calls waiting for a batch, per pipeline (`write`, `claim`,
    /// `enqueue`; summed over the databases), and long-polling Claims
    /// waiting for work.
    pub fn waiting(&self) -> [(&'static str, usize); 4] {
        let p = &self.pipelines;
        let sum = |f: fn(&DatabasePipelines) -> usize| p.databases.iter().map(f).sum();
        [
            ("write", sum(|d| d.writes.waiting())),
            ("claim", sum(|d| d.claims.waiting())),
            ("enqueue", sum(|d| d.enqueues.waiting())),
            ("long_poll", p.waiters.waiting()),
        ]
    }

    fn lease(&self, v: &mut Violations, field: &str, lease: Option<Duration>) -> Duration {
        let c = &self.config;
        match lease {
            None => c.default_lease,
            Some(d) if d.is_zero() => {
                v.add(field, "must be positive");
                d
            }
            Some(d) if d < c.min_lease || d > c.max_lease => {
                v.add(
                    field,
                    format!(
                        "must be between {} and {}",
                        humantime::format_duration(c.min_lease),
                        humantime::format_duration(c.max_lease)
                    ),
                );
                d
            }
            Some(d) => d,
        }
    }

    /// RecordObservation; see [`JobStore::record_observation`] (the job's
    /// queue is checked against `scope` before anything is written).
    pub async fn record_observation(
        &self,
        req: RecordObservation,
        scope: &QueueScope,
    ) -> Result<(Observation, bool), CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.unique_key("dedup_key", &req.dedup_key);
        v.max_bytes("body", &req.body, MAX_BODY_BYTES);
        if let Some(r) = &req.provider_reference {
            v.max_bytes("provider_reference", r, MAX_KEY_BYTES);
        }
        v.finish()?;
        let recorded = self
            .shards
            .for_job(req.job_id)?
            .record_observation(&req, scope)
            .await;
        let (observation, duplicate) = match recorded {
            Ok(done) => done,
            Err(e) => {
                let e = self.explain(e, scope).await;
                self.metrics.commit_outcome("RecordObservation", &e);
                return Err(e);
            }
        };
        self.metrics
            .observation(req.source.as_str(), req.outcome.as_str(), duplicate);
        Ok((observation, duplicate))
    }

    /// GetJob; see [`JobStore::get_job`]. A job outside `scope` is
    /// refused `QueueNotAllowed` (it was read, and nothing is told).
    pub async fn get_job(
        &self,
        job_id: u64,
        scope: &QueueScope,
    ) -> Result<(Job, Vec<Observation>), CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(job_id);
        v.finish()?;
        let found = self.shards.for_job(job_id)?.get_job(job_id).await;
        let (job, observations) = match found {
            Ok(found) => found,
            Err(e) => return Err(self.explain(e, scope).await),
        };
        scope.check(&job.queue, Some(job_id))?;
        Ok((job, observations))
    }

    /// `err`, except that a job not found whose key record says it was
    /// pruned is `JobPruned` with that record (docs/design.md rule 14: a pruned
    /// job answers with a typed reason, never as if it had not existed);
    /// one outside `scope` is `QueueNotAllowed` instead, telling nothing.
    /// Costs a lookup only on the not-found path.
    pub(crate) async fn explain(
        &self,
        err: CoordinatorError,
        scope: &QueueScope,
    ) -> CoordinatorError {
        let CoordinatorError::JobNotFound { job_id } = err else {
            return err;
        };
        let Ok(store) = self.shards.for_job(job_id) else {
            return err;
        };
        match store.explain_missing(job_id).await {
            CoordinatorError::JobPruned(record) => match scope.check(&record.queue, Some(job_id)) {
                Ok(()) => CoordinatorError::JobPruned(record),
                Err(refused) => refused,
            },
            other => other,
        }
    }
}
