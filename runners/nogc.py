"""The cyclic garbage collector paused while a reader builds many small acyclic objects.

``loopnas status`` and ``loopnas report`` of 10,000 candidates parse megabytes of JSON
(``EXP/index.json``) into millions of dicts and lists and validate thousands of records:
every 700 allocations CPython's collector runs, and its full passes walk everything built so
far, for nothing (JSON and pydantic records hold no cycles; reference counting frees them).
Paused, status takes 0.68 s instead of 0.92 and the report 5.0 s instead of 8.0 on the
benchmark (``benchmarks/bench_status_scale.py``; 23 MB more peak memory for the report, from
the figures' cycles freed at the end instead of on the way).

Once read, the records are frozen out of the collector's passes (:func:`frozen_gc`) and the
collector runs again for the charts: plotly's and matplotlib's figures hold cycles, and
freed as they go instead of at the end they no longer add up (about 20 MB of the report's peak at
10,000 candidates), while the passes skip the records read before."""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused_gc():
    """Cyclic collection off inside (as it was after: re-entrant); usable as a decorator."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def frozen_gc():
    """What exists now out of the collector's passes (``gc.freeze``), and the collector on
    for what is built inside; after, the collector as it was and nothing frozen."""
    was = gc.isenabled()
    gc.freeze()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()
        gc.unfreeze()


__all__ = ["frozen_gc", "paused_gc"]
