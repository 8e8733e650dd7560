"""The experiment directory: what a sweep writes and what `status`, `report` and `export` read.

Layout (every file written atomically, as it happens)::

    EXP/
      experiment.json         ExperimentRecord: the space, objectives, engine, settings
      space.yaml              the space file as the user wrote it
      study.journal           the Optuna study (JournalStorage): optuna-dashboard opens it
      driver.lock             held by the one driver running the sweep (runners.sweep.lock)
      trials/t0007.json       one TrialRecord per trial (any status, updated as it runs)
      index.json              a digest of each trial record, a JSON line each (iter_index), kept by status and report
      index.more.json         the rest of each digest, kept by report
      trials/t0007/           per-trial scratch: checkpoint.pt, result.json of the trainer
      trials/t0007/s1/        ... of replicate 1, when the trial has several (proxy.seeds > 1)

Reading needs pydantic only (no torch, no ray), so `status` and `report` start instantly
and work on a sweep that is still running. :func:`read_trials` is the one reader of the
records: `status`, `report` and `export` skip an unreadable record and name it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from typing_extensions import TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from pydantic_core import from_json

from nas.errors import LoopnasError

from runners.checkpoint import (
    CHECKPOINT,
    atomic,
    write_text,  # the one atomic write (re-exported: records use it)
)

from .status import ReplicateStatus, Status, TrialStatus

Direction = Literal["minimize", "maximize"]
EXPERIMENT = "experiment.json"
TRIALS = "trials"
JOURNAL = "study.journal"
# bytes: a file larger than its cap is damage, not data, and is never read whole. A trial
# record is about 2.5 kB per replicate plus 250 bytes per rung and replicate (8 MB: 30,000
# rungs); read, it takes about 20 times its size in memory.
MAX_RECORD = 8 << 20
MAX_EXPERIMENT = 4 << 20  # experiment.json (its space is at most nas.load.MAX_BYTES), calibration.json
# one line of study.journal: Optuna's entries (a trial's parameter, state or attribute) are
# well under a kilobyte; longer is no entry a study wrote, and it is never read whole
MAX_ENTRY = 16 << 20
MAX_POINTS = 1025  # points of one trial or replicate: one per loop count (nas.spec.MAX_LOOPS) and the spec's own
MAX_REPLICATES = 1024


class _Record(BaseModel):
    # a diverged metric is written as NaN, not null, so the record still reads back
    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="constants")


class Objective(_Record):
    """One objective: a quality metric measured by the proxy (``acc``, ``eval_loss``,
    ``n_max``), a serving cost measured on the trained model (``decode_latency_ms``,
    ``peak_memory_bytes``, ...: ``nas.space.SERVING_METRICS``) or a cost-model quantity
    known before training (``projection_flops``, ``unique_params``, ``kv_bytes``, ...)."""

    name: str
    direction: Direction
    measured: bool = Field(description="True for a proxy or serving metric, False for a cost-model value")
    serving: bool = Field(False, description="a measured serving cost (experiments written before "
                                             "serving objectives have none)")

    @property
    def quality(self) -> bool:
        """The proxy's quality metric: measured, not a serving cost."""
        return self.measured and not self.serving

    @property
    def metric(self) -> str:
        """The metric's name without its context and batch (``kv_bytes@4096``, ``cache_bytes/b4``)."""
        from nas.space import objective_metric
        return objective_metric(self.name)


class Rung(_Record):
    """One evaluation of a running trial: at ``step`` optimizer steps, its metrics."""

    step: int
    tokens: int = 0
    quality: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


class Point(_Record):
    """One (quality, cost) point a trial contributes to the front: ``k`` is the loop count
    an elastic checkpoint was evaluated at (None: the spec's own loops). ``values`` holds
    every objective by name: a trial's point is the mean over its replicates, ``se`` each
    objective's standard error over them (0 for cost-model objectives; NaN with one
    replicate: noise unknown) and ``n`` how many replicates it averages."""

    k: int | None = None
    values: dict[str, float]
    se: dict[str, float] = Field(default_factory=dict)
    n: int = 1


