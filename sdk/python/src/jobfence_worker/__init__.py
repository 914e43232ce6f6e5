"""jobfence worker client for Python, mirroring the Rust SDK.

The rules it enforces (docs/workers.md has the whole protocol):

* Only a committed Claim or Takeover hands out a ``ClaimedJob``; an unclear
  one raises ``OutcomeUnknown`` and the worker holds nothing.
* Every write goes through the handle, which presents its ``attempt``
  (the fencing token). ``operation_key`` is the one key to send to the
  provider; ``attempt`` is for logs only.
* Refusals are exceptions read from the ``google.rpc.ErrorInfo`` of the
  status (domain ``jobfence``), one class per reason (``REASONS``):
  ``AttemptSuperseded``, ``JobNotRunning``, ``Overloaded``, ...
* A provider success that can no longer be written back is recorded as an
  observation instead of being dropped.
* ``client.run(handler, concurrency)`` is the run loop every jobfence
  client has: it claims only for free slots, hands each ``ClaimedJob`` to
  the handler, releases a job the handler left unsettled with
  ``RETRY_RECONCILE``, and on its stop signal finishes what it holds.

``WorkerClient`` is synchronous; ``jobfence_worker.aio.AsyncWorkerClient``
is the same client on ``grpc.aio``. ``jobfence_worker.refund_worker`` is a
complete worker (``jobfence-refund-worker``).
"""

from ._wire import (
    Disposition,
    FailWritten,
    Recorded,
    RetryPolicy,
    Written,
    observation_dedup_key,
)
from .client import ClaimedJob, WorkerClient
from .runner import AsyncHandler, Handler, RunReport
from .credentials import Credentials
from .errors import (
    API_MAJOR,
    API_VERSION_HEADER,
    DOMAIN,
    REASONS,
    ApiVersionUnsupported,
    AttemptNotIssued,
    AttemptSuperseded,
    CommitOutcomeUnknown,
    CredentialExpired,
    CredentialInvalid,
    CredentialMissing,
    DatabaseUnavailable,
    Denied,
    InternalError,
    InvalidRequest,
    JobfenceError,
    JobFinished,
    JobNotCancellable,
    JobNotFound,
    JobPruned,
    EventsCursorPruned,
    JobNotInManualReview,
    JobNotRunning,
    LeaseNotExpired,
    NoCoordinatorServing,
    NotAuthorized,
    OperationKeyConflict,
    OperatorMismatch,
    OutcomeUnknown,
    Overloaded,
    PermissionDenied,
    ProviderBudgetExhausted,
    ProviderHeld,
    ProviderPaused,
    ProviderThrottled,
    QueueNotAllowed,
    RoleNotAllowed,
    ServerShuttingDown,
    SettlementExceptionMoved,
    SettlementExceptionNotFound,
    TransactionConflict,
    Unauthenticated,
    Unavailable,
    from_rpc_error,
    from_status,
)

__version__ = "0.2.0"

__all__ = [
    "API_MAJOR", "API_VERSION_HEADER", "ApiVersionUnsupported", "__version__",
    "DOMAIN", "REASONS", "AttemptNotIssued", "AttemptSuperseded", "ClaimedJob",
    "CommitOutcomeUnknown", "CredentialExpired", "CredentialInvalid", "CredentialMissing",
    "AsyncHandler", "Credentials", "DatabaseUnavailable", "Denied", "Disposition", "Handler",
    "FailWritten", "InternalError",
    "InvalidRequest", "JobFinished", "JobNotCancellable", "JobNotFound", "JobPruned", "EventsCursorPruned", "JobNotInManualReview",
    "JobNotRunning", "JobfenceError", "LeaseNotExpired", "NoCoordinatorServing", "NotAuthorized",
    "OperationKeyConflict", "OperatorMismatch", "OutcomeUnknown", "Overloaded", "ProviderBudgetExhausted", "ProviderHeld", "ProviderPaused",
    "ProviderThrottled",
    "PermissionDenied", "QueueNotAllowed", "Recorded", "RetryPolicy", "RoleNotAllowed", "RunReport",
    "ServerShuttingDown", "SettlementExceptionMoved", "SettlementExceptionNotFound",
    "TransactionConflict", "Unauthenticated", "Unavailable", "WorkerClient",
    "Written", "from_rpc_error", "from_status", "observation_dedup_key",
]
