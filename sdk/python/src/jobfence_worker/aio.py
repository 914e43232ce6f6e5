"""The asyncio client, on ``grpc.aio``: the same protocol and the same
errors as the synchronous one, with ``await``.

    async with AsyncWorkerClient("127.0.0.1:50051", "w-1", "refunds") as client:
        for job in await client.claim(4, wait_seconds=10):
            await job.complete("re_123", "{}")

or with the run loop (``stop``: an ``asyncio.Event``):

    async def handle(job):
        await job.complete("re_%d" % job.job_id, "{}")

    report = await client.run(handle, concurrency=4, stop=stop)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, List, Optional, Tuple

import grpc
from grpc import aio
from grpc_status import rpc_status

from . import _wire
from ._proto import coordinator_pb2 as pb
from .credentials import Credentials
from ._wire import Disposition, FailWritten, Recorded, RetryPolicy, Written
from .errors import (
    AttemptSuperseded,
    check_api_version,
    JobfenceError,
    JobNotRunning,
    from_status,
    retryable_claim,
    retryable_write,
)

from .runner import AsyncHandler, RunReport, run_loop_async

log = logging.getLogger("jobfence_worker")


def _from_aio_error(err: aio.AioRpcError) -> JobfenceError:
    status = None
    for key, value in err.trailing_metadata() or ():
        if key == rpc_status.GRPC_DETAILS_METADATA_KEY:
            from google.rpc import status_pb2

            status = status_pb2.Status.FromString(value)
    return from_status(err.code(), err.details() or "", status)


class AsyncWorkerClient:
    """A worker's asyncio connection to one coordinator (``host:port``).
    Same arguments and rules as ``WorkerClient``; create it inside a
    running event loop."""

    def __init__(self, target: str, worker_id: str, queue: str, lease_seconds: float = 30.0,
                 timeout_seconds: float = 10.0, retry: Optional[RetryPolicy] = None,
                 channel: Optional[aio.Channel] = None,
                 credentials: Optional[Credentials] = None) -> None:
        self.pb = pb
        self.worker_id = worker_id
        self.queue = queue
        self.lease_seconds = lease_seconds
        self.timeout_seconds = timeout_seconds
        self.retry = retry or RetryPolicy()
        #: Calls sent again (see ``WorkerClient.retries``).
        self.retries = 0
        credentials = credentials or Credentials()
        # The token goes on every call as metadata (it works on a cleartext
        # channel too, for a coordinator behind a TLS-terminating proxy).
        self._metadata = tuple(credentials.metadata()) or None
        self._channel = channel or credentials.aio_channel(target)
        self._calls = {name: self._channel.unary_unary(path, request_serializer=ser,
                                                       response_deserializer=de)
                       for name, (path, ser, de) in _wire.methods().items()}

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncWorkerClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any,
                    retryable: Callable[[JobfenceError], bool], extra_seconds: float = 0.0) -> Any:
        started, tries = time.monotonic(), 0
        while True:
            tries += 1
            try:
                call = self._calls[method](request, timeout=self.timeout_seconds + extra_seconds,
                                           metadata=_wire.call_metadata(self._metadata))
                response = await call
                check_api_version(await call.initial_metadata())
                return response
            except aio.AioRpcError as err:
                # A refusal comes trailers-only: the header is among either.
                check_api_version(err.initial_metadata(), err.trailing_metadata())
                mapped = _from_aio_error(err)
                wait = (self.retry.next_wait(tries, mapped, time.monotonic() - started)
                        if retryable(mapped) else None)
                if wait is None:
                    raise mapped from None
                self.retries += 1
                log.debug("retrying %s in %.3f s after %r", method, wait, mapped)
                await asyncio.sleep(wait)

    async def claim(self, max_jobs: int = 1, wait_seconds: float = 0.0) -> List["AsyncClaimedJob"]:
        """As ``WorkerClient.claim``: a long poll with ``wait_seconds``;
        ``OutcomeUnknown`` means hold nothing."""
        request = _wire.claim_request(self.queue, self.worker_id, max_jobs, self.lease_seconds,
                                      wait_seconds)
        response = await self._call("Claim", request, retryable_claim, extra_seconds=wait_seconds)
        return [AsyncClaimedJob(self, c) for c in response.jobs]

    async def run(self, handler: AsyncHandler, concurrency: int = 1, *,
                  wait_seconds: float = 10.0, stop: Optional[asyncio.Event] = None,
                  on_claim_error: Optional[Callable[[JobfenceError], None]] = None,
                  release_delay_seconds: float = 1.0, poll_seconds: float = 1.0) -> RunReport:
        """As ``WorkerClient.run``, on the event loop: claims and handles
        jobs until ``stop`` (an ``asyncio.Event``) is set, at most
        ``concurrency`` (1..100) at once, each ``await handler(job)`` a task
        of its own. It claims only for free slots; releases a job the
        handler left unsettled with ``RETRY_RECONCILE``; after a failed
        claim (an unknown outcome included: hold nothing) calls
        ``on_claim_error``, backs off and claims again; stops claiming on
        ``Denied`` or ``InvalidRequest`` and raises it once the handlers in
        flight are done. When ``stop`` is set it cancels a long poll under
        way and **finishes** what it holds: it awaits every handler in
        flight, abandons no job, and returns a ``RunReport``."""
        return await run_loop_async(self, handler, concurrency, wait_seconds=wait_seconds,
                                    stop=stop, on_claim_error=on_claim_error,
                                    release_delay_seconds=release_delay_seconds,
                                    poll_seconds=poll_seconds)

    async def takeover(self, job_id: int) -> "AsyncClaimedJob":
        """Takes over one job whose lease expired; starts with RECONCILE."""
        request = _wire.takeover_request(job_id, self.worker_id, self.lease_seconds)
        return AsyncClaimedJob(self, (await self._call("Takeover", request, retryable_claim)).claimed)

    async def get_job(self, job_id: int) -> Tuple[pb.Job, List[pb.Observation]]:
        """``(job, observations)``. A read decides nothing about ownership."""
        response = await self._call("GetJob", pb.GetJobRequest(job_id=job_id), retryable_write)
        return response.job, list(response.observations)

    async def enqueue(self, queue: str, operation_key: str, payload: str,
                      delay_seconds: float = 0.0, *, fairness_key: Optional[str] = None,
                      priority: Optional[int] = None) -> Tuple[pb.Job, bool]:
        """As ``WorkerClient.enqueue``."""
        request = _wire.enqueue_request(queue, operation_key, payload, delay_seconds,
                                        fairness_key, priority)
        response = await self._call("Enqueue", request, retryable_write)
        return response.job, response.created

    async def enqueue_batch(self, items: List[_wire.BatchItem]) -> List[Any]:
        """As ``WorkerClient.enqueue_batch``."""
        request = _wire.enqueue_batch_request(items)
        return list((await self._call("EnqueueBatch", request, retryable_write)).results)


class AsyncClaimedJob(_wire.HandleBase):
    """A job this worker holds (asyncio); see ``ClaimedJob``."""

    def __init__(self, client: AsyncWorkerClient, claimed: pb.ClaimedJob) -> None:
        super().__init__(claimed, client.worker_id)
        self._client = client

    async def complete(self, provider_reference: str, result: str = "") -> Written:
        """As ``ClaimedJob.complete``: a refused write keeps the provider
        result as an observation."""
        request = self._with_next(
            _wire.complete_request(self.job_id, self._attempt, provider_reference, result))
        try:
            response = await self._client._call("Complete", request, retryable_write)
            self._answered(response)
        except (AttemptSuperseded, JobNotRunning) as refusal:
            self._refused(refusal)
            if provider_reference:
                refusal.observation_recorded = await self._keep_evidence(provider_reference, result)
            raise
        except JobfenceError as err:
            self._refused(err)
            raise
        self._applied(response.job, settles=True)
        return Written(response.replayed, response.job)

    async def fail(self, disposition: Disposition, error: str,
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
            response = await self._client._call("Fail", request, retryable_write)
            self._answered(response)
        except JobfenceError as err:
            self._refused(err)
            raise
        self._applied(response.job, settles=True)
        return _wire.fail_written(response)

    async def renew_lease(self, lease_seconds: float) -> Written:
        """Extends the lease from now (DB clock); never shortens it."""
        request = _wire.renew_request(self.job_id, self._attempt, lease_seconds)
        try:
            response = await self._client._call("RenewLease", request, retryable_write)
        except JobfenceError as err:
            self._refused(err)
            raise
        self._applied(response.job, settles=False)
        return Written(response.replayed, response.job)

    async def record_observation(self, outcome: str, provider_reference: str, body: str,
                                 dedup_key: str) -> Recorded:
        """Records evidence from any attempt, stale included; never changes the job."""
        request = _wire.observation_request(self.job_id, self._attempt, outcome,
                                            provider_reference, body, dedup_key)
        response = await self._client._call("RecordObservation", request, retryable_write)
        return Recorded(response.observation, response.duplicate)

    async def _keep_evidence(self, provider_reference: str, result: str) -> bool:
        try:
            await self.record_observation("SUCCEEDED", provider_reference, result,
                                          self._evidence_key(provider_reference))
            return True
        except JobfenceError as err:
            log.warning("could not record a late provider result: %s", err)
            return False


__all__ = ["AsyncClaimedJob", "AsyncWorkerClient"]