class Replicate(_Record):
    """One seed of a candidate: its own training run (initialisation and data order), on
    the eval batches every replicate and candidate share."""

    index: int
    seed: int
    status: ReplicateStatus = Status.QUEUED.value
    reason: str | None = None
    rungs: list[Rung] = Field(default_factory=list)
    points: list[Point] = Field(default_factory=list)
    crashed: bool = False
    node: str | None = None
    devices: list[str] = Field(default_factory=list, description="the GPU ids it was given (its "
                               "CUDA_VISIBLE_DEVICES), or ['cpu']; runners.sweep.devices")
    ran_on: Literal["cuda", "cpu"] | None = Field(None, description="where the model trained: 'cpu' for "
                                                  "a GPU job in a process without CUDA")
    peak_memory: int | None = Field(None, description="the CUDA allocator's peak bytes (None on CPU)")
    retried: str | None = Field(None, description="why it was rerun alone on a whole device: the "
                                "out-of-memory error it met while sharing one (search.on_oom)")
    started: float | None = None
    finished: float | None = None
    wall_time: float | None = None


class TrialRecord(_Record):
    id: str
    number: int
    status: TrialStatus
    reason: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    spec_hash: str | None = None
    arch: dict[str, Any] | None = Field(None, description="the canonical spec (model_dump)")
    summary: str | None = Field(None, description="one line: what the architecture is")
    cost: dict[str, Any] | None = Field(None, description="CostSheet.to_dict() at the space's seq_len")
    points: list[Point] = Field(default_factory=list)
    rungs: list[Rung] = Field(default_factory=list)
    duplicate_of: str | None = None
    violations: list[str] = Field(default_factory=list)
    seed: int = 0
    replicates: list[Replicate] = Field(default_factory=list, description="one per seed; "
                                        "points and rungs above are their means")
    crashed: bool = Field(False, description="a failure of the process (killed, native crash), "
                          "not of the candidate: a later identical candidate is trained again")
    node: str | None = Field(None, description="the host that trained it")
    devices: list[str] = Field(default_factory=list, description="the devices its replicates were given "
                               "(GPU ids, or 'cpu')")
    peak_memory: int | None = Field(None, description="the largest CUDA peak of its replicates, bytes")
    started: float | None = None
    finished: float | None = None
    wall_time: float | None = None

    @property
    def values(self) -> dict[str, float]:
        """The objectives at the spec's own loop count (the last point for elastic trials)."""
        return self.points[-1].values if self.points else {}


EXPERIMENT_FORMAT = 2
"""The version of ``experiment.json``: 2 names the sweep's engine ``engine`` (1, unversioned:
``backend``); :meth:`ExperimentRecord.migrate` reads every earlier one."""


class ExperimentRecord(_Record):
    format: int = Field(EXPERIMENT_FORMAT, description="the record's version (EXPERIMENT_FORMAT)")
    name: str
    space: dict[str, Any]
    objectives: list[Objective]
    engine: str = Field(description="what ran the trials: optuna (local workers), ray, or oneshot")
    trials: int
    seed: int = 0
    seeds: int = Field(1, description="replicates per candidate")
    created: float
    seq_len: int = Field(description="context the cost sheets and kv_bytes are priced at")
    storage: str | None = Field(None, description="the RDB study as the sweep opened it (study_storage); "
                                "None: the journal in the directory")
    identity: dict[str, str] | None = Field(None, description="nas.space.identity at start (the base spec's, "
                                            "a Python space's source, the proxy's and the objectives' hashes), "
                                            "compared on a resume; None: written before it was kept")

    @model_validator(mode="before")
    @classmethod
    def migrate(cls, data: Any) -> Any:
        """An experiment written at an earlier :data:`EXPERIMENT_FORMAT`, brought to this one:
        format 1 (no ``format`` key) named the engine ``backend``."""
        if isinstance(data, dict) and data.get("format", 1) == 1 and "backend" in data and "engine" not in data:
            data = {k: v for k, v in data.items() if k != "backend"} | {"engine": data["backend"], "format": 2}
        return data


