//! The one mapping from [`CoordinatorError`] to `tonic::Status`.
//!
//! Every expected outcome gets a precise code and a `google.rpc.ErrorInfo`
//! (domain [`ERROR_DOMAIN`]) whose reason a client in any language can
//! switch on; never UNKNOWN or INTERNAL. INTERNAL is left for bugs.

use jobfence_domain::budget::Holdback;
use jobfence_domain::{CoordinatorError, DbTime, KeyRecord};
use std::collections::HashMap;
use std::time::Duration;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

use jobfence_api::v1::ErrorReason;
pub use jobfence_api::{reason, ERROR_DOMAIN};
pub use jobfence_auth::refusal::{refusal_code_and_reason, refusal_reason};

/// The RetryInfo of a Takeover held by a provider's pause or in-flight
/// cap, which no clock ends: look again after this.
const PROVIDER_HOLD_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The backoff suggested (google.rpc.RetryInfo) to a call refused as
/// OVERLOADED.
const OVERLOADED_RETRY_DELAY: Duration = Duration::from_millis(100);

fn meta<const N: usize>(pairs: [(&str, String); N]) -> HashMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The ErrorInfo reason of `err`; its status code is the reason's own
/// (`grpc_code` in errors.proto).
pub fn reason_of(err: &CoordinatorError) -> ErrorReason {
    use CoordinatorError::*;
    use ErrorReason as R;
    match err {
        InvalidArgument(_) => R::InvalidRequest,
        JobNotFound { .. } => R::JobNotFound,
        JobPruned(_) => R::JobPruned,
        EventsCursorPruned { .. } => R::EventsCursorPruned,
        AttemptSuperseded { .. } => R::AttemptSuperseded,
        AttemptNotIssued { .. } => R::AttemptNotIssued,
        JobNotRunning { .. } => R::JobNotRunning,
        JobFinished { .. } => R::JobFinished,
        LeaseNotExpired { .. } => R::LeaseNotExpired,
        OperationKeyConflict { .. } => R::OperationKeyConflict,
        JobNotInManualReview { .. } => R::JobNotInManualReview,
        JobNotCancellable { .. } => R::JobNotCancellable,
        SettlementExceptionNotFound { .. } => R::SettlementExceptionNotFound,
        SettlementExceptionMoved { .. } => R::SettlementExceptionMoved,
        CommitOutcomeUnknown(_) => R::CommitOutcomeUnknown,
        DatabaseUnavailable(_) => R::DatabaseUnavailable,
        TransactionConflict(_) => R::TransactionConflict,
        Overloaded { .. } => R::Overloaded,
        QueueNotAllowed { .. } => R::QueueNotAllowed,
        ProviderHoldback { why, .. } => match why {
            Holdback::Paused => R::ProviderPaused,
            Holdback::Throttled => R::ProviderThrottled,
            Holdback::Rate | Holdback::FairShare | Holdback::InFlight | Holdback::KeyCap => {
                R::ProviderBudgetExhausted
            }
        },
        Internal(_) | Unanswered { .. } => R::Internal,
    }
}

/// The status code and ErrorInfo reason of `err`.
pub fn code_and_reason(err: &CoordinatorError) -> (Code, &'static str) {
    let reason = reason_of(err);
    (reason.code(), reason.as_str_name())
}

/// The ErrorInfo metadata of `err`: the ids and attempts a client needs
/// to act on the refusal (`current_attempt`, `job_id`, …), by family.
pub fn metadata(err: &CoordinatorError) -> HashMap<String, String> {
    use CoordinatorError::*;
    match err {
        JobNotFound { job_id } | OperationKeyConflict { job_id, .. } => {
            meta([("job_id", job_id.to_string())])
        }
        JobPruned(record) => pruned_metadata(record),
        EventsCursorPruned {
            after,
            pruned_through,
        } => meta([
            ("after_event_id", after.to_string()),
            ("pruned_through_event_id", pruned_through.to_string()),
        ]),
        AttemptSuperseded { .. }
        | AttemptNotIssued { .. }
        | JobNotRunning { .. }
        | JobFinished { .. }
        | LeaseNotExpired { .. }
        | JobNotInManualReview { .. }
        | JobNotCancellable { .. } => refusal_metadata(err),
        ProviderHoldback {
            provider,
            why,
            retry_after,
            throttled_until,
        } => holdback_metadata(provider, *why, *retry_after, *throttled_until),
        SettlementExceptionNotFound { id } => meta([("exception_id", id.to_string())]),
        SettlementExceptionMoved { id, seen, current } => meta([
            ("exception_id", id.to_string()),
            ("seen_state", seen.as_str().to_owned()),
            ("current_state", current.as_str().to_owned()),
        ]),
        QueueNotAllowed { queue, job_id } => {
            let mut m = meta([("queue", queue.clone())]);
            if let Some(id) = job_id {
                m.insert("job_id".into(), id.to_string());
            }
            m
        }
        _ => HashMap::new(),
    }
}

/// A pruned job's key record (docs/design.md rule 14): what a client can
/// still know of the job.
fn pruned_metadata(record: &KeyRecord) -> HashMap<String, String> {
    let mut m = meta([
        ("job_id", record.job_id.to_string()),
        ("queue", record.queue.clone()),
        ("operation_key", record.operation_key.clone()),
        ("final_state", record.final_state.to_string()),
        ("attempt", record.attempt.to_string()),
        ("finished_at", record.finished_at.and_utc().to_rfc3339()),
        ("pruned_at", record.pruned_at.and_utc().to_rfc3339()),
    ]);
    if let Some(r) = &record.provider_reference {
        m.insert("provider_reference".into(), r.clone());
    }
    m
}

