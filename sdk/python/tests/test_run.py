"""The run loop of both clients (``WorkerClient.run``,
``AsyncWorkerClient.run``), against a real gRPC server in this process
that plays a coordinator: it claims only for free slots, releases what
its handler left unsettled, holds nothing after an unclear claim, stops on
a denial, cuts a long poll short on stop and finishes the jobs it holds.
Every case runs on the synchronous and on the asyncio client."""

import asyncio
import collections
import logging
import threading
import time
import unittest
from concurrent import futures

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

import jobfence_worker as jw
from jobfence_worker import Disposition, RetryPolicy, WorkerClient
from jobfence_worker._proto import coordinator_pb2 as pb
from jobfence_worker.aio import AsyncWorkerClient

SERVICE = "jobfence.v1.JobCoordinator"
# The loop logs every failed claim and handler as a warning; the cases
# assert on what it did instead.
logging.getLogger("jobfence_worker").addHandler(logging.NullHandler())
#: Longest a run may take before the test gives up on it (seconds).
LIMIT = 20.0
#: A short backoff, so the cases after a failed claim are quick.
QUICK = RetryPolicy(budget=1.0, initial=0.01, maximum=0.02)


def refusal(code, reason):
    info = error_details_pb2.ErrorInfo(reason=reason, domain="jobfence")
    detail = any_pb2.Any()
    detail.Pack(info)
    return rpc_status.to_status(
        status_pb2.Status(code=code.value[0], message="refused", details=[detail]))


class Coordinator:
    """Claim, Complete and Fail over jobs held in memory. Claim hands out
    the pending jobs (each with its next attempt), waits up to the
    request's ``wait`` when none is pending, and first answers each status
    of ``claim_errors``. Fail with RETRY_RECONCILE puts the job back."""

    def __init__(self):
        self.lock = threading.Condition()
        self.pending = collections.deque()
        self.attempts = collections.Counter()
        self.claim_errors = collections.deque()
        self.asked = []  # max_jobs of every Claim
        self.completed = []  # (job_id, attempt)
        self.failed = []  # FailRequest
        self.cancelled_claims = 0
        handlers = {
            "Claim": (self.claim, pb.ClaimRequest, pb.ClaimResponse),
            "Complete": (self.complete, pb.CompleteRequest, pb.CompleteResponse),
            "Fail": (self.fail, pb.FailRequest, pb.FailResponse),
        }
        generic = grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString)
            for name, (fn, req, resp) in handlers.items()})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self.server.add_generic_rpc_handlers((generic,))
        self.target = "127.0.0.1:%d" % self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self):
        self.server.stop(None)

    def claim(self, request, context):
        with self.lock:
            self.asked.append(request.max_jobs)
            if self.claim_errors:
                context.abort_with_status(self.claim_errors.popleft())
            deadline = time.monotonic() + request.wait.seconds + request.wait.nanos / 1e9
            while not self.pending and time.monotonic() < deadline:
                if not context.is_active():
                    self.cancelled_claims += 1
                    return pb.ClaimResponse()
                self.lock.wait(0.01)
            jobs = []
            while self.pending and len(jobs) < request.max_jobs:
                job_id = self.pending.popleft()
                self.attempts[job_id] += 1
                jobs.append(pb.ClaimedJob(job=pb.Job(
                    job_id=job_id, attempt=self.attempts[job_id], operation_key="op-%d" % job_id,
                    next_action=pb.NextAction.Value("NEXT_ACTION_EXECUTE"))))
            return pb.ClaimResponse(jobs=jobs)

    def complete(self, request, context):
        with self.lock:
            self.completed.append((request.job_id, request.attempt))
            self.lock.notify_all()
        return pb.CompleteResponse(job=pb.Job(job_id=request.job_id, attempt=request.attempt))

    def fail(self, request, context):
        with self.lock:
            self.failed.append(request)
            if request.disposition == pb.FailDisposition.Value("FAIL_DISPOSITION_RETRY_RECONCILE"):
                self.pending.append(request.job_id)
            self.lock.notify_all()
        return pb.FailResponse(job=pb.Job(job_id=request.job_id, attempt=request.attempt),
                               applied=request.disposition)


