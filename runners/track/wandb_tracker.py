"""Weights & Biases: one run per sweep (its id kept, so a resumed sweep continues it, as
``resume="allow"``), files under ``EXP/wandb``. Each replicate's curve is its own panel
group (``t0004/s1/acc`` against ``t0004/s1/step``); each candidate's means, standard errors
status, parameters and summary go to the run's summary (``t0004/acc``);
its spec is a ``spec`` artifact; the front is a table and the report is saved with the run.
``WANDB_MODE=offline`` writes it all locally (``wandb sync`` uploads it later)."""
from __future__ import annotations

import json
import secrets
from pathlib import Path

from runners.results.records import ExperimentRecord, TrialRecord

from .base import Curve, candidate_metrics, flat_params, front_rows


class WandbTracker:
    name = "wandb"

    def __init__(self, out: Path, options: dict, state: dict):
        import wandb

        self.wandb, self.out, self.options, self.state, self.run = wandb, Path(out), options, state, None

    def on_start(self, exp: ExperimentRecord, resumed: bool) -> None:
        self.state.setdefault("logged", [])
        self.state.setdefault("id", secrets.token_hex(4))  # kept: a resume continues the run
        self.run = self.wandb.init(
            project=self.options.get("project") or exp.name, entity=self.options.get("entity"),
            name=exp.name, id=self.state["id"], resume="allow", dir=str(self.out), job_type="sweep",
            config={"space": exp.name, "engine": exp.engine, "trials": exp.trials, "seeds": exp.seeds,
                    "objectives": [f"{o.name} ({o.direction})" for o in exp.objectives]},
            settings=self.wandb.Settings(silent=True, console="off"), reinit="create_new")

    def on_replicate(self, record: TrialRecord, index: int, curve: Curve) -> None:
        key = f"{record.id}/s{index}"
        if key in self.state["logged"]:
            return
        self.run.define_metric(f"{key}/*", step_metric=f"{key}/step")
        rows: dict[int, dict] = {}
        for step, metrics in curve.evals:
            rows.setdefault(step, {}).update({f"{key}/{k}": v for k, v in metrics.items()})
        for step, value in curve.losses:
            rows.setdefault(step, {})[f"{key}/train_loss"] = value
        if curve.tokens_per_s is not None:
            rows.setdefault(curve.steps or 0, {})[f"{key}/tokens_per_s"] = curve.tokens_per_s
        for step in sorted(rows):
            self.run.log({f"{key}/step": step, **rows[step]})
        self.state["logged"].append(key)

    def on_candidate(self, record: TrialRecord) -> None:
        metrics = candidate_metrics(record)
        for k, v in metrics.items():
            self.run.summary[f"{record.id}/{k}"] = v
        self.run.summary[f"{record.id}/status"] = record.status
        self.run.summary[f"{record.id}/params"] = flat_params(record.params)
        if record.summary:
            self.run.summary[f"{record.id}/summary"] = record.summary
        if record.arch is not None:
            art = self.wandb.Artifact(f"spec-{record.id}", type="spec", metadata={"summary": record.summary})
            with art.new_file("spec.json") as f:
                json.dump(record.arch, f, indent=1)
            self.run.log_artifact(art)

    def on_end(self, front: list, report: Path | None) -> None:
        rows = front_rows(front)
        if rows:
            columns = list(rows[0])
            self.run.log({"front": self.wandb.Table(columns=columns, data=[[_plain(r[c]) for c in columns]
                                                                            for r in rows])})
        if report is not None and report.is_dir():
            self.run.save(str(report / "*"), base_path=str(report.parent), policy="now")
        self.run.finish()
        self.run = None

    def close(self) -> None:
        if self.run is not None:  # interrupted: flush what was logged; a resume continues the run
            self.run.finish(exit_code=1)
            self.run = None


def _plain(value):
    return value if value is None or isinstance(value, (int, float, str, bool)) else str(value)


__all__ = ["WandbTracker"]
