//! [`WorkerClient`]: the connection and the calls that hand out attempts
//! (Claim, Takeover) or read jobs. Everything that writes to a job goes
//! through the [`ClaimedJob`] handles it returns.

use super::credentials::{Authorization, Credentials};
use super::error::{self, ClaimError, ConnectError, WriteError};
use super::handle::ClaimedJob;
use super::retry::{retry, RetryPolicy};
use crate::proto::job_coordinator_client::JobCoordinatorClient;
use crate::proto::{self, ClaimRequest, GetJobRequest, TakeoverRequest};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// The largest `max_in_flight`: the coordinator's default maximum Claim
/// batch (`--max-claim-batch`), since the runner claims up to its free
/// slots in one call.
pub const MAX_IN_FLIGHT: u32 = 100;

/// What a worker is and how it talks to the coordinator.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names this worker in `lease_owner` and in the dedup keys of the
    /// observations it records. Informational for ownership (which is the
    /// attempt), but keep it stable across restarts of the same worker.
    /// 1..=255 bytes.
    pub worker_id: String,
    /// The queue to claim from ([A-Za-z0-9._-], 1..=128 bytes).
    pub queue: String,
    /// Lease asked for on every Claim and Takeover, counted from the
    /// commit by the database clock (docs/design.md rule 2); must lie within
    /// the coordinator's bounds (default 1 s ..= 1 h), which counts it in
    /// whole microseconds. Pick it above the P99 of one job's work:
    /// when it runs out the job is open to takeover (rule 1).
    pub lease: Duration,
    /// Most jobs [`Worker::run`](super::Worker::run) handles at once, and
    /// so the most it ever holds: it claims only as many as it has free
    /// slots (the seed: never hoard claims). 1..=[`MAX_IN_FLIGHT`].
    pub max_in_flight: u32,
    /// How long the runner's Claims wait for work on the coordinator when
    /// nothing is due (a long poll: the coordinator answers as soon as a
    /// job is enqueued, comes due or is released by an expired lease).
    /// Zero turns the long poll off.
    pub claim_wait: Duration,
    /// How long the runner waits before claiming again after a Claim that
    /// found nothing due and did not wait for work (`claim_wait` zero, or
    /// a coordinator that is draining).
    pub poll_interval: Duration,
    /// Deadline of one RPC (sent as `grpc-timeout`). A Claim that misses it
    /// hands out nothing (its outcome is unknown).
    pub rpc_timeout: Duration,
    /// How long [`WorkerClient::connect`] waits for the TCP/HTTP2 handshake.
    pub connect_timeout: Duration,
    /// Retries of the calls that are safe to repeat, and the runner's
    /// backoff after a failed Claim.
    pub retry: RetryPolicy,
    /// After the runner's shutdown signal: how long in-flight handlers may
    /// take to finish before they are abandoned (their jobs stay leased and
    /// come back through a takeover, which reconciles first).
    pub shutdown_grace: Duration,
    /// Retry delay of the `RetryReconcile` the runner sends for a job whose
    /// handler returned without writing back.
    pub release_delay: Duration,
    /// TLS and bearer token (none by default: a coordinator run with
    /// `--insecure`); [`Credentials::from_env`] reads the standard
    /// `JOBFENCE_TLS_CA` / `JOBFENCE_TOKEN_FILE` variables.
    pub credentials: Credentials,
}

impl Default for WorkerConfig {
    /// Lease 30 s (the seed's example), 1 job in flight, Claims wait up to
    /// 10 s for work, poll every 1 s when they cannot, 10 s per RPC (plus
    /// the wait, for a Claim), 5 s to connect, 30 s of shutdown grace,
    /// release delay 5 s. `worker_id` is `worker-<pid>`; `queue` is empty and must be set.
    fn default() -> Self {
        WorkerConfig {
            worker_id: format!("worker-{}", std::process::id()),
            queue: String::new(),
            lease: Duration::from_secs(30),
            max_in_flight: 1,
            claim_wait: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            shutdown_grace: Duration::from_secs(30),
            release_delay: Duration::from_secs(5),
            credentials: Credentials::default(),
        }
    }
}

impl WorkerConfig {
    /// The defaults, for this worker and queue.
    pub fn new(worker_id: impl Into<String>, queue: impl Into<String>) -> Self {
        WorkerConfig {
            worker_id: worker_id.into(),
            queue: queue.into(),
            ..WorkerConfig::default()
        }
    }

