"""Sweeps of 10,000 candidates (issue #32): p_front resamples only the candidates that can
reach the front and equals today's bootstrap; status on a fabricated 10,000-candidate
experiment equals the small-sweep logic (runners.sweep.front.front) on the same records;
the sweep's progress line never runs the bootstrap."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from nas.noise import p_front, paired_seeds
from nas.pareto import pareto_front

ROOT = Path(__file__).resolve().parents[1]


def reference_p_front(replicates, directions, draws=1000, seed=0, seeds=None):
    """p_front before issue #32: every candidate resampled, the front of every draw by
    nas.pareto.pareto_front (O(n²) per draw)."""
    reps = [np.atleast_2d(np.asarray(r, dtype=float)) for r in replicates]
    rng = np.random.default_rng(seed)
    multi = [i for i, r in enumerate(reps) if len(r) > 1]
    order = paired_seeds(*[seeds[i] for i in multi]) if seeds is not None and multi else None
    if order is not None:
        for i in multi:
            at = {s: j for j, s in enumerate(seeds[i])}
            reps[i] = reps[i][[at[s] for s in order]]
    hits = np.zeros(len(reps))
    for _ in range(draws):
        shared = rng.integers(0, len(order), len(order)) if order is not None else None
        means = np.stack([r.mean(axis=0) if len(r) == 1 else
                          r[shared if shared is not None else rng.integers(0, len(r), len(r))].mean(axis=0)
                          for r in reps])
        hits[pareto_front(means, directions)] += 1
    return hits / draws


def _case(rng):
    n, s, m = int(rng.integers(1, 40)), int(rng.integers(2, 6)), int(rng.integers(1, 4))
    base = rng.normal(size=(n, 1, m)) * rng.uniform(0.1, 3)
    noise = rng.normal(size=(n, s, m)) * rng.uniform(0.01, 1)
    if rng.random() < 0.3:
        noise[:, :, -1] = 0  # a cost objective, known exactly
    if rng.random() < 0.3:  # ties everywhere
        base, noise = np.round(base, 1), np.round(noise, 1)
    reps = list(base + noise)
    if rng.random() < 0.3:
        reps[0] = reps[0][:1]  # one replicate: fixed
    if n > 1 and rng.random() < 0.2:
        reps[1] = reps[0].copy()  # a duplicate
    directions = [("minimize", "maximize")[int(rng.integers(0, 2))] for _ in range(m)]
    return reps, directions, s


@pytest.mark.parametrize("case", range(60))
def test_pruned_paired_p_front_equals_the_full_bootstrap_draw_for_draw(case):
    rng = np.random.default_rng(case)
    reps, directions, _ = _case(rng)
    seeds = [list(rng.permutation(len(r))) if len(r) > 1 else [0] for r in reps]
    got = p_front(reps, directions, draws=200, seed=case, seeds=seeds)
    assert np.array_equal(got, reference_p_front(reps, directions, draws=200, seed=case, seeds=seeds))


@pytest.mark.parametrize("case", range(8))
def test_unpaired_p_front_agrees_with_the_full_bootstrap_within_monte_carlo_error(case):
    rng = np.random.default_rng(1000 + case)
    reps, directions, _ = _case(rng)
    got = p_front(reps, directions, draws=1000, seed=case)
    want = reference_p_front(reps, directions, draws=1000, seed=case)
    se = np.sqrt(np.maximum(want * (1 - want), 1e-4) / 1000)
    assert np.all(np.abs(got - want) <= 5 * np.sqrt(2) * se + 1e-9), (got, want)
    assert np.array_equal(got == 0, want == 0) or np.all(got[want == 0] < 0.01)


def test_pruned_candidates_are_zero_and_the_rest_are_resampled():
    rng = np.random.default_rng(0)
    good = [np.column_stack([0.9 + 0.01 * rng.normal(size=5), np.full(5, 1.0)])]
    bad = [np.column_stack([0.5 + 0.01 * rng.normal(size=5), np.full(5, 2.0)]) for _ in range(200)]
    p = p_front(good + bad, ["maximize", "minimize"], seeds=[list(range(5))] * 201)
    assert p[0] == 1.0 and not p[1:].any()


def test_the_progress_line_counts_and_ranks_means_without_the_bootstrap(tmp_path, monkeypatch):
    import runners.sweep.front as front_module
    from runners.sweep.driver import Sweep
    from runners.sweep.front import front
    from runners.sweep.run import _Line
    from test_replicates import outcome, space

    def no_bootstrap(*args, **kw):
        raise AssertionError("the progress line ran the bootstrap")

    sweep = Sweep(space(tmp_path), tmp_path / "exp", "optuna")
    line = _Line(sweep)
    jobs = [sweep.next_job() for _ in range(6)]
    values = {jobs[0].trial: [0.5, 0.6, 0.7], jobs[3].trial: [0.2, 0.3, 0.2]}
    monkeypatch.setattr(front_module, "p_front", no_bootstrap)
    monkeypatch.setattr("nas.noise.p_front", no_bootstrap)
    for job in jobs:
        assert line.counts() == sweep.counts()
        sweep.finish(job.id, outcome(values[job.trial][job.replicate]))
    assert line.counts() == sweep.counts() and line.counts()["complete"] == 2
    monkeypatch.undo()
    members = [p.trial for p in front(list(sweep.records.values()), sweep.objectives)]
    assert line.text(line.counts()).endswith("front: " + ", ".join(members))
