//! [`Worker::run`] (and [`WorkerClient::run`], the same loop): claims jobs
//! as slots free up, runs a [`Handler`] on each, and shuts down gracefully.

use super::client::{proto_duration, WorkerClient, WorkerConfig};
use super::error::ClaimError;
use super::handle::{ClaimedJob, Disposition};
use super::next::NextAsk;
use crate::proto::NextJobsRequest;
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// What a handler may fail with; its text becomes the `error` of the
/// `RetryReconcile` the runner sends if the handler did not write back.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// The work a worker does with one job.
///
/// Implement it with `async fn handle(&self, job: &mut ClaimedJob) ->
/// Result<(), HandlerError>`. The handler should end by writing back
/// through the handle (`complete`, `fail`): the seed's workers write the
/// outcome, or the time of the next reconcile, and end the task. If it
/// returns without a write that settled the job, the runner sends
/// `Fail(RetryReconcile)` with [`WorkerConfig::release_delay`]: reconcile,
/// never resend, because the handler may have reached the provider before
/// it stopped (docs/design.md rule 5).
///
/// [`WorkerConfig::release_delay`]: super::WorkerConfig::release_delay
pub trait Handler: Send + Sync + 'static {
    /// Handles one job this worker holds.
    fn handle(&self, job: &mut ClaimedJob)
        -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// Counts of one [`Worker::run`], for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Jobs handed out (takeovers included), by the runner's claims and
    /// by handlers' write-backs.
    pub claimed: u64,
    /// Of `claimed`, the jobs a handler's Complete or Fail was answered
    /// with (the write and the next job in one call and one transaction,
    /// docs/design.md rule 16).
    pub on_write_back: u64,
    /// Of which inline takeovers of an expired lease.
    pub takeovers: u64,
    /// Handlers that returned (with or without an error).
    pub handled: u64,
    /// Handlers that returned an error.
    pub handler_errors: u64,
    /// Jobs the runner released with `RetryReconcile` because the handler
    /// returned without settling them.
    pub released: u64,
    /// Claims whose outcome was unknown: no handle, no handler.
    pub unclear_claims: u64,
    /// A Claim still waiting for its answer (a long poll) when the shutdown
    /// signal came, cut short: no handle, no handler. If the coordinator
    /// had already handed it a job, that job comes back after its lease
    /// through a takeover (which reconciles first).
    pub interrupted_claims: u64,
    /// Other failed claims (unavailable, invalid, unexpected).
    pub failed_claims: u64,
    /// Handlers still running at the end of the shutdown grace, aborted.
    /// Their jobs stay leased and come back through a takeover.
    pub abandoned: u64,
    /// Handlers that panicked (their jobs likewise come back).
    pub panicked: u64,
    /// Why the runner stopped claiming before `shutdown`: a Claim refused
    /// for who the caller is ([`ClaimError::Denied`](super::ClaimError::Denied):
    /// no or a bad credential, another queue's, a role without Claim) or
    /// for the request itself ([`ClaimError::Invalid`](super::ClaimError::Invalid)).
    /// Asking again cannot succeed, so the runner does not; `None` when
    /// it ran until `shutdown`.
    pub stopped_by: Option<String>,
}

/// What one handler task reports back to the runner: the jobs it
/// handled one after the other on its slot (the first, then each one its
/// write-back was answered with).
#[derive(Default)]
struct Finished {
    handled: u64,
    errors: u64,
    released: u64,
    /// Jobs handed out with a write-back (not by the runner's Claims).
    chained: u64,
    chained_takeovers: u64,
}

/// Runs a handler over the jobs of one queue, at most
/// [`WorkerConfig::max_in_flight`](super::WorkerConfig::max_in_flight) at a
/// time.
#[derive(Debug, Clone)]
pub struct Worker {
    client: WorkerClient,
}

impl Worker {
    /// A runner over `client` (its config says the queue, the slots, the
    /// lease and the timings).
    pub fn new(client: WorkerClient) -> Self {
        Worker { client }
    }

