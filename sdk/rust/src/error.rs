//! What a worker is told when a call does not do what it asked, read off
//! the `google.rpc.ErrorInfo` (domain `jobfence`) the coordinator attaches
//! to every expected refusal. Workers switch on these enums, never on
//! status messages.

use crate::proto;
use crate::reason::{self, ERROR_DOMAIN};
use crate::version::{api_version_error, ApiVersionError};
use std::collections::HashMap;
use tonic::{Code, Status};
use tonic_types::{BadRequest, StatusExt};

/// Why a write through a [`ClaimedJob`](super::ClaimedJob) handle (or a
/// read) did not apply.
///
/// Only `Ok` means "applied" (or "already applied": see
/// [`Written::replayed`](super::Written::replayed)). Every variant here
/// means the job did not change *because of this call*, except
/// [`OutcomeUnknown`](WriteError::OutcomeUnknown), where it may have.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Reason `ATTEMPT_SUPERSEDED`: a later claim or takeover replaced this
    /// attempt (docs/design.md rule 3). The handle no longer holds the job and
    /// never will again. When the refused write carried a provider result,
    /// the SDK kept it as an observation (rule 7) and says so in
    /// `observation_recorded`.
    #[error("attempt superseded by attempt {current_attempt} (job is {})", current_state.as_str_name())]
    Superseded {
        /// The job's attempt now.
        current_attempt: u64,
        /// The job's state now.
        current_state: proto::JobState,
        /// True when the refused write's provider result was recorded as an
        /// observation (source WORKER, outcome SUCCEEDED).
        observation_recorded: bool,
    },
    /// Reason `JOB_NOT_RUNNING`: the attempt is still the current one but
    /// the job has left `running` (this attempt already completed, retried
    /// or parked it with a different call).
    #[error("job is {}, not running", state.as_str_name())]
    NotRunning {
        /// The job's state now.
        state: proto::JobState,
        /// As in [`WriteError::Superseded`].
        observation_recorded: bool,
    },
    /// Reason `JOB_NOT_FOUND`.
    #[error("job not found")]
    NotFound,
    /// Reason `INVALID_REQUEST`: nothing was written; the field violations
    /// say why.
    #[error("invalid request: {0:?}")]
    Invalid(BadRequest),
    /// Reason `COMMIT_OUTCOME_UNKNOWN`, or a transport failure (connection
    /// refused or cut, an expired deadline, a status without jobfence
    /// ErrorInfo), still so after the retries: the write may or may
    /// not have been applied (rule 4). Sending the same call again later is
    /// safe: an applied call is answered as a replay.
    #[error("outcome unknown: {}", .0.message())]
    OutcomeUnknown(Box<Status>),
    /// Reason `DATABASE_UNAVAILABLE`, `TRANSACTION_CONFLICT` or
    /// `OVERLOADED` (RESOURCE_EXHAUSTED: too many calls wait for the
    /// database), still so after the retries: nothing was applied.
    #[error("coordinator unavailable: {}", .0.message())]
    Unavailable(Box<Status>),
    /// Reason `CREDENTIAL_MISSING`, `CREDENTIAL_INVALID`,
    /// `CREDENTIAL_EXPIRED` (UNAUTHENTICATED), `ROLE_NOT_ALLOWED`,
    /// `QUEUE_NOT_ALLOWED` or `OPERATOR_MISMATCH` (PERMISSION_DENIED): the
    /// caller may not make this call; nothing was applied. Never retried:
    /// fix the credential (see [`Credentials`](crate::Credentials)) or the
    /// coordinator's callers file.
    #[error("denied ({}): {}", reason_of(.0), .0.message())]
    Denied(Box<Status>),
    /// The coordinator speaks another API major version (its
    /// `jobfence-api-version` header): this client did not read its
    /// answer. Never retried. The write may have been applied by it.
    #[error("{0}")]
    ApiVersion(ApiVersionError),
    /// Anything else (for example `ATTEMPT_NOT_ISSUED`, which a handle
    /// cannot cause, or a status from a proxy without ErrorInfo).
    #[error("unexpected status: {0}")]
    Other(Box<Status>),
}

