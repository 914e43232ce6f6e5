//! `jobfence.v1.JobCoordinator`: the worker-facing service.

use super::convert::{self, duration};
use super::handoff;
use super::Rpc;
use jobfence_api::v1::job_coordinator_server::JobCoordinator;
use jobfence_api::v1::{
    enqueue_batch_result, ClaimRequest, ClaimResponse, CompleteRequest, CompleteResponse,
    EnqueueBatchRequest, EnqueueBatchResponse, EnqueueBatchResult, EnqueueRequest, EnqueueResponse,
    FailRequest, FailResponse, GetJobRequest, GetJobResponse, NextJobs, RecordObservationRequest,
    RecordObservationResponse, RenewLeaseRequest, RenewLeaseResponse, TakeoverRequest,
    TakeoverResponse,
};
use jobfence_auth::Action;
use jobfence_core::{self as coordinator, Coordinator};
use jobfence_domain::fairness::{self, Priority};
use jobfence_domain::validate::Violations;
use jobfence_domain::{self as domain, CoordinatorError};
use std::time::Duration;
use tonic::{Request, Response, Status};
use tracing::instrument;

/// The tonic service over a [`Coordinator`].
#[derive(Debug, Clone)]
pub struct JobCoordinatorService {
    coordinator: Coordinator,
}

impl JobCoordinatorService {
    /// The service over `coordinator`.
    pub fn new(coordinator: Coordinator) -> Self {
        JobCoordinatorService { coordinator }
    }

