"""Exceptions a worker can catch, read from the ``google.rpc.ErrorInfo``
(domain ``jobfence``) that the coordinator attaches to every expected
refusal. There is one class for every reason the coordinator sends
(``REASONS``, built from the enum ``ErrorReason`` of ``errors.proto``, whose
stub the package ships); switch on the class, never on the message.

The classes form three families a worker acts on:

* refusals (``AttemptSuperseded``, ``JobNotRunning``, ...): the call was not
  applied and repeating it cannot change that;
* ``OutcomeUnknown`` (``CommitOutcomeUnknown``, or a transport failure): the
  call may have been applied. After a Claim or Takeover: hold nothing;
* ``Unavailable`` (``DatabaseUnavailable``, ``TransactionConflict``,
  ``Overloaded``): nothing was applied; retry after a backoff;
* ``Denied``, also named ``NotAuthorized`` (``Unauthenticated``: ``CredentialMissing``,
  ``CredentialInvalid``, ``CredentialExpired``; ``PermissionDenied``:
  ``RoleNotAllowed``, ``QueueNotAllowed``, ``OperatorMismatch``): the caller
  may not make this call; nothing was applied and it is never retried.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from ._proto import errors_pb2

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


def _state_name(domain_state: str) -> str:
    """``succeeded`` -> ``JOB_STATE_SUCCEEDED`` (the proto enum name)."""
    return "JOB_STATE_" + domain_state.upper() if domain_state else "JOB_STATE_UNSPECIFIED"


class JobfenceError(Exception):
    """Base class. ``code`` is the grpc.StatusCode, ``reason`` the ErrorInfo
    reason ("" when there was none), ``metadata`` its metadata."""

    def __init__(self, code: Optional[grpc.StatusCode], message: str, reason: str = "",
                 metadata: Optional[Mapping[str, str]] = None) -> None:
        super().__init__("%s: %s" % (reason or code, message))
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata: Dict[str, str] = dict(metadata or {})

    def _meta_int(self, key: str) -> int:
        try:
            return int(self.metadata.get(key, 0))
        except ValueError:
            return 0


class AttemptSuperseded(JobfenceError):
    """ATTEMPT_SUPERSEDED: a later claim or takeover replaced this attempt.
    The handle no longer holds the job. ``observation_recorded`` is True
    when the refused write's provider result was kept as an observation."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.current_attempt: int = self._meta_int("current_attempt")
        self.current_state: str = _state_name(self.metadata.get("current_state", ""))
        self.observation_recorded: bool = False


class AttemptNotIssued(JobfenceError):
    """ATTEMPT_NOT_ISSUED: an attempt newer than any handed out (a bug in
    the caller: a handle never makes one up)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.current_attempt: int = self._meta_int("current_attempt")


class JobNotRunning(JobfenceError):
    """JOB_NOT_RUNNING: the attempt is current but the job left running
    (this attempt already finished, retried or parked it)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.state: str = _state_name(self.metadata.get("current_state", ""))
        self.observation_recorded: bool = False


class JobNotFound(JobfenceError):
    """JOB_NOT_FOUND."""


class JobPruned(JobNotFound):
    """JOB_PRUNED (NOT_FOUND): the job finished and retention pruned it;
    ``metadata`` holds its key record (``final_state``,
    ``provider_reference``, ``finished_at``, ...). Nothing was written."""


class EventsCursorPruned(JobfenceError):
    """EVENTS_CURSOR_PRUNED (OUT_OF_RANGE): the events feed was read from a
    cursor behind what retention pruned (``metadata``:
    ``pruned_through_event_id``). Nothing was served."""


class JobFinished(JobfenceError):
    """JOB_FINISHED (Takeover of a finished job)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.state: str = _state_name(self.metadata.get("current_state", ""))


class LeaseNotExpired(JobfenceError):
    """LEASE_NOT_EXPIRED (Takeover of a live lease, by the DB clock)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.current_attempt: int = self._meta_int("current_attempt")