class Gauge:
    """How many handlers run at once, and the most that ever did."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def enter(self):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self):
        with self.lock:
            self.now -= 1


class Both:
    """Runs one case on the synchronous and on the asyncio client: ``run``
    calls ``client.run(handler, **kw)`` and returns ``(report, error)``.
    ``handler(job, stop)`` is synchronous; on the asyncio client it runs in
    a thread (``asyncio.to_thread``) and its writes are awaited there."""

    def __init__(self, test, coordinator):
        self.test, self.coordinator = test, coordinator

    def sync(self, handler, **kw):
        stop = threading.Event()
        watchdog = threading.Timer(LIMIT, stop.set)
        watchdog.start()
        try:
            with WorkerClient(self.coordinator.target, "py-run", "refunds",
                              retry=QUICK) as client:
                try:
                    return client.run(lambda job: handler(job, stop.set), stop=stop, **kw), None
                except jw.JobfenceError as err:
                    return None, err
        finally:
            watchdog.cancel()

    def asyncio(self, handler, **kw):
        async def main():
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()

            async def handle(job):
                # The handler's writes run on this loop; its waiting in a thread.
                await asyncio.to_thread(handler, _Blocking(job, loop),
                                        lambda: loop.call_soon_threadsafe(stop.set))

            async with AsyncWorkerClient(self.coordinator.target, "py-run-aio", "refunds",
                                         retry=QUICK) as client:
                try:
                    return await asyncio.wait_for(client.run(handle, stop=stop, **kw), LIMIT), None
                except jw.JobfenceError as err:
                    return None, err

        return asyncio.run(main())


class _Blocking:
    """An ``AsyncClaimedJob`` seen from a thread: its writes block until
    the event loop ran them."""

    def __init__(self, job, loop):
        self.job, self.loop = job, loop
        self.job_id, self.attempt = job.job_id, job.attempt

    def complete(self, *args):
        return asyncio.run_coroutine_threadsafe(self.job.complete(*args), self.loop).result()


def each_client(case):
    """Runs ``case(self, run, coordinator)`` once per client, each on a
    fresh coordinator made by ``self.coordinator()``."""
    def test(self):
        for kind in ("sync", "asyncio"):
            with self.subTest(client=kind):
                coordinator = self.coordinator()
                try:
                    case(self, getattr(Both(self, coordinator), kind), coordinator)
                finally:
                    coordinator.stop()
    test.__name__ = case.__name__
    test.__doc__ = case.__doc__
    return test


class RunLoopTest(unittest.TestCase):
    def coordinator(self):
        return Coordinator()

    @each_client
    def test_it_claims_only_for_free_slots_and_handles_every_job(self, run, c):
        c.pending.extend(range(1, 10))
        gauge = Gauge()

        def handler(job, stop):
            gauge.enter()
            time.sleep(0.02)
            gauge.leave()
            job.complete("re_%d" % job.job_id, "{}")
            if len(c.completed) == 9:
                stop()

        report, error = run(handler, concurrency=3, wait_seconds=0.2)
        self.assertIsNone(error)
        self.assertEqual(sorted(c.completed), [(i, 1) for i in range(1, 10)])
        self.assertTrue(all(1 <= n <= 3 for n in c.asked), c.asked)
        self.assertLessEqual(gauge.peak, 3)
        self.assertEqual((report.claimed, report.handled, report.released), (9, 9, 0))

    @each_client
    def test_a_job_its_handler_left_or_failed_is_released_to_reconcile(self, run, c):
        c.pending.extend([1, 2, 3])

        def handler(job, stop):
            if job.attempt == 1 and job.job_id == 1:
                return  # left without a write
            if job.attempt == 1 and job.job_id == 2:
                raise RuntimeError("boom")
            job.complete("re_%d" % job.job_id, "{}")
            if len(c.completed) == 3:
                stop()

        report, error = run(handler, concurrency=2, wait_seconds=0.2, release_delay_seconds=2.5)
        self.assertIsNone(error)
        self.assertEqual(sorted(c.completed), [(1, 2), (2, 2), (3, 1)])
        released = {f.job_id: f for f in c.failed}
        self.assertEqual(sorted(released), [1, 2])
        for f in c.failed:
            self.assertEqual(f.disposition,
                             pb.FailDisposition.Value("FAIL_DISPOSITION_RETRY_RECONCILE"))
            self.assertEqual((f.attempt, f.retry_delay.seconds, f.retry_delay.nanos),
                             (1, 2, 500_000_000))
        self.assertEqual(released[1].error, "handler returned without writing back")
        self.assertEqual(released[2].error, "handler failed: boom")
        self.assertEqual((report.claimed, report.handled, report.handler_errors, report.released),
                         (5, 5, 1, 2))

    @each_client
    def test_an_unclear_claim_hands_out_nothing_and_the_loop_claims_again(self, run, c):
        c.claim_errors.append(refusal(grpc.StatusCode.UNAVAILABLE, "COMMIT_OUTCOME_UNKNOWN"))
        c.claim_errors.append(refusal(grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE"))
        c.pending.append(1)
        heard = []

        def handler(job, stop):
            job.complete("re_1", "{}")
            stop()

        report, error = run(handler, wait_seconds=0.2, on_claim_error=heard.append)
        self.assertIsNone(error)
        self.assertEqual([type(e) for e in heard], [jw.CommitOutcomeUnknown])
        # The unclear claim was not sent again within the call; the one that
        # applied nothing was (the client's retries), then the job came.
        self.assertEqual(len(c.asked), 3)
        self.assertEqual(c.completed, [(1, 1)])
        self.assertEqual((report.unclear_claims, report.failed_claims, report.claimed), (1, 0, 1))

    @each_client
    def test_a_denied_claim_stops_the_loop_and_is_raised(self, run, c):
        c.claim_errors.append(refusal(grpc.StatusCode.PERMISSION_DENIED, "QUEUE_NOT_ALLOWED"))
        report, error = run(lambda job, stop: self.fail("no job"), wait_seconds=0.2)
        self.assertIsInstance(error, jw.Denied)
        self.assertIsInstance(error, jw.QueueNotAllowed)
        self.assertEqual(len(c.asked), 1, "asking again cannot succeed")

    def test_stop_cuts_a_long_poll_short(self):
        """Nothing is due and the stop comes while a 30 s long poll waits."""
        def nothing(job):
            raise AssertionError("no job")

        def sync(target):
            stop = threading.Event()
            threading.Timer(0.3, stop.set).start()
            with WorkerClient(target, "py-run", "refunds") as client:
                return client.run(nothing, stop=stop, wait_seconds=30)

        async def aio(target):
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.3, stop.set)
            async with AsyncWorkerClient(target, "py-run-aio", "refunds") as client:
                return await client.run(nothing, stop=stop, wait_seconds=30)

        for kind, run in (("sync", sync), ("asyncio", lambda t: asyncio.run(aio(t)))):
            with self.subTest(client=kind):
                c = Coordinator()
                self.addCleanup(c.stop)
                started = time.monotonic()
                report = run(c.target)
                self.assertLess(time.monotonic() - started, 10, "the long poll was cut short")
                self.assertEqual((report.interrupted_claims, report.claimed), (1, 0))
                self.assertEqual(c.asked, [1])

    @each_client
    def test_stop_finishes_the_jobs_the_loop_holds(self, run, c):
        c.pending.extend([1, 2])

        def handler(job, stop):
            stop()  # the stop comes while both jobs are held
            time.sleep(0.2)
            job.complete("re_%d" % job.job_id, "{}")

        report, error = run(handler, concurrency=2, wait_seconds=0.2)
        self.assertIsNone(error)
        self.assertEqual(sorted(c.completed), [(1, 1), (2, 1)], "both finished, none abandoned")
        self.assertEqual((report.handled, report.released), (2, 0))

    def test_concurrency_is_checked(self):
        with WorkerClient("127.0.0.1:1", "py-run", "refunds") as client:
            for bad in (0, 101):
                with self.assertRaises(ValueError):
                    client.run(lambda job: None, concurrency=bad)


if __name__ == "__main__":
    unittest.main()
