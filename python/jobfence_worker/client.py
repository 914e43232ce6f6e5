"""WorkerClient and ClaimedJob: claim hands out handles, every write goes
through the handle that carries its attempt."""

import enum
import hashlib
import logging
import random
import time
from dataclasses import dataclass

import grpc

from . import stubs
from .errors import (
    AttemptSuperseded,
    JobfenceError,
    JobNotRunning,
    from_rpc_error,
    retryable_claim,
    retryable_write,
)

log = logging.getLogger("jobfence_worker")


class Disposition(enum.Enum):
    """How Fail disposes of the job (the API's FailDisposition)."""

    RETRY_RECONCILE = "FAIL_DISPOSITION_RETRY_RECONCILE"
    RETRY_EXECUTE = "FAIL_DISPOSITION_RETRY_EXECUTE"
    FAILED = "FAIL_DISPOSITION_FAILED"
    MANUAL_REVIEW = "FAIL_DISPOSITION_MANUAL_REVIEW"


@dataclass
class RetryPolicy:
    """Tries in all (first included); backoff doubles from ``initial``
    seconds up to ``maximum`` seconds, half of it random (equal jitter)."""

    max_tries: int = 5
    initial: float = 0.05
    maximum: float = 2.0

    def backoff(self, retry):
        ceiling = min(self.maximum, self.initial * (2 ** max(0, retry - 1)))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass
class Written:
    """An applied Complete or RenewLease. ``replayed``: this exact call had
    already been applied (its answer was lost); nothing was written again."""

    replayed: bool
    job: object


@dataclass
class FailWritten:
    """An applied Fail. ``applied`` may differ from the request when the
    coordinator turned a resend into manual review (``override_reason``)."""

    replayed: bool
    job: object
    applied: Disposition
    override_reason: str


@dataclass
class Recorded:
    """A recorded observation; ``duplicate`` when its dedup key existed."""

    observation: object
    duplicate: bool


def observation_dedup_key(worker_id, provider_reference):
    """``worker:<worker_id>:<provider_reference>``, or ``worker-sha256:<hex>``
    of both when longer than 255 bytes: the same key the Rust SDK uses."""
    plain = "worker:%s:%s" % (worker_id, provider_reference)
    if len(plain.encode()) <= 255:
        return plain
    digest = hashlib.sha256(worker_id.encode() + b"\0" + provider_reference.encode())
    return "worker-sha256:" + digest.hexdigest()


def _duration(pb, seconds):
    d = pb.Duration()
    d.seconds = int(seconds)
    d.nanos = int(round((seconds - int(seconds)) * 1e9))
    return d


class WorkerClient:
    """A worker's connection to one coordinator (``host:port``).

    ``lease_seconds`` is asked for on every Claim/Takeover (DB clock, within
    the server's bounds); ``timeout_seconds`` is the deadline of one RPC.
    """

    def __init__(self, target, worker_id, queue, lease_seconds=30.0,
                 timeout_seconds=10.0, retry=None, proto_root=None, stub_dir=None):
        self.pb, pb_grpc = stubs.load(proto_root, stub_dir)
        from google.protobuf import duration_pb2

        self._duration_pb = duration_pb2
        self.worker_id = worker_id
        self.queue = queue
        self.lease_seconds = lease_seconds
        self.timeout_seconds = timeout_seconds
        self.retry = retry or RetryPolicy()
        self._channel = grpc.insecure_channel(target)
        self._stub = pb_grpc.JobCoordinatorStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, retryable, extra_seconds=0.0):
        tries = 0
        while True:
            tries += 1
            try:
                return getattr(self._stub, method)(
                    request, timeout=self.timeout_seconds + extra_seconds)
            except grpc.RpcError as err:
                mapped = from_rpc_error(err)
                if tries >= self.retry.max_tries or not retryable(mapped):
                    raise mapped from None
                time.sleep(self.retry.backoff(tries))

    def _lease(self):
        return _duration(self._duration_pb, self.lease_seconds)

    def claim(self, max_jobs=1, wait_seconds=0.0):
        """Claims up to ``max_jobs`` due jobs; returns their handles (maybe
        none). With ``wait_seconds`` the coordinator holds the call until a
        job is due (a long poll: no polling needed) and answers empty only
        when that time passes. Raises ``OutcomeUnknown`` when the claim may
        have committed unheard: hold nothing then, and do not retry it
        blindly (its jobs come back after their lease through a takeover
        that reconciles)."""
        request = self.pb.ClaimRequest(queue=self.queue, worker_id=self.worker_id,
                                       max_jobs=max_jobs, lease=self._lease())
        if wait_seconds > 0:
            request.wait.CopyFrom(_duration(self._duration_pb, wait_seconds))
        response = self._call("Claim", request, retryable_claim, extra_seconds=wait_seconds)
        return [ClaimedJob(self, c) for c in response.jobs]

    def takeover(self, job_id):
        """Takes over one job whose lease expired; starts with RECONCILE."""
        request = self.pb.TakeoverRequest(job_id=job_id, worker_id=self.worker_id,
                                          lease=self._lease())
        return ClaimedJob(self, self._call("Takeover", request, retryable_claim).claimed)

    def get_job(self, job_id):
        """``(job, observations)``. A read decides nothing about ownership."""
        response = self._call("GetJob", self.pb.GetJobRequest(job_id=job_id), retryable_write)
        return response.job, list(response.observations)


