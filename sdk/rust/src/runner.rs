//! [`Worker::run`]: claims jobs as slots free up, runs a [`Handler`] on
//! each, and shuts down gracefully.

use super::client::WorkerClient;
use super::handle::{ClaimedJob, Disposition};
use std::future::Future;
use std::sync::Arc;
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
    /// Jobs handed out by the runner's claims (takeovers included).
    pub claimed: u64,
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

/// What one handler task reports back to the runner.
struct Finished {
    error: bool,
    released: bool,
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
        let config = self.client.config().clone();
        let slots = Arc::new(Semaphore::new(config.max_in_flight as usize));
        let handler = Arc::new(handler);
        let mut tasks = JoinSet::new();
        let mut report = RunReport::default();
        let mut failures = 0u32;
        tokio::pin!(shutdown);
        loop {
            while let Some(done) = tasks.try_join_next() {
                tally(&mut report, done);
            }
            // Wait for a free slot; only then ask for work.
            let first = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                permit = slots.clone().acquire_owned() => permit.expect("the slot semaphore is never closed"),
            };
            let mut permits = vec![first];
            while let Ok(p) = slots.clone().try_acquire_owned() {
                permits.push(p);
            }
            let asked = tokio::time::Instant::now();
            // A long-polling Claim is cut short by the shutdown signal (its
            // RPC cancelled: a claim the coordinator had not started yet is
            // dropped; one it had committed comes back after its lease).
            let claimed = tokio::select! {
                biased;
                _ = &mut shutdown => {
                    report.interrupted_claims += 1;
                    break;
                }
                claimed = self.client.claim_waiting(permits.len() as u32, config.claim_wait) => claimed,
            };
            let wait = match claimed {
                Ok(jobs) => {
                    failures = 0;
                    let idle = jobs.is_empty();
                    for job in jobs {
                        report.claimed += 1;
                        report.takeovers += u64::from(job.is_takeover());
                        let permit = permits.pop().expect("a claim never exceeds the free slots");
                        tasks.spawn(handle_one(
                            handler.clone(),
                            job,
                            permit,
                            config.release_delay,
                        ));
                    }
                    // Poll only when the coordinator did not wait for work
                    // (long poll off, or a draining coordinator).
                    let waited = asked.elapsed() >= config.claim_wait / 2;
                    (idle && !waited).then_some(config.poll_interval)
                }
                Err(e @ (super::ClaimError::Denied(_) | super::ClaimError::Invalid(_))) => {
                    report.failed_claims += 1;
                    tracing::error!(error = %e, "claim refused; asking again cannot succeed: stopping");
                    report.stopped_by = Some(e.to_string());
                    break;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    if matches!(e, super::ClaimError::OutcomeUnknown(_)) {
                        report.unclear_claims += 1;
                        tracing::warn!(error = %e, "claim outcome unknown: holding nothing");
                    } else {
                        report.failed_claims += 1;
                        tracing::warn!(error = %e, "claim failed");
                    }
                    Some(config.retry.backoff(failures))
                }
            };
            drop(permits);
            if let Some(wait) = wait {
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        tracing::info!(
            in_flight = tasks.len(),
            grace_ms = config.shutdown_grace.as_millis() as u64,
            "stopped claiming; waiting for handlers in flight"
        );
        let grace = tokio::time::sleep(config.shutdown_grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                done = tasks.join_next() => match done {
                    Some(done) => tally(&mut report, done),
                    None => break,
                },
                _ = &mut grace => {
                    report.abandoned = tasks.len() as u64;
                    tracing::warn!(abandoned = report.abandoned, "shutdown grace over: abandoning handlers (their jobs come back after the lease)");
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    break;
                }
            }
        }
        report
    }
}

async fn handle_one<H: Handler>(
    handler: Arc<H>,
    mut job: ClaimedJob,
    permit: OwnedSemaphorePermit,
    release_delay: std::time::Duration,
) -> Finished {
    // Held until the task ends, aborted or not: the slot frees with it.
    let _slot = permit;
    let result = handler.handle(&mut job).await;
    let mut released = false;
    if !job.is_settled() {
        let why = match &result {
            Ok(()) => "handler returned without writing back".to_owned(),
            Err(e) => format!("handler failed: {e}"),
        };
        match job
            .fail(Disposition::RetryReconcile, &why, release_delay)
            .await
        {
            Ok(_) => released = true,
            Err(e) => {
                tracing::warn!(job_id = job.job_id(), attempt = job.attempt(), error = %e, "could not release the job; it comes back after its lease")
            }
        }
    }
    Finished {
        error: result.is_err(),
        released,
    }
}

fn tally(report: &mut RunReport, done: Result<Finished, tokio::task::JoinError>) {
    match done {
        Ok(f) => {
            report.handled += 1;
            report.handler_errors += u64::from(f.error);
            report.released += u64::from(f.released);
        }
        Err(e) if e.is_panic() => {
            report.panicked += 1;
            tracing::error!("a handler panicked; its job comes back after its lease");
        }
        Err(_) => {}
    }
}
