"""A one-shot sweep: a sweep whose trials evaluate instead of train.

The supernet is trained once (``EXP/supernet/``: the trainer's checkpoint and result).
Then the search (beam or exhaustive, :mod:`nas.oneshot`) asks for sub-networks; each one,
at each searched loop count, goes through the sweep driver like any candidate: the study
gets its parameters (``layer{i}``, ``T``) as an enqueued trial, the gate prices it and
records its canonical spec and cost sheet, and its quality is measured on the proxy's
fixed eval batches with the supernet's weights (every switch fixed, the loop count
fixed), in this process. The experiment directory is therefore the one every sweep
writes; ``status``, ``report`` and ``export`` read it unchanged. At the end the front's
sub-networks are extracted with their inherited weights into ``trials/<id>/``
(``checkpoint.pt`` for ``export --with-weights`` and ``train --init-from``, ``spec.yaml``).

With ``oneshot.remedy`` (:mod:`runners.oneshot.remedies`) the supernet may train there
instead (sandwich sampling, few-shot branches, per-loop gates), a sub-network is scored with
its branch's weights and its loop count's gates, and with ``finetune`` it trains a few
steps from them before it is scored (:class:`Scorer`); the front is extracted as scored.
"""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import yaml

from builders.model import LoopLM, build_model
from nas import oneshot as one
from nas.space import Space
from nas.spec import ArchSpec
from runners.checkpoint import CHECKPOINT, run_folder, save, write_text
from runners.results.front import front
from runners.results.records import TRIALS, Rung, write_json
from runners.sweep.driver import Sweep
from runners.sweep.outcome import Measured, Outcome
from runners.tasks import make_task
from runners.train import eval_batches, evaluate

from .remedies import Supernets, finetune, finetune_config, finetune_steps, train_remedied
from .supernet import eval_task, load_supernet, supernet_config, train_supernet
from runners.weights import inherit

SUMMARY = "oneshot.json"


class BudgetSpent(Exception):
    """The sweep's trial budget ran out before the search finished."""


def extract(model: LoopLM, net: ArchSpec, pattern: Sequence[int], loops: int | None
            ) -> tuple[ArchSpec, LoopLM]:
    """A sub-network as a plain model holding the supernet's weights."""
    arch = one.subnet(net, pattern, loops)
    sub = build_model(arch, backend=model.backend, device=next(model.parameters()).device)
    left = inherit(sub, arch, model.state_dict(), net)
    assert not left, f"tensors with no supernet counterpart: {left}"
    return arch, sub.eval()


