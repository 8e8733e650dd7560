"""The one-shot sweep's self-check (issue #31): the analysis on fabricated numbers (a planted
supernet that ranks exactly, one that ranks in reverse, the exact permutation p against
scipy), the spot-check sample, the ``oneshot.check`` field, and one tiny real sweep whose
stand-alone trials are an ordinary experiment and whose verdict reaches status and report."""
import html
import json
import math
import textwrap

import numpy as np
import pytest
from scipy import stats

from nas import oneshot as one
from nas.errors import SpecError
from nas.space import load_space

SPACE = """\
name: osc
base:
  name: osc_tiny
  model:
    vocab_size: 32
    width: 16
    defaults:
      attn: {num_heads: 2}
      gdn: {num_heads: 2, head_dim: 8, expand_v: 1}
      swiglu: {hidden_size: 32}
  num_layers: 4
  hybrid: {ratio: {attn: 1, gdn: 1}, placement: interleave}
  loop: {boundary: block, T: 2, update: {kind: residual_gate}}
objectives:
  - {metric: eval_loss, direction: minimize}
  - {metric: projection_flops, direction: minimize}
proxy: {task: mqar, task_params: {vocab_size: 32, seq_len: 16, num_kv_pairs: 2}, steps: 4,
        batch_size: 8, eval_every: 2, eval_batches: 1, lr: 0.01}
"""


def space_file(tmp_path, oneshot: str, name: str = "space.yaml"):
    path = tmp_path / name
    path.write_text(SPACE + "oneshot:\n" + textwrap.indent(textwrap.dedent(oneshot), "  "))
    return path


def planted(n: int = 6, seeds: int = 3, noise: float = 0.01, rng: int = 0) -> np.ndarray:
    """Stand-alone replicate values (candidates × seeds): means 1, 2, ..., n, seed noise far
    below the spacing, so every seed ranks the candidates alike."""
    g = np.random.default_rng(rng)
    return np.arange(1.0, n + 1)[:, None] + noise * g.standard_normal((n, seeds))


# ---- the analysis on fabricated numbers --------------------------------------------------


def test_a_supernet_that_ranks_exactly_agrees():
    standalone = planted()
    check = one.agreement(0.3 * standalone.mean(1) + 0.05, standalone)  # another scale, the same order
    assert check.tau == 1.0 and (check.lo, check.hi) == (1.0, 1.0)
    assert check.p == pytest.approx(1 / math.factorial(6))  # one ordering of 720 reaches τ = 1
    assert check.agrees and (check.n, check.seeds) == (6, 3)
    assert check.verdict.startswith("the one-shot ranking agrees with stand-alone training on the spot-check")
    assert "τ = 1" in check.verdict


def test_a_supernet_that_ranks_in_reverse_does_not_agree():
    standalone = planted()
    check = one.agreement(-standalone.mean(1), standalone)
    assert check.tau == -1.0 and check.p == pytest.approx(1.0) and not check.agrees
    assert "does not agree" in check.verdict
    assert check.verdict.endswith("this front says where to look, not what is best")


@pytest.mark.parametrize("rng", range(5))
def test_the_p_is_scipys_exact_one_sided_kendall_p(rng):
    g = np.random.default_rng(rng)
    standalone = g.standard_normal((6, 3))
    scores = standalone.mean(1) + g.standard_normal(6)
    check = one.agreement(scores, standalone)
    want = stats.kendalltau(scores, standalone.mean(1), method="exact", alternative="greater")
    assert check.tau == pytest.approx(want.statistic) and check.p == pytest.approx(want.pvalue)
    assert check.agrees == (want.statistic > 0 and want.pvalue < one.AGREE_ALPHA)


def test_the_interval_resamples_seeds_so_noisy_seeds_widen_it():
    quiet, noisy = planted(noise=0.01), planted(noise=3.0, rng=1)
    scores = np.arange(1.0, 7)
    assert one.agreement(scores, quiet).lo == 1.0
    wide = one.agreement(scores, noisy)
    assert wide.lo < wide.tau <= wide.hi


def test_three_candidates_cannot_show_agreement_and_say_why():
    standalone = planted(n=3)
    check = one.agreement(standalone.mean(1), standalone)
    assert check.tau == 1.0 and check.p == pytest.approx(1 / 6) and not check.agrees
    assert "no ranking can reach p < 0.01 (the exact floor is 0.17)" in check.verdict