/// Why a Claim or Takeover handed out no job handle.
///
/// Whatever the variant, the worker holds nothing and must not touch the
/// provider for any job (docs/design.md rule 4, the seed's 邊界防呆).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Reason `COMMIT_OUTCOME_UNKNOWN`, or a transport failure (connection
    /// refused or cut, an expired deadline, a status without jobfence
    /// ErrorInfo): the claim may have committed. If it did, the jobs it took
    /// stay `running` under an attempt nobody acts on, and come back after
    /// their lease through a takeover, which always reconciles first. Never
    /// retried inside the call; see [`WorkerClient::claim`](super::WorkerClient::claim).
    #[error("claim outcome unknown: {}", .0.message())]
    OutcomeUnknown(Box<Status>),
    /// Reason `DATABASE_UNAVAILABLE`, `TRANSACTION_CONFLICT` or
    /// `OVERLOADED`, still so after the retries: nothing was taken.
    #[error("coordinator unavailable: {}", .0.message())]
    Unavailable(Box<Status>),
    /// Reason `INVALID_REQUEST` (a bad queue name, a lease outside the
    /// server's bounds, a batch too large).
    #[error("invalid request: {0:?}")]
    Invalid(BadRequest),
    /// Takeover only, reason `JOB_NOT_FOUND`.
    #[error("job not found")]
    NotFound,
    /// Takeover only, reason `LEASE_NOT_EXPIRED`: the holder's lease is
    /// live (DB clock).
    #[error("lease of attempt {current_attempt} has not expired")]
    LeaseNotExpired {
        /// The attempt that holds the job.
        current_attempt: u64,
    },
    /// Takeover only, reason `JOB_FINISHED`: nothing to take over.
    #[error("job already finished ({})", state.as_str_name())]
    Finished {
        /// The terminal state.
        state: proto::JobState,
    },
    /// Takeover only, reason `JOB_NOT_RUNNING` (ready or in manual review).
    #[error("job is {}, not running", state.as_str_name())]
    NotRunning {
        /// The job's state now.
        state: proto::JobState,
    },
    /// A refusal for who the caller is, as [`WriteError::Denied`]: nothing
    /// was taken. Never retried.
    #[error("denied ({}): {}", reason_of(.0), .0.message())]
    Denied(Box<Status>),
    /// Takeover only, reasons `PROVIDER_BUDGET_EXHAUSTED`, `PROVIDER_PAUSED`
    /// and `PROVIDER_THROTTLED` (RESOURCE_EXHAUSTED): the provider's budget
    /// cannot pay for the takeover's reconcile now (docs/design.md rule 11).
    /// Nothing was taken; ask again after `retry_after`.
    #[error("provider {provider:?} held the takeover ({reason}); retry after {retry_after:?}")]
    ProviderHeld {
        /// The ErrorInfo reason.
        reason: String,
        /// The provider of the job's queue.
        provider: String,
        /// The coordinator's RetryInfo delay, if it gave one.
        retry_after: Option<std::time::Duration>,
    },
    /// The coordinator speaks another API major version, as
    /// [`WriteError::ApiVersion`]: no handle is handed out, whatever it
    /// answered. Never retried.
    #[error("{0}")]
    ApiVersion(ApiVersionError),
    /// Anything else.
    #[error("unexpected status: {0}")]
    Other(Box<Status>),
}

/// Why [`WorkerClient::connect`](super::WorkerClient::connect) failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The [`WorkerConfig`](super::WorkerConfig) is unusable; says which field.
    #[error("invalid worker config: {0}")]
    InvalidConfig(String),
    /// The endpoint is malformed or could not be reached.
    #[error("cannot connect: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A credential could not be read or used (a named file missing, a
    /// token that is not printable ASCII); says which.
    #[error("unusable credentials: {0}")]
    Credentials(String),
}

