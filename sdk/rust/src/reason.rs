//! The `google.rpc.ErrorInfo` reasons a coordinator attaches to its
//! refusals (domain [`ERROR_DOMAIN`]), as plain names: the API's contract,
//! kept here so that a client needs nothing of the coordinator's code.
//! A test of the coordinator checks that these are exactly its reasons.
//!
//! Workers rarely need them: [`WriteError`](crate::WriteError) and
//! [`ClaimError`](crate::ClaimError) already switch on them.

/// The ErrorInfo domain of every jobfence error.
pub const ERROR_DOMAIN: &str = "jobfence";

/// INVALID_ARGUMENT: nothing was written; a `google.rpc.BadRequest` lists
/// the field violations.
pub const INVALID_REQUEST: &str = "INVALID_REQUEST";
/// NOT_FOUND: no job with that id.
pub const JOB_NOT_FOUND: &str = "JOB_NOT_FOUND";
/// FAILED_PRECONDITION: a later claim or takeover replaced the presented
/// attempt (metadata `current_attempt`, `current_state`).
pub const ATTEMPT_SUPERSEDED: &str = "ATTEMPT_SUPERSEDED";
/// FAILED_PRECONDITION: an attempt newer than any handed out.
pub const ATTEMPT_NOT_ISSUED: &str = "ATTEMPT_NOT_ISSUED";
/// FAILED_PRECONDITION: the attempt is current but the job left `running`.
pub const JOB_NOT_RUNNING: &str = "JOB_NOT_RUNNING";
/// FAILED_PRECONDITION: Takeover of a finished job.
pub const JOB_FINISHED: &str = "JOB_FINISHED";
/// FAILED_PRECONDITION: Takeover of a job whose lease is live (DB clock).
pub const LEASE_NOT_EXPIRED: &str = "LEASE_NOT_EXPIRED";
/// ALREADY_EXISTS: the operation_key is known with another payload.
pub const OPERATION_KEY_CONFLICT: &str = "OPERATION_KEY_CONFLICT";
/// FAILED_PRECONDITION (operators): the job is not in manual review.
pub const JOB_NOT_IN_MANUAL_REVIEW: &str = "JOB_NOT_IN_MANUAL_REVIEW";
/// FAILED_PRECONDITION (operators): the job cannot be cancelled.
pub const JOB_NOT_CANCELLABLE: &str = "JOB_NOT_CANCELLABLE";
/// UNAVAILABLE: the connection died during COMMIT; the call may have been
/// applied. After a Claim or Takeover: hold nothing (DESIGN.md rule 4).
pub const COMMIT_OUTCOME_UNKNOWN: &str = "COMMIT_OUTCOME_UNKNOWN";
/// UNAVAILABLE: the database did not answer; nothing was applied.
pub const DATABASE_UNAVAILABLE: &str = "DATABASE_UNAVAILABLE";
/// ABORTED: deadlock or lock wait timeout, rolled back; nothing applied.
pub const TRANSACTION_CONFLICT: &str = "TRANSACTION_CONFLICT";
/// INTERNAL: a bug in the coordinator.
pub const INTERNAL: &str = "INTERNAL";
/// RESOURCE_EXHAUSTED: too many calls already wait for the database;
/// nothing was written. Retry after the RetryInfo delay.
pub const OVERLOADED: &str = "OVERLOADED";
/// WatchEvents ended because the server is shutting down.
pub const SERVER_SHUTTING_DOWN: &str = "SERVER_SHUTTING_DOWN";
/// UNAVAILABLE from the load balancer (the project's HAProxy
/// configuration), not a coordinator: no coordinator was serving, the call
/// was not forwarded; nothing was applied.
pub const NO_COORDINATOR_SERVING: &str = "NO_COORDINATOR_SERVING";
/// UNAUTHENTICATED: the call carried no credential.
pub const CREDENTIAL_MISSING: &str = "CREDENTIAL_MISSING";
/// UNAUTHENTICATED: a credential the coordinator does not know (wrong,
/// tampered with, revoked, malformed); metadata `problem`.
pub const CREDENTIAL_INVALID: &str = "CREDENTIAL_INVALID";
/// UNAUTHENTICATED: the credential expired (metadata `expired_at`).
pub const CREDENTIAL_EXPIRED: &str = "CREDENTIAL_EXPIRED";
/// PERMISSION_DENIED: no role of the caller allows the method (metadata
/// `method`, `required_role`).
pub const ROLE_NOT_ALLOWED: &str = "ROLE_NOT_ALLOWED";
/// PERMISSION_DENIED: the caller's grants do not cover the queue (metadata
/// `queue`, `job_id`). Nothing was written.
pub const QUEUE_NOT_ALLOWED: &str = "QUEUE_NOT_ALLOWED";
/// PERMISSION_DENIED: an operator call named another operator than the
/// credential's.
pub const OPERATOR_MISMATCH: &str = "OPERATOR_MISMATCH";
/// RESOURCE_EXHAUSTED (Takeover): the provider's budget cannot pay for the
/// reconcile now (metadata `provider`, `limit`); RetryInfo says when.
/// Nothing was written.
pub const PROVIDER_BUDGET_EXHAUSTED: &str = "PROVIDER_BUDGET_EXHAUSTED";
/// RESOURCE_EXHAUSTED (Takeover): an operator paused the provider.
pub const PROVIDER_PAUSED: &str = "PROVIDER_PAUSED";
/// RESOURCE_EXHAUSTED (Takeover): a worker reported the provider's 429 and
/// its Retry-After runs (metadata `throttled_until`).
pub const PROVIDER_THROTTLED: &str = "PROVIDER_THROTTLED";

/// Every reason above, in the order listed.
pub const ALL: &[&str] = &[
    INVALID_REQUEST,
    JOB_NOT_FOUND,
    ATTEMPT_SUPERSEDED,
    ATTEMPT_NOT_ISSUED,
    JOB_NOT_RUNNING,
    JOB_FINISHED,
    LEASE_NOT_EXPIRED,
    OPERATION_KEY_CONFLICT,
    JOB_NOT_IN_MANUAL_REVIEW,
    JOB_NOT_CANCELLABLE,
    COMMIT_OUTCOME_UNKNOWN,
    DATABASE_UNAVAILABLE,
    TRANSACTION_CONFLICT,
    INTERNAL,
    OVERLOADED,
    SERVER_SHUTTING_DOWN,
    NO_COORDINATOR_SERVING,
    CREDENTIAL_MISSING,
    CREDENTIAL_INVALID,
    CREDENTIAL_EXPIRED,
    ROLE_NOT_ALLOWED,
    QUEUE_NOT_ALLOWED,
    OPERATOR_MISMATCH,
    PROVIDER_BUDGET_EXHAUSTED,
    PROVIDER_PAUSED,
    PROVIDER_THROTTLED,
];

/// The reasons of a refusal for who the caller is (UNAUTHENTICATED or
/// PERMISSION_DENIED): nothing was applied, and repeating the call with the
/// same credential cannot change that. Never retried.
pub const DENIALS: &[&str] = &[
    CREDENTIAL_MISSING,
    CREDENTIAL_INVALID,
    CREDENTIAL_EXPIRED,
    ROLE_NOT_ALLOWED,
    QUEUE_NOT_ALLOWED,
    OPERATOR_MISMATCH,
];
