"""Experiment tracking from the sweep driver (runners.track): one real sweep logged to
TensorBoard (read back with TensorBoard's own event reader), to a real `mlflow server` on
127.0.0.1 (read back through MlflowClient) and to W&B offline (its run file read back);
a resume continues the same runs; a tracker that is missing or raises is one warning.
MLflow and W&B are optional extras (loopnas[mlflow], loopnas[wandb]): their tests skip
when the package is absent; TensorBoard is in the test extra."""
import importlib.util
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from nas.space import load_space
from runners.sweep.driver import Sweep
from runners.results.front import front
from runners.results.records import Rung, read_experiment, read_trials
from runners.sweep.run import run_sweep

pytest.importorskip("tensorboard", reason="tensorboard is in the test extra: pip install -e '.[test]'")
HAS_MLFLOW = importlib.util.find_spec("mlflow") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None
needs_mlflow = pytest.mark.skipif(not HAS_MLFLOW, reason="mlflow is not installed (pip install 'loopnas[mlflow]')")
needs_wandb = pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install 'loopnas[wandb]')")


def space(tmp: Path, track: str, seeds: int = 2, steps: int = 4):
    path = tmp / "space.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: trk
        base: tiny_noloop
        params:
          boundary: {{target: loop.boundary, choices: [none, block]}}
          T: {{target: loop.T, choices: [2], when: {{boundary: [block]}}}}
        objectives: [{{metric: acc, direction: maximize}}, {{metric: projection_flops, direction: minimize}}]
        proxy: {{task: s5, task_params: {{seq_len: 4, degree: 2}}, steps: {steps}, batch_size: 4, eval_every: 2,
                 seeds: {seeds}}}
        search: {{sampler: grid, trials: 2, concurrency: 2, track: {track}}}
        """))
    return load_space(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """A real `mlflow server` on a free port of 127.0.0.1, killed at the end."""
    if not HAS_MLFLOW:
        yield None
        return
    tmp = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}", "--artifacts-destination", str(tmp / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "server.log", "w"), start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if urllib.request.urlopen(uri + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert server.poll() is None, (tmp / "server.log").read_text()[-2000:]
            assert time.time() < deadline, "mlflow server did not answer within 120 s"
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, mlflow_uri):
    """One real sweep (2 candidates × 2 seeds, 4 steps) logged to every installed tracker."""
    tmp = tmp_path_factory.mktemp("swept")
    track = {"tensorboard": None}
    if mlflow_uri:
        track["mlflow"] = {"uri": mlflow_uri, "experiment": "trk-sweep"}
    if HAS_WANDB:
        track["wandb"] = None
    old = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    try:
        from runners.report import write_report
        exp = run_sweep(space(tmp, json.dumps(track)), out=tmp / "exp", engine="optuna", progress=False,
                        report=write_report)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    records = read_trials(exp)
    assert [r.status for r in records] == ["complete", "complete"]
    return exp, records


@pytest.mark.slow
def test_tensorboard_has_every_replicates_curve(swept):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    exp, records = swept
    for r in records:
        for rep in r.replicates:
            acc = EventAccumulator(str(exp / "tensorboard" / r.id / f"s{rep.index}"))
            acc.Reload()
            assert [e.step for e in acc.Scalars("eval/acc")] == [g.step for g in rep.rungs] == [2, 4]
            assert [e.value for e in acc.Scalars("eval/acc")] == pytest.approx([g.metrics["acc"] for g in rep.rungs])
            assert [e.step for e in acc.Scalars("eval/eval_loss")] == [2, 4]
            assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]  # from the trainer's result.json
            assert acc.Scalars("train/tokens_per_s")[0].value > 0
        hp = EventAccumulator(str(exp / "tensorboard" / r.id / "hparams"))
        hp.Reload()
        assert hp.Scalars("objective/acc")[0].value == pytest.approx(r.points[0].values["acc"])


@pytest.mark.slow
@needs_mlflow
def test_mlflow_one_run_per_sweep_a_child_per_candidate_and_per_replicate(swept, mlflow_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    exp, records = swept
    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("trk-sweep").experiment_id], max_results=100)
    kinds = {}
    for run in runs:
        kinds.setdefault(run.data.tags["loopnas.kind"], []).append(run)
    [top] = kinds["sweep"]
    assert len(kinds["candidate"]) == 2 and len(kinds["replicate"]) == 4
    assert top.info.status == "FINISHED" and top.data.params["seeds"] == "2"
    files = {f.path for f in client.list_artifacts(top.info.run_id)}
    assert {"front.json", "report", "space.json"} <= files
    assert "index.html" in {Path(f.path).name for f in client.list_artifacts(top.info.run_id, "report")}
    members = front(records, read_experiment(exp).objectives)
    shown = json.loads(Path(client.download_artifacts(top.info.run_id, "front.json", str(tmp_path))).read_text())
    assert [row["trial"] for row in shown] == [p.trial for p in members]
    by_id = {r.id: r for r in records}
    for cand in kinds["candidate"]:
        r = by_id[cand.data.tags["trial"]]
        assert cand.data.tags["mlflow.parentRunId"] == top.info.run_id
        assert cand.data.tags["status"] == "complete" and cand.info.status == "FINISHED"
        assert cand.data.params["boundary"] == r.params["boundary"]
        assert cand.data.metrics["acc"] == pytest.approx(r.points[0].values["acc"])
        assert cand.data.metrics["acc_se"] == pytest.approx(r.points[0].se["acc"])
        assert cand.data.metrics["cost/unique_params"] == r.cost["unique_params"]
        spec = Path(client.download_artifacts(cand.info.run_id, "spec.json", str(tmp_path / r.id)))
        assert json.loads(spec.read_text()) == r.arch
        assert {f.path for f in client.list_artifacts(cand.info.run_id)} == {"spec.json", "cost.json"}
        p = next((m for m in members if m.trial == r.id), None)
        assert cand.data.metrics.get("p_front") == (None if p is None else pytest.approx(p.p_front))
    for rep_run in kinds["replicate"]:
        trial, index = rep_run.info.run_name.split("/s")
        r = by_id[trial]
        rep = r.replicates[int(index)]
        assert rep_run.data.tags["mlflow.parentRunId"] == next(
            c.info.run_id for c in kinds["candidate"] if c.data.tags["trial"] == trial)
        assert rep_run.data.tags["status"] == "complete" and rep_run.data.tags["devices"] == "cpu"
        assert rep_run.data.tags["node"] == rep.node
        history = client.get_metric_history(rep_run.info.run_id, "acc")
        history = sorted((m.step, m.value) for m in history)
        assert [h[0] for h in history] == [g.step for g in rep.rungs]
        assert [h[1] for h in history] == pytest.approx([g.metrics["acc"] for g in rep.rungs])
        assert len(client.get_metric_history(rep_run.info.run_id, "train_loss")) == 4
        assert rep_run.data.metrics["tokens_per_s"] > 0


def _wandb_records(path: Path):
    """The records of a W&B run file (LevelDB-log framing: 32 KiB blocks of CRC, length,
    type and payload after a 7-byte header), parsed as wandb's protobuf records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf = path.read_bytes(), 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (crc, length, kind) == (0, 0, 0):
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            yield rec


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # W&B stores 't0000/s1/acc' as its parts