/// The ErrorInfo reason of a status, or `""`.
fn reason_of(status: &Status) -> String {
    error_info(status).map(|(r, _)| r).unwrap_or_default()
}

/// The jobfence ErrorInfo of a status: reason and metadata. `None` for a
/// status that did not come from a coordinator (a transport failure, a proxy).
pub(crate) fn error_info(status: &Status) -> Option<(String, HashMap<String, String>)> {
    status
        .get_details_error_info()
        .filter(|i| i.domain == ERROR_DOMAIN)
        .map(|i| (i.reason, i.metadata))
}

fn meta_u64(meta: &HashMap<String, String>, key: &str) -> u64 {
    meta.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The `current_state` metadata (a domain name such as `succeeded`) as the
/// wire enum; `Unspecified` if absent or unknown.
fn meta_state(meta: &HashMap<String, String>) -> proto::JobState {
    match meta.get("current_state").map(String::as_str) {
        Some("ready") => proto::JobState::Ready,
        Some("running") => proto::JobState::Running,
        Some("succeeded") => proto::JobState::Succeeded,
        Some("failed") => proto::JobState::Failed,
        Some("manual_review") => proto::JobState::ManualReview,
        Some("cancelled") => proto::JobState::Cancelled,
        _ => proto::JobState::Unspecified,
    }
}

/// True when nothing can have been applied: the coordinator said so
/// (`DATABASE_UNAVAILABLE`: it never reached the database;
/// `TRANSACTION_CONFLICT`: rolled back; `OVERLOADED`: refused before
/// waiting for a connection), or the load balancer did
/// (`NO_COORDINATOR_SERVING`: not forwarded), or no request left this
/// client ([`never_sent`]). The only failures a Claim retries.
pub(crate) fn definitely_not_applied(status: &Status) -> bool {
    match error_info(status) {
        Some((why, _)) => matches!(
            why.as_str(),
            reason::DATABASE_UNAVAILABLE
                | reason::TRANSACTION_CONFLICT
                | reason::OVERLOADED
                | reason::NO_COORDINATOR_SERVING
        ),
        None => never_sent(status),
    }
}

/// True for an UNAVAILABLE that tonic made up because no connection could
/// be made (a coordinator restarting, nothing listening: the request never
/// left), or because the server refused the stream with HTTP/2's
/// REFUSED_STREAM, which says it was not processed (RFC 9113, 8.7).
fn never_sent(status: &Status) -> bool {
    if status.code() != Code::Unavailable {
        return false;
    }
    let mut source = std::error::Error::source(status);
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        source = err.source();
    }
    status
        .message()
        .contains("refused stream before processing")
}

/// True for a status that did not come from a coordinator's decision: a
/// transport failure (connection refused or cut, an h2 error), an expired
/// deadline, a proxy's answer. Whether the call reached the coordinator,
/// and was applied, nobody can say.
fn transport_failure(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Aborted
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Unknown
            | Code::Internal
    )
}

/// True for the failures a fenced write, an observation or a read may
/// retry: the coordinator's `COMMIT_OUTCOME_UNKNOWN`,
/// `DATABASE_UNAVAILABLE` and `TRANSACTION_CONFLICT`, and any transport
/// failure. Safe because the coordinator answers an already-applied
/// Complete/Fail/RenewLease as a replay and de-duplicates observations on
/// their key; never on a refusal, which a repeat cannot change.
pub(crate) fn retryable_write(status: &Status) -> bool {
    match error_info(status) {
        Some((why, _)) => matches!(
            why.as_str(),
            reason::COMMIT_OUTCOME_UNKNOWN
                | reason::DATABASE_UNAVAILABLE
                | reason::TRANSACTION_CONFLICT
                | reason::OVERLOADED
                | reason::NO_COORDINATOR_SERVING
        ),
        None => transport_failure(status),
    }
}