def test_fewer_than_two_results_cannot_be_checked():
    check = one.agreement([0.5], [[1.0, 1.1]])
    assert math.isnan(check.tau) and not check.agrees and check.verdict.startswith("cannot be checked")
    assert check.to_dict()["tau"] is None


def test_the_status_fields_are_there():
    data = one.agreement(np.arange(6.0), planted()).to_dict()
    assert {"tau", "tau_ci", "p", "n", "seeds", "verdict"} <= set(data)
    assert data["tau_ci"] == [1.0, 1.0] and data["alternative"].startswith("one-sided")
    json.dumps(data, allow_nan=False)


# ---- the spot-check sample ---------------------------------------------------------------


def test_the_sample_spreads_over_the_ranking_and_always_holds_the_front():
    ranked = [f"c{i:02d}" for i in range(20)]
    picked = one.spot_check(ranked, ["c00", "c03"], 6)
    assert len(picked) == 6 and {"c00", "c03", "c19"} <= set(picked)
    assert picked == sorted(picked, key=ranked.index)
    gaps = np.diff([ranked.index(c) for c in picked])
    assert gaps.max() <= 6  # no stretch of the ranking left unsampled
    assert one.spot_check(ranked, ranked[:8], 6) == ranked[:8] + ["c19"]  # the whole front, and the bottom
    assert one.spot_check(ranked[:4], [], 6) == ranked[:4]
    assert one.spot_check(ranked, [], 3) == ["c00", "c09", "c19"]  # a tie in distance: nearer the top


# ---- the oneshot.check field -------------------------------------------------------------


def test_check_is_on_by_default_and_false_skips_it(tmp_path):
    default = load_space(space_file(tmp_path, "loops: [1, 2]\n")).spec.oneshot.check
    assert one.check_settings(default) == one.OneShotCheckSpec(n=6, seeds=3)
    assert one.check_settings(load_space(space_file(tmp_path, "check: true\n")).spec.oneshot.check).n == 6
    assert one.check_settings(load_space(space_file(tmp_path, "check: false\n")).spec.oneshot.check) is None
    assert load_space(space_file(tmp_path, "check: {n: 4}\n")).spec.oneshot.check.seeds == 3


@pytest.mark.parametrize("check, field", [("{n: 2}", "oneshot.check.n"), ("{seeds: 1}", "oneshot.check.seeds"),
                                          ("{nn: 6}", "oneshot.check")], ids=["n2", "seeds1", "typo"])
