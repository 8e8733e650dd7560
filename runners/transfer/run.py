"""``run_transfer``: plan the scales (:func:`prepare`), train them as experiment directories
(:func:`train`, resuming what exists) and compare them with the base scale
(:func:`analyse`). The records are read here; the statistics live in
:mod:`runners.transfer.analysis`."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from .analysis import (
    Measured, ScaleResult, Transfer, compare_scale, extrapolate, front_labels, overall_verdict, scale_verdict,
    shown,
)
from .plan import (
    CANDIDATE, STEPS_RULES, Chosen, PlannedSpace, TransferError, base_space, check_resumable, choose, grow, growth,
    parse_scales, scale_dir, scale_space, steps_multiple,
)

TRANSFER = "transfer"


@dataclass(frozen=True)
class ScaleRun:
    """One scale to train: its label (``2x``, ``2e5``), the width and unique-parameter
    growth it gives (geometric means over the candidates), its directory, space and steps
    multiple."""

    label: str
    factor: float
    params: float
    dir: Path
    space: PlannedSpace
    multiple: float


@dataclass(frozen=True)
class Prepared:
    exp_dir: Path
    out: Path
    record: object  # the sweep's ExperimentRecord
    records: list
    chosen: list[Chosen]
    seeds: int
    steps_rule: str
    candidates: str
    runs: list[ScaleRun]  # a retrained base (1×) first, when there is one
    retrained_base: bool


def measure(record, chosen: Chosen, quality: str, seq_len: int) -> Measured:
    """One candidate's point in ``record`` (a complete trial at some scale): every
    replicate's quality by seed, the mean point's objectives, its cost at that scale."""
    from nas.space import cost_value
    from nas.spec import stored_spec

    m = Measured(label=chosen.label, trial=chosen.trial, k=chosen.k, summary=record.summary,
                 scaled_trial=record.id, status="complete")
    point = next((p for p in record.points if p.k == chosen.k), None)
    if point is None:
        m.status = f"no point at k = {chosen.k}"
        return m
    m.objectives = dict(point.values)
    for rep in record.replicates:
        p = next((p for p in rep.points if p.k == chosen.k), None)
        if rep.status == "complete" and p is not None and quality in p.values:
            m.by_seed[rep.seed] = float(p.values[quality])
    if not record.replicates and quality in point.values:  # one seed, written before replicates
        m.by_seed[record.seed] = float(point.values[quality])
    if record.arch is not None:
        arch, sheets = stored_spec(record.arch), {}
        m.unique_params = cost_value(arch, "unique_params", seq_len, k=chosen.k, sheets=sheets)
        m.projection_flops = cost_value(arch, "projection_flops", seq_len, k=chosen.k, sheets=sheets)
    return m


def base_measures(records: list, chosen: list[Chosen], quality: str, seq_len: int) -> list[Measured]:
    """The chosen points as the sweep measured them."""
    by_id = {r.id: r for r in records}
    out = []
    for c in chosen:
        r = by_id[c.trial]
        out.append(measure(by_id.get(r.duplicate_of, r) if r.status == "duplicate" else r, c, quality, seq_len))
    return out


def scale_measures(exp_dir: Path, chosen: list[Chosen], quality: str) -> list[Measured]:
    """The chosen points in one scale's directory, found by the grown spec's hash that each
    ``candidate`` choice records; a candidate not complete there says why."""
    from runners.results.records import read_experiment, read_trials

    if not (Path(exp_dir) / "experiment.json").is_file():
        return [Measured(c.label, c.trial, c.k, status="not trained") for c in chosen]
    exp = read_experiment(exp_dir)
    hashes = {c["trial"]: c["spec_hash"] for c in exp.space["params"][CANDIDATE]["choices"]}
    records = read_trials(exp_dir)
    done = {r.spec_hash: r for r in records if r.status == "complete"}
    ended = {_base_trial(r, hashes): r for r in records if r.status not in ("complete", "duplicate")}
    out = []
    for c in chosen:
        if hashes.get(c.trial) in done:
            out.append(measure(done[hashes[c.trial]], c, quality, exp.seq_len))
            continue
        r = ended.get(c.trial)
        why = "not trained" if r is None else f"{r.status}: {r.reason}" if r.reason else r.status
        out.append(Measured(c.label, c.trial, c.k, status=why, scaled_trial=r.id if r else None,
                            summary=r.summary if r else None))
    return out


def _base_trial(record, hashes: dict[str, str | None]) -> str | None:
    """The base trial a scale's record grew from: by its hash, or (a spec that could not be
    grown has none) by its ``candidate`` parameter."""
    by_hash = {h: t for t, h in hashes.items() if h}
    if record.spec_hash in by_hash:
        return by_hash[record.spec_hash]
    try:
        return json.loads(record.params.get(CANDIDATE, "null") or "null")["trial"]
    except (TypeError, ValueError, KeyError):
        return None


def prepare(exp_dir: Path, out: Path | None = None, scales: tuple[float, ...] | None = None,
            steps_rule: str = "same", seeds: int | None = None, candidates: str = "front") -> Prepared:
    """Choose the candidates and plan each scale's space (nothing trained or written).
    ``scales``: width multiples, or unique-parameter targets (numbers above 64); default the
    space's ``scales:``, else 2 and 4. The base scale is the sweep itself, unless ``scales``
    holds 1 or the sweep has one seed: then it is retrained at 1× with ``seeds`` (noise
    must be known at the base)."""
    from nas.cost import unique_params
    from nas.space import Scale, resolve_scales
    from runners.results.records import read_experiment, read_trials

    exp_dir = Path(exp_dir)
    if steps_rule not in STEPS_RULES:
        raise TransferError(f"--steps-rule must be one of {', '.join(STEPS_RULES)} (got {steps_rule!r})")
    try:
        record = read_experiment(exp_dir)
    except FileNotFoundError as exc:
        raise TransferError(str(exc)) from None
    space = base_space(exp_dir, record)
    wanted = parse_scales(scales) if scales else (resolve_scales(space) or parse_scales((2.0, 4.0)))
    records = read_trials(exp_dir)
    chosen = choose(records, record.objectives, candidates)
    if len(chosen) < 2:
        raise TransferError(f"{exp_dir}: {len(chosen)} complete candidate(s); transfer compares orders and needs "
                            "at least two (let the sweep finish, or --candidates all)")
    seeds = seeds or (record.seeds if record.seeds > 1 else 3)
    if seeds < 2:
        raise TransferError("--seeds must be at least 2: pairs are judged against seed noise")
    retrained = any(s.factor == 1 for s in wanted) or record.seeds < 2
    wanted = [s for s in wanted if s.factor != 1] + ([Scale("1x", factor=1.0)] if retrained else [])
    by_id = {r.id: r for r in records}
    trials = sorted({c.trial for c in chosen}, key=lambda t: by_id[t].number)  # the scale's ids in the sweep's order
    base = [_arch(by_id[t]) for t in trials]
    out = Path(out) if out is not None else exp_dir / TRANSFER
    runs = []
    for scale in wanted:
        plan = grow(by_id, trials, space.spec, scale)
        ok = [(b, g.arch) for b, g in zip(base, plan) if g.arch is not None]
        width = growth([b.model.width for b, _ in ok], [a.model.width for _, a in ok])
        params = growth([unique_params(b) for b, _ in ok], [unique_params(a) for _, a in ok])
        multiple = steps_multiple(steps_rule, width, params)
        runs.append(ScaleRun(scale.label, width, params, scale_dir(out, scale.label),
                             scale_space(space, plan, scale.label, multiple), multiple))
    runs.sort(key=lambda r: (r.params, r.label))
    return Prepared(exp_dir, out, record, records, chosen, seeds, steps_rule, candidates, runs, retrained)


def _arch(record):
    from nas.spec import stored_spec

    return stored_spec(record.arch)


def train(prep: Prepared, engine: str = "optuna", address: str | None = None, progress: bool = True) -> None:
    """Train every scale (an experiment directory each; one already there is resumed)."""
    from runners.sweep.driver import SweepError
    from runners.sweep.lock import LockError, check_place
    from runners.sweep.run import run_sweep

    try:
        check_place(prep.out)
        prep.out.mkdir(parents=True, exist_ok=True)
    except LockError as exc:
        raise TransferError(str(exc)) from None
    except OSError as exc:
        raise TransferError(f"--out {prep.out}: cannot make this directory ({exc.strerror})") from None
    for run in prep.runs:
        resume = check_resumable(run.space, run.dir)
        try:
            run_sweep(run.space, out=run.dir, engine=engine, resume=resume, address=address, progress=progress,
                      seeds=prep.seeds, planned=run.space.planned())
        except SweepError as exc:
            raise TransferError(str(exc)) from None


def _result(run: ScaleRun | None, d: Path, space, measured: list[Measured], objectives) -> ScaleResult:
    proxy = space.spec.proxy
    factor, label, multiple = (run.factor, run.label, run.multiple) if run is not None else (1.0, "1x", 1.0)
    return ScaleResult(scale=factor, label=label, params_multiple=run.params if run is not None else 1.0, dir=str(d), steps=proxy.steps, tokens=proxy.tokens, lr=proxy.lr,
                       steps_multiple=multiple, seeds=sorted({s for m in measured for s in m.by_seed}),
                       candidates=[m.result() for m in measured], front=front_labels(measured, objectives))


def rules_text(steps_rule: str, results: list[ScaleResult]) -> str:
    """The learning-rate and step rules, with each scale's budget."""
    lr = results[0].lr
    lr_text = f"learning rate unchanged ({lr:g} at every scale)" if lr is not None else "learning rate unchanged"
    budget = ", ".join(f"{shown(r.label)}: {r.steps if r.steps is not None else r.tokens} "
                       f"{'steps' if r.steps is not None else 'tokens'}" for r in results)
    why = {"same": "the same steps at every scale",
           "tokens-per-param": "steps grown with the candidates' unique parameters (tokens per parameter kept, "
                               "the geometric mean of their growth)",
           "x2": "steps doubled per doubling of width"}[steps_rule]
    return f"{lr_text}; {why} ({budget})"


