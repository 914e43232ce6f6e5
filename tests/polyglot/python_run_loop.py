"""The Python side of tests/system/polyglot_python.rs's run-loop tests: a
worker on the run loop of sdk/python/src/jobfence_worker (``--aio``: the
asyncio client's), against a real coordinator.

usage: python_run_loop.py [--aio] TARGET WORKER_ID QUEUE JOBS

Each job's payload says what its handler does on the job's first attempt:
``ok`` completes it, ``leave`` returns without writing back, ``raise``
raises; on a later attempt every handler completes. The loop runs with
three slots and stops itself once JOBS jobs are completed.

Lines out: REPORT <field>=<n> ... peak=<most handlers at once>, then DONE.
"""

import asyncio
import sys
import threading
import time

from jobfence_worker import WorkerClient
from jobfence_worker.aio import AsyncWorkerClient

CONCURRENCY = 3


class Work:
    """What every handler shares: the completions and the gauge."""

    def __init__(self, jobs):
        self.jobs = jobs
        self.lock = threading.Lock()
        self.completed = 0
        self.running = self.peak = 0

    def enter(self):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)

    def leave(self, completed):
        with self.lock:
            self.running -= 1
            self.completed += int(completed)
            return self.completed >= self.jobs

    def act(self, job):
        """Raises for a ``raise`` job; True when the handler should complete."""
        if job.attempt == 1 and job.payload == "raise":
            raise RuntimeError("boom")
        return not (job.attempt == 1 and job.payload == "leave")


def run_sync(target, worker_id, queue, work):
    stop = threading.Event()

    def handle(job):
        work.enter()
        done = False
        try:
            # Long enough for the loop to hand out the other slots meanwhile.
            time.sleep(0.2)
            if work.act(job):
                job.complete("re_py_run_%d" % job.job_id, "{}")
                done = True
        finally:
            if work.leave(done):
                stop.set()

    with WorkerClient(target, worker_id, queue, lease_seconds=30) as client:
        return client.run(handle, CONCURRENCY, wait_seconds=2, stop=stop,
                          release_delay_seconds=0.2)


async def run_async(target, worker_id, queue, work):
    stop = asyncio.Event()

    async def handle(job):
        work.enter()
        done = False
        try:
            # Long enough for the loop to hand out the other slots meanwhile.
            await asyncio.sleep(0.2)
            if work.act(job):
                await job.complete("re_py_run_%d" % job.job_id, "{}")
                done = True
        finally:
            if work.leave(done):
                stop.set()

    async with AsyncWorkerClient(target, worker_id, queue, lease_seconds=30) as client:
        return await client.run(handle, CONCURRENCY, wait_seconds=2, stop=stop,
                                release_delay_seconds=0.2)


def main():
    args = sys.argv[1:]
    use_aio = args[0] == "--aio"
    if use_aio:
        args = args[1:]
    target, worker_id, queue, jobs = args[0], args[1], args[2], int(args[3])
    work = Work(jobs)
    if use_aio:
        report = asyncio.run(run_async(target, worker_id, queue, work))
    else:
        report = run_sync(target, worker_id, queue, work)
    fields = " ".join("%s=%d" % kv for kv in vars(report).items())
    print("REPORT", fields, "peak=%d" % work.peak, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
