"""The run loop of both clients (``WorkerClient.run``,
``AsyncWorkerClient.run``): claim only for free slots, hand each job to the
handler, release what the handler left unsettled, back off after a failed
claim, stop cleanly. It behaves as the run loops of the other jobfence
clients do (Rust ``WorkerClient::run``, Node ``client.run``, Go
``client.Run``); the methods' docstrings say how."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Set, Union

from . import _wire
from ._wire import ClaimInterrupted, Disposition
from .errors import InvalidRequest, JobfenceError, NotAuthorized, OutcomeUnknown

if TYPE_CHECKING:
    from .aio import AsyncClaimedJob, AsyncWorkerClient
    from .client import ClaimedJob, WorkerClient

log = logging.getLogger("jobfence_worker")

#: The most jobs one run loop handles at once: the coordinator's default
#: largest Claim batch, since the loop claims up to its free slots in one
#: call (Rust ``MAX_IN_FLIGHT``).
MAX_CONCURRENCY = 100

#: What ``WorkerClient.run`` calls with each job it holds (its return value
#: is ignored; an exception counts as a handler error).
Handler = Callable[["ClaimedJob"], Any]
#: What ``AsyncWorkerClient.run`` calls with each job: a coroutine function
#: (a plain function is called as is).
AsyncHandler = Callable[["AsyncClaimedJob"], Union[Awaitable[Any], Any]]


@dataclass
class RunReport:
    """Counts of one run, for logs and tests (the fields of the Rust
    client's ``RunReport`` that apply)."""

    #: Jobs handed out (inline takeovers included), by the loop's claims
    #: and by handlers' write-backs.
    claimed: int = 0
    #: Of ``claimed``, the jobs a handler's Complete or Fail was answered
    #: with (the write and the next job in one call and one transaction,
    #: docs/design.md rule 16).
    on_write_back: int = 0
    #: Of which inline takeovers of an expired lease.
    takeovers: int = 0
    #: Handlers that returned (or raised).
    handled: int = 0
    #: Handlers that raised.
    handler_errors: int = 0
    #: Jobs released with ``RETRY_RECONCILE`` because the handler left them
    #: unsettled.
    released: int = 0
    #: Claims whose outcome was unknown: no handle, no handler.
    unclear_claims: int = 0
    #: A long-polling Claim cut short by the stop signal: nothing handled.
    interrupted_claims: int = 0
    #: Other failed claims (unavailable after the retries, refused, ...).
    failed_claims: int = 0


def _check(concurrency: int) -> None:
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError("concurrency must be 1..%d, not %r" % (MAX_CONCURRENCY, concurrency))


def _default_on_claim_error(err: JobfenceError) -> None:
    if isinstance(err, OutcomeUnknown):
        log.warning("claim outcome unknown, holding nothing; claiming again: %s", err)
    else:
        log.warning("claim failed, claiming again: %s", err)


def _stops_claiming(err: JobfenceError) -> bool:
    """A refusal that asking again cannot change: who the caller is, or
    the request itself."""
    return isinstance(err, (NotAuthorized, InvalidRequest))


def _count_failed_claim(report: RunReport, err: JobfenceError) -> None:
    if isinstance(err, OutcomeUnknown):
        report.unclear_claims += 1
    else:
        report.failed_claims += 1


def _waited(asked: float, wait_seconds: float) -> bool:
    """Did an empty Claim wait for work? If not (long poll off, or a
    draining coordinator that answered early), the loop pauses
    ``poll_seconds`` before claiming again instead of asking at once."""
    return wait_seconds > 0 and time.monotonic() - asked >= wait_seconds / 2


def _release_why(error: Optional[BaseException]) -> str:
    if error is None:
        return "handler returned without writing back"
    return "handler failed: %s" % error


def _tally(report: RunReport, lock: threading.Lock, error: bool, released: bool) -> None:
    with lock:
        report.handled += 1
        report.handler_errors += int(error)
        report.released += int(released)


def _chained(job: Any) -> Any:
    """The next job a handle's write-back was answered with; None when
    none came."""
    return job.take_next_job()


def _count_chained(report: RunReport, job: Any) -> None:
    report.claimed += 1
    report.on_write_back += 1
    report.takeovers += int(job.takeover)


def _handle_one(handler: Handler, job: "ClaimedJob", release_delay: float,
                report: RunReport, lock: threading.Lock) -> None:
    """Runs the handler on ``job`` and, while its write-back hands it the
    next job (docs/design.md rule 16), on each next job in turn."""
    current: Optional["ClaimedJob"] = job
    while current is not None:
        _handle_job(handler, current, release_delay, report, lock)
        current = _chained(current)
        if current is not None:
            with lock:
                _count_chained(report, current)


def _handle_job(handler: Handler, job: "ClaimedJob", release_delay: float,
                report: RunReport, lock: threading.Lock) -> None:
    error: Optional[Exception] = None
    try:
        handler(job)
    except Exception as err:  # the handler's failure is the job's, not the loop's
        error = err
        log.warning("job %s attempt %s: handler failed: %r", job.job_id, job.attempt, err)
    released = False
    if not job.settled:
        try:
            job.fail(Disposition.RETRY_RECONCILE, _release_why(error), release_delay)
            released = True
        except JobfenceError as err:
            log.warning("could not release job %s attempt %s (%s); it comes back after its lease",
                        job.job_id, job.attempt, err)
    _tally(report, lock, error is not None, released)


def _take_slots(slots: threading.Semaphore, concurrency: int, stop: threading.Event) -> int:
    """Waits for one free slot (0 when ``stop`` is set first), then takes
    every other free one."""
    while not slots.acquire(timeout=0.05):
        if stop.is_set():
            return 0
    if stop.is_set():
        slots.release()
        return 0
    free = 1
    while free < concurrency and slots.acquire(blocking=False):
        free += 1
    return free


def run_loop(client: "WorkerClient", handler: Handler, concurrency: int, *,
             wait_seconds: float, stop: Optional[threading.Event],
             on_claim_error: Optional[Callable[[JobfenceError], None]],
             release_delay_seconds: float, poll_seconds: float) -> RunReport:
    """``WorkerClient.run``: see its docstring."""
    _check(concurrency)
    if stop is not None or threading.current_thread() is not threading.main_thread():
        return _run_loop(client, handler, concurrency, wait_seconds=wait_seconds,
                         stop=stop or threading.Event(), on_claim_error=on_claim_error,
                         release_delay_seconds=release_delay_seconds, poll_seconds=poll_seconds)
    # No stop event given, in the main thread: Ctrl-C (SIGINT) is the stop.
    # The loop stops claiming, the handlers in flight finish (their jobs
    # are completed or released, none abandoned), and run returns its
    # report instead of a KeyboardInterrupt traceback. The handler that was
    # there before is put back when the loop ends.
    stop = threading.Event()

    def on_ctrl_c(_signum: int, _frame: Any) -> None:
        if not stop.is_set():
            log.warning("Ctrl-C: no more claims; finishing the jobs held, then stopping")
        stop.set()

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        return _run_loop(client, handler, concurrency, wait_seconds=wait_seconds, stop=stop,
                         on_claim_error=on_claim_error,
                         release_delay_seconds=release_delay_seconds, poll_seconds=poll_seconds)
    finally:
        signal.signal(signal.SIGINT, previous)


def _run_loop(client: "WorkerClient", handler: Handler, concurrency: int, *,
              wait_seconds: float, stop: threading.Event,
              on_claim_error: Optional[Callable[[JobfenceError], None]],
              release_delay_seconds: float, poll_seconds: float) -> RunReport:
    on_claim_error = on_claim_error or _default_on_claim_error
    report, lock = RunReport(), threading.Lock()
    slots = threading.Semaphore(concurrency)
    fatal: Optional[JobfenceError] = None
    failures = 0
    # Set when the loop stops claiming: write-backs then ask for no next job.
    stopped = threading.Event()

    def stopping() -> bool:
        return stop.is_set() or stopped.is_set()

    def run_handler(job: "ClaimedJob") -> None:
        try:
            _handle_one(handler, job, release_delay_seconds, report, lock)
        finally:
            slots.release()

    # Leaving the with block waits for the handlers in flight.
    with ThreadPoolExecutor(concurrency, thread_name_prefix="jobfence-handler") as pool:
        while not stop.is_set():
            free = _take_slots(slots, concurrency, stop)
            if free == 0:
                break
            asked, pause = time.monotonic(), 0.0
            try:
                jobs = client._claim_until(stop, free, wait_seconds)
            except ClaimInterrupted:
                report.interrupted_claims += 1
                jobs = []
            except JobfenceError as err:
                jobs = []
                _count_failed_claim(report, err)
                if _stops_claiming(err):
                    log.error("claim refused; asking again cannot succeed: stopping (%s)", err)
                    fatal = err
                else:
                    on_claim_error(err)
                    failures += 1
                    pause = client.retry.backoff(failures)
            else:
                failures = 0
                if not jobs and not _waited(asked, wait_seconds):
                    pause = poll_seconds
            for job in jobs:
                report.claimed += 1
                report.takeovers += int(job.takeover)
                job._next = _wire.next_ask(client.queue, client.worker_id,
                                           client.lease_seconds, stopping)
                pool.submit(run_handler, job)
            for _ in range(free - len(jobs)):
                slots.release()
            if fatal is not None or (pause > 0 and stop.wait(pause)):
                break
        stopped.set()
    if fatal is not None:
        raise fatal
    return report


async def _handle_one_async(handler: AsyncHandler, job: "AsyncClaimedJob", release_delay: float,
                            report: RunReport) -> None:
    """As ``_handle_one``, for asyncio."""
    current: Optional["AsyncClaimedJob"] = job
    while current is not None:
        await _handle_job_async(handler, current, release_delay, report)
        current = _chained(current)
        if current is not None:
            _count_chained(report, current)


async def _handle_job_async(handler: AsyncHandler, job: "AsyncClaimedJob", release_delay: float,
                            report: RunReport) -> None:
    error: Optional[Exception] = None
    try:
        result = handler(job)
        if inspect.isawaitable(result):
            await result
    except Exception as err:  # the handler's failure is the job's, not the loop's
        error = err
        log.warning("job %s attempt %s: handler failed: %r", job.job_id, job.attempt, err)
    released = False
    if not job.settled:
        try:
            await job.fail(Disposition.RETRY_RECONCILE, _release_why(error), release_delay)
            released = True
        except JobfenceError as err:
            log.warning("could not release job %s attempt %s (%s); it comes back after its lease",
                        job.job_id, job.attempt, err)
    report.handled += 1
    report.handler_errors += int(error is not None)
    report.released += int(released)


async def _first(task: "asyncio.Future[Any]", stopper: "asyncio.Future[Any]") -> bool:
    """Waits for ``task`` or ``stopper``; True when ``task`` is done."""
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    return task in done


async def run_loop_async(client: "AsyncWorkerClient", handler: AsyncHandler, concurrency: int, *,
                         wait_seconds: float, stop: Optional[asyncio.Event],
                         on_claim_error: Optional[Callable[[JobfenceError], None]],
                         release_delay_seconds: float, poll_seconds: float) -> RunReport:
    """``AsyncWorkerClient.run``: see its docstring."""
    _check(concurrency)
    stop = stop or asyncio.Event()
    on_claim_error = on_claim_error or _default_on_claim_error
    report = RunReport()
    in_flight: Set["asyncio.Task[None]"] = set()
    stopper = asyncio.ensure_future(stop.wait())
    fatal: Optional[JobfenceError] = None
    failures = 0
    stopped = False

    def stopping() -> bool:
        return stop.is_set() or stopped

    try:
        while not stop.is_set():
            if len(in_flight) >= concurrency:
                await asyncio.wait(in_flight | {stopper}, return_when=asyncio.FIRST_COMPLETED)
                continue
            asked, pause = time.monotonic(), 0.0
            claim = asyncio.ensure_future(
                client.claim(concurrency - len(in_flight), wait_seconds=wait_seconds))
            if not await _first(claim, stopper):
                # Cancelling the task cancels its RPC: nothing from it is handled.
                claim.cancel()
                await asyncio.gather(claim, return_exceptions=True)
                report.interrupted_claims += 1
                break
            try:
                jobs = claim.result()
            except JobfenceError as err:
                _count_failed_claim(report, err)
                if _stops_claiming(err):
                    log.error("claim refused; asking again cannot succeed: stopping (%s)", err)
                    fatal = err
                    break
                on_claim_error(err)
                failures += 1
                pause = client.retry.backoff(failures)
            else:
                failures = 0
                if not jobs and not _waited(asked, wait_seconds):
                    pause = poll_seconds
                for job in jobs:
                    report.claimed += 1
                    report.takeovers += int(job.takeover)
                    job._next = _wire.next_ask(client.queue, client.worker_id,
                                               client.lease_seconds, stopping)
                    task = asyncio.ensure_future(
                        _handle_one_async(handler, job, release_delay_seconds, report))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
            if pause > 0:
                await asyncio.wait({stopper}, timeout=pause)
        # Stopped claiming: the handlers in flight finish and write back,
        # asking for no next job.
        stopped = True
        await asyncio.gather(*in_flight, return_exceptions=True)
    finally:
        stopper.cancel()
    if fatal is not None:
        raise fatal
    return report


__all__ = ["AsyncHandler", "Handler", "MAX_CONCURRENCY", "RunReport"]