def analyse(prep: Prepared, target: float | None = None) -> Transfer:
    """Every scale against the base scale (:mod:`runners.transfer.analysis`)."""
    record, objectives = prep.record, prep.record.objectives
    quality = next(o for o in objectives if o.quality)
    runs, notes = list(prep.runs), []
    if prep.retrained_base:
        first = runs.pop(0)
        base = scale_measures(first.dir, prep.chosen, quality.name)
        base_res = _result(first, first.dir, first.space, base, objectives)
        notes.append(f"the base scale is retrained at 1× with {prep.seeds} seeds ({first.dir}); the sweep has "
                     f"{record.seeds} per candidate")
    else:
        base = base_measures(prep.records, prep.chosen, quality.name, record.seq_len)
        base_res = _result(None, prep.exp_dir, base_space(prep.exp_dir, record), base, objectives)
    base_res = compare_scale(base_res, base, base)  # τ = 1; its pairs: what the base separates
    results = [base_res]
    for run in runs:
        measured = scale_measures(run.dir, prep.chosen, quality.name)
        r = compare_scale(_result(run, run.dir, run.space, measured, objectives), base, measured)
        r.verdict = scale_verdict(r, quality.direction)
        results.append(r)
    p = base_res.pairs
    base_res.verdict = f"{p.separated} of {p.separated + p.unseparated} pairs differ beyond seed noise at the base"
    transfer = Transfer(experiment=str(prep.exp_dir), space=record.name, metric=quality.name,
                        direction=quality.direction, seeds=prep.seeds, base=base_res.dir,
                        candidates_rule=prep.candidates, lr_rule="same", steps_rule=prep.steps_rule,
                        rules=rules_text(prep.steps_rule, results), scales=results,
                        verdict=overall_verdict(results, quality.direction), notes=notes)
    if target is not None:
        transfer.extrapolation = extrapolate(results, target, quality.direction)
        if transfer.extrapolation is None:
            notes.append(f"--to {target:.3g}: extrapolating needs three or more scales (the base counts); "
                         f"this transfer has {len(results)}")
    return transfer


