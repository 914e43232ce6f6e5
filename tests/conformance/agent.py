"""The conformance agent of the Python client (see README.md beside it).
``--aio`` runs it on ``jobfence_worker.aio.AsyncWorkerClient`` instead of
the synchronous ``WorkerClient``: the same cases must pass on both."""

import asyncio
import inspect
import sys

import jobfence_worker as jw
from jobfence_worker import Disposition, WorkerClient
from jobfence_worker.aio import AsyncWorkerClient

KINDS = [
    (jw.AttemptSuperseded, "superseded"), (jw.JobNotRunning, "not_running"),
    (jw.JobNotFound, "not_found"), (jw.JobFinished, "finished"),
    (jw.LeaseNotExpired, "lease_not_expired"), (jw.InvalidRequest, "invalid"),
    (jw.OutcomeUnknown, "outcome_unknown"), (jw.Unavailable, "unavailable"),
    (jw.NotAuthorized, "denied"), (jw.ApiVersionUnsupported, "api_version"),
]


def error(err):
    kind = next((k for cls, k in KINDS if isinstance(err, cls)), "other")
    recorded = int(bool(getattr(err, "observation_recorded", False)))
    current = getattr(err, "current_attempt", 0)
    return "error %s recorded=%d current_attempt=%d" % (kind, recorded, current)


async def done(value):
    """The value of a call of either client (awaited if it is a coroutine)."""
    return await value if inspect.isawaitable(value) else value


async def main():
    use_aio = sys.argv[1] == "--aio"
    target, worker_id, queue = sys.argv[2:5] if use_aio else sys.argv[1:4]
    # TLS and a token when the driver gives them (JOBFENCE_TLS_CA, ...).
    client = (AsyncWorkerClient if use_aio else WorkerClient)(
        target, worker_id, queue, lease_seconds=30, credentials=jw.Credentials.from_env())
    handles = []

    def claimed(job):
        handles.append(job)
        action = "reconcile" if job.next_action == "NEXT_ACTION_RECONCILE" else "execute"
        return "claimed %d %d %d %s %d %d" % (len(handles) - 1, job.job_id, job.attempt, action,
                                              int(job.takeover), len(job.observations))

    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        words = line.split()
        if not line or words == ["quit"]:
            break
        if not words:
            continue
        cmd, args = words[0], words[1:]
        try:
            if cmd == "reasons":
                reply = "reasons " + " ".join(sorted(jw.REASONS))
            elif cmd == "retries":
                reply = "retries %d" % client.retries
            elif cmd == "held":
                reply = "held %d" % len(handles)
            elif cmd == "get":
                job, _ = await done(client.get_job(int(args[0])))
                state = client.pb.JobState.Name(job.state).replace("JOB_STATE_", "").lower()
                reply = "job %s %d" % (state, job.attempt)
            elif cmd == "enqueue":
                key, fairness_key, priority = args
                job, created = await done(client.enqueue(
                    queue, key, "{}", fairness_key=None if fairness_key == "-" else fairness_key,
                    priority=int(priority)))
                reply = "enqueued %d created=%d priority=%d fairness_key=%s" % (
                    job.job_id, int(created), job.priority, job.fairness_key)
            elif cmd == "fair":
                job = handles[int(args[0])]
                reply = "fair priority=%d fairness_key=%s" % (job.priority, job.fairness_key)
            elif cmd == "claim":
                jobs = await done(client.claim(1))
                reply = claimed(jobs[0]) if jobs else "empty"
            elif cmd == "takeover":
                reply = claimed(await done(client.takeover(int(args[0]))))
            elif cmd == "complete":
                ref = args[1]
                written = await done(handles[int(args[0])].complete(ref, '{"id":"%s"}' % ref))
                reply = "ok replayed=%d" % int(written.replayed)
            elif cmd == "complete-next":
                ref, job = args[1], handles[int(args[0])]
                job.ask_for_next_job()
                try:
                    written = await done(job.complete(ref, '{"id":"%s"}' % ref))
                    reply = "ok replayed=%d" % int(written.replayed)
                except jw.JobfenceError as err:
                    reply = error(err)
                nxt = job.take_next_job()
                reply += " next " + (claimed(nxt) if nxt is not None else "empty")
            elif cmd == "fail":
                out = await done(handles[int(args[0])].fail(Disposition[args[1].upper()],
                                                            "conformance"))
                reply = "ok applied=%s replayed=%d" % (out.applied.name.lower(), int(out.replayed))
            else:
                reply = "unknown command " + cmd
        except jw.JobfenceError as err:
            reply = error(err)
        print(reply, flush=True)
    await done(client.close())


if __name__ == "__main__":
    asyncio.run(main())