class OperationKeyConflict(JobfenceError):
    """OPERATION_KEY_CONFLICT: the operation_key is known with another
    payload; ``job_id`` is the existing job."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.job_id: int = self._meta_int("job_id")


class JobNotInManualReview(JobfenceError):
    """JOB_NOT_IN_MANUAL_REVIEW (operators: resolve of a job not parked)."""


class JobNotCancellable(JobfenceError):
    """JOB_NOT_CANCELLABLE (operators: only a never-dispatched ready job)."""


class SettlementExceptionNotFound(JobfenceError):
    """SETTLEMENT_EXCEPTION_NOT_FOUND (NOT_FOUND, operators): no settlement
    exception with that id (``metadata``: ``exception_id``)."""


class SettlementExceptionMoved(JobfenceError):
    """SETTLEMENT_EXCEPTION_MOVED (FAILED_PRECONDITION, operators): the
    exception is no longer in the state seen; someone acted first
    (``metadata``: ``exception_id``, ``seen_state``, ``current_state``).
    Nothing was written."""


class InvalidRequest(JobfenceError):
    """INVALID_REQUEST: nothing was written. ``violations`` lists
    ``(field, description)`` from the google.rpc.BadRequest detail."""

    def __init__(self, *args, violations: Tuple[Tuple[str, str], ...] = (),
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.violations: List[Tuple[str, str]] = list(violations)


class OutcomeUnknown(JobfenceError):
    """The call may or may not have been applied: a transport failure (no
    coordinator answer). After a Claim or Takeover: hold nothing. A fenced
    write may be sent again: an applied one is answered as a replay."""


class CommitOutcomeUnknown(OutcomeUnknown):
    """COMMIT_OUTCOME_UNKNOWN: the coordinator lost its database connection
    during COMMIT."""


class Unavailable(JobfenceError):
    """Nothing was applied; retry after a backoff."""


class DatabaseUnavailable(Unavailable):
    """DATABASE_UNAVAILABLE: the coordinator could not reach its database."""


class TransactionConflict(Unavailable):
    """TRANSACTION_CONFLICT: deadlock or lock wait timeout, rolled back."""


class Overloaded(Unavailable):
    """OVERLOADED (RESOURCE_EXHAUSTED): too many calls already wait for the
    database. ``retry_after`` is the coordinator's suggested delay in
    seconds (google.rpc.RetryInfo), or None."""

    def __init__(self, *args, retry_after: Optional[float] = None,
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after


class NoCoordinatorServing(Unavailable):
    """NO_COORDINATOR_SERVING: the load balancer found no coordinator
    serving (the database is unreachable, or every coordinator is down) and
    forwarded nothing."""


class NotAuthorized(JobfenceError):
    """A refusal for who the caller is: nothing was applied, and the same
    credential cannot change that. Never retried: fix the credential
    (``Credentials``) or the coordinator's callers file."""


#: The name every jobfence client gives this family (Rust
#: ``WriteError::Denied``/``ClaimError::Denied``, Go ``ErrDenied``, Node
#: ``Denied``): the same class as ``NotAuthorized``, which stays for the
#: code that already catches it.
Denied = NotAuthorized


class Unauthenticated(NotAuthorized):
    """UNAUTHENTICATED: the coordinator does not know the caller."""


class CredentialMissing(Unauthenticated):
    """CREDENTIAL_MISSING: no ``authorization`` metadata, no client
    certificate."""


class CredentialInvalid(Unauthenticated):
    """CREDENTIAL_INVALID: a token the coordinator does not know (wrong,
    tampered with, revoked) or a malformed header; ``metadata['problem']``."""


class CredentialExpired(Unauthenticated):
    """CREDENTIAL_EXPIRED: the credential is past its ``expires``
    (``metadata['expired_at']``)."""


class PermissionDenied(NotAuthorized):
    """PERMISSION_DENIED: a known caller outside its grants."""


class RoleNotAllowed(PermissionDenied):
    """ROLE_NOT_ALLOWED: no role of the caller allows the method
    (``metadata['method']``, ``metadata['required_role']``)."""


class QueueNotAllowed(PermissionDenied):
    """QUEUE_NOT_ALLOWED: the caller's grants do not cover the queue
    (``queue``, and ``job_id`` when the call named a job)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.queue: str = self.metadata.get("queue", "")
        self.job_id: int = self._meta_int("job_id")


class OperatorMismatch(PermissionDenied):
    """OPERATOR_MISMATCH: an operator call named another operator than the
    credential's."""


