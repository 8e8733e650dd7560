"""One experiment read-model (issue #33): status, the report, export's --pick and the
sweep's progress line read one front (runners.results.experiment, runners.results.front.rank)
in one order (in_cost_order). On a fabricated 10,000-candidate experiment they agree member
for member; on small ones the model's front is the logic it replaced (front(), the full
bootstrap of p_front before issue #32)."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import arch, cli
from runners.results import experiment
from runners.results.front import front, in_cost_order
from runners.results.records import (
    ExperimentRecord, Objective, Point, Replicate, TrialRecord, read_experiment, write_json,
)
from test_front_noise import LUCK, OBJ, record
from test_scale import _bench, _source, reference_p_front


def _line(records: list[TrialRecord], objectives: list[Objective]):
    """The sweep's progress line fed ``records`` as the driver writes them, one by one."""
    from runners.sweep.run import _Line

    sweep = SimpleNamespace(records={}, objectives=objectives, active=set())
    line = _Line(sweep)
    for r in records:
        sweep.records[r.id] = r
        line.counts()
    return line


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """10,000 candidates × 5 seeds (benchmarks/bench_status_scale.fabricate of test_scale's
    source), each with a spec so that export can pick it."""
    tmp = tmp_path_factory.mktemp("big")
    src = _source(tmp / "src")
    spec = arch("tiny_noloop").model_dump(mode="json")
    for path in (src / "trials").glob("t*.json"):
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "arch": spec}))
    return _bench().fabricate(src, tmp / "exp", 10_000)


@pytest.mark.slow
def test_status_report_pick_and_the_progress_line_agree_at_10000_candidates(big, capsys):
    from runners.export.pick import choose, label, pick_index
    from runners.report.data import load

    rc, out, _ = cli(capsys, "status", big, "--json")
    status = json.loads(out)
    assert rc == 0 and status["complete"] == 10_000 and len(status["front"]) > 5
    members = [(p["trial"], p["k"]) for p in status["front"]]

    report = load(big)  # past WHOLE: from the digests
    assert [(r.trial.id, r.k) for r in report.members] == members
    assert [r.entry(report.objectives) for r in report.members] == status["front"]  # values, se, p_front, ties
    assert report.noise == status["noise"] and any(0 < p["p_front"] < 1 for p in status["front"])

    picked = experiment.load(big, admit=lambda t: t.arch is not None)  # what export picks from
    assert [(p.trial.id, p.k) for p in picked.members] == members
    knee = choose(big, pick="knee")
    assert knee.front == tuple(label(p) for p in picked.members)
    assert (knee.trial.id, knee.k) == (report.rows[report.knee].trial.id, report.rows[report.knee].k)
    best = picked.points[pick_index(picked, "best-quality")[0]]
    cheapest = picked.points[pick_index(picked, "cheapest")[0]]
    assert best.trial.id == max(status["front"], key=lambda p: p["values"]["acc"])["trial"]
    assert cheapest.trial.id == status["front"][0]["trial"]  # the front's order is cost order

    line = _line(picked.trials, picked.objectives)
    assert sorted(line.front) == sorted((int(t[1:]), 0, t, k) for t, k in members)
    assert line.text(line.counts()).endswith("front: " + ", ".join(t for t, _ in members[:6]))


def test_export_picks_from_the_digests_as_from_the_records(tmp_path, monkeypatch):
    """Past WHOLE trials export picks as status reads (only candidates that can reach the
    front made records, the chosen one read whole): every pick, --trial and its errors are
    those of the whole records; a trial without a spec is never picked."""
    from runners.export.pick import ExportError, choose

    src = _source(tmp_path / "src")
    spec = arch("tiny_noloop").model_dump(mode="json")
    for path in (src / "trials").glob("t*.json"):
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "arch": spec}))
    exp = _bench().fabricate(src, tmp_path / "exp", 300)
    best = json.loads((exp / "trials" / "t0001.json").read_text())  # the best of the three kinds
    (exp / "trials" / "t0001.json").write_text(json.dumps({**best, "arch": None}))  # no spec: not exported
    whole = {p: choose(exp, pick=p) for p in ("knee", "best-quality", "cheapest")}
    whole["t0004"] = choose(exp, trial="t0004")
    errors = []
    for bad in ("t0001", "t9999"):
        with pytest.raises(ExportError) as e:
            choose(exp, trial=bad)
        errors.append(str(e.value))
    monkeypatch.setattr(experiment, "WHOLE", 10)
    digests = {p: choose(exp, pick=p) for p in ("knee", "best-quality", "cheapest")}
    digests["t0004"] = choose(exp, trial="t0004")
    assert digests == whole and all(c.trial.arch == spec for c in digests.values())
    assert whole["best-quality"].trial.id != "t0001" and "among 299 points" in whole["knee"].how
    for bad, error in zip(("t0001", "t9999"), errors):
        with pytest.raises(ExportError) as e:
            choose(exp, trial=bad)
        assert str(e.value) == error