    /// Claims and handles jobs until `shutdown` completes, then stops
    /// claiming and waits up to `shutdown_grace` for the handlers in flight.
    ///
    /// - Never holds more jobs than it has free slots: each Claim asks for
    ///   exactly the number of free slots, and waits for one to free up
    ///   before claiming again (the seed: claim only what can be done now).
    /// - A handler's Complete or Fail asks for the next job for the slot it
    ///   frees, in the same call and transaction (docs/design.md rule 16);
    ///   the handler then runs on it. A stale write still gets its next
    ///   job; a write whose outcome is unknown gets none (the SDK's retry
    ///   of it is answered as a replay, which claims nothing). When nothing
    ///   was due, the slot goes back to the loop's long-polling Claim.
    /// - A Claim already sent when `shutdown` fires is not cancelled: that
    ///   would make its outcome unknown. Its jobs, if any, are handled.
    /// - A Claim that fails hands out nothing and runs no handler; the next
    ///   one waits an exponential backoff with jitter
    ///   ([`WorkerConfig::retry`](super::WorkerConfig::retry)). A Claim
    ///   refused for who the caller is, or as an invalid request, stops
    ///   the claiming at once (handlers in flight finish as at a shutdown):
    ///   see [`RunReport::stopped_by`].
    /// - A handler still running after the grace is aborted: its job stays
    ///   leased and a takeover reconciles it. A panicking handler's job
    ///   likewise comes back after its lease.
    pub async fn run<H: Handler>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> RunReport {
        let mut run = Run::new(self.client.clone(), handler);
        tokio::pin!(shutdown);
        while run.round(&mut shutdown).await.is_continue() {}
        // No handler's write-back asks for another job from now on.
        run.stopping.store(true, Ordering::Relaxed);
        run.wind_down().await
    }
}

impl WorkerClient {
    /// The run loop, on the client as every jobfence client has it
    /// (Python `client.run`, Node `client.run`, Go `client.Run`): the same
    /// as `Worker::new(client.clone()).run(handler, shutdown)`, which
    /// stays. The slots are [`WorkerConfig::max_in_flight`](super::WorkerConfig::max_in_flight).
    pub async fn run<H: Handler>(
        &self,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> RunReport {
        Worker::new(self.clone()).run(handler, shutdown).await
    }
}

/// The state of one [`Worker::run`]: its handlers in flight and its counts.
struct Run<H> {
    client: WorkerClient,
    config: WorkerConfig,
    slots: Arc<Semaphore>,
    handler: Arc<H>,
    tasks: JoinSet<Finished>,
    report: RunReport,
    /// Failed claims in a row, for the backoff.
    failures: u32,
    /// Set once the loop stops claiming: handlers' write-backs then ask
    /// for no next job.
    stopping: Arc<AtomicBool>,
}

impl<H: Handler> Run<H> {
    fn new(client: WorkerClient, handler: H) -> Self {
        let config = client.config().clone();
        Run {
            slots: Arc::new(Semaphore::new(config.max_in_flight as usize)),
            client,
            config,
            handler: Arc::new(handler),
            tasks: JoinSet::new(),
            report: RunReport::default(),
            failures: 0,
            stopping: Arc::new(AtomicBool::new(false)),
        }
    }