class ProviderHeld(JobfenceError):
    """RESOURCE_EXHAUSTED from a Takeover: the budget of the job's provider
    cannot pay for the reconcile now (docs/design.md rule 11). Nothing was
    taken; ``retry_after`` (seconds, from google.rpc.RetryInfo, or None)
    says when to ask again, ``provider`` names the provider."""

    def __init__(self, *args, retry_after: Optional[float] = None,
                 **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.retry_after = retry_after
        self.provider: str = self.metadata.get("provider", "")


class ProviderBudgetExhausted(ProviderHeld):
    """PROVIDER_BUDGET_EXHAUSTED: no units left now (``metadata['limit']``:
    ``rate`` or ``in_flight``)."""


class ProviderPaused(ProviderHeld):
    """PROVIDER_PAUSED: an operator paused the provider."""


class ProviderThrottled(ProviderHeld):
    """PROVIDER_THROTTLED: a worker reported the provider's 429 and its
    Retry-After runs (``metadata['throttled_until']``)."""


class InternalError(JobfenceError):
    """INTERNAL: a bug in the coordinator."""


class ServerShuttingDown(JobfenceError):
    """SERVER_SHUTTING_DOWN: a stream ended because the server is draining."""


# The class of a reason is named after it (``JOB_NOT_FOUND`` ->
# ``JobNotFound``), except these.
_RENAMED = {"INTERNAL": "InternalError"}


def _class_of(reason: str) -> Type[JobfenceError]:
    name = _RENAMED.get(reason) or "".join(w.capitalize() for w in reason.split("_"))
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, JobfenceError)):
        raise ImportError("errors.proto has the reason %s, and jobfence_worker.errors no class %s "
                          "for it" % (reason, name))
    return cls


#: Every ErrorInfo reason the coordinator sends (the values of
#: ``ErrorReason`` in errors.proto but the zero one), and its class.
REASONS: Dict[str, Type[JobfenceError]] = {
    name: _class_of(name)
    for name, number in errors_pb2.ErrorReason.items()
    if number != errors_pb2.ERROR_REASON_UNSPECIFIED
}


def from_refusal(refusal: object) -> JobfenceError:
    """A write's refusal carried in the answer of a Complete or Fail that
    asked for the next job (``NextJobs.write_refused``), as the exception
    the same call without the request raises: the same class, code, reason
    and metadata (docs/design.md rule 16)."""
    code = next((c for c in grpc.StatusCode if c.value[0] == getattr(refusal, "code")), None)
    reason = getattr(refusal, "reason")
    cls = REASONS.get(reason, JobfenceError)
    return cls(code, getattr(refusal, "message"), reason, dict(getattr(refusal, "metadata")))


def _details(status_proto: object) -> Tuple[Optional[error_details_pb2.ErrorInfo],
                                            Optional[error_details_pb2.BadRequest],
                                            Optional[float]]:
    info, bad, retry_after = None, None, None
    for detail in getattr(status_proto, "details", ()):
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            candidate = error_details_pb2.ErrorInfo()
            detail.Unpack(candidate)
            if candidate.domain == DOMAIN:
                info = candidate
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            ri = error_details_pb2.RetryInfo()
            detail.Unpack(ri)
            retry_after = ri.retry_delay.seconds + ri.retry_delay.nanos / 1e9
    return info, bad, retry_after


#: The major version of the jobfence API this client speaks (the proto
#: package ``jobfence.v1``; the API's version is ``proto/Cargo.toml``'s).
API_MAJOR = 1
#: The response header a coordinator names its API version in.
API_VERSION_HEADER = "jobfence-api-version"


class ApiVersionUnsupported(JobfenceError):
    """The coordinator speaks another major version of the API (its
    ``jobfence-api-version`` header): its answer was not read. Never
    retried; the call itself may have been applied by it. ``coordinator``
    is the version it named. A coordinator without the header is older
    than it and spoke API 1: accepted."""

    def __init__(self, coordinator: str) -> None:
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION,
                         "the coordinator speaks API %s, this client speaks %d.x"
                         % (coordinator, API_MAJOR), reason="API_VERSION_UNSUPPORTED")
        self.coordinator = coordinator