def save_subnet(folder: Path, arch: ArchSpec, sub: LoopLM) -> None:
    """``checkpoint.pt`` (spec and weights, as the trainer writes them) and ``spec.yaml``,
    in ``trials/<id>/``: a symlink planted there is replaced, never written through."""
    run_folder(folder.parent, folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = arch.model_dump(mode="json")
    save(folder / CHECKPOINT, {"arch": data, "model": sub.state_dict()})
    write_text(folder / "spec.yaml", yaml.safe_dump(data, sort_keys=False))  # never through a link


class Scorer:
    """What a sub-network is scored with: the supernet's weights (its branch's supernet,
    its loop count's gates: :meth:`Supernets.model_for`), or, with
    ``oneshot.remedy.finetune``, the extracted sub-network after :func:`finetune` of
    ``finetune_steps`` steps (rerun, deterministically, when the front is extracted)."""

    def __init__(self, nets: Supernets, space: Space | None = None):
        self.nets, self.tune = nets, None
        if space is not None and space.spec.oneshot.remedy.finetune is not None:
            config = finetune_config(space)
            self.tune = (config, make_task(config.task, **config.task_params), finetune_steps(space))

    def subnet(self, pattern: Sequence[int], loops: int | None) -> tuple[ArchSpec, LoopLM]:
        """The sub-network with the weights it is scored with."""
        arch, sub = extract(self.nets.model_for(pattern, loops), self.nets.net, pattern, loops)
        return (arch, sub) if self.tune is None else (arch, finetune(sub, *self.tune))

    def evaluate(self, task, batches: list, pattern: Sequence[int], loops: int | None) -> dict[str, float]:
        if self.tune is None:
            return evaluate(self.nets.model_for(pattern, loops), task, batches, loops=loops, pattern=pattern)
        return evaluate(self.subnet(pattern, loops)[1], task, batches)


class OneShotSearch:
    """Evaluates sub-networks as trials of ``sweep``; see the module docstring."""

    def __init__(self, sweep: Sweep, scorer: Scorer, task, batches: list,
                 on_change: Callable[[], None] = lambda: None):
        self.sweep, self.scorer, self.task, self.batches = sweep, scorer, task, batches
        self.net = scorer.nets.net
        self.space: Space = sweep.space
        self.metric = sweep.quality  # the one quality objective (a one-shot space has no serving ones)
        self.on_change = on_change
        self.steps = 0  # the supernet's training steps: the rung every evaluation reports at
        self.patterns: dict[str, tuple[tuple[int, ...], int | None]] = {}  # trial id → subnet

    def _key(self, params: dict) -> str:
        return json.dumps(params, sort_keys=True)

    def _done(self, params: dict):
        key = self._key(params)
        return next((r for r in self.sweep.records.values() if self._key(r.params) == key
                     and r.status in ("complete", "duplicate", "infeasible", "failed")), None)

    def quality(self, pattern: Sequence[int], loops: int | None) -> float | None:
        """The sub-network's measured objective (a trial, run once)."""
        params = one.trial_params(self.space, pattern, loops)
        record = self._done(params)
        while record is None:
            if self.sweep.budget_used() >= self.sweep.total:
                raise BudgetSpent
            if not self.sweep.study_adapter.waiting():  # a resumed sweep first re-runs its interrupted trials
                self.sweep.study.enqueue_trial(params, skip_if_exists=False)
            self._next()
            record = self._done(params)
        self.patterns[record.duplicate_of or record.id] = (tuple(pattern), loops)
        return record.values.get(self.metric.name)

    def _next(self) -> None:
        """Ask the study for its next trial (an enqueued one) and settle it."""
        trial = self.sweep.study.ask()
        jobs = self.sweep.gate(trial)
        if jobs:
            self.sweep.queue.extend(jobs)
            job = self.sweep.next_job()  # the gated candidate's one replicate
            record = self.sweep.records[job.trial]
            names = one.mixer_names(self.space)
            pattern = [names.index(record.params[f"layer{i}"]) for i in range(self.net.L)]
            start = time.time()
            metrics = self.scorer.evaluate(self.task, self.batches, pattern, record.params.get("T"))
            end = time.time()
            value = metrics[self.metric.metric]
            self.sweep.on_outcome(job.id, Outcome(
                status="complete", measured=(Measured(value=value, metrics=metrics),),
                rungs=(Rung(step=self.steps, quality=value, metrics=metrics),),
                started=start, finished=end, wall_time=end - start, node=socket.gethostname()))
        self.on_change()

    def score(self, pattern: Sequence[int]) -> float | None:
        """A placement's score (higher is better): its quality at ``score_loops``; every
        searched loop count is evaluated (each a trial)."""
        loops = one.loop_choices(self.space)
        k = self.space.spec.oneshot.search.score_loops or loops[-1]
        values = {t: self.quality(pattern, t) for t in loops}
        value = values[k]
        return None if value is None else value if self.metric.direction == "maximize" else -value


def planned(space: Space) -> int:
    """Trials the search may run: every placement at every loop count (exhaustive), or
    at most the beam's start, plus width × moves per step, at every loop count."""
    from nas.space import grid_size

    everything = grid_size(space)
    search = space.spec.oneshot.search
    if search.strategy == "exhaustive":
        return everything
    counts, nk = one.counts(space), len(one.loop_choices(space))
    moves = len(one.swaps(tuple(i for i, c in enumerate(counts) for _ in range(c))))
    return min(everything, (len(one.RULES) + (search.depth or sum(counts)) * search.width * moves) * nk)


def search(space: Space, run: OneShotSearch) -> tuple[tuple[int, ...], dict]:
    """Beam or exhaustive search over placements at the space's counts."""
    s, counts = space.spec.oneshot.search, one.counts(space)
    if s.strategy == "exhaustive":
        scores = {p: run.score(p) for p in one.exhaustive(counts)}
        ranked = {p: v for p, v in scores.items() if v is not None}
        return max(ranked, key=ranked.get) if ranked else None, scores
    start = one.rule_placements(one.mixer_names(space), counts)
    depth = s.depth or sum(c for c in counts if c != max(counts)) or 1
    return one.beam_search(run.score, start, one.swaps, s.width, depth)


def run_oneshot(sweep: Sweep, out: Path, progress: bool = True,
                on_change: Callable[[], None] = lambda: None) -> dict:
    """Train the supernet, search, extract the front; returns the summary (also written
    to ``EXP/oneshot.json``). Runs on ``search.resources.cpu`` threads, like a trial."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(sweep.space.spec.search.resources.cpu)))  # as a sweep's trial
    try:
        return _run(sweep, out, progress, on_change)
    finally:
        torch.set_num_threads(threads)


def _run(sweep: Sweep, out: Path, progress: bool, on_change: Callable[[], None]) -> dict:
    space = sweep.space
    remedy = space.spec.oneshot.remedy
    t0 = time.perf_counter()
    if remedy.trains_supernet:
        trained, nets = train_remedied(space, out / "supernet")
    else:
        result = train_supernet(space, out / "supernet", progress=progress)
        if result.status == "failed":
            raise RuntimeError(f"the supernet's training failed: {result.reason}")
        model, net = load_supernet(space, out / "supernet")
        nets = Supernets(net, {None: model}, {None: None})
        trained = {"steps": result.steps, "wall_time": result.wall_time, "final": result.final}
    trained["wall_time"] = trained["wall_time"] or time.perf_counter() - t0
    config = supernet_config(space)
    task = eval_task(space, config)
    scorer = Scorer(nets, space)
    run = OneShotSearch(sweep, scorer, task, eval_batches(task, config, torch.device(config.device)), on_change)
    run.steps = trained["steps"]
    t1 = time.perf_counter()
    spent = False
    try:
        best, scores = search(space, run)
    except BudgetSpent:
        spent, best, scores = True, None, {}
    names = one.mixer_names(space)
    extracted = []
    for p in front(list(sweep.records.values()), sweep.objectives):
        if p.trial in run.patterns:
            arch, sub = scorer.subnet(*run.patterns[p.trial])
            save_subnet(out / TRIALS / p.trial, arch, sub)
            extracted.append(p.trial)
    summary = {
        "supernet": {"steps": trained["steps"], "wall_time": trained["wall_time"],
                     "final": trained["final"], "sampling": space.spec.oneshot.sampling,
                     "remedy": remedy.names(), "split": trained.get("split")},
        "search": {"strategy": space.spec.oneshot.search.strategy, "evaluations": len(run.patterns),
                   "finetune_steps": scorer.tune[2] if scorer.tune else None,
                   "wall_time": time.perf_counter() - t1, "budget_spent": spent},
        "best": None if best is None else [names[i] for i in best],
        "scores": {",".join(names[i] for i in p): v for p, v in scores.items()},
        "extracted": extracted,
    }
    write_json(out / SUMMARY, summary)
    return summary


__all__ = ["extract", "save_subnet", "Scorer", "OneShotSearch", "search", "run_oneshot",
           "planned", "SUMMARY", "BudgetSpent"]
