//! The load generator: workers that talk to `jobfence serve` over gRPC on
//! loopback, one HTTP/2 connection each, as separate worker processes
//! would.

use super::direct::join;
use super::{Latencies, PhaseRun};
use anyhow::{bail, ensure, Context, Result};
use jobfence_api::v1::job_coordinator_client::JobCoordinatorClient;
use jobfence_api::v1::{
    ClaimRequest, ClaimedJob, CompleteRequest, EnqueueBatchRequest, EnqueueRequest, GetJobRequest,
    NextJobsRequest,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

async fn connect(addr: &str) -> Result<JobCoordinatorClient<Channel>> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to the coordinator at {addr}"))?;
    Ok(JobCoordinatorClient::new(channel))
}

/// `workers` clients each Claim(max_jobs) and Complete every job they got
/// (side by side), until a Claim finds nothing.
///
/// An empty Claim ends a worker only once all `jobs` of the phase are
/// done: a Claim skips the rows other workers' claims hold locked at that
/// moment, so "nothing for me now" is not "nothing left" (on a loaded
/// machine a worker otherwise stopped one job early). A phase whose jobs
/// stay out of reach for 60 s is an error, naming how many were done.
pub async fn lifecycle(
    addr: &str,
    queue: &str,
    workers: usize,
    max_jobs: u32,
    jobs: u64,
) -> Result<PhaseRun> {
    run_workers(addr, queue, workers, max_jobs, None, Some(jobs), false).await
}

/// [`lifecycle`] on the run loop of every client: one job at a time, each
/// Complete asking for the worker's next job in the same call and
/// transaction (docs/design.md rule 16); a Claim only when a Complete
/// brought none.
pub async fn lifecycle_next(
    addr: &str,
    queue: &str,
    workers: usize,
    jobs: u64,
) -> Result<PhaseRun> {
    run_workers(addr, queue, workers, 1, None, Some(jobs), true).await
}

/// [`lifecycle`], but with long-polling Claims (1 s) until `until`: the
/// workers of a queue whose provider's budget paces the hand-outs, which
/// keep asking while jobs wait for units.
pub async fn lifecycle_until(
    addr: &str,
    queue: &str,
    workers: usize,
    max_jobs: u32,
    until: Option<Instant>,
    next: bool,
) -> Result<PhaseRun> {
    run_workers(addr, queue, workers, max_jobs, until, None, next).await
}

async fn run_workers(
    addr: &str,
    queue: &str,
    workers: usize,
    max_jobs: u32,
    until: Option<Instant>,
    expected: Option<u64>,
    next: bool,
) -> Result<PhaseRun> {
    let mut clients = Vec::with_capacity(workers);
    for _ in 0..workers {
        clients.push(connect(addr).await?);
    }
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (w, client) in clients.into_iter().enumerate() {
        let worker = LifecycleWorker {
            client,
            queue: queue.to_owned(),
            worker_id: format!("grpc-{w}"),
            max_jobs,
            until,
            expected,
            done: done.clone(),
            next,
        };
        tasks.spawn(worker.run());
    }
    let latencies = join(tasks).await?;
    Ok(PhaseRun {
        jobs: done.load(Ordering::Relaxed),
        elapsed: started.elapsed(),
        latencies,
    })
}

/// One gRPC worker of [`lifecycle_until`].
struct LifecycleWorker {
    client: JobCoordinatorClient<Channel>,
    queue: String,
    worker_id: String,
    max_jobs: u32,
    /// Long-poll until then; `None`: stop at an empty Claim once
    /// `expected` jobs are done.
    until: Option<Instant>,
    /// The phase's jobs.
    expected: Option<u64>,
    /// Jobs completed, by every worker.
    done: Arc<AtomicU64>,
    /// Each Complete asks for the next job (max_jobs is then 1).
    next: bool,
}

