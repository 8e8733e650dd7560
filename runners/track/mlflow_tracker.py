"""MLflow: one run per sweep, a child run per candidate, a grandchild per replicate.

Any tracking URI (``search.track.mlflow.uri``, else ``MLFLOW_TRACKING_URI``); without one a
SQLite store in the experiment directory (``EXP/mlflow.db``, artifacts in ``EXP/mlartifacts``:
``mlflow ui --backend-store-uri sqlite:///EXP/mlflow.db``). Logged through ``MlflowClient``
with explicit run ids (no active-run global), so a resumed sweep continues the same runs.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from runners.results.records import ExperimentRecord, TrialRecord

from .base import Curve, candidate_metrics, candidate_tags, env_or, flat_params, front_rows

_PARENT = "mlflow.parentRunId"
_END = {"complete": "FINISHED", "duplicate": "FINISHED", "infeasible": "FINISHED", "pruned": "KILLED"}


class MlflowTracker:
    name = "mlflow"

    def __init__(self, out: Path, options: dict, state: dict):
        from mlflow.tracking import MlflowClient

        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # not a line per run under the bar
        # a server that is down: a warning within seconds, not the sweep stalled (MLflow retries for 4 minutes)
        for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                           ("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")):
            os.environ.setdefault(key, value)
        self.out, self.options, self.state = out, options, state
        uri = env_or(options, "uri", "MLFLOW_TRACKING_URI")
        self.local = uri is None
        self.client = MlflowClient(uri or f"sqlite:///{(out / 'mlflow.db').resolve()}")

    def on_start(self, exp: ExperimentRecord, resumed: bool) -> None:
        name = self.options.get("experiment") or exp.name
        found = self.client.get_experiment_by_name(name)
        eid = found.experiment_id if found is not None else self.client.create_experiment(
            name, artifact_location=(self.out / "mlartifacts").resolve().as_uri() if self.local else None)
        if self.state.get("experiment") != eid or not self._exists(self.state.get("sweep")):
            self.state.clear()  # another store than the runs were made in: start afresh
        self.state["experiment"] = eid
        self.state.setdefault("candidates", {})
        self.state.setdefault("replicates", {})
        if "sweep" in self.state:
            self.client.update_run(self.state["sweep"], status="RUNNING")
            return
        run = self.client.create_run(eid, run_name=exp.name, tags={"loopnas.kind": "sweep", "engine": exp.engine})
        self.state["sweep"] = run.info.run_id
        self._params(run.info.run_id, {"space": exp.name, "engine": exp.engine, "trials": exp.trials,
                                       "seeds": exp.seeds, "seed": exp.seed, "seq_len": exp.seq_len,
                                       "sampler": exp.space.get("search", {}).get("sampler"),
                                       "objectives": [f"{o.name} ({o.direction})" for o in exp.objectives]})
        self.client.log_dict(run.info.run_id, exp.space, "space.json")

    def _exists(self, run_id: str | None) -> bool:
        if not run_id:
            return False
        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except Exception:  # gone, or another server's
            return False

    def _params(self, run_id: str, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], v[:6000]) for k, v in flat_params(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, params=items[i:i + 100])

    def _metrics(self, run_id: str, rows: list[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k[:250], float(v), now, step) for k, v, step in rows]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i:i + 1000])

    def _candidate(self, record: TrialRecord) -> str:
        runs = self.state["candidates"]
        if record.id not in runs:
            run = self.client.create_run(self.state["experiment"], run_name=record.id,
                                         tags={_PARENT: self.state["sweep"], "loopnas.kind": "candidate",
                                               "trial": record.id})
            runs[record.id] = run.info.run_id
        return runs[record.id]

    def on_replicate(self, record: TrialRecord, index: int, curve: Curve) -> None:
        rep, key = record.replicates[index], f"{record.id}/s{index}"
        runs = self.state["replicates"]
        if key in runs:
            return  # logged before an interruption
        parent = self._candidate(record)
        run = self.client.create_run(self.state["experiment"], run_name=key, tags={
            _PARENT: parent, "loopnas.kind": "replicate", "trial": record.id, "status": rep.status,
            "node": rep.node or "", "devices": ",".join(rep.devices), "ran_on": rep.ran_on or ""})
        rid = run.info.run_id
        runs[key] = rid
        self._params(rid, {"seed": rep.seed, "replicate": index})
        rows = [(name, value, step) for step, metrics in curve.evals for name, value in metrics.items()]
        rows += [("train_loss", value, step) for step, value in curve.losses]
        if curve.tokens_per_s is not None:
            rows.append(("tokens_per_s", curve.tokens_per_s, curve.steps or 0))
        if rep.wall_time is not None:
            rows.append(("wall_time", rep.wall_time, curve.steps or 0))
        self._metrics(rid, rows)
        self.client.set_terminated(rid, _END.get(rep.status, "FAILED"))

    def on_candidate(self, record: TrialRecord) -> None:
        rid = self._candidate(record)
        self._params(rid, record.params)
        for key, value in candidate_tags(record).items():
            self.client.set_tag(rid, key, value)
        if record.summary:
            self.client.set_tag(rid, "mlflow.note.content", record.summary)
        self._metrics(rid, [(k, v, 0) for k, v in candidate_metrics(record).items()])
        if record.arch is not None:
            self.client.log_dict(rid, record.arch, "spec.json")
        if record.cost is not None:
            self.client.log_dict(rid, record.cost, "cost.json")
        self.client.set_terminated(rid, _END.get(record.status, "FAILED"))

    def on_end(self, front: list, report: Path | None) -> None:
        run = self.state["sweep"]
        rows = front_rows(front)
        self.client.log_text(run, json.dumps(rows, indent=2, default=str), "front.json")
        for row in rows:  # a metric on the candidate's run: sortable in the runs table
            if row["p_front"] is not None and row["trial"] in self.state["candidates"]:
                self._metrics(self.state["candidates"][row["trial"]], [("p_front", row["p_front"], 0)])
        self._metrics(run, [("front_size", len(rows), 0)])
        if report is not None and report.is_dir():
            self.client.log_artifacts(run, str(report), "report")
        self.client.set_terminated(run, "FINISHED")

    def close(self) -> None:
        pass


__all__ = ["MlflowTracker"]