/// A call refused on the job's row (the fence, a takeover's checks, an
/// operator's write): the job, the attempt presented and the current one,
/// and the state it is in.
fn refusal_metadata(err: &CoordinatorError) -> HashMap<String, String> {
    use CoordinatorError::*;
    match err {
        AttemptSuperseded {
            job_id,
            presented,
            current,
            state,
        }
        | JobNotInManualReview {
            job_id,
            presented,
            current,
            state,
        } => meta([
            ("job_id", job_id.to_string()),
            ("presented_attempt", presented.to_string()),
            ("current_attempt", current.to_string()),
            ("current_state", state.to_string()),
        ]),
        AttemptNotIssued {
            job_id,
            presented,
            current,
        } => meta([
            ("job_id", job_id.to_string()),
            ("presented_attempt", presented.to_string()),
            ("current_attempt", current.to_string()),
        ]),
        JobNotRunning {
            job_id,
            attempt,
            state,
        }
        | JobFinished {
            job_id,
            attempt,
            state,
        } => meta([
            ("job_id", job_id.to_string()),
            ("current_attempt", attempt.to_string()),
            ("current_state", state.to_string()),
        ]),
        LeaseNotExpired {
            job_id,
            attempt,
            lease_until,
        } => meta([
            ("job_id", job_id.to_string()),
            ("current_attempt", attempt.to_string()),
            ("lease_until", lease_until.and_utc().to_rfc3339()),
        ]),
        JobNotCancellable {
            job_id,
            attempt,
            state,
            dispatch_count,
        } => meta([
            ("job_id", job_id.to_string()),
            ("current_attempt", attempt.to_string()),
            ("current_state", state.to_string()),
            ("dispatch_count", dispatch_count.to_string()),
        ]),
        _ => HashMap::new(),
    }
}

/// A Takeover held back by its provider's budget (docs/design.md rule
/// 11): which limit, and when to ask again.
fn holdback_metadata(
    provider: &str,
    why: Holdback,
    retry_after: Option<Duration>,
    throttled_until: Option<DbTime>,
) -> HashMap<String, String> {
    let mut m = meta([("provider", provider.to_owned())]);
    match why {
        Holdback::Rate | Holdback::FairShare => {
            m.insert("limit".into(), "rate".into());
        }
        Holdback::InFlight => {
            m.insert("limit".into(), "in_flight".into());
        }
        _ => {}
    }
    if let Some(d) = retry_after {
        m.insert("retry_after_ms".into(), d.as_millis().to_string());
    }
    if let Some(t) = throttled_until {
        m.insert("throttled_until".into(), t.and_utc().to_rfc3339());
    }
    m
}

/// The status a coordinator answers `err` with: the reason's code, an
/// ErrorInfo with its metadata, a BadRequest for invalid fields, and a
/// RetryInfo where waiting helps. (A function, not `From`: both types are
/// other crates'.)
pub fn to_status(err: CoordinatorError) -> tonic::Status {
    use CoordinatorError::*;
    let (code, why) = code_and_reason(&err);
    let metadata = metadata(&err);
    let mut details = ErrorDetails::new();
    details.set_error_info(why, ERROR_DOMAIN, metadata);
    if let InvalidArgument(violations) = &err {
        for v in violations {
            details.add_bad_request_violation(&v.field, &v.description);
        }
    }
    if let Overloaded { .. } = &err {
        details.set_retry_info(Some(OVERLOADED_RETRY_DELAY));
    }
    if let ProviderHoldback { retry_after, .. } = &err {
        details.set_retry_info(Some(
            retry_after
                .unwrap_or(PROVIDER_HOLD_RETRY_DELAY)
                .max(Duration::from_millis(1)),
        ));
    }
    if matches!(err, Internal(_) | Unanswered { .. }) {
        tracing::error!(error = %err, "internal error");
    }
    tonic::Status::with_error_details(code, err.to_string(), details)
}

/// INVALID_ARGUMENT / `INVALID_REQUEST` for a request message larger than
/// `--max-request-size` (`limit` bytes), with a BadRequest violation of
/// the field `request`. tonic's codec refuses such a message as
/// OUT_OF_RANGE without an ErrorInfo; the admission layer
/// (`crate::limits`) answers this instead, so clients see the same
/// reason as for any other field over its limit. Nothing was applied.
pub fn request_too_large(limit: usize) -> tonic::Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        reason::INVALID_REQUEST,
        ERROR_DOMAIN,
        meta([("max_request_bytes", limit.to_string())]),
    );
    details.add_bad_request_violation(
        "request",
        format!("the request message is larger than the server's limit of {limit} bytes"),
    );
    tonic::Status::with_error_details(
        ErrorReason::InvalidRequest.code(),
        format!("request message larger than {limit} bytes (--max-request-size)"),
        details,
    )
}

/// RESOURCE_EXHAUSTED / `OVERLOADED`, with a RetryInfo: a call refused at
/// once by a concurrency limit (`limit` names it: `global`, `caller`),
/// before its request was read; nothing was applied.
pub fn overloaded(limit: &str, in_flight: usize) -> tonic::Status {
    let mut details = ErrorDetails::new();
    details.set_error_info(
        reason::OVERLOADED,
        ERROR_DOMAIN,
        meta([
            ("limit", limit.to_owned()),
            ("in_flight", in_flight.to_string()),
        ]),
    );
    details.set_retry_info(Some(OVERLOADED_RETRY_DELAY));
    tonic::Status::with_error_details(
        ErrorReason::Overloaded.code(),
        format!("coordinator overloaded: {in_flight} calls in flight ({limit} limit); retry later"),
        details,
    )
}
