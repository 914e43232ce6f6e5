"""What the synchronous and the asyncio clients share: the messages, the
method table, the request builders and the result types. No I/O here."""

from __future__ import annotations

import enum
import hashlib
import random
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from google.protobuf import duration_pb2

from ._proto import coordinator_pb2 as pb
from .errors import AttemptSuperseded, JobNotFound, JobNotRunning, from_refusal

try:  # Optional: the caller's trace goes with each call when it is installed.
    from opentelemetry import propagate as _otel_propagate
except ImportError:  # pragma: no cover - without opentelemetry-api
    _otel_propagate = None

SERVICE = "jobfence.v1.JobCoordinator"

Metadata = Optional[Tuple[Tuple[str, str], ...]]


def call_metadata(base: Metadata) -> Metadata:
    """The metadata of one call: ``base`` (the bearer token) and, when the
    ``opentelemetry`` API package is importable and the caller is inside a
    trace, its context as the configured propagator writes it (W3C
    ``traceparent``/``tracestate`` by default), so the coordinator's span of
    the call is a child of the caller's. Read at each call: the current
    span is the calling code's."""
    if _otel_propagate is None:
        return base
    carrier: Dict[str, str] = {}
    _otel_propagate.inject(carrier)
    if not carrier:
        return base
    return tuple(base or ()) + tuple((k.lower(), v) for k, v in carrier.items())


def methods() -> Dict[str, Tuple[str, Callable[[Any], bytes], Callable[[bytes], Any]]]:
    """``name -> (path, serializer, deserializer)`` for every method of the
    service, read from the shipped file descriptor (so a channel of either
    kind can call it with ``unary_unary``)."""
    out = {}
    service = pb.DESCRIPTOR.services_by_name["JobCoordinator"]
    for m in service.methods:
        request = getattr(pb, m.input_type.name)
        response = getattr(pb, m.output_type.name)
        out[m.name] = ("/%s/%s" % (SERVICE, m.name), request.SerializeToString, response.FromString)
    return out


class Disposition(enum.Enum):
    """How Fail disposes of the job (the API's FailDisposition)."""

    RETRY_RECONCILE = "FAIL_DISPOSITION_RETRY_RECONCILE"
    RETRY_EXECUTE = "FAIL_DISPOSITION_RETRY_EXECUTE"
    FAILED = "FAIL_DISPOSITION_FAILED"
    MANUAL_REVIEW = "FAIL_DISPOSITION_MANUAL_REVIEW"