    /// The handler skeleton of `method` (see [`Rpc`]).
    fn rpc(&self, method: &'static str) -> Rpc<'_> {
        Rpc::new(self.coordinator.metrics(), method)
    }
}

#[tonic::async_trait]
impl JobCoordinator for JobCoordinatorService {
    #[instrument(
        name = "Enqueue",
        skip_all,
        fields(caller, queue, operation_key, job_id, outcome)
    )]
    async fn enqueue(
        &self,
        request: Request<EnqueueRequest>,
    ) -> Result<Response<EnqueueResponse>, Status> {
        let rpc = self.rpc("Enqueue");
        rpc.scoped(request, Action::Enqueue, |r, scope| async move {
            let mut v = Violations::default();
            let delay = duration(&mut v, "delay", r.delay);
            let fairness_key = fairness::key_field(&mut v, "fairness_key", r.fairness_key);
            let priority = Priority::field(&mut v, "priority", r.priority);
            v.finish()?;
            let call = domain::Enqueue {
                queue: r.queue,
                operation_key: r.operation_key,
                payload: r.payload,
                delay: delay.unwrap_or_default(),
                fairness_key,
                priority,
            };
            let out = self.coordinator.enqueue(call, &scope).await?;
            Ok(EnqueueResponse {
                job: Some(convert::job(out.job)),
                created: out.created,
            })
        })
        .await
    }

    #[instrument(
        name = "EnqueueBatch",
        skip_all,
        fields(caller, items, created, outcome)
    )]
    async fn enqueue_batch(
        &self,
        request: Request<EnqueueBatchRequest>,
    ) -> Result<Response<EnqueueBatchResponse>, Status> {
        let rpc = self.rpc("EnqueueBatch");
        rpc.scoped(request, Action::Enqueue, |r, scope| async move {
            let items = self.enqueue_items(r.items)?;
            let answers = self.coordinator.enqueue_batch(items, &scope).await?;
            Ok(EnqueueBatchResponse {
                results: answers.into_iter().map(enqueue_batch_result).collect(),
            })
        })
        .await
    }

    #[instrument(
        name = "Claim",
        skip_all,
        fields(caller, queue, worker_id, claimed, outcome)
    )]
    async fn claim(
        &self,
        request: Request<ClaimRequest>,
    ) -> Result<Response<ClaimResponse>, Status> {
        let deadline = call_deadline(request.metadata());
        let client = super::workers::client(request.metadata());
        let rpc = self.rpc("Claim");
        rpc.scoped(request, Action::Work, |r, scope| async move {
            if scope.allows(&r.queue) {
                super::workers::saw(&self.coordinator, &client, &r.worker_id, &r.queue);
            }
            let mut v = Violations::default();
            let lease = duration(&mut v, "lease", r.lease);
            let wait = duration(&mut v, "wait", r.wait).unwrap_or_default();
            v.finish()?;
            // Answer empty before the caller's deadline, never after it.
            let wait = handoff::bounded_wait(wait, deadline);
            let call = coordinator::ClaimParams {
                queue: r.queue,
                worker_id: r.worker_id,
                max_jobs: r.max_jobs,
                lease,
                wait,
            };
            let jobs = self.coordinator.claim(call, &scope).await?;
            Ok(ClaimResponse {
                jobs: jobs.into_iter().map(convert::claimed).collect(),
            })
        })
        .await
    }

    #[instrument(
        name = "Takeover",
        skip_all,
        fields(caller, job_id, queue, worker_id, attempt, operation_key, outcome)
    )]
    async fn takeover(
        &self,
        request: Request<TakeoverRequest>,
    ) -> Result<Response<TakeoverResponse>, Status> {
        let client = super::workers::client(request.metadata());
        let rpc = self.rpc("Takeover");
        rpc.scoped(request, Action::Work, |r, scope| async move {
            let mut v = Violations::default();
            let lease = duration(&mut v, "lease", r.lease);
            v.finish()?;
            let call = coordinator::TakeoverParams {
                job_id: r.job_id,
                worker_id: r.worker_id,
                lease,
            };
            let worker_id = call.worker_id.clone();
            let claimed = self.coordinator.takeover(call, &scope).await?;
            super::workers::saw(&self.coordinator, &client, &worker_id, &claimed.job.queue);
            Ok(TakeoverResponse {
                claimed: Some(convert::claimed(claimed)),
            })
        })
        .await
    }

    #[instrument(
        name = "RenewLease",
        skip_all,
        fields(caller, job_id, queue, attempt, operation_key, outcome)
    )]
    async fn renew_lease(
        &self,
        request: Request<RenewLeaseRequest>,
    ) -> Result<Response<RenewLeaseResponse>, Status> {
        let rpc = self.rpc("RenewLease");
        rpc.scoped(request, Action::Work, |r, scope| async move {
            let mut v = Violations::default();
            let lease = duration(&mut v, "lease", r.lease);
            v.finish()?;
            let call = coordinator::RenewLeaseParams {
                job_id: r.job_id,
                attempt: r.attempt,
                lease,
            };
            let out = self.coordinator.renew_lease(call, &scope).await?;
            Ok(RenewLeaseResponse {
                job: Some(convert::job(out.job)),
                replayed: out.replayed,
            })
        })
        .await
    }

    #[instrument(
        name = "Complete",
        skip_all,
        fields(
            caller,
            job_id,
            queue,
            attempt,
            operation_key,
            replayed,
            claimed,
            outcome
        )
    )]
    async fn complete(
        &self,
        request: Request<CompleteRequest>,
    ) -> Result<Response<CompleteResponse>, Status> {
        let deadline = call_deadline(request.metadata());
        let client = super::workers::client(request.metadata());
        let rpc = self.rpc("Complete");
        rpc.scoped(request, Action::Work, |r, scope| async move {
            if let Some(n) = r.next.as_ref().filter(|n| scope.allows(&n.queue)) {
                super::workers::saw(&self.coordinator, &client, &n.worker_id, &n.queue);
            }
            let mut v = Violations::default();
            let call = domain::Complete {
                job_id: r.job_id,
                attempt: r.attempt,
                provider_reference: v.optional("provider_reference", r.provider_reference),
                result: Violations::content(r.result),
            };
            let next = r
                .next
                .map(|next| handoff::next_params(&mut v, next, deadline));
            handoff::with_write_checks(&mut v, coordinator::check_complete(&call));
            v.finish()?;
            let with_next = next.is_some();
            let handed = self.coordinator.complete(call, next, &scope).await?;
            let out = match handed.write {
                Ok(out) => out,
                Err(e) if with_next => {
                    return Ok(CompleteResponse {
                        job: None,
                        replayed: false,
                        next: Some(handoff::next_jobs(handed.jobs, Some(&e))),
                    })
                }
                Err(e) => return Err(e),
            };
            Ok(CompleteResponse {
                job: Some(convert::job(out.job)),
                replayed: out.replayed,
                next: with_next.then(|| handoff::next_jobs(handed.jobs, None)),
            })
        })
        .await
    }

    #[instrument(
        name = "Fail",
        skip_all,
        fields(
            caller,
            job_id,
            queue,
            attempt,
            operation_key,
            applied,
            replayed,
            claimed,
            outcome
        )
    )]
    async fn fail(&self, request: Request<FailRequest>) -> Result<Response<FailResponse>, Status> {
        let deadline = call_deadline(request.metadata());
        let client = super::workers::client(request.metadata());
        let rpc = self.rpc("Fail");
        rpc.scoped(request, Action::Work, |r, scope| async move {
            if let Some(n) = r.next.as_ref().filter(|n| scope.allows(&n.queue)) {
                super::workers::saw(&self.coordinator, &client, &n.worker_id, &n.queue);
            }
            let mut v = Violations::default();
            let disposition = convert::disposition(&mut v, r.disposition);
            let retry_delay = duration(&mut v, "retry_delay", r.retry_delay);
            let provider_retry_after =
                duration(&mut v, "provider_retry_after", r.provider_retry_after);
            // The claim half's fields are checked with the write's: every
            // violation of both in one refusal.
            let next = r
                .next
                .map(|next| handoff::next_params(&mut v, next, deadline));
            let call = coordinator::FailParams {
                job_id: r.job_id,
                attempt: r.attempt,
                disposition,
                error: r.error,
                retry_delay: retry_delay.unwrap_or_default(),
                provider_retry_after,
            };
            handoff::with_write_checks(&mut v, coordinator::check_fail(&call));
            v.finish()?;
            let with_next = next.is_some();
            let handed = self.coordinator.fail(call, next, &scope).await?;
            Ok(match handed.write {
                Ok(out) => fail_response(
                    out,
                    with_next.then(|| handoff::next_jobs(handed.jobs, None)),
                ),
                Err(e) if with_next => FailResponse {
                    next: Some(handoff::next_jobs(handed.jobs, Some(&e))),
                    ..Default::default()
                },
                Err(e) => return Err(e),
            })
        })
        .await
    }

    /// The one handler whose scope depends on the message (a webhook
    /// reports webhooks only), so it authorises after converting it.
    #[instrument(
        name = "RecordObservation",
        skip_all,
        fields(caller, job_id, attempt, source, observed, duplicate, outcome)
    )]
    async fn record_observation(
        &self,
        request: Request<RecordObservationRequest>,
    ) -> Result<Response<RecordObservationResponse>, Status> {
        let rpc = self.rpc("RecordObservation");
        let caller = super::caller(&request);
        let (_, extensions, r) = request.into_parts();
        super::record_request(&r);
        let mut v = Violations::default();
        let source = convert::source(&mut v, r.source);
        let outcome = convert::outcome(&mut v, r.outcome);
        let provider_reference = v.optional("provider_reference", r.provider_reference);
        if let Err(e) = v.finish() {
            return rpc.answer(Err(e));
        }
        let scope = jobfence_auth::observation_scope(caller.as_deref(), source)
            .map_err(|r| rpc.refuse(&extensions, r))?;
        let call = domain::RecordObservation {
            job_id: r.job_id,
            attempt: r.attempt,
            source,
            outcome,
            provider_reference,
            body: r.body,
            dedup_key: r.dedup_key,
        };
        let result = self.coordinator.record_observation(call, &scope).await;
        rpc.answer(
            result.map(|(observation, duplicate)| RecordObservationResponse {
                observation: Some(convert::observation(observation)),
                duplicate,
            }),
        )
    }

    #[instrument(
        name = "GetJob",
        skip_all,
        fields(caller, job_id, queue, operation_key, attempt, outcome)
    )]
    async fn get_job(
        &self,
        request: Request<GetJobRequest>,
    ) -> Result<Response<GetJobResponse>, Status> {
        let rpc = self.rpc("GetJob");
        rpc.scoped(request, Action::ReadJob, |r, scope| async move {
            let (job, observations) = self.coordinator.get_job(r.job_id, &scope).await?;
            Ok(GetJobResponse {
                job: Some(convert::job(job)),
                observations: observations.into_iter().map(convert::observation).collect(),
            })
        })
        .await
    }
}