def check_api_version(*metadata: Any) -> None:
    """Raises ``ApiVersionUnsupported`` when any of the metadata (sequences
    of ``(key, value)``, or None) names an API version of another major
    version than ``API_MAJOR``."""
    for pairs in metadata:
        for key, value in pairs or ():
            if key != API_VERSION_HEADER:
                continue
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            major = str(value).strip().split(".")[0]
            if not major.isdigit() or int(major) != API_MAJOR:
                raise ApiVersionUnsupported(str(value))


def from_status(code: grpc.StatusCode, message: str, status_proto: object) -> JobfenceError:
    """Maps a status (code, message, decoded google.rpc.Status or None) to a
    ``JobfenceError`` subclass."""
    info, bad, retry_after = _details(status_proto) if status_proto is not None else (None, None, None)
    if info is None:
        cls: Type[JobfenceError] = OutcomeUnknown if code in _TRANSPORT_CODES else JobfenceError
        return cls(code, message)
    cls = REASONS.get(info.reason, JobfenceError)
    if cls is InvalidRequest:
        violations = tuple((v.field, v.description) for v in (bad.field_violations if bad else []))
        return InvalidRequest(code, message, reason=info.reason, metadata=info.metadata,
                              violations=violations)
    if cls is Overloaded or issubclass(cls, ProviderHeld):
        return cls(code, message, reason=info.reason, metadata=info.metadata,  # type: ignore[call-arg]
                   retry_after=retry_after)
    return cls(code, message, reason=info.reason, metadata=info.metadata)


def from_rpc_error(err: grpc.RpcError) -> JobfenceError:
    """Maps a failed call of a synchronous channel to a ``JobfenceError``."""
    code, message = err.code(), err.details() or ""  # type: ignore[attr-defined]
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:
        status = None
    return from_status(code, message, status)


def retryable_write(err: JobfenceError) -> bool:
    """May a fenced write, an observation or a read be sent again? Yes for a
    lost commit, an unavailable database, a conflict, an overload and any
    transport failure: the coordinator answers an applied write as a replay
    and de-duplicates observations. Never for a refusal."""
    return isinstance(err, (OutcomeUnknown, Unavailable))


def never_sent(err: JobfenceError) -> bool:
    """True for an UNAVAILABLE that gRPC made up because no connection
    could be made (a coordinator restarting, nothing listening: the request
    never left), or because the server refused the stream (HTTP/2
    REFUSED_STREAM: not processed). Nothing can have been applied."""
    if err.reason or err.code != grpc.StatusCode.UNAVAILABLE:
        return False
    message = str(err.message).lower()
    return any(m in message for m in _NEVER_SENT)


#: What gRPC's core says when it could not connect or the stream was refused.
_NEVER_SENT = ("failed to connect", "connection refused", "connect failed",
               "refused_stream", "refused stream")


def retryable_claim(err: JobfenceError) -> bool:
    """May a Claim or Takeover be sent again? Only when nothing was applied:
    the coordinator or the load balancer said so, or no request left (see
    ``never_sent``). After an unclear claim the worker holds nothing; any
    job it may have taken comes back after its lease through a takeover that
    reconciles first."""
    return isinstance(err, Unavailable) or never_sent(err)


__all__ = [
    "AttemptNotIssued", "AttemptSuperseded", "CommitOutcomeUnknown", "CredentialExpired",
    "CredentialInvalid", "CredentialMissing", "DOMAIN", "DatabaseUnavailable", "Denied",
    "InternalError",
    "EventsCursorPruned", "InvalidRequest", "JobFinished", "JobNotCancellable", "JobNotFound",
    "JobNotInManualReview", "JobPruned",
    "JobNotRunning", "JobfenceError", "LeaseNotExpired", "NoCoordinatorServing", "NotAuthorized",
    "OperationKeyConflict", "OperatorMismatch", "OutcomeUnknown", "Overloaded", "PermissionDenied",
    "ProviderBudgetExhausted", "ProviderHeld", "ProviderPaused", "ProviderThrottled",
    "QueueNotAllowed", "REASONS", "RoleNotAllowed", "ServerShuttingDown",
    "SettlementExceptionMoved", "SettlementExceptionNotFound", "TransactionConflict",
    "Unauthenticated", "Unavailable", "from_rpc_error", "from_status", "never_sent", "retryable_claim",
    "retryable_write",
]
