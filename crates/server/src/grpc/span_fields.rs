//! What [`Rpc`](super::Rpc) records on an RPC's span, so that no handler
//! records by hand: the request's fields ([`RequestFields`]) before
//! anything else, so a refused or failed call carries them too, in the
//! logs and in an exported trace; the answer's ([`ResponseFields`]) when
//! the call succeeds. A field the span does not declare is not recorded.

use super::convert;
use super::providers as conv;
use jobfence_api::v1 as proto;
use jobfence_domain::validate::Violations;
use tracing::Span;

/// A request's fields on the RPC's span (`job_id`, `queue`, `attempt`,
/// the operation key, the worker, the provider, …).
pub(crate) trait RequestFields {
    /// Records them on `span`.
    fn record(&self, span: &Span);
}

/// `request`'s fields on the current span.
pub(crate) fn record_request(request: &impl RequestFields) {
    request.record(&Span::current());
}

/// A successful answer's fields on the RPC's span (the job made, the jobs
/// claimed, whether it was a replay, …).
pub(crate) trait ResponseFields {
    /// Records them on `span`.
    fn record(&self, _span: &Span) {}
}

/// One field of a request, read from the message's field of that name.
macro_rules! request_field {
    ($r:ident, $span:ident, queue) => {
        // An empty queue, "every queue", is not recorded.
        if !$r.queue.is_empty() {
            $span.record("queue", $r.queue.as_str());
        }
    };
    ($r:ident, $span:ident, provider = name) => {
        $span.record("provider", $r.name.as_str());
    };
    ($r:ident, $span:ident, items) => {
        $span.record("items", $r.items.len());
    };
    ($r:ident, $span:ident, $field:ident) => {
        $span.record(stringify!($field), &$r.$field);
    };
}

/// [`RequestFields`] for each request, with the fields it carries.
macro_rules! request_fields {
    ($($request:ty => [$($field:ident $(= $from:ident)?),*]),+ $(,)?) => {
        $(impl RequestFields for $request {
            #[allow(unused_variables)]
            fn record(&self, span: &Span) {
                $(request_field!(self, span, $field $(= $from)?);)*
            }
        })+
    };
}

request_fields!(
    proto::EnqueueRequest => [queue, operation_key],
    proto::EnqueueBatchRequest => [items],
    proto::ClaimRequest => [queue, worker_id],
    proto::TakeoverRequest => [job_id, worker_id],
    proto::RenewLeaseRequest => [job_id, attempt],
    proto::CompleteRequest => [job_id, attempt],
    proto::FailRequest => [job_id, attempt],
    proto::GetJobRequest => [job_id],
    proto::GetJobDetailRequest => [job_id],
    proto::ListJobsRequest => [queue],
    proto::CancelJobRequest => [job_id, attempt],
    proto::RetryAsNewOperationRequest => [job_id],
    proto::PauseQueueRequest => [queue],
    proto::ResumeQueueRequest => [queue],
    proto::QueueStatsRequest => [queue],
    proto::PutQueuePolicyRequest => [queue],
    proto::DeleteQueuePolicyRequest => [queue],
    proto::ListEventsRequest => [after_event_id, queue],
    proto::WatchEventsRequest => [after_event_id, queue],
    proto::ListWorkersRequest => [],
    proto::PutProviderRequest => [provider = name],
    proto::DeleteProviderRequest => [provider = name],
    proto::ListProvidersRequest => [],
    proto::ResumeProviderRequest => [provider = name],
    proto::ListQueuePoliciesRequest => [],
    proto::ListPolicyChangesRequest => [],
    proto::PutSettlementSettingsRequest => [],
    proto::ImportSettlementHeader => [provider],
    proto::ListSettlementImportsRequest => [provider],
    proto::GetSettlementRequest => [],
    proto::ListSettlementExceptionsRequest => [],
    proto::ActOnSettlementExceptionRequest => [],
);

/// The source and outcome, once both are ones the call takes.
impl RequestFields for proto::RecordObservationRequest {
    fn record(&self, span: &Span) {
        span.record("job_id", self.job_id);
        span.record("attempt", self.attempt);
        let mut v = Violations::default();
        let source = convert::source(&mut v, self.source);
        let outcome = convert::outcome(&mut v, self.outcome);
        if v.0.is_empty() {
            span.record("source", source.as_str());
            span.record("observed", outcome.as_str());
        }
    }
}

/// The action, once it is one the call takes, and how many jobs.
impl RequestFields for proto::BulkRepairRequest {
    fn record(&self, span: &Span) {
        span.record("jobs", self.jobs.len());
        let mut v = Violations::default();
        let action = super::repair::bulk_action(&mut v, self.action);
        if v.0.is_empty() {
            span.record("action", action.as_str());
        }
    }
}

/// The resolution, once it is one the call takes.
impl RequestFields for proto::ResolveManualReviewRequest {
    fn record(&self, span: &Span) {
        span.record("job_id", self.job_id);
        span.record("attempt", self.attempt);
        let mut v = Violations::default();
        let resolution = super::job_admin::resolution(&mut v, self);
        if v.0.is_empty() {
            span.record("resolution", resolution.as_str());
        }
    }
}

/// The pause, once it is one the call takes.
impl RequestFields for proto::PauseProviderRequest {
    fn record(&self, span: &Span) {
        span.record("provider", self.name.as_str());
        let mut v = Violations::default();
        let pause = conv::pause(&mut v, self.pause);
        if v.0.is_empty() {
            span.record("pause", pause.as_str());
        }
    }
}