def test_a_bad_check_names_its_field(tmp_path, check, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        load_space(space_file(tmp_path, f"check: {check}\n"))


def test_a_skipped_check_says_so_without_training(tmp_path):
    from runners.oneshot.check import run_check
    from runners.results.records import Objective

    objectives = [Objective(name="eval_loss", direction="minimize", measured=True)]
    (tmp_path / "oneshot.json").write_text(json.dumps({"search": {"budget_spent": True}}))
    space = load_space(space_file(tmp_path, "check: {n: 3}\n"))
    cut = run_check(space, [], objectives, tmp_path)
    assert cut["skipped"] and "resume the sweep" in cut["verdict"] and cut["n"] == 0
    off = run_check(load_space(space_file(tmp_path, "check: false\n", "off.yaml")), [], objectives, tmp_path)
    assert off["verdict"].startswith("not checked (oneshot.check is false)")
    assert json.loads((tmp_path / "oneshot.json").read_text())["check"] == off
    assert not (tmp_path / "check").exists()


def test_measure_pairs_trials_by_spec_hash_and_names_what_it_left_out():
    from runners.oneshot.check import measure
    from runners.results.records import Objective, Point, Replicate, TrialRecord

    def record(rid, h, value, runs=()):
        reps = [Replicate(index=i, seed=i, status="complete", points=[Point(k=None, values={"eval_loss": v})])
                for i, v in enumerate(runs)]
        mean = sum(runs) / len(runs) if runs else value
        return TrialRecord(id=rid, number=0, status="complete", spec_hash=h, replicates=reps,
                           points=[Point(k=None, values={"eval_loss": mean})])

    quality = Objective(name="eval_loss", direction="minimize", measured=True)
    searched = [record("t0", "a", 0.1), record("t1", "b", 0.2), record("t2", "c", 0.3), record("t3", "d", 0.4)]
    trained = [record("s0", "c", 0, [3.0, 3.2]), record("s1", "a", 0, [1.0, 1.1]), record("s2", "b", 0, [2.0]),
               record("s3", "d", 0, [4.0, 4.1])]
    out = measure(searched, trained, quality, 2, ["t0", "t1", "t2", "t3"])
    assert [r["standalone_trial"] for r in out["candidates"]] == ["s1", "s0", "s3"]
    assert out["candidates"][1]["values"] == [3.0, 3.2] and out["missing"] == ["t1"]
    assert out["tau"] == 1.0 and out["n"] == 3 and out["verdict"].endswith("seed for t1)")


# ---- one tiny real sweep -----------------------------------------------------------------


def test_a_oneshot_sweep_checks_itself_with_ordinary_stand_alone_trials(tmp_path, one_thread, capsys):
    from runners.cli import main
    from runners.cli.status import status_data
    from runners.oneshot.check import ranking
    from runners.report import write_report
    from runners.results.records import read_experiment, read_trials
    from runners.sweep.run import run_sweep

    path = space_file(tmp_path, "loops: [1, 2]\nsearch: {strategy: beam, width: 1, depth: 1}\ncheck: {n: 3, seeds: 2}\n")
    exp = run_sweep(path, out=tmp_path / "exp", progress=False)
    searched = {r.id: r for r in read_trials(exp)}
    check_dir = exp / "check"
    record = read_experiment(check_dir)
    assert record.seeds == 2 and record.engine == "optuna" and record.space["oneshot"] is None
    trained = read_trials(check_dir)
    assert len(trained) >= 3 and all(t.status == "complete" for t in trained)
    assert all([r.seed for r in t.replicates] == [0, 1] for t in trained)
    # each stand-alone trial is a one-shot trial's sub-network, trained: same parameters and spec hash
    twins = {t.id: next(r for r in searched.values() if r.spec_hash == t.spec_hash) for t in trained}
    assert all(twins[t.id].params == t.params and twins[t.id].arch == t.arch for t in trained)
    quality = next(o for o in record.objectives if o.quality)
    ranked = [r.id for r in ranking(list(searched.values()), quality)]
    assert {ranked[0], ranked[-1]} <= {r.id for r in twins.values()}  # top and bottom
    data = status_data(exp)
    check = data["oneshot_check"]
    assert {"tau", "tau_ci", "p", "n", "seeds", "verdict"} <= set(check)
    assert check["n"] == len(trained) and check["seeds"] == 2
    assert check["agrees"] == (check["tau"] > 0 and check["p"] < 0.01)
    for row in check["candidates"]:  # the analysis read the stand-alone runs the records hold
        twin = next(t for t in trained if t.id == row["standalone_trial"])
        assert row["values"] == [r.points[-1].values["eval_loss"] for r in twin.replicates]
        assert row["oneshot"] == searched[row["trial"]].values["eval_loss"]
    redo = one.agreement([r["oneshot"] for r in check["candidates"]], [r["values"] for r in check["candidates"]])
    assert redo.tau == pytest.approx(check["tau"]) and redo.p == pytest.approx(check["p"])
    assert status_data(check_dir)["front"]  # an ordinary experiment: its own, stand-alone front
    capsys.readouterr()
    assert main(["status", str(exp), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["oneshot_check"]["verdict"] == check["verdict"]
    assert main(["status", str(exp)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("one-shot self-check: ")
    assert check["verdict"] in html.unescape(write_report(exp).index.read_text())
    # resumed, the sweep trains nothing again and reaches the same verdict
    finished = {t.id: t.finished for t in trained}
    run_sweep(path, out=exp, resume=True, progress=False)
    assert {t.id: t.finished for t in read_trials(check_dir)} == finished
    assert status_data(exp)["oneshot_check"]["verdict"] == check["verdict"]


@pytest.mark.slow
def test_the_check_trains_on_ray_when_the_sweep_does(tmp_path, one_thread, monkeypatch):
    pytest.importorskip("ray.tune")
    from runners.cli.status import status_data
    from runners.results.records import read_experiment, read_trials
    from runners.sweep.run import run_sweep

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    path = space_file(tmp_path, "search: {strategy: exhaustive}\ncheck: {n: 3, seeds: 2}\n")
    exp = run_sweep(path, out=tmp_path / "exp", engine="ray", progress=False)
    assert read_experiment(exp).engine == "oneshot" and read_experiment(exp / "check").engine == "ray"
    trained = read_trials(exp / "check")
    assert len(trained) >= 3 and all(t.status == "complete" and len(t.replicates) == 2 for t in trained)
    assert status_data(exp)["oneshot_check"]["n"] == len(trained)
