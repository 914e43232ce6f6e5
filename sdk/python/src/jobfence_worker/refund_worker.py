"""A refund worker in Python, on jobfence_worker: the same reconcile-first
protocol as the Rust one (src/refund_worker/handler.rs), against the fake
payment provider's Stripe-style API (docs/fake-provider.md).

    jobfence-refund-worker --coordinator 127.0.0.1:50051 \\
        --provider http://127.0.0.1:8099/ --worker-id py-1 --queue refunds

(or ``python -m jobfence_worker.refund_worker ...``).

The rules it follows:
  * operation_key is the idempotency key and the merchant reference; the
    attempt is never sent to the provider.
  * EXECUTE: send the refund. A timeout or a cut connection is an unknown
    outcome: retry as RECONCILE, never "not refunded". A 503 did nothing:
    ask for a resend (RETRY_EXECUTE).
  * RECONCILE: look the refund up by merchant reference. Succeeded ->
    Complete; pending -> reconcile again later; not found -> ask for a
    resend, which the coordinator allows only inside the resend window.
  * A 429 (the provider's rate limit) did nothing: Fail with the same next
    action (RETRY_EXECUTE for a send, RETRY_RECONCILE for a lookup), due
    after the Retry-After, and report that Retry-After as
    provider_retry_after so the coordinator holds every worker's hand-outs
    for the provider until then. No client-side rate limiter.
  * A refused write (AttemptSuperseded, JobNotRunning) means someone else
    holds the job: stop; the client keeps any provider result as evidence.
"""

import argparse
import json
import logging
import math
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from jobfence_worker import (
    AttemptSuperseded,
    Credentials,
    Disposition,
    JobNotRunning,
    WorkerClient,
)

log = logging.getLogger("refund_worker")


class Unknown(Exception):
    """The provider call may have been processed: reconcile."""


class NothingDone(Exception):
    """The provider certainly did nothing (connection refused, 5xx)."""


class Refused(Exception):
    """A 4xx: the provider refused the request; nothing was done."""


class Throttled(Exception):
    """A 429: the provider's rate limit refused the request; nothing was
    done. ``retry_after``: seconds it asked to wait."""

    def __init__(self, message, retry_after):
        super().__init__(message)
        self.retry_after = retry_after


# A 429 without Retry-After counts as this (seconds); the coordinator
# accepts at most 24 h.
DEFAULT_RETRY_AFTER = 1.0
MAX_RETRY_AFTER = 24 * 3600.0


def retry_after_seconds(headers):
    """The wait a 429 asked for: Retry-After-Ms (the fake provider's precise
    one), else Retry-After as delta-seconds, else DEFAULT_RETRY_AFTER;
    clamped to what the coordinator accepts."""
    wait = None
    for name, scale in (("Retry-After-Ms", 0.001), ("Retry-After", 1.0)):
        try:
            value = float(headers.get(name, ""))
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            wait = value * scale
            break
    if wait is None:
        wait = DEFAULT_RETRY_AFTER
    return min(max(wait, 0.001), MAX_RETRY_AFTER)


class Provider:
    def __init__(self, base_url, timeout):
        self.base = base_url.rstrip("/") + "/"
        self.timeout = timeout

    def _send(self, req):
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read().decode())
        except urllib.error.HTTPError as e:
            if e.code == 429:
                raise Throttled("HTTP 429", retry_after_seconds(e.headers)) from None
            if e.code >= 500:
                raise NothingDone("HTTP %d" % e.code) from None
            raise Refused("HTTP %d: %s" % (e.code, e.read().decode(errors="replace"))) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, ConnectionRefusedError):
                raise NothingDone("connection refused") from None
            raise Unknown(str(e.reason)) from None
        except (socket.timeout, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
            raise Unknown(repr(e)) from None

    def create_refund(self, idempotency_key, params):
        req = urllib.request.Request(
            self.base + "v1/refunds", data=json.dumps(params).encode(), method="POST",
            headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key})
        return self._send(req)

    def find_by_merchant_reference(self, reference):
        query = urllib.parse.urlencode({"merchant_reference": reference})
        return self._send(urllib.request.Request(self.base + "v1/refunds?" + query))["data"]


def throttled(disposition, call, err):
    why = "provider rate limit (429) on the %s: nothing was done; retry after %gs" % (
        call, err.retry_after)
    return "throttled", (disposition, why, err.retry_after)