/// A job's operation key, queue and attempt, as `fields` name them.
fn job(span: &Span, job: Option<&proto::Job>, fields: &[&str]) {
    let Some(job) = job else { return };
    for field in fields {
        match *field {
            "queue" => span.record("queue", job.queue.as_str()),
            "operation_key" => span.record("operation_key", job.operation_key.as_str()),
            "attempt" => span.record("attempt", job.attempt),
            "job_id" => span.record("job_id", job.job_id),
            _ => continue,
        };
    }
}

/// The jobs a Complete's or Fail's claim half handed out.
fn next(span: &Span, next: Option<&proto::NextJobs>) {
    if let Some(n) = next {
        span.record("claimed", n.jobs.len());
    }
}

impl ResponseFields for proto::EnqueueResponse {
    fn record(&self, span: &Span) {
        job(span, self.job.as_ref(), &["job_id"]);
    }
}

impl ResponseFields for proto::EnqueueBatchResponse {
    fn record(&self, span: &Span) {
        let created = self.results.iter().filter(|r| {
            matches!(&r.result, Some(proto::enqueue_batch_result::Result::Enqueued(e)) if e.created)
        });
        span.record("created", created.count());
    }
}

impl ResponseFields for proto::ClaimResponse {
    fn record(&self, span: &Span) {
        span.record("claimed", self.jobs.len());
    }
}

impl ResponseFields for proto::TakeoverResponse {
    fn record(&self, span: &Span) {
        let claimed = self.claimed.as_ref().and_then(|c| c.job.as_ref());
        job(span, claimed, &["attempt", "operation_key"]);
    }
}

impl ResponseFields for proto::CompleteResponse {
    fn record(&self, span: &Span) {
        next(span, self.next.as_ref());
        if self.job.is_some() {
            job(span, self.job.as_ref(), &["operation_key"]);
            span.record("replayed", self.replayed);
        }
    }
}

impl ResponseFields for proto::FailResponse {
    fn record(&self, span: &Span) {
        next(span, self.next.as_ref());
        if self.job.is_some() {
            job(span, self.job.as_ref(), &["operation_key"]);
            let applied = proto::FailDisposition::try_from(self.applied);
            span.record("applied", applied.unwrap_or_default().as_str_name());
            span.record("replayed", self.replayed);
        }
    }
}

impl ResponseFields for proto::RecordObservationResponse {
    fn record(&self, span: &Span) {
        span.record("duplicate", self.duplicate);
    }
}

impl ResponseFields for proto::GetJobResponse {
    fn record(&self, span: &Span) {
        job(
            span,
            self.job.as_ref(),
            &["queue", "operation_key", "attempt"],
        );
    }
}

impl ResponseFields for proto::GetJobDetailResponse {
    fn record(&self, span: &Span) {
        job(
            span,
            self.job.as_ref(),
            &["queue", "operation_key", "attempt"],
        );
    }
}

impl ResponseFields for proto::ListJobsResponse {
    fn record(&self, span: &Span) {
        span.record("listed", self.jobs.len());
    }
}

impl ResponseFields for proto::ResolveManualReviewResponse {
    fn record(&self, span: &Span) {
        span.record("replayed", self.replayed);
    }
}

impl ResponseFields for proto::CancelJobResponse {
    fn record(&self, span: &Span) {
        job(span, self.job.as_ref(), &["queue"]);
        span.record("replayed", self.replayed);
    }
}

impl ResponseFields for proto::BulkRepairResponse {
    fn record(&self, span: &Span) {
        span.record("applied", self.applied);
        span.record("skipped", self.skipped);
        span.record("conflicts_retried", self.conflicts_retried);
    }
}

impl ResponseFields for proto::RetryAsNewOperationResponse {
    fn record(&self, span: &Span) {
        if let Some(new) = &self.new_job {
            span.record("new_job_id", new.job_id);
        }
        span.record("created", self.created);
    }
}

impl ResponseFields for proto::PutProviderResponse {
    fn record(&self, span: &Span) {
        span.record("created", self.created);
    }
}

impl ResponseFields for proto::ListEventsResponse {
    fn record(&self, span: &Span) {
        span.record("listed", self.events.len());
        span.record("next_after_event_id", self.next_after_event_id);
    }
}

/// Answers whose fields are not on the span.
macro_rules! no_response_fields {
    ($($response:ty),+ $(,)?) => {
        $(impl ResponseFields for $response {})+
    };
}

no_response_fields!(
    proto::RenewLeaseResponse,
    proto::PauseQueueResponse,
    proto::ResumeQueueResponse,
    proto::QueueStatsResponse,
    proto::ListWorkersResponse,
    proto::DeleteProviderResponse,
    proto::ListProvidersResponse,
    proto::PauseProviderResponse,
    proto::ResumeProviderResponse,
    proto::PutQueuePolicyResponse,
    proto::DeleteQueuePolicyResponse,
    proto::ListQueuePoliciesResponse,
    proto::ListPolicyChangesResponse,
    proto::PutSettlementSettingsResponse,
    proto::ImportSettlementResponse,
    proto::ListSettlementImportsResponse,
    proto::GetSettlementResponse,
    proto::ListSettlementExceptionsResponse,
    proto::ActOnSettlementExceptionResponse,
);
