"""Every ErrorInfo reason the coordinator sends maps to its own class, in
the family a worker acts on (refusal, outcome unknown, retry)."""

import os
import unittest

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

import jobfence_worker as jw
from jobfence_worker._proto import errors_pb2
from jobfence_worker.errors import from_status, retryable_claim, retryable_write


def server_reasons():
    """Every reason of the coordinator: the values of ErrorReason in the
    shipped errors_pb2 (test_stubs.py checks it is errors.proto), but the
    zero one."""
    return set(errors_pb2.ErrorReason.keys()) - {"ERROR_REASON_UNSPECIFIED"}


def status(code, reason, metadata=None, *extra):
    info = error_details_pb2.ErrorInfo(reason=reason, domain="jobfence", metadata=metadata or {})
    details = []
    for d in (info,) + extra:
        a = any_pb2.Any()
        a.Pack(d)
        details.append(a)
    return status_pb2.Status(code=code.value[0], message="refused", details=details)


class ReasonsTest(unittest.TestCase):
    def test_every_reason_of_the_coordinator_has_a_class(self):
        self.assertEqual(set(jw.REASONS), server_reasons())
        self.assertEqual(len(set(jw.REASONS.values())), len(jw.REASONS), "one class per reason")

    def test_each_reason_maps_to_its_class(self):
        for reason, cls in jw.REASONS.items():
            err = from_status(grpc.StatusCode.FAILED_PRECONDITION, "x",
                              status(grpc.StatusCode.FAILED_PRECONDITION, reason))
            self.assertIs(type(err), cls, reason)
            self.assertEqual(err.reason, reason)

    def test_superseded_carries_the_current_attempt_and_state(self):
        err = from_status(grpc.StatusCode.FAILED_PRECONDITION, "x", status(
            grpc.StatusCode.FAILED_PRECONDITION, "ATTEMPT_SUPERSEDED",
            {"current_attempt": "8", "current_state": "succeeded"}))
        self.assertIsInstance(err, jw.AttemptSuperseded)
        self.assertEqual((err.current_attempt, err.current_state), (8, "JOB_STATE_SUCCEEDED"))
        self.assertFalse(retryable_write(err))

    def test_overloaded_applied_nothing_and_is_retried_after_its_delay(self):
        retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(nanos=100_000_000))
        err = from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", status(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "OVERLOADED", None, retry))
        self.assertIsInstance(err, jw.Overloaded)
        self.assertIsInstance(err, jw.Unavailable)
        self.assertAlmostEqual(err.retry_after, 0.1)
        self.assertTrue(retryable_claim(err) and retryable_write(err))
        # The retry waits at least the server's hint, however short the
        # backoff.
        short = jw.RetryPolicy(initial=0.001, maximum=0.001)
        self.assertGreaterEqual(short.wait(1, err), 0.1)
        self.assertLessEqual(short.wait(1, jw.Unavailable(grpc.StatusCode.UNAVAILABLE, "x")), 0.001)

    def test_the_load_balancers_answer_applied_nothing(self):
        err = from_status(grpc.StatusCode.UNAVAILABLE, "no jobfence coordinator is serving",
                          status(grpc.StatusCode.UNAVAILABLE, "NO_COORDINATOR_SERVING"))
        self.assertIsInstance(err, jw.NoCoordinatorServing)
        self.assertTrue(retryable_claim(err) and retryable_write(err))

    def test_a_lost_commit_is_unknown_and_never_retried_as_a_claim(self):
        err = from_status(grpc.StatusCode.UNAVAILABLE, "x",
                          status(grpc.StatusCode.UNAVAILABLE, "COMMIT_OUTCOME_UNKNOWN"))
        self.assertIsInstance(err, jw.OutcomeUnknown)
        self.assertFalse(retryable_claim(err))
        self.assertTrue(retryable_write(err))

    def test_a_connection_never_made_applied_nothing_and_a_claim_retries_it(self):
        refused = from_status(grpc.StatusCode.UNAVAILABLE,
                              "failed to connect to all addresses; last error: UNKNOWN: "
                              "ipv4:127.0.0.1:1: Failed to connect to remote host: "
                              "Connection refused", None)
        self.assertIsInstance(refused, jw.OutcomeUnknown)
        self.assertTrue(retryable_claim(refused) and retryable_write(refused))
        # A connection cut after the request left: nobody knows.
        cut = from_status(grpc.StatusCode.UNAVAILABLE, "Socket closed", None)
        self.assertFalse(retryable_claim(cut))
        self.assertTrue(retryable_write(cut))

    def test_the_retry_budget_is_time_not_tries(self):
        policy = jw.RetryPolicy()
        self.assertEqual((policy.budget, policy.initial, policy.maximum), (30.0, 0.05, 2.0))
        down = jw.Unavailable(grpc.StatusCode.UNAVAILABLE, "x")
        # The 20th retry still fits in the budget (a 10 s outage takes
        # about 12 retries), and none starts whose wait would end past it.
        self.assertIsNotNone(policy.next_wait(20, down, 10.0))
        self.assertIsNone(policy.next_wait(1, down, 29.99))
        self.assertIsNone(jw.RetryPolicy(budget=0).next_wait(1, down, 0.0))

    def test_a_transport_failure_is_unknown_and_another_domain_is_not_ours(self):
        self.assertIsInstance(from_status(grpc.StatusCode.UNAVAILABLE, "tcp", None),
                              jw.OutcomeUnknown)
        other = status(grpc.StatusCode.FAILED_PRECONDITION, "ATTEMPT_SUPERSEDED")
        other.details[0].Clear()
        self.assertIs(type(from_status(grpc.StatusCode.FAILED_PRECONDITION, "x", other)),
                      jw.JobfenceError)

    def test_invalid_request_keeps_its_field_violations(self):
        bad = error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="lease", description="too long")])
        err = from_status(grpc.StatusCode.INVALID_ARGUMENT, "x", status(
            grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST", None, bad))
        self.assertEqual(err.violations, [("lease", "too long")])


    def test_a_denial_applied_nothing_and_is_never_retried(self):
        for reason, code in [("CREDENTIAL_MISSING", grpc.StatusCode.UNAUTHENTICATED),
                             ("CREDENTIAL_INVALID", grpc.StatusCode.UNAUTHENTICATED),
                             ("CREDENTIAL_EXPIRED", grpc.StatusCode.UNAUTHENTICATED),
                             ("ROLE_NOT_ALLOWED", grpc.StatusCode.PERMISSION_DENIED),
                             ("QUEUE_NOT_ALLOWED", grpc.StatusCode.PERMISSION_DENIED),
                             ("OPERATOR_MISMATCH", grpc.StatusCode.PERMISSION_DENIED)]:
            err = from_status(code, "no", status(code, reason, {"queue": "payouts", "job_id": "7"}))
            self.assertIsInstance(err, jw.NotAuthorized, reason)
            family = jw.Unauthenticated if code == grpc.StatusCode.UNAUTHENTICATED else jw.PermissionDenied
            self.assertIsInstance(err, family, reason)
            self.assertFalse(retryable_claim(err) or retryable_write(err), reason)
        err = from_status(grpc.StatusCode.PERMISSION_DENIED, "no", status(
            grpc.StatusCode.PERMISSION_DENIED, "QUEUE_NOT_ALLOWED", {"queue": "payouts", "job_id": "7"}))
        self.assertEqual((err.queue, err.job_id), ("payouts", 7))

    def test_denied_is_not_authorized_under_the_name_every_client_shares(self):
        self.assertIs(jw.Denied, jw.NotAuthorized)
        err = from_status(grpc.StatusCode.UNAUTHENTICATED, "no", status(
            grpc.StatusCode.UNAUTHENTICATED, "CREDENTIAL_MISSING"))
        self.assertIsInstance(err, jw.Denied)


class CredentialsTest(unittest.TestCase):
    def test_from_env_reads_the_token_file_and_never_shows_it(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("jft_secret\n")
        old = dict(os.environ)
        try:
            for k in list(os.environ):
                if k.startswith("JOBFENCE_T"):
                    del os.environ[k]
            os.environ["JOBFENCE_TOKEN_FILE"] = f.name
            c = jw.Credentials.from_env()
            self.assertEqual(c.metadata(), [("authorization", "Bearer jft_secret")])
            self.assertNotIn("jft_secret", repr(c))
            self.assertIsNone(c.tls_ca_pem)
            os.environ["JOBFENCE_TLS_CLIENT_CERT"] = f.name
            with self.assertRaises(ValueError):
                jw.Credentials.from_env()
        finally:
            os.environ.clear()
            os.environ.update(old)
            os.unlink(f.name)
        self.assertEqual(jw.Credentials().metadata(), [])


class DedupKeyTest(unittest.TestCase):
    def test_plain_when_short_hashed_when_long(self):
        self.assertEqual(jw.observation_dedup_key("w1", "re_1"), "worker:w1:re_1")
        key = jw.observation_dedup_key("w1", "r" * 255)
        self.assertTrue(key.startswith("worker-sha256:"))
        self.assertEqual(len(key), len("worker-sha256:") + 64)


if __name__ == "__main__":
    unittest.main()