@pytest.fixture
def small(tmp_path):
    """Four candidates of five seeds sharing a seed effect, and one of one seed; each with
    a cost sheet the report can draw."""
    exp = tmp_path / "exp"
    (exp / "trials").mkdir(parents=True)
    write_json(exp / "experiment.json", ExperimentRecord(name="small", space={}, objectives=OBJ, engine="optuna",
                                                         trials=5, seeds=5, created=0.0, seq_len=64))
    rng = np.random.default_rng(3)
    records = [record(i, flops, (acc + LUCK + 0.02 * rng.normal(size=5)).tolist())
               for i, (flops, acc) in enumerate([(1.0, 0.50), (2.0, 0.56), (3.0, 0.62), (2.5, 0.45)])]
    records.append(TrialRecord(id="t0004", number=4, status="complete",
                               points=[Point(values={"acc": 0.55, "projection_flops": 4.0})]))
    records = [r.model_copy(update={"summary": f"candidate {r.number}", "cost": {
        "unique_params": 1000, "projection_flops_per_token": r.values["projection_flops"],
        "forward_flops_per_token": r.values["projection_flops"], "kv_cache_bytes": 0, "state_bytes": 0}})
        for r in records]
    for r in records:
        write_json(exp / "trials" / f"{r.id}.json", r)
    return exp, records


def test_the_models_front_is_front_and_the_full_bootstrap(small):
    exp_dir, records = small
    model = experiment.load(exp_dir)
    old = front(records, OBJ)
    assert [p.front_point() for p in model.members] == old
    assert [p.trial for p in old] == ["t0000", "t0001", "t0002"]  # t0003 dominated, t0004 dominated
    # p_front draw for draw as the bootstrap before issue #32 (every point resampled, paired by seed)
    reps = [np.array([[rep.points[0].values["acc"], 0.0] for rep in r.replicates] or
                     [[r.points[0].values["acc"], 0.0]]) for r in records]
    for r, rows in zip(records, reps):
        rows[:, 1] = r.points[0].values["projection_flops"]
    seeds = [[rep.seed for rep in r.replicates] or None for r in records]
    want = reference_p_front(reps, ["maximize", "minimize"], seeds=[s or [0] for s in seeds])
    assert [p.p_front for p in model.points] == want.tolist()
    assert model.knee in model.front and "paired t-test" in model.noise


def test_one_order_everywhere_a_maximised_cost_too(tmp_path):
    """The front's order is the cost objective's value, ascending, ties in trial order,
    whatever its direction: status, the report's model and the progress line agree."""
    objectives = [Objective(name="acc", direction="maximize", measured=True),
                  Objective(name="decode_tokens_per_s", direction="maximize", measured=True, serving=True)]
    values = [(0.9, 100.0), (0.5, 900.0), (0.7, 500.0), (0.8, 500.0), (0.7, 600.0)]
    records = [TrialRecord(id=f"t{i:04d}", number=i, status="complete", summary=f"c{i}",
                           points=[Point(values={"acc": a, "decode_tokens_per_s": s})])
               for i, (a, s) in enumerate(values)]
    exp = tmp_path / "exp"
    (exp / "trials").mkdir(parents=True)
    write_json(exp / "experiment.json", ExperimentRecord(name="max", space={}, objectives=objectives,
                                                         engine="optuna", trials=5, created=0.0, seq_len=64))
    for r in records:
        write_json(exp / "trials" / f"{r.id}.json", r)
    from runners.cli.status import status_data

    order = [p["trial"] for p in status_data(exp)["front"]]
    assert order == ["t0000", "t0003", "t0004", "t0001"]  # t0002 is dominated by t0003
    assert [p.trial.id for p in experiment.load(exp).members] == order
    assert in_cost_order(order, objectives, lambda t: records[int(t[1:])].values) == order
    line = _line(records, objectives)
    assert line.text(line.counts()).endswith("front: " + ", ".join(order))


def test_a_candidates_checkpoint_is_the_records_rule(small):
    exp_dir, _ = small
    model = experiment.load(exp_dir)
    assert model.checkpoint_of("t0001", 3) == exp_dir / "trials" / "t0001" / "s3" / "checkpoint.pt"
    assert model.checkpoint_of(model.members[0], 0) == exp_dir / "trials" / "t0000" / "s0" / "checkpoint.pt"
    assert model.checkpoint_of("t0004") == exp_dir / "trials" / "t0004" / "checkpoint.pt"  # one run: no s<i>/
    assert read_experiment(exp_dir).seeds == 5


def test_status_and_report_print_one_table(small, capsys, monkeypatch):
    import runners.results.table as table

    drawn = []
    real = table.front_table
    monkeypatch.setattr(table, "front_table", lambda entries, *a, **kw: drawn.append((entries, kw)) or real(entries, *a, **kw))
    rc, status, _ = cli(capsys, "status", small[0])
    rc2, report, _ = cli(capsys, "report", small[0])
    assert rc == rc2 == 0 and len(drawn) == 2
    (entries, status_kw), (same, report_kw) = drawn
    assert [e["trial"] for e in entries] == ["t0000", "t0001", "t0002"] and same == entries
    assert report_kw["knee"] is not None and "knee" not in status_kw  # the report marks the knee ★
    noise = [line for line in status.splitlines() if "seed noise" in line]
    assert noise and noise[0].split(" (")[0] in report.replace("\n", " ")