@pytest.mark.slow
@needs_wandb
def test_wandb_offline_run_holds_curves_means_and_specs(swept):
    exp, records = swept
    [run_dir] = (exp / "wandb").glob("offline-run-*")
    [run_file] = run_dir.glob("run-*.wandb")
    kept = json.loads((exp / "tracking.json").read_text())["wandb"]["id"]
    assert run_file.name == f"run-{kept}.wandb"
    history, summary, artifacts = [], {}, []
    for rec in _wandb_records(run_file):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            history.append({_key(i): json.loads(i.value_json) for i in rec.history.item})
        elif kind == "summary":
            summary.update({_key(i): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "artifact":
            artifacts.append(rec.artifact.name)
    for r in records:
        assert summary[f"{r.id}/acc"] == pytest.approx(r.points[0].values["acc"])
        assert summary[f"{r.id}/acc_se"] == pytest.approx(r.points[0].se["acc"])
        assert summary[f"{r.id}/status"] == "complete"
        assert f"spec-{r.id}" in artifacts
        for rep in r.replicates:
            key = f"{r.id}/s{rep.index}"
            curve = [(h[f"{key}/step"], h[f"{key}/acc"]) for h in history if f"{key}/acc" in h]
            assert [c[0] for c in curve] == [g.step for g in rep.rungs]
            assert [c[1] for c in curve] == pytest.approx([g.metrics["acc"] for g in rep.rungs])
    assert (run_dir / "files" / "report" / "index.html").exists()


def outcome(value):
    return {"status": "complete", "measured": [{"k": None, "value": value, "metrics": {"acc": value}}]}


def test_a_resumed_sweep_continues_the_same_runs(tmp_path, mlflow_uri):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    track = {"tensorboard": None, **({"mlflow": {"uri": mlflow_uri, "experiment": "trk-resume"}} if mlflow_uri else {})}
    sp, exp = space(tmp_path, json.dumps(track), seeds=3), tmp_path / "exp"
    sweep = Sweep(sp, exp, "optuna")
    jobs = [sweep.next_job() for _ in range(3)]
    sweep.on_rung(jobs[2].id, Rung(step=2, quality=0.4, metrics={"acc": 0.4}))
    sweep.on_outcome(jobs[0].id, outcome(0.5))
    sweep.on_outcome(jobs[1].id, outcome(0.6))
    sweep.interrupted()  # killed with replicate 2 of the first candidate half-way
    first = json.loads((exp / "tracking.json").read_text())
    resumed = Sweep(sp, exp, "optuna", resume=True)
    while (job := resumed.next_job()) is not None:
        resumed.on_outcome(job.id, outcome(0.7))
    resumed.end()
    resumed.close()
    state = json.loads((exp / "tracking.json").read_text())
    ids = [r.id for r in read_trials(exp)]
    assert len(ids) == 2 and all(r.status == "complete" for r in read_trials(exp))
    assert sorted(state["tensorboard"]["logged"]) == [f"{t}/s{i}" for t in ids for i in range(3)]
    for key in state["tensorboard"]["logged"]:  # each replicate written once
        assert len(list((exp / "tensorboard" / key).glob("events.*"))) == 1
    acc = EventAccumulator(str(exp / "tensorboard" / "t0000" / "s2"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("eval/acc")] == [2]
    if not mlflow_uri:
        return
    assert state["mlflow"]["sweep"] == first["mlflow"]["sweep"]
    assert {k: v for k, v in state["mlflow"]["replicates"].items() if k in first["mlflow"]["replicates"]} == \
        first["mlflow"]["replicates"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("trk-resume").experiment_id], max_results=100)
    names = sorted(r.info.run_name for r in runs)
    assert names == sorted(["trk", *ids, *(f"{t}/s{i}" for t in ids for i in range(3))])


class Broken:
    name, state = "broken", {}

    def on_start(self, exp, resumed):
        pass

    def on_replicate(self, record, index, curve):
        raise RuntimeError("the tracking server went away")

    def close(self):
        pass


def test_a_missing_or_failing_tracker_is_one_warning_and_the_sweep_goes_on(tmp_path, monkeypatch, caplog):
    import runners.track.base as base

    real = base._make
    monkeypatch.setattr(base, "_make", lambda name, out, options, state: Broken() if name == "mlflow"
                        else real(name, out, options, state))
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    sp, exp = space(tmp_path, "[tensorboard, mlflow, wandb]"), tmp_path / "exp"
    with caplog.at_level(logging.WARNING, logger="loopnas.track"):
        sweep = Sweep(sp, exp, "optuna")
        while (job := sweep.next_job()) is not None:
            sweep.on_outcome(job.id, outcome(0.5))
        sweep.end()
        sweep.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "loopnas.track"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("warning: tracker wandb cannot start (ModuleNotFoundError: import of wandb")
    assert lines[1].startswith("warning: tracker broken failed in on_replicate (RuntimeError: the tracking "
                               "server went away)")
    assert [r.status for r in read_trials(exp)] == ["complete", "complete"]
    assert len(json.loads((exp / "tracking.json").read_text())["tensorboard"]["logged"]) == 4


@needs_mlflow
def test_a_tracking_server_that_is_down_is_one_warning_within_seconds(tmp_path, caplog, monkeypatch):
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(key, raising=False)  # the tracker's own defaults
    down = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    sp, exp = space(tmp_path, json.dumps({"mlflow": {"uri": down}, "tensorboard": None})), tmp_path / "exp"
    start = time.time()
    with caplog.at_level(logging.WARNING, logger="loopnas.track"):
        sweep = Sweep(sp, exp, "optuna")
        while (job := sweep.next_job()) is not None:
            sweep.on_outcome(job.id, outcome(0.5))
        sweep.end()
        sweep.close()
    assert time.time() - start < 60  # MLflow's own retries would take 4 minutes
    [line] = [r.getMessage() for r in caplog.records if r.name == "loopnas.track"]
    assert line.startswith("warning: tracker mlflow failed in on_start (MlflowException")
    assert [r.status for r in read_trials(exp)] == ["complete", "complete"]