/// Classifies a failed write. `observation_recorded` starts false; the
/// handle sets it after recording a provider result.
pub(crate) fn write_error(status: Status) -> WriteError {
    if let Some(e) = api_version_error(&status) {
        return WriteError::ApiVersion(e);
    }
    let Some((why, meta)) = error_info(&status) else {
        return match status.code() {
            // No coordinator answer: the request may have been applied.
            _ if transport_failure(&status) => WriteError::OutcomeUnknown(Box::new(status)),
            _ => WriteError::Other(Box::new(status)),
        };
    };
    match why.as_str() {
        reason::ATTEMPT_SUPERSEDED => WriteError::Superseded {
            current_attempt: meta_u64(&meta, "current_attempt"),
            current_state: meta_state(&meta),
            observation_recorded: false,
        },
        reason::JOB_NOT_RUNNING => WriteError::NotRunning {
            state: meta_state(&meta),
            observation_recorded: false,
        },
        reason::JOB_NOT_FOUND => WriteError::NotFound,
        reason::INVALID_REQUEST => WriteError::Invalid(bad_request(&status)),
        reason::COMMIT_OUTCOME_UNKNOWN => WriteError::OutcomeUnknown(Box::new(status)),
        reason::DATABASE_UNAVAILABLE
        | reason::TRANSACTION_CONFLICT
        | reason::OVERLOADED
        | reason::NO_COORDINATOR_SERVING => WriteError::Unavailable(Box::new(status)),
        r if reason::DENIALS.contains(&r) => WriteError::Denied(Box::new(status)),
        _ => WriteError::Other(Box::new(status)),
    }
}

/// Classifies a failed Claim or Takeover.
pub(crate) fn claim_error(status: Status) -> ClaimError {
    if let Some(e) = api_version_error(&status) {
        return ClaimError::ApiVersion(e);
    }
    let Some((why, meta)) = error_info(&status) else {
        return match status.code() {
            _ if transport_failure(&status) => ClaimError::OutcomeUnknown(Box::new(status)),
            _ => ClaimError::Other(Box::new(status)),
        };
    };
    match why.as_str() {
        reason::COMMIT_OUTCOME_UNKNOWN => ClaimError::OutcomeUnknown(Box::new(status)),
        reason::DATABASE_UNAVAILABLE
        | reason::TRANSACTION_CONFLICT
        | reason::OVERLOADED
        | reason::NO_COORDINATOR_SERVING => ClaimError::Unavailable(Box::new(status)),
        reason::INVALID_REQUEST => ClaimError::Invalid(bad_request(&status)),
        reason::JOB_NOT_FOUND => ClaimError::NotFound,
        reason::LEASE_NOT_EXPIRED => ClaimError::LeaseNotExpired {
            current_attempt: meta_u64(&meta, "current_attempt"),
        },
        reason::JOB_FINISHED => ClaimError::Finished {
            state: meta_state(&meta),
        },
        reason::JOB_NOT_RUNNING => ClaimError::NotRunning {
            state: meta_state(&meta),
        },
        r if reason::DENIALS.contains(&r) => ClaimError::Denied(Box::new(status)),
        reason::PROVIDER_BUDGET_EXHAUSTED
        | reason::PROVIDER_PAUSED
        | reason::PROVIDER_THROTTLED => ClaimError::ProviderHeld {
            retry_after: status.get_details_retry_info().and_then(|r| r.retry_delay),
            provider: meta.get("provider").cloned().unwrap_or_default(),
            reason: why,
        },
        _ => ClaimError::Other(Box::new(status)),
    }
}

