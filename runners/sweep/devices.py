"""Where trials run: the GPUs a sweep may use and how its trials share them. One rule for
both engines, no torch import here.

- The GPUs are the entries of ``CUDA_VISIBLE_DEVICES`` (ids or UUIDs, as CUDA reads them:
  up to the first negative one), else torch's device count.
- ``resources.gpu: f`` packs ``floor(1/f)`` trials on each GPU for f ≤ 1 and gives a trial
  ``ceil(f)`` whole GPUs for f > 1; 0 asks for none.
- A trial sees only its devices: the ``optuna`` engine starts each worker process with its
  own ``CUDA_VISIBLE_DEVICES`` (:class:`DevicePool` decides which), Ray sets it for the
  actors it gives GPUs to. The trial reads it the same way on both (:func:`visible`).
- A trial with a share below one whole device caps its CUDA memory at that share
  (``resources.memory_cap``), so one greedy trial runs out of memory alone instead of
  starving its neighbours; an out-of-memory trial with ``search.on_oom: retry_alone`` is
  rerun with a whole device to itself (:meth:`DevicePool.acquire` with ``alone``).
- Where CUDA is not available in the worker (a declared but absent GPU, a CPU laptop), the
  trial trains on CPU and the sweep prints one warning line (:class:`FallbackNotice`).
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field

from nas.errors import LoopnasError

ENV = "CUDA_VISIBLE_DEVICES"
CPU = "cpu"
MIN_SHARE = 1e-4  # of a GPU: the finest fraction Ray schedules
log = logging.getLogger("loopnas.sweep")


def parse_visible(value: str | None) -> list[str] | None:
    """The device ids in a ``CUDA_VISIBLE_DEVICES`` value (None: the variable is unset).
    CUDA ignores everything from the first invalid entry on; ``-1`` hides every device."""
    if value is None:
        return None
    out = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


def visible_gpus(environ=None) -> list[str]:
    """The GPUs this process may hand out: ``CUDA_VISIBLE_DEVICES``, else torch's count."""
    ids = parse_visible((os.environ if environ is None else environ).get(ENV))
    if ids is not None:
        return ids
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def packing(gpu: float) -> tuple[int, int]:
    """``(trials per GPU, GPUs per trial)`` for ``resources.gpu``; ``(0, 0)``: no GPU. A
    share below :data:`MIN_SHARE` (Ray's resource precision) is a :class:`PoolError`."""
    if not math.isfinite(gpu):
        raise PoolError(f"resources.gpu: {gpu} is not a finite number of GPUs")
    if gpu <= 0:
        return 0, 0
    if gpu < MIN_SHARE:
        raise PoolError(f"resources.gpu: {gpu:g} is below the smallest share of a GPU, {MIN_SHARE:g} "
                        f"(at most {round(1 / MIN_SHARE)} trials per GPU)")
    if gpu <= 1:
        return math.floor(1 / gpu + 1e-9), 1
    return 1, math.ceil(gpu - 1e-9)


def share(gpu: float, alone: bool = False) -> float | None:
    """The fraction of each of its devices a trial may use: ``gpu`` below one whole
    device, 1 for whole devices or a trial rerun alone, None without a GPU."""
    if gpu <= 0:
        return None
    return 1.0 if alone or gpu >= 1 else float(gpu)


def ray_resources(resources, alone: bool = False) -> dict:
    """Ray's resource request for one job: ``resources`` (a ``ResourcesSpec``), a whole
    GPU for a fractional job rerun ``alone``, and ``accelerator_type`` as Ray's
    ``accelerator_type:<T>`` node resource (every node of that type offers 1 of it)."""
    gpu = resources.gpu
    packing(gpu)  # a share too small to schedule is one clear error here too
    if alone and 0 < gpu < 1:
        gpu = 1.0
    out = {"cpu": resources.cpu, "gpu": gpu}
    if resources.accelerator_type:
        out[f"accelerator_type:{resources.accelerator_type}"] = 0.001
    return out


def job_placement(resources, alone: bool = False) -> dict:
    """What a job carries to its trial about its devices (the driver sets it for both
    engines): :class:`.job.Job`'s ``gpu``, ``share`` and ``memory_cap``."""
    return {"gpu": resources.gpu, "share": share(resources.gpu, alone), "memory_cap": resources.memory_cap}