def run_transfer(exp_dir: Path, out: Path | None = None, scales: tuple[float, ...] | None = None,
                 steps_rule: str = "same", seeds: int | None = None, candidates: str = "front",
                 engine: str = "optuna", address: str | None = None, target: float | None = None,
                 progress: bool = True) -> Transfer:
    """Plan, train (resuming) and analyse a transfer of ``exp_dir``'s chosen candidates."""
    prep = prepare(exp_dir, out, scales, steps_rule, seeds, candidates)
    train(prep, engine, address, progress)
    return analyse(prep, target)


def find(exp_dir: Path) -> Transfer | None:
    """An experiment's transfer, when one exists: ``EXP/transfer/transfer.json``."""
    from runners.results.records import MAX_EXPERIMENT, read_optional

    path = Path(exp_dir) / TRANSFER / "transfer.json"
    # bounded, regular files only (a FIFO or a device is one warning, not a hang) (issue #34)
    return read_optional(path, Transfer, MAX_EXPERIMENT)


def summary_json(t: Transfer) -> dict:
    """What ``loopnas status --json`` shows of a transfer: the verdict and the largest scale's τ."""
    last = t.scales[-1]
    return {"verdict": t.verdict, "tau": last.tau, "scale": last.label}


def status_entry(exp_dir: Path) -> dict:
    """``{"transfer": {verdict, tau, scale}}`` for ``loopnas status --json`` when the
    experiment has a transfer, else nothing."""
    t = find(exp_dir)
    return {"transfer": summary_json(t)} if t is not None else {}


__all__ = ["TRANSFER", "Prepared", "ScaleRun", "analyse", "base_measures", "find", "measure", "prepare",
           "run_transfer", "scale_measures", "status_entry", "summary_json", "train"]
