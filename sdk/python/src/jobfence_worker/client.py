"""The synchronous client: ``WorkerClient`` hands out ``ClaimedJob``
handles, and every write goes through the handle that carries its attempt."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

import grpc

from . import _wire
from ._proto import coordinator_pb2 as pb
from .credentials import Credentials
from ._wire import ClaimInterrupted, Disposition, FailWritten, Recorded, RetryPolicy, Written
from .errors import (
    AttemptSuperseded,
    check_api_version,
    JobfenceError,
    JobNotRunning,
    from_rpc_error,
    retryable_claim,
    retryable_write,
)
from .runner import Handler, RunReport, run_loop

log = logging.getLogger("jobfence_worker")

#: How often a cancellable call (the run loop's Claim) looks at its stop
#: signal, in seconds.
_STOP_POLL_SECONDS = 0.05


class WorkerClient:
    """A worker's connection to one coordinator (``host:port``).

    ``lease_seconds`` is asked for on every Claim/Takeover (DB clock, within
    the server's bounds); ``timeout_seconds`` is the deadline of one RPC;
    ``credentials`` (``Credentials.from_env()``) give TLS and the bearer
    token for a coordinator that authenticates its callers.
    """

    def __init__(self, target: str, worker_id: str, queue: str, lease_seconds: float = 30.0,
                 timeout_seconds: float = 10.0, retry: Optional[RetryPolicy] = None,
                 channel: Optional[grpc.Channel] = None,
                 credentials: Optional[Credentials] = None) -> None:
        self.pb = pb
        self.worker_id = worker_id
        self.queue = queue
        self.lease_seconds = lease_seconds
        self.timeout_seconds = timeout_seconds
        self.retry = retry or RetryPolicy()
        #: Calls sent again because the answer said nothing was applied (or,
        #: for a write, an observation or a read, that the outcome was
        #: unknown): a worker that rode through an outage shows it here.
        self.retries = 0
        self._retries_lock = threading.Lock()
        credentials = credentials or Credentials()
        # The token goes on every call as metadata (it works on a cleartext
        # channel too, for a coordinator behind a TLS-terminating proxy).
        self._metadata = tuple(credentials.metadata()) or None
        self._channel = channel or credentials.channel(target)
        self._calls = {name: self._channel.unary_unary(path, request_serializer=ser,
                                                       response_deserializer=de)
                       for name, (path, ser, de) in _wire.methods().items()}

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "WorkerClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, retryable: Callable[[JobfenceError], bool],
              extra_seconds: float = 0.0, stop: Optional[threading.Event] = None) -> Any:
        """One call under the retry policy. With ``stop`` (the run loop's
        Claim), setting it cuts the call and its retries short with
        ``ClaimInterrupted``."""
        started, tries = time.monotonic(), 0
        while True:
            tries += 1
            try:
                response, call = self._invoke(method, request, extra_seconds, stop)
                check_api_version(call.initial_metadata())
                return response
            except grpc.RpcError as err:
                # A refusal comes trailers-only: the header is among either.
                check_api_version(err.initial_metadata(),  # type: ignore[attr-defined]
                                  err.trailing_metadata())  # type: ignore[attr-defined]
                mapped = from_rpc_error(err)
                wait = (self.retry.next_wait(tries, mapped, time.monotonic() - started)
                        if retryable(mapped) else None)
                if wait is None:
                    raise mapped from None
                with self._retries_lock:
                    self.retries += 1
                log.debug("retrying %s in %.3f s after %r", method, wait, mapped)
                if stop is None:
                    time.sleep(wait)
                elif stop.wait(wait):
                    raise ClaimInterrupted() from None

    def _invoke(self, method: str, request: Any, extra_seconds: float,
                stop: Optional[threading.Event]) -> Tuple[Any, Any]:
        """``(response, call)``; a failure raises the call's ``grpc.RpcError``."""
        timeout = self.timeout_seconds + extra_seconds
        metadata = _wire.call_metadata(self._metadata)
        if stop is None:
            return self._calls[method].with_call(request, timeout=timeout, metadata=metadata)
        # A blocking call cannot be interrupted; a future can be cancelled.
        call = self._calls[method].future(request, timeout=timeout, metadata=metadata)
        while True:
            try:
                return call.result(timeout=_STOP_POLL_SECONDS), call
            except grpc.FutureTimeoutError:
                if stop.is_set():
                    call.cancel()
                    raise ClaimInterrupted() from None

    def claim(self, max_jobs: int = 1, wait_seconds: float = 0.0) -> List["ClaimedJob"]:
        """Claims up to ``max_jobs`` due jobs; returns their handles (maybe
        none). With ``wait_seconds`` the coordinator holds the call until a
        job is due (a long poll: no polling needed) and answers empty only
        when that time passes. Raises ``OutcomeUnknown`` when the claim may
        have committed unheard: hold nothing then, and do not retry it
        blindly (its jobs come back after their lease through a takeover
        that reconciles)."""
        request = _wire.claim_request(self.queue, self.worker_id, max_jobs, self.lease_seconds,
                                      wait_seconds)
        response = self._call("Claim", request, retryable_claim, extra_seconds=wait_seconds)
        return [ClaimedJob(self, c) for c in response.jobs]

    def _claim_until(self, stop: threading.Event, max_jobs: int,
                     wait_seconds: float) -> List["ClaimedJob"]:
        """``claim``, cut short (``ClaimInterrupted``) when ``stop`` is set."""
        request = _wire.claim_request(self.queue, self.worker_id, max_jobs, self.lease_seconds,
                                      wait_seconds)
        response = self._call("Claim", request, retryable_claim, extra_seconds=wait_seconds,
                              stop=stop)
        return [ClaimedJob(self, c) for c in response.jobs]

    def run(self, handler: Handler, concurrency: int = 1, *,
            wait_seconds: float = 10.0, stop: Optional[threading.Event] = None,
            on_claim_error: Optional[Callable[[JobfenceError], None]] = None,
            release_delay_seconds: float = 1.0,
            poll_seconds: float = 1.0) -> RunReport:
        """Claims and handles jobs until ``stop`` (a ``threading.Event``) is
        set, at most ``concurrency`` (1..100) at once, each handler in a
        thread of its own: the run loop of every jobfence client (Rust
        ``WorkerClient::run``, Node ``client.run``, Go ``client.Run``).

        * It claims only for free slots: each Claim asks for exactly the
          free slots (a long poll of ``wait_seconds``), so it never holds a
          job it cannot start now.
        * ``handler(job)`` gets a ``ClaimedJob`` and writes back through it
          (``complete``, ``fail``; ``renew_lease`` for a long job: nothing
          renews on its own). A job it leaves without a write that settled
          it (it returned, or raised) is released with ``Fail(RETRY_RECONCILE)``
          after ``release_delay_seconds``: reconcile, never resend, because
          the handler may have reached the provider. Its exception is
          logged and counted, never raised here.
        * A Claim whose outcome is unknown (``OutcomeUnknown``, a lost
          COMMIT included) hands out nothing and runs no handler: the jobs
          it may have taken come back after their lease through a takeover
          that reconciles first. It and any other failed Claim (after the
          client's retries) go to ``on_claim_error`` (default: a warning
          in the log), then the loop waits ``retry.backoff(failures)`` and
          claims again.
        * A Claim refused for who the caller is (``Denied``) or as an
          ``InvalidRequest`` cannot succeed by asking again: the loop stops
          claiming, lets the handlers in flight finish, and raises it.
        * When ``stop`` is set it stops claiming (a long poll under way is
          cancelled: nothing from it is handled) and **finishes** what it
          holds: it waits for every handler in flight, which writes back as
          usual, and abandons no job. Then it returns a ``RunReport``.
        * Without ``stop``, called from the main thread, Ctrl-C (SIGINT) is
          the stop: the same finish, and a report instead of a
          ``KeyboardInterrupt`` traceback (the previous SIGINT handler is
          put back when it returns).
        """
        return run_loop(self, handler, concurrency, wait_seconds=wait_seconds, stop=stop,
                        on_claim_error=on_claim_error,
                        release_delay_seconds=release_delay_seconds, poll_seconds=poll_seconds)

    def takeover(self, job_id: int) -> "ClaimedJob":
        """Takes over one job whose lease expired; starts with RECONCILE."""
        request = _wire.takeover_request(job_id, self.worker_id, self.lease_seconds)
        return ClaimedJob(self, self._call("Takeover", request, retryable_claim).claimed)

    def get_job(self, job_id: int) -> Tuple[pb.Job, List[pb.Observation]]:
        """``(job, observations)``. A read decides nothing about ownership."""
        response = self._call("GetJob", pb.GetJobRequest(job_id=job_id), retryable_write)
        return response.job, list(response.observations)

    def enqueue(self, queue: str, operation_key: str, payload: str,
                delay_seconds: float = 0.0, *, fairness_key: Optional[str] = None,
                priority: Optional[int] = None) -> Tuple[pb.Job, bool]:
        """Adds a job, idempotent on (queue, operation_key): ``(job, created)``.

        ``fairness_key`` (a merchant, a tenant; at most 128 bytes, not
        blank): within a queue and a priority, claims go round-robin across
        the keys. ``priority``: 1 (lowest) to 9 (most urgent); ``None`` or 0
        is the default, 5 (docs/design.md rule 18). The job returned says
        what it was given (``job.priority``, ``job.fairness_key``); a bad
        value is refused with ``InvalidRequest`` naming the field."""
        request = _wire.enqueue_request(queue, operation_key, payload, delay_seconds,
                                        fairness_key, priority)
        response = self._call("Enqueue", request, retryable_write)
        return response.job, response.created

    def enqueue_batch(self, items: List[_wire.BatchItem]) -> List[Any]:
        """Enqueues ``items`` in one transaction, each a ``(queue,
        operation_key, payload)`` tuple or a mapping with the keyword names
        of ``enqueue`` (``{"queue": ..., "operation_key": ..., "payload":
        ..., "fairness_key": ..., "priority": ...}``); one
        ``EnqueueBatchResult`` per item, in order (each an ``enqueued``
        response or an ``error`` for that item alone)."""
        request = _wire.enqueue_batch_request(items)
        return list(self._call("EnqueueBatch", request, retryable_write).results)


class ClaimedJob(_wire.HandleBase):
    """A job this worker holds, handed out by a committed Claim or Takeover.
    Every write presents ``attempt``; the coordinator applies it only while
    that attempt is current."""

    def __init__(self, client: WorkerClient, claimed: pb.ClaimedJob) -> None:
        super().__init__(claimed, client.worker_id)
        self._client = client

    def complete(self, provider_reference: str, result: str = "") -> Written:
        """Marks the job succeeded. On ``AttemptSuperseded`` or
        ``JobNotRunning`` with a provider reference, the result is recorded
        as an observation (source WORKER, outcome SUCCEEDED) and the
        exception says ``observation_recorded = True``."""
        request = self._with_next(
            _wire.complete_request(self.job_id, self._attempt, provider_reference, result))
        try:
            response = self._client._call("Complete", request, retryable_write)
            self._answered(response)
        except (AttemptSuperseded, JobNotRunning) as refusal:
            self._refused(refusal)
            if provider_reference:
                refusal.observation_recorded = self._keep_evidence(provider_reference, result)
            raise
        except JobfenceError as err:
            self._refused(err)
            raise
        self._applied(response.job, settles=True)
        return Written(response.replayed, response.job)

    def fail(self, disposition: Disposition, error: str,
             retry_delay_seconds: float = 0.0, *,
             provider_retry_after_seconds: Optional[float] = None) -> FailWritten:
        """Reports a failure; see ``Disposition``. ``error`` is required.

        ``provider_retry_after_seconds``: set it when the provider pushed
        back (HTTP 429, or 503 with Retry-After) to how long it asked to
        wait (positive, at most 24 h). The coordinator then hands out
        nothing for the provider until then, on every coordinator, so the
        other workers stop hitting it too; the job is disposed of as asked
        (a throttled send was not processed: ``RETRY_EXECUTE``)."""
        request = self._with_next(
            _wire.fail_request(self.job_id, self._attempt, disposition, error,
                               retry_delay_seconds, provider_retry_after_seconds))
        try:
            response = self._client._call("Fail", request, retryable_write)
            self._answered(response)
        except JobfenceError as err:
            self._refused(err)
            raise
        self._applied(response.job, settles=True)
        return _wire.fail_written(response)

    def renew_lease(self, lease_seconds: float) -> Written:
        """Extends the lease from now (DB clock); never shortens it."""
        request = _wire.renew_request(self.job_id, self._attempt, lease_seconds)
        try:
            response = self._client._call("RenewLease", request, retryable_write)
        except JobfenceError as err:
            self._refused(err)
            raise
        self._applied(response.job, settles=False)
        return Written(response.replayed, response.job)

    def record_observation(self, outcome: str, provider_reference: str, body: str,
                           dedup_key: str) -> Recorded:
        """Records evidence (``outcome`` like ``"SUCCEEDED"``), allowed from
        any attempt, stale included; never changes the job."""
        request = _wire.observation_request(self.job_id, self._attempt, outcome,
                                            provider_reference, body, dedup_key)
        response = self._client._call("RecordObservation", request, retryable_write)
        return Recorded(response.observation, response.duplicate)

    def _keep_evidence(self, provider_reference: str, result: str) -> bool:
        try:
            self.record_observation("SUCCEEDED", provider_reference, result,
                                    self._evidence_key(provider_reference))
            return True
        except JobfenceError as err:
            log.warning("could not record a late provider result: %s", err)
            return False


__all__ = ["ClaimedJob", "WorkerClient"]
