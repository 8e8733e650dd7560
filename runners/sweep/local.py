"""The ``optuna`` backend: a pool of local worker processes, no Ray.

Each worker is a spawned process that imports torch once and trains job after job (like
Ray's actor reuse). The driver asks and tells the study and talks to workers over pipes:
a worker sends each rung and waits for the go/stop answer, then sends the outcome. A worker
that dies (out-of-memory kill, segfault) becomes a failed trial; one that runs past the
trial time limit (plus a grace period for its cooperative stop) is killed and recorded as
timed out. The pool is replaced worker by worker, so the sweep goes on.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import wait
from typing import Callable

from .driver import Sweep
from .records import Rung

GRACE = 30.0  # seconds past the time limit before a worker is killed


def _worker_main(conn, threads: int) -> None:
    import torch

    from .trial import run_trial

    torch.set_num_threads(threads)
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(("start", job["id"], None))  # the time limit runs from here, not from spawn

        def report(rung: Rung) -> bool:
            conn.send(("rung", job["id"], rung.model_dump()))
            return conn.recv()

        conn.send(("done", job["id"], run_trial(job, report)))


class _Worker:
    def __init__(self, ctx, threads: int):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, threads), daemon=True)
        self.proc.start()
        child.close()
        self.job: dict | None = None
        self.started = 0.0

    def give(self, job: dict) -> None:
        self.job, self.started = job, time.time()
        self.conn.send(job)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(5)


def run_local(sweep: Sweep, on_change: Callable[[], None] = lambda: None) -> None:
    """Run the sweep to its trial budget with ``concurrency`` worker processes."""
    search = sweep.space.spec.search
    ctx = mp.get_context("spawn")
    threads = max(1, int(search.resources.cpu))
    workers: list[_Worker] = []
    try:
        while True:
            while len([w for w in workers if w.job]) < search.concurrency:
                job = sweep.next_job()
                on_change()
                if job is None:
                    break
                idle = next((w for w in workers if w.job is None), None)
                if idle is None:
                    idle = _Worker(ctx, threads)
                    workers.append(idle)
                idle.give(job)
            busy = [w for w in workers if w.job]
            if not busy:
                break
            for conn in wait([w.conn for w in busy], timeout=1.0):
                worker = next(w for w in busy if w.conn is conn)
                _handle(sweep, worker)
                on_change()
            workers = _reap(sweep, workers, ctx, threads)
    except BaseException:
        sweep.interrupted()
        raise
    finally:
        for w in workers:
            if w.job is None and w.proc.is_alive():
                w.conn.send(None)
            else:
                w.kill()
        for w in workers:
            w.proc.join(5)


def _handle(sweep: Sweep, worker: _Worker) -> None:
    try:
        kind, rid, payload = worker.conn.recv()
    except (EOFError, OSError):
        return  # the process died; _reap records it
    if kind == "start":
        worker.started = time.time()
    elif kind == "rung":
        worker.conn.send(sweep.on_rung(rid, Rung.model_validate(payload)))
    else:
        sweep.finish(rid, payload)
        worker.job = None


def _reap(sweep: Sweep, workers: list[_Worker], ctx, threads: int) -> list[_Worker]:
    """Replace dead and overdue workers; their trials become failed / timed out."""
    limit = sweep.space.spec.search.trial_timeout
    alive = []
    for w in workers:
        overdue = w.job is not None and limit is not None and time.time() - w.started > limit + GRACE
        if w.proc.is_alive() and not overdue:
            alive.append(w)
            continue
        if w.job is not None:
            if overdue:
                w.kill()
                outcome = {"status": "timeout", "reason": f"killed after {time.time() - w.started:.0f} s "
                           f"(time limit {limit:g} s)"}
            else:
                outcome = {"status": "failed", "crashed": True,
                           "reason": f"worker process died (exit code {w.proc.exitcode}); "
                                     "out of memory or a crash in native code"}
            sweep.finish(w.job["id"], {**outcome, "started": w.started, "finished": time.time(),
                                       "wall_time": time.time() - w.started})
    return alive


__all__ = ["run_local"]