impl JobCoordinatorService {
    /// The items of an EnqueueBatch as domain calls. A delay that is not a
    /// duration is refused with every other problem of the batch named at
    /// once, not only the durations.
    fn enqueue_items(
        &self,
        items: Vec<EnqueueRequest>,
    ) -> Result<Vec<domain::Enqueue>, CoordinatorError> {
        let mut v = Violations::default();
        let items: Vec<domain::Enqueue> = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| domain::Enqueue {
                delay: duration(&mut v, &format!("items[{i}].delay"), item.delay)
                    .unwrap_or_default(),
                fairness_key: fairness::key_field(
                    &mut v,
                    &format!("items[{i}].fairness_key"),
                    item.fairness_key,
                ),
                priority: Priority::field(&mut v, &format!("items[{i}].priority"), item.priority),
                queue: item.queue,
                operation_key: item.operation_key,
                payload: item.payload,
            })
            .collect();
        if !v.0.is_empty() {
            self.coordinator.check_enqueue_batch(&items, &mut v);
            v.finish()?;
        }
        Ok(items)
    }
}

/// One item's answer in an EnqueueBatch: its job, or its refusal.
fn enqueue_batch_result(
    answer: Result<domain::EnqueueOutcome, CoordinatorError>,
) -> EnqueueBatchResult {
    EnqueueBatchResult {
        result: Some(match answer {
            Ok(out) => enqueue_batch_result::Result::Enqueued(EnqueueResponse {
                job: Some(convert::job(out.job)),
                created: out.created,
            }),
            Err(e) => enqueue_batch_result::Result::Error(convert::item_error(&e)),
        }),
    }
}

/// A Fail's response for what was applied (`next`: the claim half, when
/// the call asked for it).
fn fail_response(out: domain::FailOutcome, next: Option<NextJobs>) -> FailResponse {
    let applied = convert::disposition_to_proto(out.applied);
    FailResponse {
        job: Some(convert::job(out.job)),
        applied: applied as i32,
        override_reason: out
            .override_reason
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default(),
        replayed: out.replayed,
        next,
    }
}

/// The call's deadline, from its `grpc-timeout` header (the server's
/// admission layer cuts it to `--call-timeout`).
fn call_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    super::parse_grpc_timeout(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_headers_parse_to_deadlines() {
        let mut m = tonic::metadata::MetadataMap::new();
        assert_eq!(call_deadline(&m), None);
        for (v, d) in [
            ("10S", Duration::from_secs(10)),
            ("2500m", Duration::from_millis(2500)),
            ("1M", Duration::from_secs(60)),
            ("7u", Duration::from_micros(7)),
        ] {
            m.insert("grpc-timeout", v.parse().unwrap());
            assert_eq!(call_deadline(&m), Some(d), "{v}");
        }
        m.insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(call_deadline(&m), None);
    }
}
