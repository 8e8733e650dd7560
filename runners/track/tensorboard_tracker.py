"""TensorBoard: event files under ``EXP/tensorboard/``: one directory per replicate
(``t0004/s1``: its eval metrics per rung, training loss per step, tokens/s), one per
candidate (``t0004``: its summary and spec as text, and in ``t0004/hparams`` its parameters
against every objective's mean for the HPARAMS tab), the front as text at the top.
``tensorboard --logdir EXP`` shows every curve. Each replicate is written once, when it ends."""
from __future__ import annotations

import json
import math
from pathlib import Path

from runners.results.records import ExperimentRecord, TrialRecord

from .base import Curve, candidate_metrics, front_rows

ROOT = "tensorboard"


class TensorboardTracker:
    name = "tensorboard"

    def __init__(self, out: Path, options: dict, state: dict):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer, self.root, self.state = SummaryWriter, Path(out) / ROOT, state

    def on_start(self, exp: ExperimentRecord, resumed: bool) -> None:
        self.state.setdefault("logged", [])

    def on_replicate(self, record: TrialRecord, index: int, curve: Curve) -> None:
        key = f"{record.id}/s{index}"
        if key in self.state["logged"]:
            return
        with self.writer(str(self.root / record.id / f"s{index}")) as w:
            for step, metrics in curve.evals:
                for name, value in metrics.items():
                    w.add_scalar(f"eval/{name}", value, step)
            for step, value in curve.losses:
                w.add_scalar("train/loss", value, step)
            if curve.tokens_per_s is not None:
                w.add_scalar("train/tokens_per_s", curve.tokens_per_s, curve.steps or 0)
        self.state["logged"].append(key)

    def on_candidate(self, record: TrialRecord) -> None:
        with self.writer(str(self.root / record.id)) as w:
            w.add_text("summary", f"{record.status}: {record.summary or ''}" + (
                f" ({record.reason})" if record.reason else ""))
            if record.arch is not None:
                w.add_text("spec", "```\n" + json.dumps(record.arch, indent=1) + "\n```")
            metrics = {f"objective/{k}": v for k, v in candidate_metrics(record).items() if not k.startswith("cost/")}
            if record.status == "complete" and metrics:
                params = {k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
                          for k, v in record.params.items()}
                w.add_hparams(params, metrics, run_name="hparams")

    def on_end(self, front: list, report: Path | None) -> None:
        rows = front_rows(front)
        if not rows:
            return
        keys = [k for k in rows[0] if k not in ("k", "tied", "n")]
        table = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        table += ["| " + " | ".join(_cell(r.get(k)) for k in keys) + " |" for r in rows]
        with self.writer(str(self.root)) as w:
            w.add_text("front", "\n".join(table))

    def close(self) -> None:
        pass


def _cell(value) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return "" if value is None else str(value).replace("|", "/")


__all__ = ["TensorboardTracker"]