    /// One round: wait for a free slot, claim for every free slot, hand the
    /// jobs to handlers, then pause if the answer says so. Breaks on
    /// `shutdown` or on a claim that cannot succeed by asking again.
    async fn round<S: Future<Output = ()> + Unpin>(&mut self, shutdown: &mut S) -> ControlFlow<()> {
        while let Some(done) = self.tasks.try_join_next() {
            tally(&mut self.report, done);
        }
        // Wait for a free slot; only then ask for work.
        let first = tokio::select! {
            biased;
            _ = &mut *shutdown => return ControlFlow::Break(()),
            permit = self.slots.clone().acquire_owned() => permit.expect("the slot semaphore is never closed"),
        };
        let mut permits = vec![first];
        while let Ok(p) = self.slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let asked = tokio::time::Instant::now();
        // A long-polling Claim is cut short by the shutdown signal (its
        // RPC cancelled: a claim the coordinator had not started yet is
        // dropped; one it had committed comes back after its lease).
        let claimed = tokio::select! {
            biased;
            _ = &mut *shutdown => {
                self.report.interrupted_claims += 1;
                return ControlFlow::Break(());
            }
            claimed = self.client.claim_waiting(permits.len() as u32, self.config.claim_wait) => claimed,
        };
        let wait = match claimed {
            Ok(jobs) => self.dispatch(jobs, &mut permits, asked),
            Err(e) => self.claim_failed(e)?,
        };
        drop(permits);
        if let Some(wait) = wait {
            tokio::select! {
                biased;
                _ = &mut *shutdown => return ControlFlow::Break(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
        ControlFlow::Continue(())
    }

    /// Starts a handler for each claimed job, each on one of `permits`;
    /// says how long to pause before the next claim, if at all.
    fn dispatch(
        &mut self,
        jobs: Vec<ClaimedJob>,
        permits: &mut Vec<OwnedSemaphorePermit>,
        asked: tokio::time::Instant,
    ) -> Option<Duration> {
        self.failures = 0;
        let idle = jobs.is_empty();
        for mut job in jobs {
            self.report.claimed += 1;
            self.report.takeovers += u64::from(job.is_takeover());
            job.ask_next(self.next_ask());
            let permit = permits.pop().expect("a claim never exceeds the free slots");
            self.tasks.spawn(handle_one(
                self.handler.clone(),
                job,
                permit,
                self.config.release_delay,
            ));
        }
        // Poll only when the coordinator did not wait for work (long poll
        // off, or a draining coordinator).
        let waited = asked.elapsed() >= self.config.claim_wait / 2;
        (idle && !waited).then_some(self.config.poll_interval)
    }

    /// What a handler's Complete or Fail asks for: the next job of the
    /// queue for the slot it frees (docs/design.md rule 16).
    fn next_ask(&self) -> NextAsk {
        NextAsk {
            request: NextJobsRequest {
                queue: self.config.queue.clone(),
                worker_id: self.config.worker_id.clone(),
                max_jobs: 1,
                lease: Some(proto_duration(self.config.lease)),
                wait: None,
            },
            stopping: self.stopping.clone(),
        }
    }

    /// Counts a failed claim: breaks when asking again cannot succeed,
    /// else says how long to back off.
    fn claim_failed(&mut self, e: ClaimError) -> ControlFlow<(), Option<Duration>> {
        if matches!(e, ClaimError::Denied(_) | ClaimError::Invalid(_)) {
            self.report.failed_claims += 1;
            tracing::error!(error = %e, "claim refused; asking again cannot succeed: stopping");
            self.report.stopped_by = Some(e.to_string());
            return ControlFlow::Break(());
        }
        self.failures = self.failures.saturating_add(1);
        if matches!(e, ClaimError::OutcomeUnknown(_)) {
            self.report.unclear_claims += 1;
            tracing::warn!(error = %e, "claim outcome unknown: holding nothing");
        } else {
            self.report.failed_claims += 1;
            tracing::warn!(error = %e, "claim failed");
        }
        ControlFlow::Continue(Some(self.config.retry.backoff(self.failures)))
    }

    /// After the loop: waits up to `shutdown_grace` for the handlers in
    /// flight, then aborts the rest (their jobs stay leased and come back
    /// through a takeover).
    async fn wind_down(mut self) -> RunReport {
        tracing::info!(
            in_flight = self.tasks.len(),
            grace_ms = self.config.shutdown_grace.as_millis() as u64,
            "stopped claiming; waiting for handlers in flight"
        );
        let grace = tokio::time::sleep(self.config.shutdown_grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                done = self.tasks.join_next() => match done {
                    Some(done) => tally(&mut self.report, done),
                    None => break,
                },
                _ = &mut grace => {
                    self.report.abandoned = self.tasks.len() as u64;
                    tracing::warn!(abandoned = self.report.abandoned, "shutdown grace over: abandoning handlers (their jobs come back after the lease)");
                    self.tasks.abort_all();
                    while self.tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        self.report
    }
}

/// Runs the handler on `job` and, while its write-back hands it the next
/// job (docs/design.md rule 16), on each next job in turn, on one slot.
async fn handle_one<H: Handler>(
    handler: Arc<H>,
    job: ClaimedJob,
    permit: OwnedSemaphorePermit,
    release_delay: std::time::Duration,
) -> Finished {
    // Held until the task ends, aborted or not: the slot frees with it.
    let _slot = permit;
    let mut finished = Finished::default();
    let mut next = Some(job);
    while let Some(mut job) = next.take() {
        let result = handler.handle(&mut job).await;
        finished.handled += 1;
        finished.errors += u64::from(result.is_err());
        if !job.is_settled() {
            finished.released += u64::from(release(&mut job, &result, release_delay).await);
        }
        next = job.take_handed().pop();
        if let Some(n) = &next {
            finished.chained += 1;
            finished.chained_takeovers += u64::from(n.is_takeover());
        }
    }
    finished
}

/// Sends `RetryReconcile` for a job its handler left unsettled; true when
/// applied.
async fn release(
    job: &mut ClaimedJob,
    result: &Result<(), HandlerError>,
    release_delay: Duration,
) -> bool {
    let why = match result {
        Ok(()) => "handler returned without writing back".to_owned(),
        Err(e) => format!("handler failed: {e}"),
    };
    match job
        .fail(Disposition::RetryReconcile, &why, release_delay)
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(job_id = job.job_id(), attempt = job.attempt(), error = %e, "could not release the job; it comes back after its lease");
            false
        }
    }
}

fn tally(report: &mut RunReport, done: Result<Finished, tokio::task::JoinError>) {
    match done {
        Ok(f) => {
            report.handled += f.handled;
            report.handler_errors += f.errors;
            report.released += f.released;
            report.claimed += f.chained;
            report.on_write_back += f.chained;
            report.takeovers += f.chained_takeovers;
        }
        Err(e) if e.is_panic() => {
            report.panicked += 1;
            tracing::error!("a handler panicked; its job comes back after its lease");
        }
        Err(_) => {}
    }
}
