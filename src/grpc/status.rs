//! The one mapping from [`CoordinatorError`] to `tonic::Status`.
//!
//! Every expected outcome gets a precise code and a `google.rpc.ErrorInfo`
//! (domain [`ERROR_DOMAIN`]) whose reason a client in any language can
//! switch on; never UNKNOWN or INTERNAL. INTERNAL is left for bugs.

use crate::auth::Refusal;
use crate::domain::budget::Holdback;
use crate::domain::CoordinatorError;
use std::collections::HashMap;
use std::time::Duration;
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
    /// UNAUTHENTICATED: the call carried no credential (no
    /// `authorization: Bearer` metadata, no client certificate). Nothing
    /// was applied; never retried.
    pub const CREDENTIAL_MISSING: &str = "CREDENTIAL_MISSING";
    /// UNAUTHENTICATED: the credential is not one the coordinator knows
    /// (a wrong, tampered or revoked token, a malformed header); metadata
    /// `problem`. Nothing was applied; never retried.
    pub const CREDENTIAL_INVALID: &str = "CREDENTIAL_INVALID";
    /// UNAUTHENTICATED: the credential is known but expired (metadata
    /// `caller`, `expired_at`). Nothing was applied; never retried.
    pub const CREDENTIAL_EXPIRED: &str = "CREDENTIAL_EXPIRED";
    /// PERMISSION_DENIED: the caller's roles do not include the method
    /// (metadata `caller`, `method`, `required_role`; for a webhook, the
    /// observation `source` it may not report). Nothing was applied.
    pub const ROLE_NOT_ALLOWED: &str = "ROLE_NOT_ALLOWED";
    /// PERMISSION_DENIED: the caller's grants do not cover the queue the
    /// call acts on (metadata `queue`, and `job_id` when the call named a
    /// job). Nothing was applied, not even a refusal event.
    pub const QUEUE_NOT_ALLOWED: &str = "QUEUE_NOT_ALLOWED";
    /// PERMISSION_DENIED: an operator call named another operator than
    /// the credential's (metadata `caller`, `operator`). Nothing was
    /// applied.
    pub const OPERATOR_MISMATCH: &str = "OPERATOR_MISMATCH";
    /// RESOURCE_EXHAUSTED: a Takeover whose reconcile the provider's
    /// budget cannot pay for now (metadata `provider`, `limit`: `rate` or
    /// `in_flight`), with a RetryInfo for when the next unit is due.
    /// Nothing was written. DESIGN.md rule 11.
    pub const PROVIDER_BUDGET_EXHAUSTED: &str = "PROVIDER_BUDGET_EXHAUSTED";
    /// RESOURCE_EXHAUSTED: an operator paused the provider (metadata
    /// `provider`); retry after the RetryInfo delay. Nothing was written.
    pub const PROVIDER_PAUSED: &str = "PROVIDER_PAUSED";
    /// RESOURCE_EXHAUSTED: a worker reported the provider's 429 and its
    /// Retry-After runs (metadata `provider`, `throttled_until`), with a
    /// RetryInfo until then. Nothing was written.
    pub const PROVIDER_THROTTLED: &str = "PROVIDER_THROTTLED";
}

/// The RetryInfo of a Takeover held by a provider's pause or in-flight
/// cap, which no clock ends: look again after this.
const PROVIDER_HOLD_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The backoff suggested (google.rpc.RetryInfo) to a call refused as
/// OVERLOADED.
const OVERLOADED_RETRY_DELAY: Duration = Duration::from_millis(100);

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
        QueueNotAllowed { .. } => (Code::PermissionDenied, reason::QUEUE_NOT_ALLOWED),
        ProviderHoldback { why, .. } => (
            Code::ResourceExhausted,
            match why {
                Holdback::Paused => reason::PROVIDER_PAUSED,
                Holdback::Throttled => reason::PROVIDER_THROTTLED,
                Holdback::Rate | Holdback::FairShare | Holdback::InFlight => {
                    reason::PROVIDER_BUDGET_EXHAUSTED
                }
            },
        ),
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
        ProviderHoldback {
            provider,
            why,
            retry_after,
            throttled_until,
        } => {
            let mut m = meta([("provider", provider.clone())]);
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
        if let ProviderHoldback { retry_after, .. } = &err {
            details.set_retry_info(Some(
                retry_after
                    .unwrap_or(PROVIDER_HOLD_RETRY_DELAY)
                    .max(Duration::from_millis(1)),
            ));
        }
        if matches!(err, Internal(_)) {
            tracing::error!(error = %err, "internal error");
        }
        tonic::Status::with_error_details(code, err.to_string(), details)
    }
}

/// The status code and ErrorInfo reason of a refusal for who the caller is.
pub fn refusal_code_and_reason(refusal: &Refusal) -> (Code, &'static str) {
    match refusal {
        Refusal::CredentialMissing => (Code::Unauthenticated, reason::CREDENTIAL_MISSING),
        Refusal::CredentialInvalid { .. } => (Code::Unauthenticated, reason::CREDENTIAL_INVALID),
        Refusal::CredentialExpired { .. } => (Code::Unauthenticated, reason::CREDENTIAL_EXPIRED),
        Refusal::RoleNotAllowed { .. } => (Code::PermissionDenied, reason::ROLE_NOT_ALLOWED),
        Refusal::OperatorMismatch { .. } => (Code::PermissionDenied, reason::OPERATOR_MISMATCH),
    }
}

impl From<&Refusal> for tonic::Status {
    fn from(refusal: &Refusal) -> Self {
        let (code, why) = refusal_code_and_reason(refusal);
        let metadata = match refusal {
            Refusal::CredentialMissing => HashMap::new(),
            Refusal::CredentialInvalid { problem } => meta([("problem", (*problem).to_owned())]),
            Refusal::CredentialExpired { caller, expired_at } => meta([
                ("caller", caller.clone()),
                ("expired_at", expired_at.to_rfc3339()),
            ]),
            Refusal::RoleNotAllowed {
                caller,
                roles,
                method,
                required,
            } => meta([
                ("caller", caller.clone()),
                ("roles", roles.clone()),
                ("method", method.clone()),
                ("required_role", required.clone()),
            ]),
            Refusal::OperatorMismatch { caller, requested } => {
                meta([("caller", caller.clone()), ("operator", requested.clone())])
            }
        };
        let mut details = ErrorDetails::new();
        details.set_error_info(why, ERROR_DOMAIN, metadata);
        tonic::Status::with_error_details(code, refusal.to_string(), details)
    }
}

impl From<Refusal> for tonic::Status {
    fn from(refusal: Refusal) -> Self {
        tonic::Status::from(&refusal)
    }
}

/// INVALID_ARGUMENT / `INVALID_REQUEST` for a request message larger than
/// `--max-request-size` (`limit` bytes), with a BadRequest violation of
/// the field `request`. tonic's codec refuses such a message as
/// OUT_OF_RANGE without an ErrorInfo; the admission layer
/// (`crate::server::limits`) answers this instead, so clients see the same
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
        Code::InvalidArgument,
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
        Code::ResourceExhausted,
        format!("coordinator overloaded: {in_flight} calls in flight ({limit} limit); retry later"),
        details,
    )
}
