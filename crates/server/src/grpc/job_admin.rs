//! `jobfence.v1.JobAdmin`: the operator service, in the same shape as the
//! worker-facing adapters ([`Rpc`]): the operator's writes are recorded
//! under the operator's name ([`Rpc::operator`]), the reads only record
//! the caller ([`Rpc::read`]).

use super::convert::{self, duration};
use super::events::event_to_proto;
use super::providers as conv;
use super::Rpc;
use jobfence_api::v1::job_admin_server::JobAdmin;
use jobfence_api::v1::{
    self as proto, CancelJobRequest, CancelJobResponse, DeleteProviderRequest,
    DeleteProviderResponse, DeleteQueuePolicyRequest, DeleteQueuePolicyResponse,
    GetJobDetailRequest, GetJobDetailResponse, ListJobsRequest, ListJobsResponse,
    ListPolicyChangesRequest, ListPolicyChangesResponse, ListProvidersRequest,
    ListProvidersResponse, ListQueuePoliciesRequest, ListQueuePoliciesResponse,
    PauseProviderRequest, PauseProviderResponse, PutProviderRequest, PutProviderResponse,
    PutQueuePolicyRequest, PutQueuePolicyResponse, QueueStatsRequest, QueueStatsResponse,
    ResolveManualReviewRequest, ResolveManualReviewResponse, ResumeProviderRequest,
    ResumeProviderResponse,
};
use jobfence_core::Coordinator;
use jobfence_domain::admin::Resolution;
use jobfence_domain::budget::Pause;
use jobfence_domain::providers::{ChangeBy, PutProvider, PutQueuePolicy, SetPause};
use jobfence_domain::validate::Violations;
use tonic::{Request, Response, Status};
use tracing::instrument;

/// The tonic service over a [`Coordinator`].
#[derive(Debug, Clone)]
pub struct JobAdminService {
    coordinator: Coordinator,
}

impl JobAdminService {
    /// The service over `coordinator`.
    pub fn new(coordinator: Coordinator) -> Self {
        JobAdminService { coordinator }
    }

    /// The handler skeleton of `method` (see [`Rpc`]).
    fn rpc(&self, method: &'static str) -> Rpc<'_> {
        Rpc::new(self.coordinator.metrics(), method)
    }
}

/// The resolution a request asks for (its delay checked into `v`).
pub(super) fn resolution(v: &mut Violations, r: &ResolveManualReviewRequest) -> Resolution {
    let mut delay = || duration(v, "delay", r.delay).unwrap_or_default();
    match proto::Resolution::try_from(r.resolution) {
        Ok(proto::Resolution::Succeeded) => Resolution::Succeeded {
            provider_reference: r.provider_reference.clone(),
            result: Violations::content(r.result.clone()),
        },
        Ok(proto::Resolution::Failed) => Resolution::Failed,
        Ok(proto::Resolution::RetryReconcile) => Resolution::RetryReconcile { delay: delay() },
        Ok(proto::Resolution::RetryExecute) => Resolution::RetryExecute { delay: delay() },
        _ => {
            v.add(
                "resolution",
                format!("unknown or unset resolution {}", r.resolution),
            );
            Resolution::Failed
        }
    }
}

fn queue_stats(s: jobfence_domain::admin::QueueStats) -> proto::QueueStats {
    let oldest = jobfence_domain::admin::QueuePending::STATES
        .iter()
        .zip(s.pending.oldest)
        .filter_map(|(state, o)| {
            o.map(|o| proto::PendingAge {
                state: convert::state(*state) as i32,
                age: Some(convert::duration_to_proto(o.age)),
                job_id: o.job_id,
            })
        })
        .collect();
    proto::QueueStats {
        queue: s.queue,
        counts: s
            .counts
            .into_iter()
            .map(|(state, jobs)| proto::StateCount {
                state: convert::state(state) as i32,
                jobs,
            })
            .collect(),
        oldest,
        oldest_unfinished_age: s.pending.unfinished.map(convert::duration_to_proto),
        takeovers: s.takeovers,
        stale_write_rejections: s.stale_write_rejections,
        held: s.held.map(|h| proto::QueueHold {
            provider: h.provider,
            kind: h.kind.as_str().into(),
            why: h.why,
            since: h.since.map(convert::timestamp),
            by: h.by.unwrap_or_default(),
        }),
        due_keys: s.due_keys.top.into_iter().map(key_backlog).collect(),
        other_keys: s.due_keys.others.map(key_backlog),
    }
}

fn key_backlog(k: jobfence_domain::admin::KeyBacklog) -> proto::KeyBacklog {
    proto::KeyBacklog {
        fairness_key: k.fairness_key.unwrap_or_default(),
        keys: k.keys,
        due: k.due,
        oldest_due_age: Some(convert::duration_to_proto(k.oldest_due)),
    }
}

#[tonic::async_trait]
impl JobAdmin for JobAdminService {
    #[instrument(name = "PutSettlementSettings", skip_all, fields(caller, outcome))]
    async fn put_settlement_settings(
        &self,
        request: Request<proto::PutSettlementSettingsRequest>,
    ) -> Result<Response<proto::PutSettlementSettingsResponse>, Status> {
        let rpc = self.rpc("PutSettlementSettings");
        super::settlement::put_settings(rpc, &self.coordinator, request).await
    }

