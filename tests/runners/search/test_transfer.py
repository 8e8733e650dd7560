"""loopnas transfer: fabricated sweeps whose larger scale keeps or reverses planted orders
(driven through the real driver with made-up outcomes, as calibrate's tests are), the
candidate choice, the extrapolation, and one real tiny run through the CLI."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from nas.space import load_space
from runners.calibrate import design, scaled
from runners.sweep.driver import Sweep
from nas.noise import spearman
from runners.transfer import analyse, choose, markdown, parse_candidates, prepare, write
from runners.transfer.analysis import classify, extrapolate
from runners.transfer.plan import TransferError

SPACE = """\
name: planted
base: tiny_noloop
params:
  ffn: {target: model.defaults.swiglu.hidden_size, choices: [32, 48, 64, 80, 96, 112]}
objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2, lr: 0.003}
search: {sampler: grid, trials: 6, concurrency: 2}
"""
SEEDS = 4


def drive(sweep, quality):
    """Finish every job of ``sweep`` with ``quality(params, seed)``: no training."""
    while (job := sweep.next_job()) is not None:
        value = quality(sweep.records[job.trial].params, job.config["seed"])
        sweep.on_outcome(job.id, {"status": "complete",
                              "measured": [{"k": None, "value": value, "metrics": {"acc": value}}]})
    sweep.close()


def base_sweep(tmp_path, quality, seeds=SEEDS):
    path = tmp_path / "space.yaml"
    path.write_text(textwrap.dedent(SPACE))
    space = load_space(path)
    _, plan = design(space)
    exp = tmp_path / "exp"
    drive(Sweep(scaled(space, 1.0), exp, "optuna", seeds=seeds, planned=plan), quality)
    return exp


def grown(prep, qualities):
    """Drive each planned scale with ``qualities[factor](params, seed)``."""
    for run in prep.runs:
        drive(Sweep(run.space, run.dir, "optuna", seeds=prep.seeds, planned=run.space.planned()),
              qualities[run.factor])


def planted(means, sd=0.004, seed_effect=0.01):
    """Quality by FFN width: a mean per width, a shared luck per seed, a little noise (each
    drawn from its own key, so every scale sees the same draws)."""
    def quality(params, seed):
        luck = np.random.default_rng([seed, 1]).normal(0, seed_effect)
        return means[params["ffn"]] + luck + np.random.default_rng([seed, params["ffn"]]).normal(0, sd)
    return quality


BASE = {32: 0.40, 48: 0.46, 64: 0.52, 80: 0.58, 96: 0.64, 112: 0.70}


def test_an_order_that_holds_reports_tau_one_and_every_separated_pair_kept(tmp_path):
    exp = base_sweep(tmp_path, planted(BASE))
    prep = prepare(exp, scales=(2.0,), candidates="all")
    grown(prep, {2.0: planted({w: m + 0.1 for w, m in BASE.items()})})
    t = analyse(prep)
    base, big = t.scales
    assert [r.scale for r in t.scales] == [1.0, 2.0] and base.dir == str(exp)
    assert big.tau == pytest.approx(1.0) and big.spearman == pytest.approx(1.0)
    assert big.tau_ci[0] == pytest.approx(1.0)  # 0.06 apart at s.e. ~0.002: no draw reorders
    assert big.pairs.separated == 15 and big.pairs.kept == 15 and big.pairs.flipped == big.pairs.within_noise == 0
    assert "holds at 2× width (τ = 1.00" in t.verdict and "all 15 separated pairs keep their order" in t.verdict
    # every candidate: its quality at 2× and its cost there (the width doubled: ~4x FFN params)
    c = big.candidates[0]
    assert c.mean == pytest.approx(base.candidates[0].mean + 0.1, abs=1e-9) and c.se > 0 and c.n == SEEDS
    assert c.unique_params > 2.5 * base.candidates[0].unique_params and c.projection_flops > 0
    assert big.steps == 4 and big.lr == 0.003 and "learning rate unchanged" in t.rules
    assert big.seeds == base.seeds == [0, 1, 2, 3]


def test_a_reversed_pair_is_reported_as_a_flip(tmp_path):
    exp = base_sweep(tmp_path, planted(BASE))
    prep = prepare(exp, scales=(2.0,), candidates="all")
    swapped = {**BASE, 96: 0.70, 112: 0.64}  # the two best change places at 2×
    grown(prep, {2.0: planted(swapped)})
    t = analyse(prep)
    big = t.scales[1]
    assert big.pairs.flipped == 1 and big.pairs.kept == 14 and big.pairs.within_noise == 0
    [flip] = [d for d in big.pairs.detail if d.outcome == "flipped"]
    from runners.results.records import read_trials
    ffn = {r.id: r.params["ffn"] for r in read_trials(exp)}
    assert {ffn[flip.a], ffn[flip.b]} == {96, 112}
    assert flip.base_diff * flip.diff < 0 and flip.p < 0.05 and flip.base_p < 0.05
    assert "does not hold at 2× width" in t.verdict and "1 of 15 separated pairs flips" in t.verdict
    assert big.tau == pytest.approx(1 - 2 / 15)


def test_pairs_within_noise_at_the_base_are_not_called_a_failure_to_transfer(tmp_path):
    """Three candidates tied at the base reshuffle at 2×: τ drops, but no separated pair flips."""
    tied = {32: 0.40, 48: 0.40, 64: 0.40, 80: 0.58, 96: 0.64, 112: 0.70}
    exp = base_sweep(tmp_path, planted(tied, sd=0.03, seed_effect=0.0))
    prep = prepare(exp, scales=(2.0,), candidates="all")
    grown(prep, {2.0: planted({**tied, 32: 0.405, 64: 0.395}, sd=0.03, seed_effect=0.0)})
    big = analyse(prep).scales[1]
    p = big.pairs
    assert p.flipped == 0 and p.separated >= 9 and p.unseparated >= 1
    assert p.kept + p.within_noise == p.separated and p.still_within_noise + p.newly_separated == p.unseparated
    assert "the base order holds" in big.verdict


def test_classify_uses_the_sign_and_the_pair_test():
    from nas.noise import compare
    s = [0, 1, 2, 3]
    apart, close = compare([1.0, 1.1, 1.05, 0.95], [0.0, 0.1, 0.02, -0.05], s, s), compare([0, 1, 0, 1], [1, 0, 1, 0], s, s)
    behind = compare([0.0, 0.1, 0.02, -0.05], [1.0, 1.1, 1.05, 0.95], s, s)
    assert classify(apart, apart) == "kept" and classify(apart, behind) == "flipped"
    assert classify(apart, close) == "within_noise" and classify(close, apart) == "newly_separated"
    assert classify(close, close) == "still_within_noise"


def test_choice_takes_the_front_and_its_best_rivals(tmp_path):
    exp = base_sweep(tmp_path, planted(BASE))
    from runners.results.records import read_experiment, read_trials
    records, objectives = read_trials(exp), read_experiment(exp).objectives
    # more FFN costs more compute and scores more here: all six are on the front
    assert len(choose(records, objectives, "front")) == 6
    assert len(choose(records, objectives, "front:2")) == 6  # the front is never cut
    top = choose(records, objectives, "top:2")
    acc = {r.id: r.values["acc"] for r in records}
    assert [c.trial for c in top] == sorted(acc, key=acc.get, reverse=True)[:2]
    for bad in ("top", "best:3", "all:3", "top:1"):
        with pytest.raises(TransferError):
            parse_candidates(bad)


def test_a_dominated_rival_fills_the_front(tmp_path):
    """Only the widest FFN scores: the front is it and the cheapest; rivals come by rank then quality."""
    exp = base_sweep(tmp_path, planted({32: 0.4, 48: 0.3, 64: 0.35, 80: 0.2, 96: 0.25, 112: 0.7}))
    from runners.results.records import read_experiment, read_trials
    records, objectives = read_trials(exp), read_experiment(exp).objectives
    ffn = {r.id: r.params["ffn"] for r in records}
    picked = [ffn[c.trial] for c in choose(records, objectives, "front:4")]
    assert picked[:2] == [112, 32] and picked[2:] == [64, 48]


def test_steps_rules_and_a_retrained_base(tmp_path):
    exp = base_sweep(tmp_path, planted(BASE), seeds=1)
    prep = prepare(exp, scales=(2.0,), steps_rule="x2", candidates="all")
    assert prep.retrained_base and [r.factor for r in prep.runs] == [1.0, 2.0] and prep.seeds == 3
    assert [r.space.spec.proxy.steps for r in prep.runs] == [4, 8]
    per_param = prepare(exp, scales=(2.0,), steps_rule="tokens-per-param", candidates="all")
    assert 2.5 < per_param.runs[1].multiple < 4.0  # the width doubled: parameters grew ~3x
    target = prepare(exp, scales=(2e5,), candidates="all")  # a number above 64: unique parameters
    assert [r.label for r in target.runs] == ["1x", "2e5"] and target.runs[1].dir.name == "scale-2e5"
    from nas.cost import unique_params
    assert all(abs(unique_params(g.arch) / 2e5 - 1) < 0.02
               for g in target.runs[1].space.plan)
    grown(prep, {1.0: planted(BASE), 2.0: planted(BASE)})
    t = analyse(prep)
    assert t.scales[0].dir.endswith("scale-1x") and "retrained at 1×" in t.notes[0]
    assert t.scales[1].tau == pytest.approx(1.0) and "steps doubled" in t.rules and "2×: 8 steps" in t.rules


def test_extrapolation_orders_what_it_can_and_says_what_it_cannot(tmp_path):
    exp = base_sweep(tmp_path, planted(BASE))
    prep = prepare(exp, scales=(2.0, 4.0), candidates="all")
    # every candidate gains 0.05 per doubling, except 96 which gains 0.08: it catches up with 112
    slope = {w: 0.05 for w in BASE} | {96: 0.08}
    grown(prep, {f: planted({w: m + slope[w] * np.log2(f) for w, m in BASE.items()}) for f in (2.0, 4.0)})
    t = analyse(prep, target=1e8)
    e = t.extrapolation
    assert e is not None and e.extrapolated and "EXTRAPOLATED" in e.note
    assert len(e.candidates) == 6 and all(p.lo < p.predicted < p.hi for p in e.candidates)
    ffn = {f"t{i:04d}": w for i, w in enumerate(BASE)}
    assert [ffn[x] for x in e.order[:2]] == [96, 112]  # 96 overtakes beyond the trained range
    assert "Extrapolated (not measured)" in markdown(t)
    assert extrapolate(t.scales[:2], 1e8, "maximize") is None  # two scales: no line to trust


def test_extrapolation_says_when_it_cannot_order_two():
    from runners.transfer.analysis import CandidateResult, ScaleResult, extrapolation_sentence

    def scale(f, means):
        return ScaleResult(scale=f, dir="", candidates=[
            CandidateResult(trial=k, label=k, mean=m, se=0.02, unique_params=1e5 * f * f) for k, m in means.items()])
    t = [scale(1, {"a": 0.5, "b": 0.51}), scale(2, {"a": 0.55, "b": 0.56}), scale(4, {"a": 0.6, "b": 0.6})]
    e = extrapolate(t, 1e8, "maximize")
    assert e.unresolved == [tuple(e.order)] and "too uncertain to order 1 pair: " in extrapolation_sentence(e)


def test_spearman_with_ties():
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    assert spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1)


def test_outputs_and_a_mismatched_resume(tmp_path):
    exp = base_sweep(tmp_path, planted(BASE))
    prep = prepare(exp, scales=(2.0,), candidates="all")
    grown(prep, {2.0: planted(BASE)})
    t = analyse(prep)
    paths = write(t, prep.out)
    data = json.loads(paths[0].read_text())
    s = data["scales"][1]
    assert set(s) >= {"scale", "candidates", "tau", "tau_ci", "spearman", "pairs", "front"} and data["verdict"]
    assert set(s["candidates"][0]) >= {"trial", "mean", "se", "unique_params", "projection_flops"}
    assert set(s["pairs"]) >= {"kept", "flipped", "within_noise"}
    assert paths[2].stat().st_size > 10_000 and "| 2× |" in paths[1].read_text()
    # the sweep's report shows the section; its status --json names the verdict and the largest scale's tau
    from runners.cli.status import status_data
    from runners.report import write_report
    html = write_report(exp).index.read_text()
    assert "Does the ranking hold at larger scale?" in html and t.verdict in html
    assert status_data(exp)["transfer"] == {"verdict": t.verdict, "tau": t.scales[1].tau, "scale": "2x"}
    assert "transfer" not in status_data(prep.runs[0].dir)
    # export --pick knee@2x picks from that scale's front (the grown spec)
    from runners.export.pick import ExportError, at_scale, choose as pick
    for asked in ("knee@2x", "knee@2", "knee@largest"):
        assert at_scale(exp, asked) == (prep.runs[0].dir, "knee")
    assert at_scale(exp, "knee") == (exp, "knee")
    with pytest.raises(ExportError, match="no transfer scale 4x"):
        at_scale(exp, "knee@4x")
    assert pick(prep.runs[0].dir, pick="knee").trial.arch["model"]["width"] == 128
    from runners.transfer import train
    other = prepare(exp, scales=(2.0,), candidates="top:3")
    with pytest.raises(TransferError, match="other candidates"):
        train(other, progress=False)


TINY = """\
name: tiny_transfer
base: tiny_noloop
params:
  boundary: {target: loop.boundary, choices: [none, block]}
  T: {target: loop.T, choices: [2], when: {boundary: [block]}}
objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2, seeds: 2}
search: {sampler: grid, trials: 2, concurrency: 2}
"""


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "runners", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_real_tiny_transfer_trains_writes_resumes_and_status_reads_it(tmp_path):
    """A two-candidate sweep (2 seeds, 4 steps) carried to 2× width through the CLI."""
    space = tmp_path / "space.yaml"
    space.write_text(TINY)
    exp = tmp_path / "exp"
    assert cli("sweep", str(space), "--out", str(exp)).returncode == 0
    assert cli("export", str(exp), "--pick", "knee", "--out", str(tmp_path / "before")).returncode == 0
    assert "whether its order holds at larger scale was not checked" in " ".join(
        (tmp_path / "before" / "README.md").read_text().split())
    run = cli("transfer", str(exp), "--scales", "2")
    assert run.returncode == 0, run.stderr
    out = exp / "transfer"
    data = json.loads((out / "transfer.json").read_text())
    assert [s["label"] for s in data["scales"]] == ["1x", "2x"] and data["verdict"] in run.stdout
    big = data["scales"][1]
    assert big["dir"] == str(out / "scale-2x") and big["seeds"] == [0, 1] and len(big["candidates"]) == 2
    for base, grown in zip(data["scales"][0]["candidates"], big["candidates"]):
        assert grown["trial"] == base["trial"] and grown["n"] == 2 and grown["mean"] is not None
        assert 3 < grown["unique_params"] / base["unique_params"] < 4  # width 64 -> 128
    assert "learning rate unchanged" in data["rules"] and (out / "transfer.png").stat().st_size > 10_000
    # the scale is an ordinary experiment: status reads it; the base's status --json names the transfer
    status = json.loads(cli("status", str(out / "scale-2x"), "--json").stdout)
    assert status["complete"] == 2 and status["seeds"] == 2
    assert json.loads(cli("status", str(exp), "--json").stdout)["transfer"]["verdict"] == data["verdict"]
    # rerunning resumes: nothing is trained again
    before = (out / "scale-2x" / "trials" / "t0000.json").stat().st_mtime
    again = cli("transfer", str(exp), "--scales", "2")
    assert again.returncode == 0 and (out / "scale-2x" / "trials" / "t0000.json").stat().st_mtime == before
    bad = cli("transfer", str(exp), "--scales", "2", "--steps-rule", "x2")  # another plan for scale-2x
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: ") and "other candidates" in bad.stderr
    assert cli("transfer", str(exp), "--scales", "x").stderr.strip().startswith("error: --scales")
    # the export's README says at which scale the choice was checked
    for pick, said in (("knee", "its order was checked at 2x by `loopnas transfer`: " + data["verdict"]),
                       ("knee@2x", "Chosen from the 2x front of the sweep's transfer")):
        done = cli("export", str(exp), "--pick", pick, "--out", str(tmp_path / pick))
        assert done.returncode == 0, done.stderr
        assert said in " ".join((tmp_path / pick / "README.md").read_text().split())


ELASTIC = """\
name: planted_elastic
base: tiny_elr
params:
  ffn: {target: model.defaults.swiglu.hidden_size, choices: [96, 128]}
objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}
search: {sampler: grid, trials: 2, concurrency: 2}
"""


def test_elastic_points_are_retrained_once_per_trial_and_compared_at_the_same_k(tmp_path):
    """Two elastic trials, each a point at k = 1 and 2: four candidates, two trainings per
    scale; at 2× the wide FFN overtakes the narrow one at k = 2 only."""
    path = tmp_path / "space.yaml"
    path.write_text(ELASTIC)
    space = load_space(path)
    _, plan = design(space)

    def curve(means):
        def outcome(params, seed):
            noise = np.random.default_rng([seed, params["ffn"]]).normal(0, 0.003, 2)
            return [{"k": k, "value": means[params["ffn"], k] + noise[k - 1],
                     "metrics": {"acc": means[params["ffn"], k] + noise[k - 1]}} for k in (1, 2)]
        return outcome

    def run(sweep, outcome):
        while (job := sweep.next_job()) is not None:
            sweep.on_outcome(job.id, {"status": "complete",
                                  "measured": outcome(sweep.records[job.trial].params, job.config["seed"])})
        sweep.close()

    base = {(96, 1): 0.5, (96, 2): 0.7, (128, 1): 0.55, (128, 2): 0.6}
    run(Sweep(scaled(space, 1.0), tmp_path / "exp", "optuna", seeds=3, planned=plan), curve(base))
    prep = prepare(tmp_path / "exp", scales=(2.0,), candidates="all")
    assert len(prep.chosen) == 4 and len(prep.runs[0].space.planned()) == 2
    assert {c.label for c in prep.chosen} == {"t0000@k=1", "t0000@k=2", "t0001@k=1", "t0001@k=2"}
    run(Sweep(prep.runs[0].space, prep.runs[0].dir, "optuna", seeds=3, planned=prep.runs[0].space.planned()),
        curve({**base, (128, 2): 0.8}))
    big = analyse(prep).scales[1]
    by = {c.label: c for c in big.candidates}
    assert by["t0001@k=2"].mean == pytest.approx(0.8, abs=0.01) and by["t0001@k=1"].k == 1
    [flip] = [d for d in big.pairs.detail if d.outcome == "flipped"]
    assert {flip.a, flip.b} == {"t0000@k=2", "t0001@k=2"}


def test_a_transfer_is_recomputed_from_its_per_seed_values(tmp_path):
    """transfer.json holds every candidate's value per seed at every scale: reanalysed() gives
    back the same τ, pairs and verdicts (what experiments/ regenerates its markdown from)."""
    from runners.transfer.analysis import reanalysed

    exp = base_sweep(tmp_path, planted(BASE))
    prep = prepare(exp, scales=(2.0,), candidates="all")
    swapped = {**BASE, 32: BASE[112], 112: BASE[32]}
    grown(prep, {2.0: planted(swapped)})
    t = analyse(prep)
    again = reanalysed(type(t).model_validate_json(t.model_dump_json()))
    assert markdown(again) == markdown(t) and again.scales[1].pairs.flipped == t.scales[1].pairs.flipped > 0


@pytest.mark.slow
def test_a_transfer_trains_its_scales_on_ray(tmp_path, one_thread, monkeypatch):
    """The same tiny transfer with ``engine="ray"``: each scale is a Ray Tune experiment
    (a local instance), resumable like the optuna engine's, and analysed the same way."""
    pytest.importorskip("ray.tune")
    from runners.results.records import read_experiment, read_trials
    from runners.sweep.run import run_sweep
    from runners.transfer import run_transfer

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    space = tmp_path / "space.yaml"
    space.write_text(TINY)
    exp = run_sweep(space, out=tmp_path / "exp", progress=False)
    t = run_transfer(exp, scales=(2.0,), engine="ray", progress=False)
    scale = exp / "transfer" / "scale-2x"
    assert read_experiment(scale).engine == "ray"
    trained = read_trials(scale)
    assert len(trained) == 2 and all(r.status == "complete" and len(r.replicates) == 2 for r in trained)
    big = t.scales[1]
    assert big.label == "2x" and [c.n for c in big.candidates] == [2, 2] and t.verdict
    finished = {r.id: r.finished for r in trained}
    run_transfer(exp, scales=(2.0,), engine="ray", progress=False)  # resumes: nothing trained again
    assert {r.id: r.finished for r in read_trials(scale)} == finished