class RecordError(LoopnasError):
    """A file of the experiment directory cannot be read: one line naming it."""


@dataclass(frozen=True)
class Unreadable:
    """A trial record :func:`read_trials` skipped: the file and why, in words."""

    path: Path
    why: str

    def __str__(self) -> str:
        return f"{self.path}: unreadable trial record ({self.why})"


def write_json(path: Path, data: BaseModel | dict) -> None:
    """Write a record atomically (:func:`write_text`)."""
    write_text(path, data.model_dump_json(indent=2) if isinstance(data, BaseModel) else json.dumps(data, indent=2))


def trial_path(exp_dir: Path, trial_id: str) -> Path:
    return Path(exp_dir) / TRIALS / f"{trial_id}.json"


def run_dir(exp_dir: str | Path, record: TrialRecord, replicate: int | None = None) -> Path:
    """Where a trial's training run writes its ``checkpoint.pt`` and ``result.json``: the one
    rule the driver writes by and export reads by. A trial of one run (one seed, a one-shot
    sub-network, a record from before replicates) uses ``trials/<id>/``; replicate ``i`` of
    a seeded trial ``trials/<id>/s<i>/``, and there ``replicate`` must name one."""
    base = Path(exp_dir) / TRIALS / record.id
    indices = [r.index for r in record.replicates]
    if len(indices) <= 1:
        if replicate not in (None, *indices, 0):
            raise RecordError(f"trial {record.id} has one run; it has no replicate {replicate}")
        return base
    if replicate is None:
        raise RecordError(f"trial {record.id} has {len(indices)} replicates; name one of {indices}")
    if replicate not in indices:
        raise RecordError(f"trial {record.id} has no replicate {replicate} (it has {indices})")
    return base / f"s{replicate}"


def checkpoint_of(exp_dir: str | Path, record: TrialRecord, replicate: int | None = None) -> Path:
    """The trainer checkpoint of a trial, or of one of its replicates (:func:`run_dir`)."""
    return run_dir(exp_dir, record, replicate) / CHECKPOINT