class ClaimedJob:
    """A job this worker holds. Every write presents ``attempt``; the
    coordinator applies it only while that attempt is current."""

    def __init__(self, client, claimed):
        self._client = client
        self.job = claimed.job
        self._attempt = claimed.job.attempt
        self.takeover = claimed.takeover
        self.observations = list(claimed.observations)

    @property
    def job_id(self):
        return self.job.job_id

    @property
    def operation_key(self):
        """THE idempotency key to send to the provider. Never changes
        across attempts, so the provider de-duplicates a resend or a
        reconcile by a later attempt; a key built from the attempt would
        look like a new operation."""
        return self.job.operation_key

    @property
    def attempt(self):
        """The fencing token, for logs only: never put it in a provider key."""
        return self._attempt

    @property
    def payload(self):
        return self.job.payload

    @property
    def next_action(self):
        """``"NEXT_ACTION_EXECUTE"`` or ``"NEXT_ACTION_RECONCILE"``."""
        return self._client.pb.NextAction.Name(self.job.next_action)

    def complete(self, provider_reference, result=""):
        """Marks the job succeeded. On ``AttemptSuperseded`` or
        ``JobNotRunning`` with a provider reference, the result is recorded
        as an observation (source WORKER, outcome SUCCEEDED) and the
        exception says ``observation_recorded = True``."""
        pb = self._client.pb
        request = pb.CompleteRequest(job_id=self.job_id, attempt=self._attempt,
                                     provider_reference=provider_reference, result=result)
        try:
            response = self._client._call("Complete", request, retryable_write)
        except (AttemptSuperseded, JobNotRunning) as refusal:
            if provider_reference:
                refusal.observation_recorded = self._keep_evidence(provider_reference, result)
            raise
        self.job = response.job
        return Written(response.replayed, response.job)

    def fail(self, disposition, error, retry_delay_seconds=0.0):
        """Reports a failure; see ``Disposition``. ``error`` is required."""
        pb = self._client.pb
        request = pb.FailRequest(
            job_id=self.job_id, attempt=self._attempt,
            disposition=pb.FailDisposition.Value(disposition.value), error=error,
            retry_delay=_duration(self._client._duration_pb, retry_delay_seconds))
        response = self._client._call("Fail", request, retryable_write)
        self.job = response.job
        return FailWritten(response.replayed, response.job,
                           Disposition(pb.FailDisposition.Name(response.applied)),
                           response.override_reason)

    def renew_lease(self, lease_seconds):
        """Extends the lease from now (DB clock); never shortens it."""
        pb = self._client.pb
        request = pb.RenewLeaseRequest(
            job_id=self.job_id, attempt=self._attempt,
            lease=_duration(self._client._duration_pb, lease_seconds))
        response = self._client._call("RenewLease", request, retryable_write)
        self.job = response.job
        return Written(response.replayed, response.job)

    def record_observation(self, outcome, provider_reference, body, dedup_key):
        """Records evidence (``outcome`` like ``"SUCCEEDED"``), allowed from
        any attempt, stale included; never changes the job."""
        pb = self._client.pb
        request = pb.RecordObservationRequest(
            job_id=self.job_id, attempt=self._attempt,
            source=pb.ObservationSource.Value("OBSERVATION_SOURCE_WORKER"),
            outcome=pb.ObservationOutcome.Value("OBSERVATION_OUTCOME_" + outcome),
            provider_reference=provider_reference, body=body, dedup_key=dedup_key)
        response = self._client._call("RecordObservation", request, retryable_write)
        return Recorded(response.observation, response.duplicate)

    def _keep_evidence(self, provider_reference, result):
        key = observation_dedup_key(self._client.worker_id, provider_reference)
        try:
            self.record_observation("SUCCEEDED", provider_reference, result, key)
            return True
        except JobfenceError as err:
            log.warning("could not record a late provider result: %s", err)
            return False


__all__ = ["ClaimedJob", "Disposition", "FailWritten", "Recorded",
           "RetryPolicy", "WorkerClient", "Written", "observation_dedup_key"]
