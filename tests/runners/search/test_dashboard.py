"""The Optuna dashboard on a real loopnas study: optuna-dashboard's own WSGI app (what
`optuna-dashboard EXP/study.journal --artifact-dir EXP/artifacts` serves) lists the study
with loopnas' objective names, its best trials are loopnas' front, and each trial shows
its summary, mean ± s.e. and spec; the front's p_front is on the study and in the notes.
optuna-dashboard is an optional extra (loopnas[dashboard]) and in the test extra."""
import io
import json
import textwrap
from wsgiref.util import setup_testing_defaults

import pytest

from nas.space import load_space
from runners.results.front import front
from runners.results.records import read_experiment, read_trials
from runners.sweep.run import run_sweep

optuna_dashboard = pytest.importorskip(
    "optuna_dashboard", reason="optuna-dashboard is not installed (pip install 'loopnas[dashboard]')")


def get(app, path: str):
    environ = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, QUERY_STRING="", REQUEST_METHOD="GET", **{"wsgi.input": io.BytesIO()})
    status = []
    body = b"".join(app(environ, lambda s, headers, exc=None: status.append(s)))
    assert status[0].startswith("200"), (path, status[0], body[:300])
    return body


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A real sweep: three distinct candidates × 2 seeds, then the dashboard on its journal."""
    tmp = tmp_path_factory.mktemp("dash")
    path = tmp / "space.yaml"
    path.write_text(textwrap.dedent("""\
        name: dash
        base: tiny_noloop
        params:
          boundary: {target: loop.boundary, choices: [none, block, mixer]}
          T: {target: loop.T, choices: [2], when: {boundary: [block, mixer]}}
        objectives: [{metric: acc, direction: maximize}, {metric: projection_flops, direction: minimize}]
        proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2, seeds: 2}
        search: {sampler: grid, trials: 3, concurrency: 2}
        """))
    exp = run_sweep(load_space(path), out=tmp / "exp", engine="optuna", progress=False)
    from optuna.artifacts import FileSystemArtifactStore
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(str(exp / "study.journal")))
    app = optuna_dashboard.wsgi(storage, artifact_store=FileSystemArtifactStore(str(exp / "artifacts")))
    [listed] = json.loads(get(app, "/api/studies"))["study_summaries"]
    detail = json.loads(get(app, f"/api/studies/{listed['study_id']}"))
    return exp, app, listed, detail


def _ids(trials) -> set[str]:
    return {json.loads(_attr(t, "loopnas"))["id"] for t in trials}


def _attr(trial, key):
    return next(a["value"] for a in trial["user_attrs"] if a["key"] == key)


def test_the_dashboard_lists_the_study_with_loopnas_objectives_and_its_front(study):
    exp, _, listed, detail = study
    record = read_experiment(exp)
    assert listed["study_name"] == "dash"
    assert detail["objective_names"] == [o.name for o in record.objectives] == ["acc", "projection_flops"]
    assert detail["directions"] == ["maximize", "minimize"]
    records = read_trials(exp)
    assert sorted(r.status for r in records) == ["complete"] * 3
    members = front(records, record.objectives)
    assert members and _ids(detail["best_trials"]) == {p.trial for p in members}
    # p_front, computed once at the end: on the study, and in a note on each member's trial
    attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    p_front = json.loads(attrs["p_front"].replace("'", '"'))
    assert p_front == pytest.approx({p.trial: p.p_front for p in members})
    for t in detail["best_trials"]:
        rid = json.loads(_attr(t, "loopnas"))["id"]
        assert f"p_front {p_front[rid]:.2f}" in t["note"]["body"]


def test_each_trial_shows_its_summary_mean_se_and_spec(study):
    exp, app, _, detail = study
    by_id = {r.id: r for r in read_trials(exp)}
    assert len(detail["trials"]) == 3
    for t in detail["trials"]:
        r = by_id[json.loads(_attr(t, "loopnas"))["id"]]
        point = r.points[0]
        assert _attr(t, "summary") == r.summary
        assert float(_attr(t, "acc_mean")) == pytest.approx(point.values["acc"])
        assert float(_attr(t, "acc_se")) == pytest.approx(point.se["acc"])
        assert int(_attr(t, "seeds")) == 2
        [artifact] = t["artifacts"]
        assert artifact["filename"] == "spec.json"
        spec = get(app, f"/artifacts/{t['study_id']}/{t['trial_id']}/{artifact['artifact_id']}")
        assert json.loads(spec) == r.arch