@dataclass
class RetryPolicy:
    """How patiently a call that is safe to repeat is retried: for up to
    ``budget`` seconds from its first try (no retry starts whose wait would
    end past it; 0 turns retrying off), with a backoff that doubles from
    ``initial`` seconds up to ``maximum`` seconds, half of it random (equal
    jitter). The default, 30 s from 50 ms up to 2 s, is the same in every
    jobfence client and outlasts a 10-second database outage."""

    budget: float = 30.0
    initial: float = 0.05
    maximum: float = 2.0

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first)."""
        ceiling = min(self.maximum, self.initial * (2 ** max(0, retry - 1)))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def wait(self, retry: int, error: object) -> float:
        """Seconds to wait before retry number ``retry`` after ``error``:
        the backoff, or the server's retry-after hint (``retry_after`` of
        an ``Overloaded``, from google.rpc.RetryInfo) when that is longer."""
        hint = getattr(error, "retry_after", None) or 0.0
        return max(self.backoff(retry), hint)

    def next_wait(self, retry: int, error: object, elapsed: float) -> Optional[float]:
        """``wait(retry, error)``, or None when it would end past the
        budget (``elapsed``: seconds since the call's first try)."""
        wait = self.wait(retry, error)
        return None if elapsed + wait > self.budget else wait


@dataclass
class Written:
    """An applied Complete or RenewLease. ``replayed``: this exact call had
    already been applied (its answer was lost); nothing was written again."""

    replayed: bool
    job: pb.Job


@dataclass
class FailWritten:
    """An applied Fail. ``applied`` may differ from the request when the
    coordinator turned a resend into manual review (``override_reason``)."""

    replayed: bool
    job: pb.Job
    applied: Disposition
    override_reason: str


@dataclass
class Recorded:
    """A recorded observation; ``duplicate`` when its dedup key existed."""

    observation: pb.Observation
    duplicate: bool


def observation_dedup_key(worker_id: str, provider_reference: str) -> str:
    """``worker:<worker_id>:<provider_reference>``, or ``worker-sha256:<hex>``
    of both when longer than 255 bytes: the same key every jobfence SDK
    derives, so one worker reporting one result twice records it once."""
    plain = "worker:%s:%s" % (worker_id, provider_reference)
    if len(plain.encode()) <= 255:
        return plain
    digest = hashlib.sha256(worker_id.encode() + b"\0" + provider_reference.encode())
    return "worker-sha256:" + digest.hexdigest()


def duration(seconds: float) -> duration_pb2.Duration:
    """Seconds as a protobuf Duration."""
    d = duration_pb2.Duration()
    d.seconds = int(seconds)
    d.nanos = int(round((seconds - int(seconds)) * 1e9))
    return d


def claim_request(queue: str, worker_id: str, max_jobs: int, lease_seconds: float,
                  wait_seconds: float) -> pb.ClaimRequest:
    request = pb.ClaimRequest(queue=queue, worker_id=worker_id, max_jobs=max_jobs,
                              lease=duration(lease_seconds))
    if wait_seconds > 0:
        request.wait.CopyFrom(duration(wait_seconds))
    return request


def enqueue_request(queue: str, operation_key: str, payload: str, delay_seconds: float = 0.0,
                    fairness_key: Optional[str] = None,
                    priority: Optional[int] = None) -> pb.EnqueueRequest:
    """An Enqueue as both clients send it: ``fairness_key`` (a merchant, a
    tenant; claims go round-robin across a queue's keys) and ``priority``
    (1 lowest to 9 most urgent, 0 the default 5) are sent when given
    (docs/design.md rule 18)."""
    request = pb.EnqueueRequest(queue=queue, operation_key=operation_key, payload=payload)
    if delay_seconds > 0:
        request.delay.CopyFrom(duration(delay_seconds))
    if fairness_key is not None:
        request.fairness_key = fairness_key
    if priority is not None:
        request.priority = priority
    return request


#: One job of ``enqueue_batch``: a ``(queue, operation_key, payload)``
#: tuple, or a mapping with the keyword names of ``enqueue`` (``queue``,
#: ``operation_key``, ``payload``, ``delay_seconds``, ``fairness_key``,
#: ``priority``).
BatchItem = Union[Tuple[str, str, str], Mapping[str, Any]]


def enqueue_batch_request(items: List[BatchItem]) -> pb.EnqueueBatchRequest:
    """The EnqueueBatch of ``items`` (see ``BatchItem``), in order."""
    return pb.EnqueueBatchRequest(items=[
        enqueue_request(**item) if isinstance(item, Mapping) else enqueue_request(*item)
        for item in items])


def takeover_request(job_id: int, worker_id: str, lease_seconds: float) -> pb.TakeoverRequest:
    return pb.TakeoverRequest(job_id=job_id, worker_id=worker_id, lease=duration(lease_seconds))


def complete_request(job_id: int, attempt: int, provider_reference: str,
                     result: str) -> pb.CompleteRequest:
    return pb.CompleteRequest(job_id=job_id, attempt=attempt,
                              provider_reference=provider_reference, result=result)


def fail_request(job_id: int, attempt: int, disposition: Disposition, error: str,
                 retry_delay_seconds: float,
                 provider_retry_after_seconds: Optional[float] = None) -> pb.FailRequest:
    request = pb.FailRequest(job_id=job_id, attempt=attempt,
                             disposition=pb.FailDisposition.Value(disposition.value), error=error,
                             retry_delay=duration(retry_delay_seconds))
    if provider_retry_after_seconds is not None:
        request.provider_retry_after.CopyFrom(duration(provider_retry_after_seconds))
    return request


def renew_request(job_id: int, attempt: int, lease_seconds: float) -> pb.RenewLeaseRequest:
    return pb.RenewLeaseRequest(job_id=job_id, attempt=attempt, lease=duration(lease_seconds))


def observation_request(job_id: int, attempt: int, outcome: str, provider_reference: str,
                        body: str, dedup_key: str) -> pb.RecordObservationRequest:
    """``outcome`` like ``"SUCCEEDED"`` (an ObservationOutcome without its prefix)."""
    return pb.RecordObservationRequest(
        job_id=job_id, attempt=attempt,
        source=pb.ObservationSource.Value("OBSERVATION_SOURCE_WORKER"),
        outcome=pb.ObservationOutcome.Value("OBSERVATION_OUTCOME_" + outcome),
        provider_reference=provider_reference, body=body, dedup_key=dedup_key)


def fail_written(response: pb.FailResponse) -> FailWritten:
    return FailWritten(response.replayed, response.job,
                       Disposition(pb.FailDisposition.Name(response.applied)),
                       response.override_reason)


@dataclass
class NextAsk:
    """What a handle's Complete and Fail ask for when the run loop set it:
    the worker's next job, claimed in the same call and transaction
    (docs/design.md rule 16). Nothing is asked once ``stopping()``."""

    request: pb.NextJobsRequest
    stopping: Callable[[], bool]


def next_ask(queue: str, worker_id: str, lease_seconds: float,
             stopping: Callable[[], bool]) -> NextAsk:
    """One job of ``queue`` with the worker's lease, no long poll (when
    nothing is due, the loop's own Claim waits for work)."""
    return NextAsk(pb.NextJobsRequest(queue=queue, worker_id=worker_id, max_jobs=1,
                                      lease=duration(lease_seconds)), stopping)


class HandleBase:
    """The read-only part of a job handle: what a Claim or Takeover handed
    out. Every write presents ``attempt``; the coordinator applies it only
    while that attempt is the job's current one (and the job is running)."""

    def __init__(self, claimed: pb.ClaimedJob, worker_id: str) -> None:
        self.job: pb.Job = claimed.job
        self._attempt: int = claimed.job.attempt
        self._worker_id = worker_id
        self.takeover: bool = claimed.takeover
        self.observations = list(claimed.observations)
        #: True once a write told this handle it no longer holds the job:
        #: its Complete or Fail was applied (or replayed), or a write was
        #: refused as superseded, not running or not found. The run loop
        #: releases a job whose handler returned while it was still False.
        self.settled: bool = False
        self._next: Optional[NextAsk] = None
        self._handed: List[pb.ClaimedJob] = []

    @property
    def job_id(self) -> int:
        return self.job.job_id

    @property
    def operation_key(self) -> str:
        """THE idempotency key to send to the provider. Never changes
        across attempts, so the provider de-duplicates a resend or a
        reconcile by a later attempt; a key built from the attempt would
        look like a new operation."""
        return self.job.operation_key

    @property
    def attempt(self) -> int:
        """The fencing token, for logs only: never put it in a provider key."""
        return self._attempt

    @property
    def payload(self) -> str:
        return self.job.payload

    @property
    def priority(self) -> int:
        """1 (lowest) to 9 (most urgent); 5 unless the job's enqueue asked
        for another (docs/design.md rule 18)."""
        return self.job.priority

    @property
    def fairness_key(self) -> str:
        """The fairness key the job was enqueued with (a merchant, a
        tenant); ``""`` when it was given none (rule 18)."""
        return self.job.fairness_key

    @property
    def next_action(self) -> str:
        """``"NEXT_ACTION_EXECUTE"`` or ``"NEXT_ACTION_RECONCILE"`` (always
        RECONCILE after a takeover: ask the provider what happened first)."""
        return pb.NextAction.Name(self.job.next_action)

    def _evidence_key(self, provider_reference: str) -> str:
        return observation_dedup_key(self._worker_id, provider_reference)

    def _applied(self, job: pb.Job, settles: bool) -> None:
        self.job = job
        if settles:
            self.settled = True

    def ask_for_next_job(self) -> None:
        """Makes this handle's ``complete`` and ``fail`` also claim the
        worker's next job of its queue (the client's queue, lease and
        worker id) in the same call and transaction (docs/design.md rule
        16); take it with ``take_next_job()`` after the write. The run
        loop does this for every job it hands to a handler.

        Each half answers for itself: a write refused as superseded still
        brings its next job (the exception is the write's); an empty claim
        leaves the write applied. A write whose outcome is unknown brings
        none, and the client's retry of it is answered as a replay, which
        claims nothing."""
        client = getattr(self, "_client")
        self._next = next_ask(client.queue, client.worker_id, client.lease_seconds,
                              lambda: False)

    def take_next_job(self) -> Any:
        """The next job a write-back of this handle brought, as a handle of
        the same kind that asks for its own next job the same way; None
        when none came."""
        handed = self._take_handed()
        if not handed:
            return None
        nxt = type(self)(getattr(self, "_client"), handed[0])  # type: ignore[call-arg]
        nxt._next = self._next
        return nxt

    def _with_next(self, request: Any) -> Any:
        """``request`` asking for the next job, when the run loop set it
        and is not stopping."""
        if self._next is not None and not self._next.stopping():
            request.next.CopyFrom(self._next.request)
        return request

    def _answered(self, response: Any) -> None:
        """Keeps the next jobs of a write's answer, and raises the write's
        refusal, if the fence refused it, as the same call without a
        next-job request would have."""
        if not response.HasField("next"):
            return
        self._handed.extend(response.next.jobs)
        if response.next.HasField("write_refused"):
            raise from_refusal(response.next.write_refused)

    def _take_handed(self) -> List[pb.ClaimedJob]:
        handed, self._handed = self._handed, []
        return handed

    def _refused(self, err: Exception) -> None:
        """Marks the handle settled when a refusal says it no longer holds
        the job (as the Rust, Node and Go handles do)."""
        if isinstance(err, (AttemptSuperseded, JobNotRunning, JobNotFound)):
            self.settled = True


class ClaimInterrupted(Exception):
    """A Claim of the run loop cut short by its stop signal (its RPC
    cancelled): nothing was handed out. If the coordinator had committed
    it, its jobs come back after their lease through a takeover that
    reconciles first (docs/design.md rule 4)."""
