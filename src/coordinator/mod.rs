//! The coordinator: validates requests, applies lease bounds and per-queue
//! policy, batches concurrent calls, calls the store, and logs and counts
//! the decisions that matter (takeover, stale write rejected, resend allowed
//! or refused, moved to manual review, operator resolution). Independent of
//! tonic; the gRPC adapters in `grpc` call it.
//!
//! - [`batcher`]: natural batching of concurrent calls (group commit of
//!   fenced writes, coalesced Claims per queue, coalesced Enqueues).
//! - [`long_poll`]: Claims that wait for work instead of polling.
//! - `writes.rs`: RenewLease, Complete and Fail.
//! - [`admin`]: the operator calls and the events feed.
//! - [`providers`]: provider budgets and stored queue policies.

pub mod admin;
pub mod batcher;
pub mod gauges;
pub mod long_poll;
pub mod providers;
mod writes;

use crate::domain::validate::{Violations, MAX_BODY_BYTES, MAX_KEY_BYTES};
use crate::domain::{
    ClaimSlot, ClaimedJob, CoordinatorError, EnqueueOutcome, EnqueueRequest, Job, NextAction,
    Observation, QueuePolicies, QueuePolicy, QueueScope, RecordObservationRequest, ScopedWrite,
    TakeoverRequest,
};
use crate::metrics::Metrics;
use crate::store::shards::Shards;
use crate::store::{EnqueueResult, JobStore, WriteResult, MAX_CLAIM_TRANSACTION_JOBS};
use batcher::{BatchSettings, Batcher};
use long_poll::{LongPollSettings, Waiters, Wake};
use std::sync::Arc;
use std::time::Duration;

pub use writes::{Fail, RenewLease};

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
        }
    }
}

/// Claim input before defaults: `lease: None` means the default lease,
/// `wait` zero means answer at once.
#[derive(Debug, Clone)]
pub struct Claim {
    pub queue: String,
    pub worker_id: String,
    pub max_jobs: u32,
    pub lease: Option<Duration>,
    /// How long to wait for work when none is due (long poll); cut to
    /// the server's maximum.
    pub wait: Duration,
}

/// Takeover input before defaults.
#[derive(Debug, Clone)]
pub struct Takeover {
    pub job_id: u64,
    pub worker_id: String,
    pub lease: Option<Duration>,
}

/// One caller's share of a coalesced claim.
struct ClaimCall {
    queue: String,
    policy: QueuePolicy,
    slot: ClaimSlot,
    want_next_due: bool,
}

/// What a coalesced claim gave one caller: its jobs, and when the queue's
/// next job is due if it was asked for.
type ClaimAnswer = Result<(Vec<ClaimedJob>, Option<Duration>), CoordinatorError>;

/// The batching pipelines of one database: a batch is one transaction,
/// and a transaction never spans two databases.
struct DatabasePipelines {
    writes: Batcher<ScopedWrite, WriteResult>,
    claims: Batcher<ClaimCall, ClaimAnswer>,
    enqueues: Batcher<EnqueueRequest, EnqueueResult>,
}

/// The batching pipelines (one set per database, indexed like
/// [`Shards::all`]) and the long-poll waiters of one coordinator.
struct Pipelines {
    databases: Vec<DatabasePipelines>,
    waiters: Waiters,
}

