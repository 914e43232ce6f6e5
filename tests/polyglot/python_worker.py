"""The Python side of tests/system/polyglot_python.rs: a worker built on
sdk/python/src/jobfence_worker, driven step by step over stdin/stdout so the Rust
side can take a job over at an exact point. Every expectation about the
refusals is asserted here, in Python.

usage: python_worker.py TARGET WORKER_ID QUEUE CLOSED_TARGET

CLOSED_TARGET is a loopback address nothing listens on.

Lines out: CLAIMED, COMPLETED, REPLAYED, HOLDING, SUPERSEDED, DEDUP, DONE.
Lines in:  TAKEN_OVER <attempt>.
"""

import sys

from jobfence_worker import (
    AttemptSuperseded,
    Disposition,
    OutcomeUnknown,
    WorkerClient,
    observation_dedup_key,
)


def say(*words):
    print(*words, flush=True)


def expect(line, word):
    parts = line.split()
    assert parts and parts[0] == word, "expected %s from the test, got %r" % (word, line)
    return parts[1:]


def main():
    target, worker_id, queue, closed = sys.argv[1:5]
    with WorkerClient(target, worker_id, queue, lease_seconds=30) as client:
        # 1. Claim and complete: the plain path, then the same call again.
        [job] = client.claim(1)
        assert job.next_action == "NEXT_ACTION_EXECUTE", job.next_action
        assert not job.takeover
        say("CLAIMED", job.job_id, job.attempt, job.operation_key)
        written = job.complete("re_py_1", '{"status":"succeeded"}')
        assert not written.replayed
        say("COMPLETED", job.job_id, written.job.state)
        again = job.complete("re_py_1", '{"status":"succeeded"}')
        assert again.replayed, "an identical Complete must be reported as a replay"
        say("REPLAYED", job.job_id)

        # 2. Claim, then stall "at the provider" until the Rust side has
        #    taken the job over.
        [stale] = client.claim(1)
        say("HOLDING", stale.job_id, stale.attempt)
        [current] = expect(sys.stdin.readline(), "TAKEN_OVER")
        current = int(current)

        # 3. The late provider success: refused, kept as evidence.
        try:
            stale.complete("re_py_late", '{"id":"re_py_late","status":"succeeded"}')
        except AttemptSuperseded as e:
            assert e.current_attempt == current, (e.current_attempt, current)
            assert e.current_attempt > stale.attempt
            assert e.current_state == "JOB_STATE_RUNNING", e.current_state
            assert e.reason == "ATTEMPT_SUPERSEDED"
            assert e.observation_recorded, "the late result must be recorded"
        else:
            raise AssertionError("a superseded Complete was accepted")

        # 4. The seed's ghost story: the late timeout handler tries to
        #    schedule a retry. Refused too, and records nothing.
        try:
            stale.fail(Disposition.RETRY_RECONCILE, "socket timeout")
        except AttemptSuperseded as e:
            assert not e.observation_recorded
            say("SUPERSEDED", stale.job_id, e.current_attempt)
        else:
            raise AssertionError("a superseded Fail was accepted")

        # The evidence is visible to whoever holds the job now.
        _, observations = client.get_job(stale.job_id)
        keys = [o.dedup_key for o in observations]
        assert observation_dedup_key(worker_id, "re_py_late") in keys, keys

    # 5. An unreachable coordinator: no handle, an unclear outcome.
    with WorkerClient(closed, worker_id, queue, timeout_seconds=2) as nowhere:
        try:
            nowhere.claim(1)
        except OutcomeUnknown:
            pass
        else:
            raise AssertionError("a claim nobody answered handed out jobs")

    say("DEDUP", observation_dedup_key(worker_id, "r" * 250))
    say("DONE")


if __name__ == "__main__":
    main()