def decide(job, provider):
    """(action, argument): ("complete", refund), ("fail", (disposition, why,
    delay)), or ("throttled", (disposition, why, retry_after)) when the
    provider's rate limit refused the call."""
    try:
        p = json.loads(job.payload)
        params = {"payment_id": p["payment_id"], "amount": p["amount"],
                  "currency": p["currency"], "merchant_reference": job.operation_key}
    except (ValueError, KeyError, TypeError) as e:
        return "fail", (Disposition.MANUAL_REVIEW, "bad refund payload: %r" % e, 0)

    if job.next_action == "NEXT_ACTION_RECONCILE":
        try:
            found = provider.find_by_merchant_reference(job.operation_key)
        except Throttled as e:
            return throttled(Disposition.RETRY_RECONCILE, "lookup", e)
        except (Unknown, NothingDone, Refused) as e:
            return "fail", (Disposition.RETRY_RECONCILE, "lookup failed: %s" % e, 1.0)
        done = [r for r in found if r["status"] == "succeeded"]
        if done:
            return "complete", done[0]
        if any(r["status"] == "pending" for r in found):
            return "fail", (Disposition.RETRY_RECONCILE, "refund pending", 1.0)
        if found:
            return "fail", (Disposition.FAILED, "the provider failed the refund", 0)
        return "fail", (Disposition.RETRY_EXECUTE,
                        "not found at the provider; resend with the same idempotency key", 0.5)

    try:
        refund = provider.create_refund(job.operation_key, params)
    except Throttled as e:
        # Refused before anything was done: the same send, later.
        return throttled(Disposition.RETRY_EXECUTE, "send", e)
    except Unknown as e:
        return "fail", (Disposition.RETRY_RECONCILE, "outcome unknown, reconcile: %s" % e, 1.0)
    except NothingDone as e:
        return "fail", (Disposition.RETRY_EXECUTE, "provider did nothing: %s" % e, 0.5)
    except Refused as e:
        return "fail", (Disposition.MANUAL_REVIEW, "provider refused: %s" % e, 0)
    if refund["status"] == "succeeded":
        return "complete", refund
    if refund["status"] == "pending":
        return "fail", (Disposition.RETRY_RECONCILE, "refund %s pending" % refund["id"], 1.0)
    return "fail", (Disposition.FAILED, "the provider failed refund %s" % refund["id"], 0)


def handle(job, provider):
    action, arg = decide(job, provider)
    try:
        if action == "complete":
            job.complete(arg["id"], json.dumps(arg))
            log.info("job %s attempt %s completed with %s", job.job_id, job.attempt, arg["id"])
        elif action == "throttled":
            disposition, why, retry_after = arg
            out = job.fail(disposition, why, retry_after,
                           provider_retry_after_seconds=retry_after)
            log.info("job %s attempt %s: %s -> %s %s", job.job_id, job.attempt, why,
                     out.applied.name, out.override_reason)
        else:
            disposition, why, delay = arg
            out = job.fail(disposition, why, delay)
            log.info("job %s attempt %s: %s -> %s %s", job.job_id, job.attempt, why,
                     out.applied.name, out.override_reason)
    except (AttemptSuperseded, JobNotRunning) as e:
        log.info("job %s attempt %s: write refused, no longer the holder (%s)",
                 job.job_id, job.attempt, e.reason)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coordinator", default="127.0.0.1:50051", help="host:port")
    ap.add_argument("--provider", default="http://127.0.0.1:8099/")
    ap.add_argument("--worker-id", default="python-worker")
    ap.add_argument("--queue", default="refunds")
    ap.add_argument("--lease-seconds", type=float, default=30.0)
    ap.add_argument("--provider-timeout", type=float, default=2.0, help="seconds")
    ap.add_argument("--batch", type=int, default=4,
                    help="jobs held at once (the run loop's concurrency)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Times in UTC, like the Rust and Node workers' logs.
    for handler in logging.getLogger().handlers:
        if handler.formatter is not None:
            handler.formatter.converter = time.gmtime

    stop = threading.Event()
    # SIGTERM and Ctrl-C alike: no more claims, the jobs held are finished,
    # then it exits cleanly.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    provider = Provider(args.provider, args.provider_timeout)
    target = args.coordinator.replace("http://", "")
    # TLS and the token from JOBFENCE_TLS_CA, JOBFENCE_TOKEN_FILE, ...
    with WorkerClient(target, args.worker_id, args.queue, lease_seconds=args.lease_seconds,
                      timeout_seconds=5.0, credentials=Credentials.from_env()) as client:
        log.info("python refund worker %s on %s", args.worker_id, target)
        # The run loop of every jobfence client: claims for free slots only,
        # and each Complete or Fail asks for the next job in the same call
        # (docs/design.md rule 16). A handler that leaves a job unsettled
        # (a write back that failed after the retries) has it released to
        # reconcile.
        report = client.run(lambda job: handle(job, provider), concurrency=args.batch,
                            wait_seconds=5.0, stop=stop)
    log.info("stopped after %d jobs (%d came with the write back before them)",
             report.handled, report.on_write_back)


if __name__ == "__main__":
    main()