class Skipped(ValueError):
    """Why :func:`read_bounded` refused a file, in words."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def read_bounded(path: str | Path, cap: int = MAX_RECORD) -> bytes:
    """The bytes of the regular file at ``path``: the one read of a file of an experiment
    directory. Never blocks (a FIFO is opened non-blocking and refused), never reads more
    than ``cap`` bytes (a device's size is 0 and it never ends): :class:`Skipped` says why
    a file is refused; OSError is left as it is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Skipped(f"{_kind(info.st_mode)}, not a file")
        chunks, size = [], 0
        while size <= cap and info.st_size <= cap:  # the file may grow while it is read
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap or info.st_size > cap:
            raise Skipped(f"larger than {cap / (1 << 20):g} MB")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _unusable(record: BaseModel) -> str:
    """Why a well-formed trial record cannot be used (status and report would trip on it)."""
    if not isinstance(record, TrialRecord):
        return ""
    if len(record.replicates) > MAX_REPLICATES:
        return f"{len(record.replicates)} replicates (at most {MAX_REPLICATES})"
    for where, points in [("", record.points)] + [(f"replicate {r.index}: ", r.points) for r in record.replicates]:
        ks = [p.k for p in points]
        if len(ks) > MAX_POINTS or len(set(ks)) < len(ks):
            return f"{where}{len(ks)} points for {len(set(ks))} loop counts (one point per loop count)"
        for p in points:
            bad = [n for n, se in p.se.items() if se < 0 or math.isinf(se)]
            if bad:
                return f"{where}standard error of {bad[0]} is {p.se[bad[0]]} (not a standard error)"
            if p.n < 1:
                return f"{where}a point of {p.n} replicates"
    return ""


def read_record(path: str | Path, model: type[BaseModel],
                cap: int = MAX_RECORD) -> tuple[BaseModel | None, str]:
    """The file read as ``model`` (:func:`read_bounded`, at most ``cap`` bytes), or None and
    why it cannot be, in words."""
    return _why(Path(path), model, cap)


def read_optional(path: str | Path, model: type[BaseModel], cap: int = MAX_RECORD) -> BaseModel | None:
    """The file read as ``model``, or None: when there is none, and when it cannot be read,
    with one warning line on stderr naming it and why (``loopnas.records``'s log)."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    record, why = _why(path, model, cap)
    if record is None:
        logging.getLogger("loopnas.records").warning("warning: %s: unreadable (%s); skipped", path, why)
    return record


def _why(path: Path, model: type[BaseModel], cap: int = MAX_RECORD) -> tuple[BaseModel | None, str]:
    """The file read as ``model``, or why it cannot be, in words."""
    from pydantic import ValidationError

    try:
        text = read_bounded(path, cap).decode("utf-8")
        record = model.model_validate_json(text)
        why = _unusable(record)
        return (None, why) if why else (record, "")
    except Skipped as exc:
        return None, str(exc)
    except OSError as exc:
        return None, exc.strerror or type(exc).__name__
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start}"
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            return None, f"not JSON, torn or overwritten: {first['msg']}"
        where = ".".join(map(str, first["loc"])) or "the top level"
        return None, f"{exc.error_count()} validation errors, first: {where}: {first['msg']}"


def read_experiment(exp_dir: str | Path) -> ExperimentRecord:
    """The experiment record; a missing one is FileNotFoundError, an unreadable one a
    :class:`RecordError` naming the file."""
    path = Path(exp_dir) / EXPERIMENT
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{exp_dir} is not an experiment directory (no {EXPERIMENT})")
    record, why = _why(path, ExperimentRecord, MAX_EXPERIMENT)
    if record is None:
        raise RecordError(f"{path}: unreadable experiment record ({why}); restore it from a copy, "
                          "or run the sweep again with another --out")
    return record


def read_trials(exp_dir: str | Path, problems: list[Unreadable] | None = None) -> list[TrialRecord]:
    """Every trial record, by trial number: the one reader of ``EXP/trials/``. An unreadable
    record (torn, not UTF-8, not a record, not a regular file, over :data:`MAX_RECORD`, or
    one status and report cannot use: a negative standard error, two points at one loop
    count) is appended to ``problems`` and skipped; without ``problems`` it is a
    :class:`RecordError` naming the file."""
    records = []
    for path in sorted((Path(exp_dir) / TRIALS).glob("t*.json")):
        record, why = _why(path, TrialRecord)
        if record is not None:
            records.append(record)
        elif problems is None:
            raise RecordError(f"{Unreadable(path, why)}; restore it or move it out of {path.parent}")
        else:
            problems.append(Unreadable(path, why))
    return sorted(records, key=lambda r: r.number)


INDEX = "index.json"  # EXP/index.json: a digest of every trial record, kept by its readers
INDEX_MORE = "index.more.json"  # the rest of each digest: what the report reads beyond status
_HEAVY = ("ops", "extras", "projection_flops_breakdown")  # cost-sheet detail no reader of many trials needs


def arch_problem(arch: dict | None) -> str:
    """Why a trial's canonical spec does not validate (status and report draw and reprice
    it), or ''."""
    if arch is None:
        return ""
    from pydantic import ValidationError

    from nas.spec import stored_spec
    try:
        stored_spec(arch)
    except (ValidationError, ValueError, TypeError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else {"loc": (), "msg": str(exc)}
        where = ".".join(map(str, first["loc"])) or "the top level"
        return f"arch is not a valid spec: {where}: {first['msg']}"
    return ""


_BRIEF = {"id", "number", "status", "reason", "node", "devices", "points", "summary"}


class _DigestPoint(TypedDict):
    k: int | None
    values: dict[str, float]
    se: dict[str, float]
    n: int


class _Brief(TypedDict):
    """A :func:`digest` without its ``"more"``: what status reads of each record."""

    id: str
    number: int
    status: TrialStatus
    reason: str | None
    summary: str | None
    points: list[_DigestPoint]
    node: str | None
    devices: list[str]
    reps: list[tuple[int, int, ReplicateStatus, list[tuple[int | None, dict[str, float]]]]]
    has_arch: bool


_BRIEF_DIGEST = TypeAdapter(_Brief)


def brief(data: dict) -> dict:
    """A digest's brief part as a reader of digests can trust it (iter_index's ``use``: 50 ms
    for 10,000), with its ``"more"`` as it was; pydantic's ValidationError where it is not
    one (a line planted, or written by another version of the digest)."""
    out = _BRIEF_DIGEST.validate_python(data)
    if "more" in data:
        out["more"] = data["more"]
    return out


def digest(record: TrialRecord) -> dict:
    """What a reader of many trials needs of one record, as JSON data a :class:`TrialRecord`
    validates from (:func:`undigest`): its status, devices, summary and points, under
    ``"reps"`` its replicates' ``[index, seed, status, [[k, values], ...]]``, ``"has_arch"``
    whether it has a spec; under ``"more"``, the rest but the canonical spec (``arch_problem``
    says whether it is valid), replicate rungs and
    timings and the cost sheet's per-op detail, with rungs as ``[step, quality]``."""
    data = record.model_dump(mode="json", include=_BRIEF)
    data["reps"] = [[r.index, r.seed, r.status, [[p.k, p.values] for p in r.points]] for r in record.replicates]
    more = record.model_dump(mode="json", exclude=_BRIEF | {"arch", "violations", "replicates", "rungs", "cost"})
    more["rungs"] = [[r.step, r.quality] for r in record.rungs]
    if record.cost is not None:
        cost = {k: v for k, v in record.cost.items() if k not in _HEAVY}
        if isinstance(cost.get("per_k"), dict):
            cost["per_k"] = {k: {f: x for f, x in v.items() if f not in _HEAVY} if isinstance(v, dict) else v
                             for k, v in cost["per_k"].items()}
        more["cost"] = cost
    more["arch_problem"] = arch_problem(record.arch)
    data["has_arch"] = record.arch is not None  # export picks among trials with a spec
    data["more"] = more
    return data


