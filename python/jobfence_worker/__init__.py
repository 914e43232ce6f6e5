"""A small jobfence worker client for Python, mirroring the Rust SDK.

The rules it enforces (docs/workers.md has the whole protocol):

* Only a committed Claim or Takeover hands out a ``ClaimedJob``; an unclear
  one raises ``OutcomeUnknown`` and the worker holds nothing.
* Every write goes through the handle, which presents its ``attempt``
  (the fencing token). ``operation_key`` is the one key to send to the
  provider; ``attempt`` is for logs only.
* Refusals are exceptions read from the ``google.rpc.ErrorInfo`` of the
  status (domain ``jobfence``): ``AttemptSuperseded``, ``JobNotRunning``, ...
* A provider success that can no longer be written back is recorded as an
  observation instead of being dropped.

Stubs are generated from ``proto/`` on first use (``stubs.load``); they are
never committed.
"""

from .errors import (
    AttemptSuperseded,
    InvalidRequest,
    JobFinished,
    JobNotFound,
    JobNotRunning,
    JobfenceError,
    LeaseNotExpired,
    OutcomeUnknown,
    Unavailable,
    from_rpc_error,
)
from .client import (
    ClaimedJob,
    Disposition,
    FailWritten,
    Recorded,
    RetryPolicy,
    WorkerClient,
    Written,
    observation_dedup_key,
)

__all__ = [
    "AttemptSuperseded",
    "ClaimedJob",
    "Disposition",
    "FailWritten",
    "InvalidRequest",
    "JobFinished",
    "JobNotFound",
    "JobNotRunning",
    "JobfenceError",
    "LeaseNotExpired",
    "OutcomeUnknown",
    "Recorded",
    "RetryPolicy",
    "Unavailable",
    "WorkerClient",
    "Written",
    "from_rpc_error",
    "observation_dedup_key",
]
