//! The one mapping from [`CoordinatorError`] to `tonic::Status`.
//!
//! Every expected outcome gets a precise code and a `google.rpc.ErrorInfo`
//! (domain [`ERROR_DOMAIN`]) whose reason a client in any language can
//! switch on; never UNKNOWN or INTERNAL. INTERNAL is left for bugs.

use crate::domain::CoordinatorError;
use std::collections::HashMap;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

/// The ErrorInfo domain of every jobfence error.
pub const ERROR_DOMAIN: &str = "jobfence";

/// ErrorInfo reasons, as clients see them.
pub mod reason {
    pub const INVALID_REQUEST: &str = "INVALID_REQUEST";
    pub const JOB_NOT_FOUND: &str = "JOB_NOT_FOUND";
    pub const ATTEMPT_SUPERSEDED: &str = "ATTEMPT_SUPERSEDED";
    pub const ATTEMPT_NOT_ISSUED: &str = "ATTEMPT_NOT_ISSUED";
    pub const JOB_NOT_RUNNING: &str = "JOB_NOT_RUNNING";
    pub const JOB_FINISHED: &str = "JOB_FINISHED";
    pub const LEASE_NOT_EXPIRED: &str = "LEASE_NOT_EXPIRED";
    pub const OPERATION_KEY_CONFLICT: &str = "OPERATION_KEY_CONFLICT";
    pub const JOB_NOT_IN_MANUAL_REVIEW: &str = "JOB_NOT_IN_MANUAL_REVIEW";
    pub const JOB_NOT_CANCELLABLE: &str = "JOB_NOT_CANCELLABLE";
    pub const COMMIT_OUTCOME_UNKNOWN: &str = "COMMIT_OUTCOME_UNKNOWN";
    pub const DATABASE_UNAVAILABLE: &str = "DATABASE_UNAVAILABLE";
    pub const TRANSACTION_CONFLICT: &str = "TRANSACTION_CONFLICT";
    pub const INTERNAL: &str = "INTERNAL";
    /// RESOURCE_EXHAUSTED: too many calls already wait for the database;
    /// nothing was written. Retry after the RetryInfo delay.
    pub const OVERLOADED: &str = "OVERLOADED";
    /// WatchEvents ended because the server is shutting down: reconnect
    /// (to another replica) from the last event applied.
    pub const SERVER_SHUTTING_DOWN: &str = "SERVER_SHUTTING_DOWN";
    /// UNAVAILABLE, sent by the load balancer, never by a coordinator
    /// (`deploy/haproxy/grpc-unavailable.http`): no coordinator was
    /// serving, so the call was not forwarded; nothing was applied. Retry
    /// after a backoff.
    pub const NO_COORDINATOR_SERVING: &str = "NO_COORDINATOR_SERVING";
}

/// The backoff suggested (google.rpc.RetryInfo) to a call refused as
/// OVERLOADED.
const OVERLOADED_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

fn meta<const N: usize>(pairs: [(&str, String); N]) -> HashMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The status code and ErrorInfo reason of `err`.
pub fn code_and_reason(err: &CoordinatorError) -> (Code, &'static str) {
    use CoordinatorError::*;
    match err {
        InvalidArgument(_) => (Code::InvalidArgument, reason::INVALID_REQUEST),
        JobNotFound { .. } => (Code::NotFound, reason::JOB_NOT_FOUND),
        AttemptSuperseded { .. } => (Code::FailedPrecondition, reason::ATTEMPT_SUPERSEDED),
        AttemptNotIssued { .. } => (Code::FailedPrecondition, reason::ATTEMPT_NOT_ISSUED),
        JobNotRunning { .. } => (Code::FailedPrecondition, reason::JOB_NOT_RUNNING),
        JobFinished { .. } => (Code::FailedPrecondition, reason::JOB_FINISHED),
        LeaseNotExpired { .. } => (Code::FailedPrecondition, reason::LEASE_NOT_EXPIRED),
        OperationKeyConflict { .. } => (Code::AlreadyExists, reason::OPERATION_KEY_CONFLICT),
        JobNotInManualReview { .. } => (Code::FailedPrecondition, reason::JOB_NOT_IN_MANUAL_REVIEW),
        JobNotCancellable { .. } => (Code::FailedPrecondition, reason::JOB_NOT_CANCELLABLE),
        CommitOutcomeUnknown(_) => (Code::Unavailable, reason::COMMIT_OUTCOME_UNKNOWN),
        DatabaseUnavailable(_) => (Code::Unavailable, reason::DATABASE_UNAVAILABLE),
        TransactionConflict(_) => (Code::Aborted, reason::TRANSACTION_CONFLICT),
        Overloaded { .. } => (Code::ResourceExhausted, reason::OVERLOADED),
        Internal(_) => (Code::Internal, reason::INTERNAL),
    }
}

/// The ErrorInfo metadata of `err`: the ids and attempts a client needs
/// to act on the refusal (`current_attempt`, `job_id`, …).
pub fn metadata(err: &CoordinatorError) -> HashMap<String, String> {
    use CoordinatorError::*;
    match err {
        JobNotFound { job_id } => meta([("job_id", job_id.to_string())]),
        AttemptSuperseded {
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
        OperationKeyConflict { job_id, .. } => meta([("job_id", job_id.to_string())]),
        JobNotInManualReview {
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

impl From<CoordinatorError> for tonic::Status {
    fn from(err: CoordinatorError) -> Self {
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
        if matches!(err, Internal(_)) {
            tracing::error!(error = %err, "internal error");
        }
        tonic::Status::with_error_details(code, err.to_string(), details)
    }
}