class _SharedNames(set):
    """The names of the fields a record was given (pydantic's ``__pydantic_fields_set__``),
    one object for every record read from a digest that was given the same ones: pydantic
    keeps a set per model, 2.2 kB for a trial record's 20 names, and 10,000 digests with
    their points and rungs held 32 MB of equal sets (the report's peak memory,
    ``benchmarks/bench_status_scale.py``). Shared, so read-only: assigning a field the
    digest gave is as usual, one it did not raises (use ``model_copy``, whose copy is a set of
    its own)."""

    _known: dict[frozenset, _SharedNames] = {}

    @classmethod
    def of(cls, names: set[str]) -> _SharedNames:
        key = frozenset(names)
        if key not in cls._known:
            cls._known[key] = cls(key)
        return cls._known[key]

    def __copy__(self) -> set[str]:
        return set(self)

    def copy(self) -> set[str]:
        return set(self)

    def add(self, name: str) -> None:  # pydantic's assignment to a field: a no-op for one already set
        if name not in self:
            self._read_only()

    def _read_only(self, *args: object) -> None:
        raise TypeError("the field names of a record read from a digest are shared: model_copy(update=...) it")

    discard = remove = pop = clear = update = difference_update = _read_only
    intersection_update = symmetric_difference_update = _read_only
    __ior__ = __iand__ = __isub__ = __ixor__ = _read_only  # type: ignore[assignment]


def _share_names(model: BaseModel) -> None:
    object.__setattr__(model, "__pydantic_fields_set__", _SharedNames.of(model.__pydantic_fields_set__))


