//! proto ⇄ domain conversions. Shapes only (enums, durations); limits are
//! checked by the coordinator. Unknown or unset enum values and negative
//! durations are field violations. An optional string field is read with
//! [`Violations::optional`], the API's one rule for strings (docs/api.md,
//! "Strings").

use jobfence_api::v1 as proto;
use jobfence_domain::validate::Violations;
use jobfence_domain::{
    ClaimedJob, DbTime, FailDisposition, Job, JobState, NextAction, Observation,
    ObservationOutcome, ObservationSource,
};
use std::time::Duration;

/// A DB timestamp (UTC) as a protobuf Timestamp.
pub fn timestamp(t: DbTime) -> prost_types::Timestamp {
    let utc = t.and_utc();
    prost_types::Timestamp {
        seconds: utc.timestamp(),
        nanos: utc.timestamp_subsec_nanos() as i32,
    }
}

/// A `std` duration as a protobuf Duration (whole seconds + nanoseconds,
/// saturating at `i64::MAX` seconds).
pub fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// A protobuf Duration as a `std::time::Duration`; `None` when unset.
/// Negative or malformed durations are violations of `field`.
pub fn duration(
    v: &mut Violations,
    field: &str,
    d: Option<prost_types::Duration>,
) -> Option<Duration> {
    let d = d?;
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        v.add(
            field,
            "must not be negative (seconds >= 0, 0 <= nanos < 1e9)",
        );
        return None;
    }
    Some(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// A job state as sent on the wire.
pub fn state(s: JobState) -> proto::JobState {
    match s {
        JobState::Ready => proto::JobState::Ready,
        JobState::Running => proto::JobState::Running,
        JobState::Succeeded => proto::JobState::Succeeded,
        JobState::Failed => proto::JobState::Failed,
        JobState::ManualReview => proto::JobState::ManualReview,
        JobState::Cancelled => proto::JobState::Cancelled,
    }
}

fn next_action(a: NextAction) -> proto::NextAction {
    match a {
        NextAction::Execute => proto::NextAction::Execute,
        NextAction::Reconcile => proto::NextAction::Reconcile,
    }
}

/// A job as sent on the wire.
pub fn job(j: Job) -> proto::Job {
    proto::Job {
        job_id: j.id,
        queue: j.queue,
        operation_key: j.operation_key,
        payload: j.payload,
        state: state(j.state) as i32,
        attempt: j.attempt,
        next_action: next_action(j.next_action) as i32,
        run_at: Some(timestamp(j.run_at)),
        lease_until: j.lease_until.map(timestamp),
        lease_owner: j.lease_owner.unwrap_or_default(),
        first_dispatched_at: j.first_dispatched_at.map(timestamp),
        dispatch_count: j.dispatch_count,
        provider_reference: j.provider_reference.unwrap_or_default(),
        result: j.result.unwrap_or_default(),
        last_error: j.last_error.unwrap_or_default(),
        state_reason: j.state_reason.unwrap_or_default(),
        created_at: Some(timestamp(j.created_at)),
        updated_at: Some(timestamp(j.updated_at)),
        finished_at: j.finished_at.map(timestamp),
        priority: u32::from(j.priority.get()),
        fairness_key: j.fairness_key.unwrap_or_default(),
    }
}

/// An observation as sent on the wire.
pub fn observation(o: Observation) -> proto::Observation {
    proto::Observation {
        observation_id: o.id,
        job_id: o.job_id,
        attempt: o.attempt,
        source: source_to_proto(o.source) as i32,
        outcome: outcome_to_proto(o.outcome) as i32,
        provider_reference: o.provider_reference.unwrap_or_default(),
        body: o.body,
        dedup_key: o.dedup_key,
        recorded_at: Some(timestamp(o.recorded_at)),
    }
}

/// A claimed job as sent on the wire.
pub fn claimed(c: ClaimedJob) -> proto::ClaimedJob {
    proto::ClaimedJob {
        job: Some(job(c.job)),
        takeover: c.takeover,
        observations: c.observations.into_iter().map(observation).collect(),
    }
}

fn source_to_proto(s: ObservationSource) -> proto::ObservationSource {
    match s {
        ObservationSource::Worker => proto::ObservationSource::Worker,
        ObservationSource::Webhook => proto::ObservationSource::Webhook,
        ObservationSource::Reconciler => proto::ObservationSource::Reconciler,
        ObservationSource::Operator => proto::ObservationSource::Operator,
        ObservationSource::Settlement => proto::ObservationSource::Settlement,
    }
}

fn outcome_to_proto(o: ObservationOutcome) -> proto::ObservationOutcome {
    match o {
        ObservationOutcome::Succeeded => proto::ObservationOutcome::Succeeded,
        ObservationOutcome::Pending => proto::ObservationOutcome::Pending,
        ObservationOutcome::Failed => proto::ObservationOutcome::Failed,
        ObservationOutcome::NotFound => proto::ObservationOutcome::NotFound,
        ObservationOutcome::Unknown => proto::ObservationOutcome::Unknown,
    }
}

fn unset_or_unknown(v: &mut Violations, field: &str, raw: i32) {
    if raw == 0 {
        v.add(field, "must be set");
    } else {
        v.add(field, format!("unknown value {raw}"));
    }
}

/// The observation source in a request.
pub fn source(v: &mut Violations, raw: i32) -> ObservationSource {
    match proto::ObservationSource::try_from(raw) {
        Ok(proto::ObservationSource::Worker) => ObservationSource::Worker,
        Ok(proto::ObservationSource::Webhook) => ObservationSource::Webhook,
        Ok(proto::ObservationSource::Reconciler) => ObservationSource::Reconciler,
        Ok(proto::ObservationSource::Operator) => ObservationSource::Operator,
        Ok(proto::ObservationSource::Settlement) => {
            v.add(
                "source",
                "SETTLEMENT is written by the coordinator's settlement import only",
            );
            ObservationSource::Worker
        }
        _ => {
            unset_or_unknown(v, "source", raw);
            ObservationSource::Worker
        }
    }
}

/// The observation outcome in a request.
pub fn outcome(v: &mut Violations, raw: i32) -> ObservationOutcome {
    match proto::ObservationOutcome::try_from(raw) {
        Ok(proto::ObservationOutcome::Succeeded) => ObservationOutcome::Succeeded,
        Ok(proto::ObservationOutcome::Pending) => ObservationOutcome::Pending,
        Ok(proto::ObservationOutcome::Failed) => ObservationOutcome::Failed,
        Ok(proto::ObservationOutcome::NotFound) => ObservationOutcome::NotFound,
        Ok(proto::ObservationOutcome::Unknown) => ObservationOutcome::Unknown,
        _ => {
            unset_or_unknown(v, "outcome", raw);
            ObservationOutcome::Unknown
        }
    }
}

/// The Fail disposition in a request.
pub fn disposition(v: &mut Violations, raw: i32) -> FailDisposition {
    match proto::FailDisposition::try_from(raw) {
        Ok(proto::FailDisposition::RetryReconcile) => FailDisposition::RetryReconcile,
        Ok(proto::FailDisposition::RetryExecute) => FailDisposition::RetryExecute,
        Ok(proto::FailDisposition::Failed) => FailDisposition::Failed,
        Ok(proto::FailDisposition::ManualReview) => FailDisposition::ManualReview,
        _ => {
            unset_or_unknown(v, "disposition", raw);
            FailDisposition::ManualReview
        }
    }
}

/// A Fail disposition as sent on the wire.
pub fn disposition_to_proto(d: FailDisposition) -> proto::FailDisposition {
    match d {
        FailDisposition::RetryReconcile => proto::FailDisposition::RetryReconcile,
        FailDisposition::RetryExecute => proto::FailDisposition::RetryExecute,
        FailDisposition::Failed => proto::FailDisposition::Failed,
        FailDisposition::ManualReview => proto::FailDisposition::ManualReview,
    }
}

/// One item's refusal in a batch's answer (an EnqueueBatch item, a
/// BulkRepair job), as the status of the item's single call would say it.
pub fn item_error(e: &jobfence_domain::CoordinatorError) -> proto::ItemError {
    let (code, reason) = super::status::code_and_reason(e);
    proto::ItemError {
        code: code as i32,
        reason: reason.to_owned(),
        message: e.to_string(),
        metadata: super::status::metadata(e),
    }
}

/// A job state named in a request (unset or unknown is a violation).
pub(super) fn state_from(v: &mut Violations, field: &str, raw: i32) -> JobState {
    match proto::JobState::try_from(raw) {
        Ok(proto::JobState::Ready) => JobState::Ready,
        Ok(proto::JobState::Running) => JobState::Running,
        Ok(proto::JobState::Succeeded) => JobState::Succeeded,
        Ok(proto::JobState::Failed) => JobState::Failed,
        Ok(proto::JobState::ManualReview) => JobState::ManualReview,
        Ok(proto::JobState::Cancelled) => JobState::Cancelled,
        _ => {
            v.add(field, format!("unknown or unset job state {raw}"));
            JobState::Ready
        }
    }
}

/// The filter of a ListJobs request.
pub(super) fn list_filter(
    r: proto::ListJobsRequest,
) -> Result<jobfence_domain::admin::ListJobsFilter, jobfence_domain::CoordinatorError> {
    let mut v = Violations::default();
    let states = r
        .states
        .iter()
        .map(|s| state_from(&mut v, "states", *s))
        .collect();
    let min_age = duration(&mut v, "min_age", r.min_age);
    let after_id = match v.optional("page_token", r.page_token) {
        None => 0,
        Some(token) => token.parse().unwrap_or_else(|_| {
            v.add("page_token", "is not a token this service returned");
            0
        }),
    };
    let queue = v.optional("queue", r.queue);
    v.finish()?;
    Ok(jobfence_domain::admin::ListJobsFilter {
        queue,
        states,
        min_age,
        operation_key: None,
        after_id,
        limit: r.page_size,
    })
}