    fn validate(&self) -> Result<(), ConnectError> {
        let bad = |why: &str| Err(ConnectError::InvalidConfig(why.to_owned()));
        if self.worker_id.is_empty() || self.worker_id.len() > 255 {
            return bad("worker_id must be 1..=255 bytes");
        }
        if self.queue.is_empty() {
            return bad("queue must be set");
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return bad("max_in_flight must be 1..=100");
        }
        if self.lease.is_zero() || self.rpc_timeout.is_zero() {
            return bad("lease and rpc_timeout must be positive");
        }
        Ok(())
    }
}

/// A typed jobfence client for one worker. Cheap to clone (one shared
/// HTTP/2 channel).
///
/// It hands out [`ClaimedJob`] handles and offers no call that writes to
/// a job by id and attempt: a write can only be made through the handle
/// that a committed Claim or Takeover returned (docs/design.md rules 3 and 4).
#[derive(Debug, Clone)]
pub struct WorkerClient {
    pub(crate) rpc:
        JobCoordinatorClient<InterceptedService<crate::version::Checked, Authorization>>,
    pub(crate) config: Arc<WorkerConfig>,
    /// Retries made by this client and its clones (see [`Self::retries`]).
    retries: Arc<AtomicU64>,
}

impl WorkerClient {
    /// Connects to a coordinator at `endpoint` (`http://host:port`, or
    /// `https://host:port`; with a CA in `config.credentials` the client
    /// speaks TLS either way).
    ///
    /// Errors: [`ConnectError::InvalidConfig`] for an unusable config,
    /// [`ConnectError::Transport`] if the endpoint is malformed or does not
    /// answer within `config.connect_timeout` (a TLS handshake the
    /// coordinator refuses included).
    pub async fn connect(
        endpoint: impl Into<String>,
        config: WorkerConfig,
    ) -> Result<Self, ConnectError> {
        config.validate()?;
        let channel = config
            .credentials
            .endpoint(endpoint)?
            .connect_timeout(config.connect_timeout)
            .connect()
            .await?;
        Self::new(channel, config)
    }