def undigest(data: dict, more: bool = False, replicates: bool = True, rungs: bool = True) -> TrialRecord:
    """The :class:`TrialRecord` a :func:`digest` keeps (with its ``"more"`` when ``more``;
    with no replicates unless ``replicates``, no rungs unless ``rungs``: a reader of 10,000
    candidates that ranks from the digest's ``"reps"`` itself keeps 50,000 small records out
    of memory, and one that reads the rungs as :func:`digest_rungs` 40,000). Its models share
    their field-name sets (:class:`_SharedNames`): read-only, as a reader keeps them."""
    replicates = [{"index": i, "seed": seed, "status": status, "points": [{"k": k, "values": v} for k, v in points]}
                  for i, seed, status, points in data["reps"]] if replicates else []
    brief = {k: v for k, v in data.items() if k not in ("reps", "more", "has_arch")}
    rest = {}
    if more:
        rest = {k: v for k, v in data["more"].items() if k != "rungs"}
        if rungs:
            rest["rungs"] = [{"step": step, "quality": quality} for step, quality in _RUNGS.validate_python(
                data["more"].get("rungs", []))]
    record = TrialRecord.model_validate({**brief, "replicates": replicates, **rest})
    for model in (record, *record.points, *record.rungs, *record.replicates,
                  *(p for r in record.replicates for p in r.points)):
        _share_names(model)
    return record


_RUNGS = TypeAdapter(list[tuple[int, float | None]])


def digest_rungs(data: dict) -> array:
    """A :func:`digest`'s rungs (its ``"more"``), flattened: step, quality, step, quality, ...
    (quality NaN where the rung has none), 100 bytes where as :class:`Rung` models they take
    1.5 kB. Not rungs as a digest holds them: pydantic's ValidationError."""
    return array("d", [x for step, quality in _RUNGS.validate_python(data["more"].get("rungs", []))
                       for x in (step, math.nan if quality is None else quality)])


_INDEX_SLACK = 1 << 10  # bytes of an index per record beyond the record's own size


def _size(entry: os.DirEntry) -> int:
    try:
        return entry.stat().st_size  # cached by the entry: _version reads it again for free
    except OSError:
        return 0


def _version(entry: os.DirEntry) -> list[int]:
    st = entry.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino]


INDEX_FORMAT = 3
"""The index files' version: 3 is JSON lines (a header, then one ``[file name, version,
part]`` line per record in file-name order), so a reader holds one parsed digest at a time;
2 (one JSON object) took the 10,000-candidate report's memory 100 MB up while it parsed. An
index of another version is not read: the records are read again and it is rewritten."""
_HEADER = json.dumps({"format": INDEX_FORMAT}).encode() + b"\n"


class _IndexFile:
    """One index file's lines, parsed one at a time as the records' entries (in file-name
    order) ask for them: :meth:`take`. A line that is not ``[name, version, part]`` (torn,
    planted, out of order) is passed over, and its record read again."""

    def __init__(self, path: Path, cap: int):
        try:
            self.data = read_bounded(path, cap)
        except (OSError, Skipped):
            self.data = b""
        self.pos = len(_HEADER) if self.data.startswith(_HEADER) else len(self.data)
        self.lines = self.data.count(b"\n", self.pos)  # the entries it holds (its records, when current)
        self.head: tuple[str, Any, Any, bytes] | None = None

    def _next(self) -> tuple[str, Any, Any, bytes] | None:
        while self.pos < len(self.data):
            end = self.data.find(b"\n", self.pos)
            end = len(self.data) if end < 0 else end
            line, self.pos = self.data[self.pos:end], end + 1
            try:  # pydantic's parser: its cache shares the strings 10,000 digests repeat (names, keys)
                name, version, part = from_json(line)
            except (ValueError, TypeError):
                try:  # json's: a file name that is not UTF-8 (a lone surrogate escaped), which from_json refuses
                    name, version, part = json.loads(line)
                except (ValueError, TypeError):
                    continue
            if isinstance(name, str) and isinstance(part, dict):
                return name, version, part, line
        return None

    def take(self, name: str) -> tuple[Any, Any, bytes] | None:
        """The ``(version, part, line)`` of file ``name``, or None; lines of names before it
        (records gone) are passed over."""
        while True:
            if self.head is None:
                self.head = self._next()
                if self.head is None:
                    return None
            if self.head[0] > name:
                return None
            head, self.head = self.head, None
            if head[0] == name:
                return head[1:]