    #[instrument(name = "ImportSettlement", skip_all, fields(caller, provider, outcome))]
    async fn import_settlement(
        &self,
        request: Request<tonic::Streaming<proto::ImportSettlementRequest>>,
    ) -> Result<Response<proto::ImportSettlementResponse>, Status> {
        let rpc = self.rpc("ImportSettlement");
        super::settlement::import(rpc, &self.coordinator, request).await
    }

    #[instrument(
        name = "ListSettlementImports",
        skip_all,
        fields(caller, provider, outcome)
    )]
    async fn list_settlement_imports(
        &self,
        request: Request<proto::ListSettlementImportsRequest>,
    ) -> Result<Response<proto::ListSettlementImportsResponse>, Status> {
        let rpc = self.rpc("ListSettlementImports");
        super::settlement::imports(rpc, &self.coordinator, request).await
    }

    #[instrument(name = "GetSettlement", skip_all, fields(caller, outcome))]
    async fn get_settlement(
        &self,
        request: Request<proto::GetSettlementRequest>,
    ) -> Result<Response<proto::GetSettlementResponse>, Status> {
        super::settlement::get(self.rpc("GetSettlement"), &self.coordinator, request).await
    }

    #[instrument(name = "ListSettlementExceptions", skip_all, fields(caller, outcome))]
    async fn list_settlement_exceptions(
        &self,
        request: Request<proto::ListSettlementExceptionsRequest>,
    ) -> Result<Response<proto::ListSettlementExceptionsResponse>, Status> {
        let rpc = self.rpc("ListSettlementExceptions");
        super::settlement::list(rpc, &self.coordinator, request).await
    }

    #[instrument(name = "ActOnSettlementException", skip_all, fields(caller, outcome))]
    async fn act_on_settlement_exception(
        &self,
        request: Request<proto::ActOnSettlementExceptionRequest>,
    ) -> Result<Response<proto::ActOnSettlementExceptionResponse>, Status> {
        let rpc = self.rpc("ActOnSettlementException");
        super::settlement::act(rpc, &self.coordinator, request).await
    }

    #[instrument(name = "ListJobs", skip_all, fields(caller, queue, listed, outcome))]
    async fn list_jobs(
        &self,
        request: Request<ListJobsRequest>,
    ) -> Result<Response<ListJobsResponse>, Status> {
        self.rpc("ListJobs")
            .read(request, |r| async move {
                let filter = convert::list_filter(r)?;
                let (jobs, next) = self.coordinator.list_jobs(filter).await?;
                Ok(ListJobsResponse {
                    jobs: jobs.into_iter().map(convert::job).collect(),
                    next_page_token: next.map(|id| id.to_string()).unwrap_or_default(),
                })
            })
            .await
    }

    #[instrument(
        name = "AdminGetJob",
        skip_all,
        fields(caller, job_id, queue, operation_key, attempt, outcome)
    )]
    async fn get_job(
        &self,
        request: Request<GetJobDetailRequest>,
    ) -> Result<Response<GetJobDetailResponse>, Status> {
        self.rpc("GetJob")
            .read(request, |r| async move {
                let d = self.coordinator.job_detail(r.job_id).await?;
                Ok(GetJobDetailResponse {
                    job: Some(convert::job(d.job)),
                    observations: d
                        .observations
                        .into_iter()
                        .map(convert::observation)
                        .collect(),
                    events: d.events.into_iter().map(event_to_proto).collect(),
                })
            })
            .await
    }

    #[instrument(
        name = "ResolveManualReview",
        skip_all,
        fields(
            caller, job_id, queue, attempt, operator, resolution, replayed, outcome
        )
    )]
    async fn resolve_manual_review(
        &self,
        request: Request<ResolveManualReviewRequest>,
    ) -> Result<Response<ResolveManualReviewResponse>, Status> {
        self.rpc("ResolveManualReview")
            .operator(request, |r, operator| async move {
                let mut v = Violations::default();
                let resolution = resolution(&mut v, &r);
                v.finish()?;
                let call = jobfence_domain::admin::ResolveManualReview {
                    job_id: r.job_id,
                    attempt: r.attempt,
                    resolution,
                    operator,
                    reason: r.reason,
                };
                let out = self
                    .coordinator
                    .resolve_manual_review(call, r.authorize_resend)
                    .await?;
                Ok(ResolveManualReviewResponse {
                    job: Some(convert::job(out.job)),
                    replayed: out.replayed,
                })
            })
            .await
    }

    #[instrument(
        name = "CancelJob",
        skip_all,
        fields(caller, job_id, queue, attempt, operator, replayed, outcome)
    )]
    async fn cancel_job(
        &self,
        request: Request<CancelJobRequest>,
    ) -> Result<Response<CancelJobResponse>, Status> {
        self.rpc("CancelJob")
            .operator(request, |r, operator| async move {
                let call = jobfence_domain::admin::CancelJob {
                    job_id: r.job_id,
                    attempt: r.attempt,
                    operator,
                    reason: r.reason,
                };
                let out = self.coordinator.cancel_job(call).await?;
                Ok(CancelJobResponse {
                    job: Some(convert::job(out.job)),
                    replayed: out.replayed,
                })
            })
            .await
    }

    #[instrument(
        name = "BulkRepair",
        skip_all,
        fields(
            caller,
            action,
            jobs,
            operator,
            applied,
            skipped,
            conflicts_retried,
            outcome
        )
    )]
    async fn bulk_repair(
        &self,
        request: Request<proto::BulkRepairRequest>,
    ) -> Result<Response<proto::BulkRepairResponse>, Status> {
        super::repair::bulk_repair(self.rpc("BulkRepair"), &self.coordinator, request).await
    }

    #[instrument(
        name = "RetryAsNewOperation",
        skip_all,
        fields(caller, job_id, operator, new_job_id, created, outcome)
    )]
    async fn retry_as_new_operation(
        &self,
        request: Request<proto::RetryAsNewOperationRequest>,
    ) -> Result<Response<proto::RetryAsNewOperationResponse>, Status> {
        super::repair::retry(self.rpc("RetryAsNewOperation"), &self.coordinator, request).await
    }

    #[instrument(name = "PauseQueue", skip_all, fields(caller, queue, outcome))]
    async fn pause_queue(
        &self,
        request: Request<proto::PauseQueueRequest>,
    ) -> Result<Response<proto::PauseQueueResponse>, Status> {
        super::repair::pause_queue(self.rpc("PauseQueue"), &self.coordinator, request).await
    }

    #[instrument(name = "ResumeQueue", skip_all, fields(caller, queue, outcome))]
    async fn resume_queue(
        &self,
        request: Request<proto::ResumeQueueRequest>,
    ) -> Result<Response<proto::ResumeQueueResponse>, Status> {
        super::repair::resume_queue(self.rpc("ResumeQueue"), &self.coordinator, request).await
    }

    #[instrument(name = "ListWorkers", skip_all, fields(caller, outcome))]
    async fn list_workers(
        &self,
        request: Request<proto::ListWorkersRequest>,
    ) -> Result<Response<proto::ListWorkersResponse>, Status> {
        super::workers::list(self.rpc("ListWorkers"), &self.coordinator, request).await
    }

    #[instrument(name = "QueueStats", skip_all, fields(caller, queue, outcome))]
    async fn queue_stats(
        &self,
        request: Request<QueueStatsRequest>,
    ) -> Result<Response<QueueStatsResponse>, Status> {
        self.rpc("QueueStats")
            .read(request, |r| async move {
                let mut v = Violations::default();
                let window = duration(&mut v, "window", r.window);
                let queue = v.optional("queue", r.queue);
                v.finish()?;
                let (stats, window) = self.coordinator.queue_stats(queue, window).await?;
                Ok(QueueStatsResponse {
                    queues: stats.into_iter().map(queue_stats).collect(),
                    window: Some(convert::duration_to_proto(window)),
                })
            })
            .await
    }

    #[instrument(
        name = "PutProvider",
        skip_all,
        fields(caller, provider, operator, created, outcome)
    )]
    async fn put_provider(
        &self,
        request: Request<PutProviderRequest>,
    ) -> Result<Response<PutProviderResponse>, Status> {
        self.rpc("PutProvider")
            .operator(request, |r, operator| async move {
                let mut v = Violations::default();
                let budget = conv::budget(&mut v, r.budget);
                v.finish()?;
                let call = PutProvider {
                    name: r.name,
                    budget,
                    queues: r.queues,
                    by: by(operator, r.reason),
                };
                let (provider, created) = self.coordinator.put_provider(call).await?;
                Ok(PutProviderResponse {
                    provider: Some(conv::provider(provider)),
                    created,
                })
            })
            .await
    }

    #[instrument(
        name = "DeleteProvider",
        skip_all,
        fields(caller, provider, operator, outcome)
    )]
    async fn delete_provider(
        &self,
        request: Request<DeleteProviderRequest>,
    ) -> Result<Response<DeleteProviderResponse>, Status> {
        self.rpc("DeleteProvider")
            .operator(request, |r, operator| async move {
                let by = by(operator, r.reason);
                let p = self.coordinator.delete_provider(&r.name, by).await?;
                Ok(DeleteProviderResponse {
                    provider: Some(conv::provider(p)),
                })
            })
            .await
    }

    #[instrument(name = "ListProviders", skip_all, fields(caller, outcome))]
    async fn list_providers(
        &self,
        request: Request<ListProvidersRequest>,
    ) -> Result<Response<ListProvidersResponse>, Status> {
        self.rpc("ListProviders")
            .read(request, |_| async move {
                let all = self.coordinator.list_providers().await?;
                Ok(ListProvidersResponse {
                    providers: all.into_iter().map(conv::provider).collect(),
                })
            })
            .await
    }

    #[instrument(
        name = "PauseProvider",
        skip_all,
        fields(caller, provider, pause, operator, outcome)
    )]
    async fn pause_provider(
        &self,
        request: Request<PauseProviderRequest>,
    ) -> Result<Response<PauseProviderResponse>, Status> {
        self.rpc("PauseProvider")
            .operator(request, |r, operator| async move {
                let mut v = Violations::default();
                let pause = conv::pause(&mut v, r.pause);
                v.finish()?;
                let call = SetPause {
                    name: r.name,
                    pause,
                    by: by(operator, r.reason),
                };
                let p = self.coordinator.set_provider_pause(call).await?;
                Ok(PauseProviderResponse {
                    provider: Some(conv::provider(p)),
                })
            })
            .await
    }

    #[instrument(
        name = "ResumeProvider",
        skip_all,
        fields(caller, provider, operator, outcome)
    )]
    async fn resume_provider(
        &self,
        request: Request<ResumeProviderRequest>,
    ) -> Result<Response<ResumeProviderResponse>, Status> {
        self.rpc("ResumeProvider")
            .operator(request, |r, operator| async move {
                let call = SetPause {
                    name: r.name,
                    pause: Pause::None,
                    by: by(operator, r.reason),
                };
                let p = self.coordinator.set_provider_pause(call).await?;
                Ok(ResumeProviderResponse {
                    provider: Some(conv::provider(p)),
                })
            })
            .await
    }

    #[instrument(
        name = "PutQueuePolicy",
        skip_all,
        fields(caller, queue, operator, outcome)
    )]
    async fn put_queue_policy(
        &self,
        request: Request<PutQueuePolicyRequest>,
    ) -> Result<Response<PutQueuePolicyResponse>, Status> {
        self.rpc("PutQueuePolicy")
            .operator(request, |r, operator| async move {
                let mut v = Violations::default();
                let policy = conv::queue_policy(&mut v, &r);
                let job_retention = r
                    .job_retention
                    .and_then(|d| duration(&mut v, "job_retention", Some(d)));
                v.finish()?;
                let call = PutQueuePolicy {
                    queue: r.queue,
                    policy,
                    job_retention,
                    by: by(operator, r.reason),
                };
                let stored = self.coordinator.put_queue_policy(call).await?;
                Ok(PutQueuePolicyResponse {
                    policy: Some(conv::queue_policy_to_proto(stored)),
                })
            })
            .await
    }

    #[instrument(
        name = "DeleteQueuePolicy",
        skip_all,
        fields(caller, queue, operator, outcome)
    )]
    async fn delete_queue_policy(
        &self,
        request: Request<DeleteQueuePolicyRequest>,
    ) -> Result<Response<DeleteQueuePolicyResponse>, Status> {
        self.rpc("DeleteQueuePolicy")
            .operator(request, |r, operator| async move {
                let by = by(operator, r.reason);
                let p = self.coordinator.delete_queue_policy(&r.queue, by).await?;
                Ok(DeleteQueuePolicyResponse {
                    policy: Some(conv::queue_policy_to_proto(p)),
                })
            })
            .await
    }

    #[instrument(name = "ListQueuePolicies", skip_all, fields(caller, outcome))]
    async fn list_queue_policies(
        &self,
        request: Request<ListQueuePoliciesRequest>,
    ) -> Result<Response<ListQueuePoliciesResponse>, Status> {
        self.rpc("ListQueuePolicies")
            .read(request, |_| async move {
                let all = self.coordinator.list_queue_policies().await?;
                Ok(ListQueuePoliciesResponse {
                    policies: all.into_iter().map(conv::queue_policy_to_proto).collect(),
                })
            })
            .await
    }

    #[instrument(name = "ListPolicyChanges", skip_all, fields(caller, outcome))]
    async fn list_policy_changes(
        &self,
        request: Request<ListPolicyChangesRequest>,
    ) -> Result<Response<ListPolicyChangesResponse>, Status> {
        self.rpc("ListPolicyChanges")
            .read(request, |r| async move {
                let mut v = Violations::default();
                let subject = v.optional("subject", r.subject);
                v.finish()?;
                let before = (r.before_change_id > 0).then_some(r.before_change_id);
                let all = self
                    .coordinator
                    .list_policy_changes(subject.as_deref(), before, r.limit)
                    .await?;
                Ok(ListPolicyChangesResponse {
                    changes: all.into_iter().map(conv::change).collect(),
                })
            })
            .await
    }
}

/// Who makes an operator's change, and why.
fn by(operator: String, reason: String) -> ChangeBy {
    ChangeBy { operator, reason }
}
