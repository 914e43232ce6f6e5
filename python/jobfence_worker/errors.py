"""Exceptions a worker can catch, read from the ``google.rpc.ErrorInfo``
(domain ``jobfence``) that the coordinator attaches to every expected
refusal. Switch on the exception class, never on the message."""

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

DOMAIN = "jobfence"

# Statuses without a jobfence ErrorInfo and with one of these codes come
# from the transport (connection refused or cut, an expired deadline, a
# proxy): whether the call reached the coordinator, nobody can say.
_TRANSPORT_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}


class JobfenceError(Exception):
    """Base class. ``code`` is the grpc.StatusCode, ``reason`` the ErrorInfo
    reason ("" when there was none), ``metadata`` its metadata."""

    def __init__(self, code, message, reason="", metadata=None):
        super().__init__("%s: %s" % (reason or code, message))
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})


class AttemptSuperseded(JobfenceError):
    """ATTEMPT_SUPERSEDED: a later claim or takeover replaced this attempt.
    The handle no longer holds the job. ``observation_recorded`` is True
    when the refused write's provider result was kept as an observation."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.current_attempt = int(self.metadata.get("current_attempt", 0))
        self.current_state = _state_name(self.metadata.get("current_state", ""))
        self.observation_recorded = False


class JobNotRunning(JobfenceError):
    """JOB_NOT_RUNNING: the attempt is current but the job left running
    (this attempt already finished, retried or parked it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state = _state_name(self.metadata.get("current_state", ""))
        self.observation_recorded = False


class JobNotFound(JobfenceError):
    """JOB_NOT_FOUND."""


class JobFinished(JobfenceError):
    """JOB_FINISHED (Takeover of a finished job)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.state = _state_name(self.metadata.get("current_state", ""))


class LeaseNotExpired(JobfenceError):
    """LEASE_NOT_EXPIRED (Takeover of a live lease)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.current_attempt = int(self.metadata.get("current_attempt", 0))


class InvalidRequest(JobfenceError):
    """INVALID_REQUEST: nothing was written. ``violations`` lists
    ``(field, description)`` from the google.rpc.BadRequest detail."""

    def __init__(self, *args, violations=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.violations = list(violations)


class OutcomeUnknown(JobfenceError):
    """COMMIT_OUTCOME_UNKNOWN or a transport failure: the call may or may
    not have been applied. After a Claim or Takeover: hold nothing."""


class Unavailable(JobfenceError):
    """DATABASE_UNAVAILABLE, TRANSACTION_CONFLICT or OVERLOADED (too many
    calls already wait for the database): nothing was applied; retry after
    a backoff."""


_BY_REASON = {
    "ATTEMPT_SUPERSEDED": AttemptSuperseded,
    "JOB_NOT_RUNNING": JobNotRunning,
    "JOB_NOT_FOUND": JobNotFound,
    "JOB_FINISHED": JobFinished,
    "LEASE_NOT_EXPIRED": LeaseNotExpired,
    "INVALID_REQUEST": InvalidRequest,
    "COMMIT_OUTCOME_UNKNOWN": OutcomeUnknown,
    "DATABASE_UNAVAILABLE": Unavailable,
    "TRANSACTION_CONFLICT": Unavailable,
    "OVERLOADED": Unavailable,
}


def _state_name(domain_state):
    """``succeeded`` -> ``JOB_STATE_SUCCEEDED`` (the proto enum name)."""
    return "JOB_STATE_" + domain_state.upper() if domain_state else "JOB_STATE_UNSPECIFIED"


def _details(err):
    """The (ErrorInfo, BadRequest) of a failed call, each possibly None."""
    info, bad = None, None
    try:
        status = rpc_status.from_call(err)
    except ValueError:
        status = None
    if status is None:
        return None, None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            candidate = error_details_pb2.ErrorInfo()
            detail.Unpack(candidate)
            if candidate.domain == DOMAIN:
                info = candidate
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
    return info, bad


def from_rpc_error(err):
    """Maps a ``grpc.RpcError`` to a ``JobfenceError`` subclass."""
    code, message = err.code(), err.details() or ""
    info, bad = _details(err)
    if info is None:
        cls = OutcomeUnknown if code in _TRANSPORT_CODES else JobfenceError
        return cls(code, message)
    cls = _BY_REASON.get(info.reason, JobfenceError)
    kwargs = {"reason": info.reason, "metadata": info.metadata}
    if cls is InvalidRequest:
        kwargs["violations"] = [(v.field, v.description) for v in (bad.field_violations if bad else [])]
    return cls(code, message, **kwargs)


def retryable_write(err):
    """May a fenced write, an observation or a read be sent again? Yes for a
    lost commit, an unavailable database, a conflict, and any transport
    failure: the coordinator answers an applied write as a replay and
    de-duplicates observations. Never for a refusal."""
    if isinstance(err, (OutcomeUnknown, Unavailable)):
        return True
    return False


def retryable_claim(err):
    """May a Claim or Takeover be sent again? Only when the coordinator
    said nothing was applied. After an unclear claim the worker holds
    nothing; any job it may have taken comes back after its lease through
    a takeover that reconciles first."""
    return isinstance(err, Unavailable)