class PoolError(LoopnasError):
    """The visible GPUs cannot hold one trial of the requested size."""


@dataclass
class Placement:
    """Devices given to one job: ``devices`` (visible ids; empty: the worker's environment
    is left as it is) and the unit they came from."""

    devices: tuple[str, ...]
    unit: int | None = None
    weight: int = 1


@dataclass
class DevicePool:
    """The GPUs of one machine, in units of ``ceil(f)`` GPUs, each holding up to
    ``floor(1/f)`` trials at once; without GPUs (or with ``gpu: 0``) it places every job
    on the CPU and never limits concurrency."""

    gpu: float
    gpus: list[str]
    units: list[tuple[str, ...]] = field(init=False)
    load: list[int] = field(init=False)
    drained: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.per_unit, width = packing(self.gpu)
        gpus = self.gpus if width else []
        twice = next((g for i, g in enumerate(gpus) if g in gpus[:i]), None)
        if twice is not None:  # one device would be given twice: to one trial, or to two as if apart
            raise PoolError(f"{ENV}={','.join(gpus)} names GPU {twice} twice; list each GPU once")
        if width and gpus and len(gpus) < width:
            raise PoolError(f"resources.gpu: {self.gpu:g} needs {width} GPUs per trial; "
                            f"{len(gpus)} visible ({ENV}={','.join(gpus)})")
        self.units = [tuple(gpus[i:i + width]) for i in range(0, len(gpus) - width + 1, width)] if gpus else []
        self.load = [0] * len(self.units)

    @classmethod
    def from_env(cls, gpu: float, environ=None) -> "DevicePool":
        return cls(gpu, visible_gpus(environ) if gpu > 0 else [])

    @property
    def capacity(self) -> int | None:
        """Trials the pool holds at once (None: no GPUs, the CPU holds any number)."""
        return self.per_unit * len(self.units) if self.units else None

    def acquire(self, alone: bool = False, prefer: set[tuple[str, ...]] = frozenset()) -> Placement | None:
        """A place for one job, or None while none is free. ``alone``: a whole unit with no
        other trial on it; until one drains, no new trial is put on the emptiest unit.
        ``prefer``: devices that already have an idle worker, among the least loaded."""
        if not self.units:
            return Placement(())
        if alone:
            free = [u for u, n in enumerate(self.load) if n == 0]
            if not free:
                if self.drained is None:
                    self.drained = min(range(len(self.units)), key=lambda u: self.load[u])
                return None
            unit = self.drained if self.drained in free else free[0]
            self.drained = None
            self.load[unit] = self.per_unit
            return Placement(self.units[unit], unit, weight=self.per_unit)
        open_ = [u for u, n in enumerate(self.load) if n < self.per_unit and u != self.drained]
        if not open_:
            return None
        unit = min(open_, key=lambda u: (self.load[u], self.units[u] not in prefer, u))
        self.load[unit] += 1
        return Placement(self.units[unit], unit)

    def release(self, placement: Placement) -> None:
        if placement.unit is not None:
            self.load[placement.unit] -= placement.weight


def visible(environ=None) -> list[str]:
    """The devices this trial was given, as its record names them: the entries of its
    ``CUDA_VISIBLE_DEVICES``, or ``["cpu"]`` when it has none."""
    ids = parse_visible((os.environ if environ is None else environ).get(ENV))
    return ids or [CPU]


class FallbackNotice:
    """One warning line per sweep when trials that asked for a GPU trained on CPU."""

    def __init__(self) -> None:
        self.shown = False

    def seen(self, outcome) -> None:
        """``outcome``: an :class:`.outcome.Outcome`."""
        reason = outcome.fallback
        if reason and not self.shown:
            self.shown = True
            log.warning("warning: %s; trials that ask for a GPU train on CPU in this sweep", reason)


__all__ = ["DevicePool", "FallbackNotice", "Placement", "PoolError", "job_placement", "packing",
           "parse_visible", "ray_resources", "share", "visible", "visible_gpus", "ENV", "CPU", "MIN_SHARE"]