fn bad_request(status: &Status) -> BadRequest {
    status
        .get_details_bad_request()
        .unwrap_or_else(|| BadRequest::new(Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    /// A status as a coordinator sends it: code, ErrorInfo, metadata.
    fn refusal(code: Code, why: &str, meta: &[(&str, &str)]) -> Status {
        let mut details = ErrorDetails::new();
        details.set_error_info(
            why,
            ERROR_DOMAIN,
            meta.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        );
        Status::with_error_details(code, "refused", details)
    }

    #[test]
    fn superseded_carries_the_current_attempt_and_state() {
        let status = refusal(
            Code::FailedPrecondition,
            reason::ATTEMPT_SUPERSEDED,
            &[("current_attempt", "8"), ("current_state", "succeeded")],
        );
        match write_error(status) {
            WriteError::Superseded {
                current_attempt: 8,
                current_state: proto::JobState::Succeeded,
                observation_recorded: false,
            } => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_lost_commit_is_unknown_and_a_dead_database_is_not() {
        let unknown = refusal(Code::Unavailable, reason::COMMIT_OUTCOME_UNKNOWN, &[]);
        assert!(!definitely_not_applied(&unknown));
        assert!(matches!(
            claim_error(unknown.clone()),
            ClaimError::OutcomeUnknown(_)
        ));
        assert!(matches!(
            write_error(unknown),
            WriteError::OutcomeUnknown(_)
        ));
        let down = refusal(Code::Unavailable, reason::DATABASE_UNAVAILABLE, &[]);
        assert!(definitely_not_applied(&down));
        assert!(matches!(claim_error(down), ClaimError::Unavailable(_)));
        // A transport failure carries no ErrorInfo: nobody can say.
        let transport = Status::unavailable("tcp connect error");
        assert!(!definitely_not_applied(&transport));
        // A connection never made (tonic's ConnectError under the status):
        // no request left, so a Claim may be sent again.
        let refused = Status::from_error(Box::new(tonic::ConnectError(Box::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ))));
        assert_eq!(refused.code(), Code::Unavailable);
        assert!(definitely_not_applied(&refused));
        assert!(retryable_write(&refused));
        assert!(matches!(
            claim_error(transport),
            ClaimError::OutcomeUnknown(_)
        ));
    }

    #[test]
    fn overloaded_applied_nothing_and_is_retried() {
        let busy = refusal(Code::ResourceExhausted, reason::OVERLOADED, &[]);
        assert!(definitely_not_applied(&busy));
        assert!(retryable_write(&busy));
        assert!(matches!(
            claim_error(busy.clone()),
            ClaimError::Unavailable(_)
        ));
        assert!(matches!(write_error(busy), WriteError::Unavailable(_)));
    }

    #[test]
    fn a_denial_is_never_retried() {
        for why in reason::DENIALS {
            let code = if why.starts_with("CREDENTIAL") {
                Code::Unauthenticated
            } else {
                Code::PermissionDenied
            };
            let no = refusal(code, why, &[("queue", "payouts")]);
            assert!(!retryable_write(&no) && !definitely_not_applied(&no));
            assert!(matches!(write_error(no.clone()), WriteError::Denied(_)));
            assert!(matches!(claim_error(no), ClaimError::Denied(_)));
        }
    }

    #[test]
    fn invalid_requests_keep_their_field_violations() {
        let mut details = ErrorDetails::new();
        details.set_error_info(reason::INVALID_REQUEST, ERROR_DOMAIN, HashMap::new());
        details.add_bad_request_violation("lease", "too long");
        let status = Status::with_error_details(Code::InvalidArgument, "bad", details);
        match write_error(status) {
            WriteError::Invalid(b) => assert_eq!(b.field_violations[0].field, "lease"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn another_domain_is_not_a_coordinator_answer() {
        let mut details = ErrorDetails::new();
        details.set_error_info(reason::ATTEMPT_SUPERSEDED, "proxy.example", HashMap::new());
        let status = Status::with_error_details(Code::FailedPrecondition, "x", details);
        assert!(matches!(write_error(status), WriteError::Other(_)));
    }
}