    /// A client over an existing channel (for example a lazily connecting
    /// one, or one shared with other clients); the channel's TLS is its
    /// own, the bearer token of `config.credentials` is added to every call.
    pub fn new(channel: Channel, config: WorkerConfig) -> Result<Self, ConnectError> {
        config.validate()?;
        Ok(WorkerClient {
            rpc: JobCoordinatorClient::with_interceptor(
                crate::version::Checked::new(channel),
                config.credentials.authorization(),
            ),
            config: Arc::new(config),
            retries: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// How many times this client (and its clones) sent a call again
    /// because the answer said nothing was applied (or, for a fenced write,
    /// an observation or a read, that its outcome was unknown); see
    /// [`RetryPolicy`]. A worker that rode through an outage shows it here
    /// and in its `debug` log (`retrying`), not as an error.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Runs `op` under this client's [`RetryPolicy`], counting its retries.
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        retryable: impl Fn(&Status) -> bool,
        op: F,
    ) -> Result<T, Status>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        retry(&self.config.retry, &self.retries, retryable, op).await
    }

    /// A request carrying `rpc_timeout` as its `grpc-timeout`, so the
    /// coordinator stops working on a call its caller gave up on.
    pub(crate) fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.config.rpc_timeout);
        request
    }

    /// Awaits one RPC for at most `rpc_timeout`, on this side too: the
    /// header above only helps while the coordinator answers at all.
    pub(crate) async fn deadline<T>(
        &self,
        call: impl Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        tokio::time::timeout(self.config.rpc_timeout, call)
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer within rpc_timeout")))
    }

    fn lease(&self) -> Option<prost_types::Duration> {
        Some(proto_duration(self.config.lease))
    }

    /// Claims up to `max_jobs` (1..=the server's max batch) due jobs of the
    /// configured queue, with the configured lease. Each handle carries its
    /// new attempt; a takeover of an expired lease comes with
    /// `next_action` RECONCILE. An empty list means nothing is due.
    ///
    /// Retried, within [`RetryPolicy::budget`], only when nothing was
    /// applied: the coordinator says so (`DATABASE_UNAVAILABLE`,
    /// `TRANSACTION_CONFLICT`, `OVERLOADED`), the load balancer does
    /// (`NO_COORDINATOR_SERVING`), or no connection could be made. After an unclear
    /// failure (`COMMIT_OUTCOME_UNKNOWN`, an expired deadline, a transport
    /// error) it returns [`ClaimError::OutcomeUnknown`] at once and no
    /// handle: the worker must act as if it holds nothing (rule 4), and must
    /// not infer ownership by reading the job back. Claiming again is not a
    /// way to recover the lost claim: if it did commit, its jobs stay
    /// `running` under an attempt nobody acts on until their lease runs
    /// out, and then come back through a takeover that reconciles first. A
    /// blind retry would only take *other* jobs while that happens, so the
    /// choice of when to claim again (after a backoff) is the caller's, as
    /// [`Worker::run`](super::Worker::run) does.
    pub async fn claim(&self, max_jobs: u32) -> Result<Vec<ClaimedJob>, ClaimError> {
        self.claim_waiting(max_jobs, Duration::ZERO).await
    }

    /// [`claim`](Self::claim) as a long poll: when nothing is due the
    /// coordinator holds the call up to `wait` (cut to its own maximum) and
    /// answers as soon as work arrives; an empty list means none came. The
    /// call's deadline is `rpc_timeout` plus `wait`.
    pub async fn claim_waiting(
        &self,
        max_jobs: u32,
        wait: Duration,
    ) -> Result<Vec<ClaimedJob>, ClaimError> {
        let message = ClaimRequest {
            queue: self.config.queue.clone(),
            worker_id: self.config.worker_id.clone(),
            max_jobs,
            lease: self.lease(),
            wait: (!wait.is_zero()).then(|| proto_duration(wait)),
        };
        let timeout = self.config.rpc_timeout + wait;
        let response = self
            .retrying(error::definitely_not_applied, || {
                let mut rpc = self.rpc.clone();
                let mut request = Request::new(message.clone());
                request.set_timeout(timeout);
                async move {
                    tokio::time::timeout(timeout, rpc.claim(request))
                        .await
                        .unwrap_or_else(|_| {
                            Err(Status::deadline_exceeded(
                                "no answer within rpc_timeout + wait",
                            ))
                        })
                }
            })
            .await
            .map_err(error::claim_error)?;
        Ok(response
            .into_inner()
            .jobs
            .into_iter()
            .filter_map(|c| ClaimedJob::from_proto(self.clone(), c))
            .collect())
    }

    /// Takes over one named job whose lease has expired (DB clock). The new
    /// attempt always starts with `next_action` RECONCILE (rule 5): ask the
    /// provider what happened before anything else. Retried like
    /// [`claim`](Self::claim), for the same reasons.
    ///
    /// Errors: [`ClaimError::LeaseNotExpired`], [`ClaimError::Finished`],
    /// [`ClaimError::NotRunning`], [`ClaimError::NotFound`], and the
    /// failures of `claim`.
    pub async fn takeover(&self, job_id: u64) -> Result<ClaimedJob, ClaimError> {
        let message = TakeoverRequest {
            job_id,
            worker_id: self.config.worker_id.clone(),
            lease: self.lease(),
        };
        let response = self
            .retrying(error::definitely_not_applied, || {
                let mut rpc = self.rpc.clone();
                let request = self.request(message.clone());
                async move { self.deadline(rpc.takeover(request)).await }
            })
            .await
            .map_err(error::claim_error)?;
        response
            .into_inner()
            .claimed
            .and_then(|c| ClaimedJob::from_proto(self.clone(), c))
            .ok_or_else(|| {
                ClaimError::Other(Box::new(Status::internal(
                    "takeover response without a job",
                )))
            })
    }

    /// Reads a job and its observations (oldest first). A read decides
    /// nothing: ownership is the attempt a handle holds, never what a read
    /// shows (rule 4). Retried like a write.
    pub async fn get_job(
        &self,
        job_id: u64,
    ) -> Result<(proto::Job, Vec<proto::Observation>), WriteError> {
        let response = self
            .retrying(error::retryable_write, || {
                let mut rpc = self.rpc.clone();
                let request = self.request(GetJobRequest { job_id });
                async move { self.deadline(rpc.get_job(request)).await }
            })
            .await
            .map_err(error::write_error)?
            .into_inner();
        let job = response.job.ok_or(WriteError::NotFound)?;
        Ok((job, response.observations))
    }
}

/// A `std` duration as a protobuf Duration (whole seconds + nanoseconds,
/// saturating at `i64::MAX` seconds).
pub(crate) fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}