def _line(name: str, version: list[int], part: dict) -> bytes:
    return json.dumps([name, version, part], separators=(",", ":")).encode() + b"\n"


_NONE = object()  # iter_index: no usable digest yet


def iter_index(exp_dir: str | Path, problems: list[Unreadable] | None = None, more: bool = False,
               use: Callable[[dict], Any] | None = None) -> Iterator[Any]:
    """The :func:`digest` of every readable trial record, in file-name order (``"more"`` a
    dict, or absent unless ``more``), one at a time, or what ``use`` makes of each:
    incremental. ``EXP/index.json`` (``index.more.json`` for the rest) keeps each record's
    digest beside the file's size, modification time and inode (records are replaced whole,
    so a new version has a new inode); a record whose file changed, and only such, is read
    again (:func:`read_trials`'s rules, its problems appended to ``problems``), as is one
    whose kept digest ``use`` refuses (ValueError, pydantic's among them, TypeError,
    KeyError, IndexError, ArithmeticError: a planted line, or one of another version); and
    both files are rewritten atomically once the last is yielded when anything changed (not
    at all where the directory cannot be written: the next reader reads again). Memory: the
    index files' bytes and the digest being yielded; a reader that keeps each as a record
    never holds 10,000 parsed digests."""
    exp_dir = Path(exp_dir)
    trials = exp_dir / TRIALS
    try:
        entries = sorted((e for e in os.scandir(trials) if e.name.startswith("t") and e.name.endswith(".json")),
                         key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        entries = []
    # a digest is a part of its record: an index larger than the records it digests (and a
    # little more) is not theirs, and is not read (a planted 250 MB one took status past 500 MB)
    cap = min(64 * MAX_EXPERIMENT, _INDEX_SLACK * (len(entries) + 64) + sum(_size(e) for e in entries))
    files = [_IndexFile(exp_dir / INDEX, cap)] + ([_IndexFile(exp_dir / INDEX_MORE, cap)] if more else [])
    kept: list[tuple[str, list[int], list[bytes] | None]] = []  # each entry's lines: the old ones, or new ones
    hits = 0
    for entry in entries:
        try:
            version = _version(entry)
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            path = Path(entry.path)
            if problems is None:
                raise RecordError(f"{Unreadable(path, why)}; restore it or move it out of {trials}") from None
            problems.append(Unreadable(path, why))
            continue
        found = [f.take(entry.name) for f in files]
        out = _NONE
        if all(h is not None and h[0] == version for h in found):
            parts = [h[1] for h in found]  # type: ignore[index]
            data = {**parts[0], "more": parts[1]} if more else parts[0]
            try:
                out = data if use is None else use(data)
            except (ValueError, TypeError, KeyError, IndexError, ArithmeticError):
                pass  # not a digest this reader can use: the record is read again
        if out is not _NONE:
            kept.append((entry.name, version, None))
            hits += 1
        else:
            path = Path(entry.path)  # only for a record read again (10,000 Paths cost status 0.1 s)
            record, why = _why(path, TrialRecord)
            if record is None:
                if problems is None:
                    raise RecordError(f"{Unreadable(path, why)}; restore it or move it out of {trials}")
                problems.append(Unreadable(path, why))
                continue
            brief = digest(record)
            parts = [brief, brief.pop("more")]
            kept.append((entry.name, version, [_line(entry.name, version, p) for p in parts]))
            data = {**parts[0], "more": parts[1]} if more else parts[0]
            out = data if use is None else use(data)
        yield out
    if any(hits != f.lines for f in files) or len(kept) != hits:
        del files
        _write_index(exp_dir, kept, more, cap)


def read_index(exp_dir: str | Path, problems: list[Unreadable] | None = None, more: bool = False) -> list[dict]:
    """:func:`iter_index`'s digests (their brief part checked: :func:`brief`) in a list, by
    trial number."""
    return sorted(iter_index(exp_dir, problems, more, use=brief), key=lambda d: d["number"])


def _write_index(exp_dir: Path, kept: list[tuple[str, list[int], list[bytes] | None]], more: bool, cap: int) -> None:
    """Both index files, atomically, line by line: each entry's line the old one where its
    record was unchanged (read again here, one file at a time), else its new one; the second
    file's old lines are kept as they are where the reader did not load it (their versions
    are checked when it is read)."""
    try:
        for n, name in enumerate((INDEX, INDEX_MORE)):
            old = _IndexFile(exp_dir / name, cap)
            with atomic(exp_dir / name) as tmp, tmp.open("wb") as f:
                f.write(_HEADER)
                for file, version, new in kept:
                    if new is not None:
                        f.write(new[n])
                        continue
                    found = old.take(file)
                    if found is not None and (found[0] == version or (n and not more)):
                        f.write(found[2] + b"\n")
            del old
    except OSError:
        pass


def repair_journal(path: Path) -> int:
    """Check the study's journal before it is opened: a torn last entry (a write cut short
    by a kill or a full disk: Optuna never replayed it) is cut off, so the next append does
    not glue onto it; returns the bytes cut. Damage before the last entry is a
    :class:`RecordError` naming the file and the entry; so is an entry longer than
    :data:`MAX_ENTRY` (no study writes one: not a write cut short), read no further than
    that, wherever it is."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(mode):  # Optuna would block on a FIFO, read a device forever, write through a link
        what = "a symbolic link" if stat.S_ISLNK(mode) else _kind(mode)
        raise RecordError(f"{path} is {what}, not the study's journal file; move it away, or run the sweep "
                          "again with another --out")
    good, number = 0, 0
    with path.open("rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_ENTRY + 1), b""), start=1):
            if len(line) > MAX_ENTRY:
                raise RecordError(f"{path}: entry {number} (byte {good}) is longer than {MAX_ENTRY >> 20} MB, "
                                  "which no study writes, so the study cannot be replayed; restore the file "
                                  "from a copy, or run the sweep again with another --out")
            try:
                json.loads(line)
                whole = line.endswith(b"\n")
            except ValueError:
                whole = False
            if not whole:
                if f.read(1):
                    raise RecordError(f"{path}: entry {number} (byte {good}) is damaged, so the study "
                                      "cannot be replayed; restore the file from a copy, or run the sweep "
                                      "again with another --out (the trial records are intact)")
                break
            good += len(line)
    size = path.stat().st_size
    if size > good:
        os.truncate(path, good)
    return size - good


def study_storage(exp_dir: str | Path, url: str | None) -> str:
    """Where the study lives: the journal in the experiment directory, or the RDB URL with
    its password hidden (a relative SQLite path made absolute)."""
    if not url:
        return str(Path(exp_dir) / JOURNAL)
    url = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
    m = re.match(r"(sqlite[^:]*:///)([^?]+)(.*)", url)
    if m and m.group(2) != ":memory:" and not m.group(2).startswith("/"):
        url = m.group(1) + str(Path(m.group(2)).resolve()) + m.group(3)
    return url


__all__ = ["Direction", "Objective", "Rung", "Point", "Replicate", "TrialRecord", "ExperimentRecord",
           "EXPERIMENT_FORMAT", "RecordError", "Unreadable", "write_text", "write_json", "trial_path", "read_experiment", "read_trials",
           "run_dir", "checkpoint_of", "INDEX", "INDEX_MORE", "arch_problem", "digest", "read_index", "undigest",
           "repair_journal", "study_storage", "read_bounded", "read_record", "read_optional", "Skipped",
           "EXPERIMENT", "TRIALS", "JOURNAL", "MAX_RECORD", "MAX_EXPERIMENT"]
