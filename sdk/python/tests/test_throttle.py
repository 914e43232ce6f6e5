"""A provider's push-back reaches the coordinator: ``fail`` carries
``provider_retry_after`` (both clients), and the refund worker turns a
provider 429 into a Fail with it. Against a real gRPC server in this
process that records what it receives, and a real HTTP server that
answers 429."""

import asyncio
import http.server
import json
import threading
import unittest
from concurrent import futures

import grpc
from google.protobuf import duration_pb2

from jobfence_worker import Disposition, WorkerClient
from jobfence_worker import refund_worker
from jobfence_worker._proto import coordinator_pb2 as pb
from jobfence_worker.aio import AsyncClaimedJob, AsyncWorkerClient
from jobfence_worker.client import ClaimedJob

SERVICE = "jobfence.v1.JobCoordinator"


class RecordingCoordinator:
    """A gRPC server with the coordinator's Fail method only: it records
    each request and answers that the disposition was applied."""

    def __init__(self):
        self.requests = []

        def fail(request, context):
            self.requests.append(request)
            job = pb.Job(job_id=request.job_id, attempt=request.attempt)
            return pb.FailResponse(job=job, applied=request.disposition)

        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Fail": grpc.unary_unary_rpc_method_handler(
                fail, request_deserializer=pb.FailRequest.FromString,
                response_serializer=pb.FailResponse.SerializeToString),
        })
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.target = "127.0.0.1:%d" % port
        self.server.start()

    def stop(self):
        self.server.stop(None)


def claimed(job_id=7, attempt=3, next_action="NEXT_ACTION_EXECUTE"):
    payload = json.dumps({"payment_id": "pay_1", "amount": 500, "currency": "twd"})
    return pb.ClaimedJob(job=pb.Job(
        job_id=job_id, attempt=attempt, operation_key="refund-pay_1-500", payload=payload,
        next_action=pb.NextAction.Value(next_action)))


class TooManyRequests(http.server.BaseHTTPRequestHandler):
    """Answers every request 429, as the fake provider past its limit."""

    headers_to_send = {"Retry-After": "3", "Retry-After-Ms": "2500"}

    def answer(self):
        body = b'{"error":{"type":"invalid_request_error","code":"rate_limit","message":"slow down"}}'
        self.send_response(429)
        for name, value in self.headers_to_send.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass


class FailCarriesProviderRetryAfterTest(unittest.TestCase):
    def setUp(self):
        self.coordinator = RecordingCoordinator()
        self.addCleanup(self.coordinator.stop)

    def test_the_sync_client_sends_provider_retry_after(self):
        with WorkerClient(self.coordinator.target, "py-w", "refunds") as client:
            job = ClaimedJob(client, claimed())
            out = job.fail(Disposition.RETRY_EXECUTE, "provider said 429", 2.5,
                           provider_retry_after_seconds=2.5)
            job.fail(Disposition.RETRY_RECONCILE, "lookup timed out", 1.0)
        self.assertEqual(out.applied, Disposition.RETRY_EXECUTE)
        throttled, plain = self.coordinator.requests
        self.assertEqual((throttled.job_id, throttled.attempt), (7, 3))
        self.assertTrue(throttled.HasField("provider_retry_after"))
        self.assertEqual(throttled.provider_retry_after,
                         duration_pb2.Duration(seconds=2, nanos=500_000_000))
        self.assertEqual(throttled.retry_delay, duration_pb2.Duration(seconds=2, nanos=500_000_000))
        self.assertFalse(plain.HasField("provider_retry_after"), "unset unless given")

    def test_the_asyncio_client_sends_provider_retry_after(self):
        async def run():
            async with AsyncWorkerClient(self.coordinator.target, "py-aio", "refunds") as client:
                job = AsyncClaimedJob(client, claimed())
                await job.fail(Disposition.RETRY_RECONCILE, "lookup got 429", 4.0,
                               provider_retry_after_seconds=4.0)
                await job.fail(Disposition.RETRY_RECONCILE, "pending", 1.0)

        asyncio.run(run())
        throttled, plain = self.coordinator.requests
        self.assertEqual(throttled.provider_retry_after, duration_pb2.Duration(seconds=4))
        self.assertFalse(plain.HasField("provider_retry_after"))


class RefundWorkerReportsA429Test(unittest.TestCase):
    def setUp(self):
        self.coordinator = RecordingCoordinator()
        self.addCleanup(self.coordinator.stop)
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TooManyRequests)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.addCleanup(self.http.server_close)
        self.addCleanup(self.http.shutdown)
        self.provider = refund_worker.Provider(
            "http://127.0.0.1:%d/" % self.http.server_address[1], timeout=5)

    def handled(self, next_action):
        with WorkerClient(self.coordinator.target, "py-refunds", "refunds") as client:
            refund_worker.handle(ClaimedJob(client, claimed(next_action=next_action)), self.provider)
        [request] = self.coordinator.requests
        return request

    def test_a_429_to_a_send_is_a_resend_later_with_provider_retry_after(self):
        request = self.handled("NEXT_ACTION_EXECUTE")
        self.assertEqual(pb.FailDisposition.Name(request.disposition),
                         "FAIL_DISPOSITION_RETRY_EXECUTE")
        # Retry-After-Ms wins over the whole seconds of Retry-After.
        self.assertEqual(request.provider_retry_after,
                         duration_pb2.Duration(seconds=2, nanos=500_000_000))
        self.assertEqual(request.retry_delay, request.provider_retry_after)
        self.assertIn("429", request.error)

    def test_a_429_to_a_lookup_is_a_reconcile_later_with_provider_retry_after(self):
        request = self.handled("NEXT_ACTION_RECONCILE")
        self.assertEqual(pb.FailDisposition.Name(request.disposition),
                         "FAIL_DISPOSITION_RETRY_RECONCILE")
        self.assertEqual(request.provider_retry_after,
                         duration_pb2.Duration(seconds=2, nanos=500_000_000))

    def test_retry_after_headers(self):
        wait = refund_worker.retry_after_seconds
        self.assertEqual(wait({"Retry-After": "3"}), 3.0)
        self.assertEqual(wait({"Retry-After": "3", "Retry-After-Ms": "120"}), 0.12)
        self.assertEqual(wait({}), refund_worker.DEFAULT_RETRY_AFTER)
        self.assertEqual(wait({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
                         refund_worker.DEFAULT_RETRY_AFTER)
        self.assertEqual(wait({"Retry-After": "0"}), 0.001, "positive, as the coordinator wants")
        self.assertEqual(wait({"Retry-After": "1e9"}), refund_worker.MAX_RETRY_AFTER)


if __name__ == "__main__":
    unittest.main()
