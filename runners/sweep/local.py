"""The ``optuna`` engine: a pool of local worker processes, no Ray.

Each worker is a spawned process that imports torch once and trains job after job (like
Ray's actor reuse). The driver asks and tells the study and talks to workers over pipes:
a worker sends each rung and waits for the go/stop answer, then sends the outcome (an
:class:`.outcome.Outcome` as plain data, validated back here). A worker
that dies (out-of-memory kill, segfault) becomes a failed trial; one that runs past the
trial time limit (plus a grace period for its cooperative stop) is killed and recorded as
timed out. The pool is replaced worker by worker, so the sweep goes on.

GPUs (:mod:`.devices`): each worker is bound to the devices the :class:`DevicePool` gave
it, through its own ``CUDA_VISIBLE_DEVICES``, set before the process starts (so before
torch is imported in it), and takes only jobs placed on those devices; concurrency is at
most what the pool holds. A job rerun alone after an out-of-memory error waits for a whole
device, while other jobs go on on the other devices.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from contextlib import contextmanager
from multiprocessing.connection import wait
from typing import Callable

from runners.results.records import Rung

from .devices import CPU, ENV, DevicePool, FallbackNotice, Placement, PoolError
from .driver import Sweep, SweepError
from .job import Job
from .outcome import Outcome

GRACE = 30.0  # seconds past the time limit before a worker is killed


def _worker_main(conn, threads: int) -> None:
    import torch

    from .trial import run_trial

    torch.set_num_threads(threads)
    try:
        while True:
            given = conn.recv()
            if given is None:
                return
            conn.send(("start", given["id"], None))  # the time limit runs from here, not from spawn
            job = Job.model_validate(given)

            def report(rung: Rung) -> bool:
                conn.send(("rung", job.id, rung.model_dump()))
                return conn.recv()

            conn.send(("done", job.id, run_trial(job, report).model_dump()))
    except (EOFError, OSError, KeyboardInterrupt):
        # the driver is gone (killed, SIGTERM: a broken pipe) or interrupted with the whole
        # process group: it records what became of the job, so the worker just ends
        return


@contextmanager
def _visible(devices: tuple[str, ...]):
    """``CUDA_VISIBLE_DEVICES`` for a process started inside: a spawned child inherits the
    environment before it runs any Python. Empty: the environment is left as it is."""
    if not devices:
        yield
        return
    old = os.environ.get(ENV)
    os.environ[ENV] = ",".join(devices)
    try:
        yield
    finally:
        if old is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = old


class _Worker:
    def __init__(self, ctx, threads: int, devices: tuple[str, ...]):
        self.devices = devices
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, threads), daemon=True)
        with _visible(devices):
            self.proc.start()
        child.close()
        self.job: Job | None = None
        self.placement: Placement | None = None
        self.started = 0.0

    def give(self, job: Job, placement: Placement) -> None:
        self.job, self.placement, self.started = job, placement, time.time()
        self.conn.send(job.model_dump())

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)


class _Pool:
    """Worker processes on the devices of a :class:`DevicePool`."""

    def __init__(self, sweep: Sweep):
        search = sweep.space.spec.search
        self.resources = search.resources
        try:
            self.devices = DevicePool.from_env(self.resources.gpu)
        except PoolError as exc:
            raise SweepError(str(exc)) from None
        self.concurrency = min(search.concurrency, self.devices.capacity or search.concurrency)
        self.ctx = mp.get_context("spawn")
        self.threads = max(1, int(self.resources.cpu))
        self.workers: list[_Worker] = []
        self.waiting: list[Job] = []  # jobs the driver gave out that wait for a device
        self.notice = FallbackNotice()

    def busy(self) -> list[_Worker]:
        return [w for w in self.workers if w.job]

    def start(self, job: Job) -> bool:
        """Place ``job`` and give it to a worker on its devices; False: no device free."""
        idle = {w.devices for w in self.workers if w.job is None}
        placement = self.devices.acquire(alone=job.alone, prefer=idle)
        if placement is None:
            return False
        worker = next((w for w in self.workers if w.job is None and w.devices == placement.devices), None)
        if worker is None:
            worker = _Worker(self.ctx, self.threads, placement.devices)
            self.workers.append(worker)
        worker.give(job, placement)
        return True

    def fill(self, sweep: Sweep, on_change: Callable[[], None]) -> None:
        for job in list(self.waiting):
            if len(self.busy()) < self.concurrency and self.start(job):
                self.waiting.remove(job)
        while len(self.busy()) < self.concurrency:
            job = sweep.next_job()
            on_change()
            if job is None:
                return
            if not self.start(job):
                self.waiting.append(job)
                return

    def done(self, worker: _Worker) -> None:
        self.devices.release(worker.placement)
        worker.job = worker.placement = None


def run_local(sweep: Sweep, on_change: Callable[[], None] = lambda: None) -> None:
    """Run the sweep to its trial budget with ``concurrency`` worker processes (at most
    as many as the visible GPUs hold, when trials ask for GPUs)."""
    pool = _Pool(sweep)
    try:
        while True:
            pool.fill(sweep, on_change)
            busy = pool.busy()
            if not busy:
                break  # nothing runs, so nothing waits: a free pool places any job
            for conn in wait([w.conn for w in busy], timeout=1.0):
                worker = next(w for w in busy if w.conn is conn)
                _handle(sweep, pool, worker)
                on_change()
            _reap(sweep, pool)
    except BaseException:
        sweep.interrupted()
        raise
    finally:
        for w in pool.workers:
            if w.job is None and w.proc.is_alive():
                w.conn.send(None)
            else:
                w.kill()
        for w in pool.workers:
            w.proc.join(5)


def _handle(sweep: Sweep, pool: _Pool, worker: _Worker) -> None:
    try:
        kind, rid, payload = worker.conn.recv()
    except (EOFError, OSError):
        return  # the process died; _reap records it
    if kind == "start":
        worker.started = time.time()
    elif kind == "rung":
        worker.conn.send(sweep.on_rung(rid, Rung.model_validate(payload)))
    else:
        outcome = Outcome.model_validate(payload)
        pool.done(worker)
        pool.notice.seen(outcome)
        sweep.on_outcome(rid, outcome)


def _reap(sweep: Sweep, pool: _Pool) -> None:
    """Drop dead and overdue workers (a later job starts a new one on their devices);
    their trials become failed / timed out."""
    limit = sweep.space.spec.search.trial_timeout
    alive = []
    for w in pool.workers:
        overdue = w.job is not None and limit is not None and time.time() - w.started > limit + GRACE
        if w.proc.is_alive() and not overdue:
            alive.append(w)
            continue
        if w.job is not None:
            if overdue:
                w.kill()
                ended = {"status": "timeout", "reason": f"killed after {time.time() - w.started:.0f} s "
                         f"(time limit {limit:g} s)"}
            else:
                ended = {"status": "failed", "crashed": True,
                         "reason": f"worker process died (exit code {w.proc.exitcode}); "
                                   "out of memory or a crash in native code"}
            job, now = w.job, time.time()
            pool.done(w)
            sweep.on_outcome(job.id, Outcome(**ended, started=w.started, finished=now, wall_time=now - w.started,
                                             devices=tuple(w.devices) or (CPU,), share=job.share))
    pool.workers = alive


__all__ = ["run_local"]