impl DatabasePipelines {
    fn spawn(store: &JobStore, config: &CoordinatorConfig, metrics: &Metrics) -> Self {
        let batching = config.batching;
        let writes = {
            let (store, policies) = (store.clone(), config.policies.clone());
            Batcher::spawn(
                "write",
                batching,
                metrics.batch_sizes("write"),
                move |writes: Vec<ScopedWrite>| {
                    let (store, policies) = (store.clone(), policies.clone());
                    async move { store.write_scoped_batch(&writes, &policies).await }
                },
            )
        };
        let claims = {
            let (store, m) = (store.clone(), metrics.clone());
            Batcher::spawn(
                "claim",
                batching,
                metrics.batch_sizes("claim"),
                move |calls: Vec<ClaimCall>| run_claims(store.clone(), calls, m.clone()),
            )
        };
        let enqueues = {
            let store = store.clone();
            Batcher::spawn(
                "enqueue",
                batching,
                metrics.batch_sizes("enqueue"),
                move |items: Vec<EnqueueRequest>| {
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
    /// placement names (see [`crate::store::shards`]); run
    /// [`Shards::prepare`] first.
    pub fn over_shards(shards: Shards, config: CoordinatorConfig) -> Self {
        let metrics = Metrics::new();
        let databases = shards
            .all()
            .iter()
            .map(|(_, store)| DatabasePipelines::spawn(store, &config, &metrics))
            .collect();
        let waiters = Waiters::new(config.long_poll);
        Coordinator {
            shards,
            config: Arc::new(config),
            metrics,
            pipelines: Arc::new(Pipelines { databases, waiters }),
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

    /// Enqueue; see [`JobStore::enqueue`]. Concurrent Enqueues share one
    /// transaction. `QueueNotAllowed` when `scope` does not cover the
    /// queue (after validation; nothing written).
    pub async fn enqueue(
        &self,
        req: EnqueueRequest,
        scope: &QueueScope,
    ) -> Result<EnqueueOutcome, CoordinatorError> {
        let mut v = Violations::default();
        check_enqueue(&mut v, "", &req);
        v.finish()?;
        scope.check(&req.queue, None)?;
        let out = self
            .for_queue(&req.queue)?
            .enqueues
            .submit(req)
            .await
            .and_then(|r| r)
            .inspect_err(|e| self.metrics.commit_outcome("Enqueue", e))?;
        self.enqueued(&out);
        tracing::debug!(job_id = out.job.id, created = out.created, "enqueued");
        Ok(out)
    }

    /// EnqueueBatch: every item is checked first, and a batch with any bad
    /// item is refused whole (INVALID_ARGUMENT naming `items[i].field` for
    /// each problem; nothing written). Otherwise one transaction per
    /// database its queues live on, and each item gets its own answer, as a
    /// single Enqueue would (created, the same request again, or
    /// `OperationKeyConflict`). A batch with any item outside `scope` is
    /// refused whole (`QueueNotAllowed`, nothing written). With several databases an outer error
    /// (nothing written, or the commit's outcome unknown) is that of the
    /// first database that failed; the others' items may have been
    /// written, and an Enqueue again is answered `created=false`.
    pub async fn enqueue_batch(
        &self,
        items: Vec<EnqueueRequest>,
        scope: &QueueScope,
    ) -> Result<Vec<Result<EnqueueOutcome, CoordinatorError>>, CoordinatorError> {
        let mut v = Violations::default();
        self.check_enqueue_batch(&items, &mut v);
        let mut by_database: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for (i, item) in items.iter().enumerate() {
            match self.shards.index_for_queue(&item.queue) {
                Ok(d) => by_database.entry(d).or_default().push(i),
                Err(CoordinatorError::InvalidArgument(why)) => {
                    for f in why {
                        v.add(&format!("items[{i}].{}", f.field), f.description);
                    }
                }
                Err(other) => return Err(other),
            }
        }
        v.finish()?;
        for item in &items {
            scope.check(&item.queue, None)?;
        }
        let mut answers: Vec<Option<Result<EnqueueOutcome, CoordinatorError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut failed = None;
        for (d, which) in by_database {
            let part: Vec<EnqueueRequest> = which.iter().map(|&i| items[i].clone()).collect();
            match self.shards.at(d).enqueue_batch(&part).await {
                Ok(done) => {
                    for (i, answer) in which.into_iter().zip(done) {
                        answers[i] = Some(answer);
                    }
                }
                Err(e) => {
                    self.metrics.commit_outcome("EnqueueBatch", &e);
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let answers: Vec<_> = answers
            .into_iter()
            .map(|a| a.expect("every item answered"))
            .collect();
        for out in answers.iter().flatten() {
            self.enqueued(out);
        }
        Ok(answers)
    }

    /// Adds the limits an EnqueueBatch of `items` breaks to `v` (fields
    /// named `items[i].field`).
    pub fn check_enqueue_batch(&self, items: &[EnqueueRequest], v: &mut Violations) {
        if items.is_empty() {
            v.add("items", "must hold at least one item");
        } else if items.len() > self.config.max_enqueue_batch {
            v.add(
                "items",
                format!(
                    "must hold at most {} items (got {})",
                    self.config.max_enqueue_batch,
                    items.len()
                ),
            );
        }
        for (i, item) in items.iter().enumerate() {
            check_enqueue(v, &format!("items[{i}]."), item);
        }
    }

    /// Wakes long-polling Claims of a new job's queue when it is due.
    fn enqueued(&self, out: &EnqueueOutcome) {
        if out.created {
            let due = (out.job.run_at - out.job.created_at)
                .to_std()
                .unwrap_or_default();
            self.pipelines.waiters.due_in(&out.job.queue, due);
        }
    }

    /// Claim: up to `max_jobs` jobs of the queue (see
    /// [`JobStore::claim_batch`]); concurrent Claims of a queue share one
    /// claim transaction. With a `wait`, a Claim that finds nothing waits
    /// for work (see [`long_poll`]) and answers empty only when the wait
    /// ends or the coordinator drains. `QueueNotAllowed` when `scope` does
    /// not cover the queue.
    pub async fn claim(
        &self,
        req: Claim,
        scope: &QueueScope,
    ) -> Result<Vec<ClaimedJob>, CoordinatorError> {
        let mut v = Violations::default();
        v.queue("queue", &req.queue);
        v.key("worker_id", &req.worker_id);
        if req.max_jobs == 0 || req.max_jobs > self.config.max_claim_batch {
            v.add(
                "max_jobs",
                format!("must be between 1 and {}", self.config.max_claim_batch),
            );
        }
        let lease = self.lease(&mut v, "lease", req.lease);
        v.finish()?;
        scope.check(&req.queue, None)?;
        let policy = self.config.policies.get(&req.queue);
        let claims = &self.for_queue(&req.queue)?.claims;
        let waiters = &self.pipelines.waiters;
        let mut waiting = waiters.register(&req.queue, req.wait);
        self.metrics.set_claim_waiters(waiters.waiting());
        let claimed = loop {
            let (claimed, next_due) = claims
                .submit(ClaimCall {
                    queue: req.queue.clone(),
                    policy,
                    slot: ClaimSlot {
                        worker_id: req.worker_id.clone(),
                        max_jobs: req.max_jobs,
                        lease,
                    },
                    want_next_due: waiting.is_some(),
                })
                .await
                .and_then(|r| r)
                .inspect_err(|e| self.metrics.commit_outcome("Claim", e))?;
            if !claimed.is_empty() {
                break claimed;
            }
            let again = match waiting.as_mut() {
                Some(w) => w.wait(next_due).await == Wake::Claim,
                None => false,
            };
            if !again {
                break claimed;
            }
        };
        drop(waiting);
        self.metrics.set_claim_waiters(waiters.waiting());
        if claimed.is_empty() {
            self.metrics.empty_claim(&req.queue);
        }
        for c in &claimed {
            self.handed_out(c, &req.worker_id, "claim", lease);
        }
        Ok(claimed)
    }

    /// Takeover; see [`JobStore::takeover`] (the job's queue is checked
    /// against `scope` under its row lock).
    pub async fn takeover(
        &self,
        req: Takeover,
        scope: &QueueScope,
    ) -> Result<ClaimedJob, CoordinatorError> {
        let mut v = Violations::default();
        v.job_id(req.job_id);
        v.key("worker_id", &req.worker_id);
        let lease = self.lease(&mut v, "lease", req.lease);
        v.finish()?;
        let claimed = self
            .shards
            .for_job(req.job_id)?
            .takeover(
                &TakeoverRequest {
                    job_id: req.job_id,
                    worker_id: req.worker_id.clone(),
                    lease,
                },
                scope,
            )
            .await
            .inspect_err(|e| {
                self.metrics.commit_outcome("Takeover", e);
                if let CoordinatorError::ProviderHoldback { provider, why, .. } = e {
                    self.metrics.provider_deferred(provider, *why);
                }
            })?;
        tracing::Span::current().record("queue", claimed.job.queue.as_str());
        self.handed_out(&claimed, &req.worker_id, "takeover", lease);
        Ok(claimed)
    }

    /// Counts and logs a job handed out, and remembers when its lease
    /// ends (a long-polling Claim of the queue wakes then).
    fn handed_out(&self, c: &ClaimedJob, worker_id: &str, via: &'static str, lease: Duration) {
        let job = &c.job;
        self.metrics.claimed(&job.queue, job.next_action.as_str());
        if let Some(p) = &c.provider {
            self.metrics.provider_handout(p, job.next_action.as_str());
        }
        self.pipelines.waiters.due_in(&job.queue, lease);
        if c.takeover {
            debug_assert_eq!(job.next_action, NextAction::Reconcile);
            self.metrics.takeover(&job.queue, via);
            tracing::info!(
                job_id = job.id,
                queue = %job.queue,
                operation_key = %job.operation_key.escape_debug(),
                attempt = job.attempt,
                previous_attempt = job.attempt - 1,
                worker_id = %worker_id.escape_debug(),
                via,
                "expired lease taken over"
            );
        }
    }

    /// RecordObservation; see [`JobStore::record_observation`] (the job's
    /// queue is checked against `scope` before anything is written).
    pub async fn record_observation(
        &self,
        req: RecordObservationRequest,
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
        let (observation, duplicate) = self
            .shards
            .for_job(req.job_id)?
            .record_observation(&req, scope)
            .await
            .inspect_err(|e| self.metrics.commit_outcome("RecordObservation", e))?;
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
        let (job, observations) = self.shards.for_job(job_id)?.get_job(job_id).await?;
        scope.check(&job.queue, Some(job_id))?;
        Ok((job, observations))
    }
}

/// The limits of one Enqueue; `prefix` names the item in a batch
/// (`items[3].`).
fn check_enqueue(v: &mut Violations, prefix: &str, req: &EnqueueRequest) {
    v.queue(&format!("{prefix}queue"), &req.queue);
    v.unique_key(&format!("{prefix}operation_key"), &req.operation_key);
    v.max_bytes(&format!("{prefix}payload"), &req.payload, MAX_BODY_BYTES);
    v.delay(&format!("{prefix}delay"), req.delay);
}

/// Counts and logs a due resend a claim parked in manual review instead
/// of handing it out (its window would close within the lease).
fn parked(metrics: &Metrics, job: &Job) {
    let reason = job.state_reason.as_deref().unwrap_or_default();
    metrics.resend_decision(&job.queue, "refused");
    metrics.manual_review_entered(&job.queue, reason);
    tracing::warn!(
        job_id = job.id,
        queue = %job.queue,
        operation_key = %job.operation_key.escape_debug(),
        attempt = job.attempt,
        reason,
        dispatch_count = job.dispatch_count,
        "resend not handed out: its window would close within the lease; moved to manual review"
    );
}

/// Runs one batch of Claims: one claim transaction per queue (split so
/// none takes more than [`MAX_CLAIM_TRANSACTION_JOBS`]), the queues side by
/// side.
async fn run_claims(store: JobStore, calls: Vec<ClaimCall>, metrics: Metrics) -> Vec<ClaimAnswer> {
    // Group by queue, keeping arrival order inside each group, and split a
    // group that would take too many jobs in one transaction.
    let mut chunks: Vec<(Vec<usize>, u32)> = Vec::new();
    let mut open: std::collections::HashMap<&str, usize> = Default::default();
    for (i, c) in calls.iter().enumerate() {
        let n = c.slot.max_jobs;
        match open.get(c.queue.as_str()) {
            Some(&k) if chunks[k].1 + n <= MAX_CLAIM_TRANSACTION_JOBS => {
                chunks[k].0.push(i);
                chunks[k].1 += n;
            }
            _ => {
                open.insert(c.queue.as_str(), chunks.len());
                chunks.push((vec![i], n));
            }
        }
    }
    let calls = Arc::new(calls);
    let mut runs = tokio::task::JoinSet::new();
    for (k, (chunk, _)) in chunks.iter().enumerate() {
        let (store, calls, chunk) = (store.clone(), calls.clone(), chunk.clone());
        runs.spawn(async move {
            let first = &calls[chunk[0]];
            let slots: Vec<ClaimSlot> = chunk.iter().map(|&i| calls[i].slot.clone()).collect();
            let want_next_due = chunk.iter().any(|&i| calls[i].want_next_due);
            let result = store
                .claim_batch(&first.queue, first.policy, &slots, want_next_due)
                .await;
            (k, result)
        });
    }
    let mut answers: Vec<Option<ClaimAnswer>> = (0..calls.len()).map(|_| None).collect();
    while let Some(joined) = runs.join_next().await {
        let (k, result) = match joined {
            Ok(done) => done,
            // A panicking claim task: nothing says whether it committed.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        let chunk = &chunks[k].0;
        match result {
            Ok(batch) => {
                if let Some(report) = &batch.budget {
                    metrics.provider_claim(report);
                }
                for job in &batch.parked {
                    parked(&metrics, job);
                }
                let next_due = batch.next_due;
                for (&i, jobs) in chunk.iter().zip(batch.jobs) {
                    answers[i] = Some(Ok((jobs, next_due)));
                }
            }
            Err(e) => {
                for &i in chunk {
                    answers[i] = Some(Err(e.clone()));
                }
            }
        }
    }
    answers
        .into_iter()
        .map(|a| a.expect("every claim answered"))
        .collect()
}