impl LifecycleWorker {
    /// Claims and completes until the queue is empty (or `until`), timing
    /// every call.
    async fn run(self) -> Result<Latencies> {
        let mut lat = Latencies::default();
        let mut empty_since: Option<Instant> = None;
        let mut held: Vec<ClaimedJob> = Vec::new();
        loop {
            if self.until.is_some_and(|u| Instant::now() >= u) {
                if let Some(c) = held.pop() {
                    self.complete_next(c, &mut lat, false).await?;
                }
                return Ok(lat);
            }
            if let Some(c) = held.pop() {
                held = self.complete_next(c, &mut lat, true).await?;
                continue;
            }
            let t = Instant::now();
            let jobs = self
                .client
                .clone()
                .claim(ClaimRequest {
                    queue: self.queue.clone(),
                    worker_id: self.worker_id.clone(),
                    max_jobs: self.max_jobs,
                    lease: None,
                    wait: self.until.map(|_| prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                })
                .await
                .context("Claim")?
                .into_inner()
                .jobs;
            lat.claim.push(t.elapsed());
            if jobs.is_empty() && self.until.is_none() {
                let done = self.done.load(Ordering::Relaxed);
                match self.expected {
                    Some(e) if done < e => {
                        let since = *empty_since.get_or_insert_with(Instant::now);
                        ensure!(
                            since.elapsed() < Duration::from_secs(60),
                            "{done} of {e} jobs done, and Claim found nothing for 60 s"
                        );
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    _ => return Ok(lat),
                }
            }
            empty_since = None;
            if self.next {
                held = jobs;
                continue;
            }
            self.complete(jobs, &mut lat).await?;
        }
    }

    /// Completes `c`, asking for the worker's next job when `next`;
    /// returns the jobs the answer brought.
    async fn complete_next(
        &self,
        c: ClaimedJob,
        lat: &mut Latencies,
        next: bool,
    ) -> Result<Vec<ClaimedJob>> {
        let job = c.job.context("claimed job without a job")?;
        let t = Instant::now();
        let out = self
            .client
            .clone()
            .complete(CompleteRequest {
                job_id: job.job_id,
                attempt: job.attempt,
                provider_reference: "re_bench".into(),
                result: String::new(),
                next: next.then(|| NextJobsRequest {
                    queue: self.queue.clone(),
                    worker_id: self.worker_id.clone(),
                    max_jobs: 1,
                    lease: None,
                    wait: None,
                }),
            })
            .await
            .with_context(|| format!("Complete of job {}", job.job_id))?
            .into_inner();
        lat.complete.push(t.elapsed());
        ensure!(!out.replayed, "job {} completed twice", job.job_id);
        let next = out.next.unwrap_or_default();
        ensure!(
            next.write_refused.is_none(),
            "job {}: Complete refused: {:?}",
            job.job_id,
            next.write_refused
        );
        self.done.fetch_add(1, Ordering::Relaxed);
        Ok(next.jobs)
    }

    /// Completes the claimed `jobs` side by side, each checked to be
    /// applied once.
    async fn complete(&self, jobs: Vec<ClaimedJob>, lat: &mut Latencies) -> Result<()> {
        let mut set = tokio::task::JoinSet::new();
        for c in jobs {
            let mut client = self.client.clone();
            set.spawn(async move {
                let job = c.job.context("claimed job without a job")?;
                let t = Instant::now();
                let out = client
                    .complete(CompleteRequest {
                        job_id: job.job_id,
                        attempt: job.attempt,
                        provider_reference: "re_bench".into(),
                        result: String::new(),
                        next: None,
                    })
                    .await
                    .with_context(|| format!("Complete of job {}", job.job_id))?
                    .into_inner();
                ensure!(!out.replayed, "job {} completed twice", job.job_id);
                Ok::<_, anyhow::Error>(t.elapsed())
            });
        }
        while let Some(r) = set.join_next().await {
            lat.complete.push(r??);
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// `callers` clients enqueue `jobs` jobs, `batch` per call (1: the Enqueue
/// RPC; more: EnqueueBatch).
pub async fn enqueue(
    addr: &str,
    queue: &str,
    jobs: u64,
    callers: usize,
    batch: u64,
) -> Result<PhaseRun> {
    let next = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::with_capacity(callers);
    for _ in 0..callers {
        clients.push(connect(addr).await?);
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut client in clients {
        let (next, queue) = (next.clone(), queue.to_owned());
        tasks.spawn(async move {
            let mut lat = Latencies::default();
            loop {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if first >= jobs {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let items: Vec<EnqueueRequest> = (first..(first + batch).min(jobs))
                    .map(|i| EnqueueRequest {
                        queue: queue.clone(),
                        operation_key: format!("op-{i}"),
                        payload: format!("{{\"amount\":{i}}}"),
                        delay: None,
                        fairness_key: String::new(),
                        priority: 0,
                    })
                    .collect();
                let t = Instant::now();
                if batch == 1 {
                    let item = items.into_iter().next().expect("one item");
                    let out = client.enqueue(item).await.context("Enqueue")?.into_inner();
                    ensure!(out.created, "a fresh key was not created");
                } else {
                    let n = items.len();
                    let out = client
                        .enqueue_batch(EnqueueBatchRequest { items })
                        .await
                        .context("EnqueueBatch")?
                        .into_inner();
                    ensure!(
                        out.results.len() == n,
                        "EnqueueBatch answered {} of {n}",
                        out.results.len()
                    );
                    for r in out.results {
                        match r.result {
                            Some(jobfence_api::v1::enqueue_batch_result::Result::Enqueued(e))
                                if e.created => {}
                            other => bail!("a fresh key was not created: {other:?}"),
                        }
                    }
                }
                lat.claim.push(t.elapsed());
            }
        });
    }
    let latencies = join(tasks).await?;
    Ok(PhaseRun {
        jobs,
        elapsed: started.elapsed(),
        latencies,
    })
}

/// One cheap call, so the coordinator's pools and caches are warm before
/// a phase is timed.
pub async fn warm_up(addr: &str) -> Result<()> {
    let mut client = connect(addr).await?;
    // JOB_NOT_FOUND is the expected answer; it still runs a query.
    let _ = client.get_job(GetJobRequest { job_id: u64::MAX }).await;
    Ok(())
}

/// Median time of a call that does no database work (the standard health
/// check), over `n` calls on one connection: the cost of the network hop.
pub async fn health_round_trip(addr: &str, n: usize) -> Result<Duration> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await?;
        times.push(t.elapsed());
    }
    times.sort_unstable();
    Ok(times[n / 2])
}
