"""Load a trained proxy and write its loop diagnostics: ``summary.json`` and PNG plots."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nas.plan import max_loops
from nas.spec import ArchSpec, stored_spec
from runners.checkpoint import CHECKPOINT, RESULT, load, write_text
from runners.results.records import read_optional

from .measures import Evaluator, interventions, traces, transport, truncation


@dataclass
class Loaded:
    model: Any
    arch: ArchSpec
    task: Any
    config: Any
    quality_metric: str
    elastic_recorded: list[dict] | None = None   # the trainer's own per-k evaluation


def load_run(path: str | Path, spec: str | Path | None = None, task: str | None = None,
             task_params: dict | None = None) -> Loaded:
    """A trainer output dir or sweep trial dir (``checkpoint.pt`` + ``result.json``), or a
    checkpoint file. The arch: ``spec`` if given, else result.json's, else the checkpoint's;
    the vocabulary always follows the saved embedding. The task: ``task`` (with
    ``task_params``) if given, else the one the run trained on."""
    from nas.load import load_arch, resolve
    from runners.tasks import make_task
    from runners.train import TrainConfig, TrainResult, with_vocab
    from builders import build_model

    path = Path(path)
    ckpt_path = path / CHECKPOINT if path.is_dir() else path
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"{path}: no {CHECKPOINT} (train with --out DIR to write one)")
    ckpt = load(ckpt_path)
    state = ckpt.get("model", ckpt)
    result_path = ckpt_path.parent / RESULT
    # beside the checkpoint (a trial's run dir, someone else's): bounded; unreadable, one warning
    result = read_optional(result_path, TrainResult) if result_path.is_file() else None
    if spec is not None:
        arch = load_arch(spec)
    elif result is not None:  # TrainResult reads its stored spec through today's (migrate_arch)
        arch = result.arch
    elif "arch" in ckpt:
        arch = stored_spec(ckpt["arch"])
    else:
        raise ValueError(f"{ckpt_path}: no result.json or saved spec next to it; give --spec")
    arch = with_vocab(arch if arch.is_canonical else resolve(arch), state["embed.weight"].shape[0])
    config = TrainConfig.model_validate(ckpt["config"]) if "config" in ckpt else None
    if task is None and config is None:
        raise ValueError(f"{ckpt_path}: no saved trainer config; give --task or --data")
    name = task or config.task
    params = task_params if task is not None else dict(config.task_params)
    model = build_model(arch, backend="torch")
    model.load_state_dict(state)
    model.eval()
    the_task = make_task(name, **params)
    if the_task.vocab_size > arch.model.vocab_size:
        raise ValueError(f"task {name!r} has vocabulary {the_task.vocab_size}, the checkpoint "
                         f"{arch.model.vocab_size}")
    metric = (result.quality_metric if result is not None and task is None and result.quality_metric != "n_max"
              else getattr(the_task, "quality_metric", "acc"))
    recorded = [p.model_dump() for p in result.elastic] if result is not None and result.elastic else None
    return Loaded(model, arch, the_task, config, metric, recorded)


def _batches(loaded: Loaded, n: int | None, seed: int) -> list:
    """The trainer's own fixed eval batches (so the intact metrics are the run's final ones)
    when the task is the trained one, else ``n`` (default 2) eval batches of 32."""
    from runners.train import TrainConfig, eval_batches

    config = loaded.config
    if config is None or loaded.task.name != config.task:
        config = TrainConfig(task=loaded.task.name, steps=1, seed=seed, eval_batches=n or 2)
    elif n is not None:
        config = config.model_copy(update={"eval_batches": n})
    return eval_batches(loaded.task, config, torch.device("cpu"))


def diagnose(loaded: Loaded, out_dir: str | Path, batches: int | None = None, seed: int = 0,
             jac_len: int = 8, probes: int | None = None) -> dict:
    """Every diagnostic of :mod:`runners.diagnose.measures` on ``loaded``; writes
    ``summary.json`` and the plots into ``out_dir`` and returns the summary."""
    from .plots import write_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    data = _batches(loaded, batches, seed)
    model, arch = loaded.model, loaded.arch
    ev = Evaluator(model, data, loaded.task, loaded.quality_metric, seed)
    _, intact = ev.run()
    has_gate = any(getattr(m, "output_gate", False) for m in model.modules())
    jac_ids = data[0][0][:1, :jac_len]
    summary = {
        "arch": arch.name, "task": loaded.task.name, "quality_metric": loaded.quality_metric,
        "loops": [{"start": r.start.model_dump(), "end": r.end.model_dump(), "T": r.T,
                   "update": r.update.kind} for r in arch.loops],
        "elastic_eval": list(arch.elastic.eval) if arch.elastic is not None else None,
        "elastic_recorded": loaded.elastic_recorded,
        "data": {"batches": len(data), "batch_size": int(data[0][0].shape[0]), "seed": seed,
                 "seq_len": int(data[0][0].shape[1]), "jacobian_len": int(jac_ids.shape[1]),
                 "probes": probes},
        "intact": intact,
        "interventions": interventions(ev),
        "truncation": truncation(ev, max_loops(arch)) if arch.loops else [],
        "transport": transport(model, jac_ids, probes=probes)[1],
        "traces": traces(model, data),
        "traces_gate_off": traces(model, data, gate_off=True) if has_gate else None,
    }
    write_text(out / "summary.json", json.dumps(summary, indent=1))  # atomic: never through a link
    write_text(out / "summary.md", markdown(summary))
    summary["plots"] = write_plots(summary, out)
    return summary


def _table(head: list[str], rows: list[list]) -> list[str]:
    fmt = [lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))]
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(fmt[0](v) for v in r) + " |" for r in rows)]


def markdown(s: dict) -> str:
    """The summary's tables (traces reduced to one row per loop iteration boundary)."""
    q = s["quality_metric"]
    lines = [f"### {s['arch']} on {s['task']}", "",
             "intact: " + ", ".join(f"{k} {v:.4g}" for k, v in s["intact"].items()), "",
             "context-closed intervention per mixer application:", ""]
    lines += _table(["application", "KL(intact‖closed)", "Δloss", f"Δ{q}"],
                    [[r["label"], r["kl"], r["d_loss"], r["d_quality"]] for r in s["interventions"]])
    if s["truncation"]:
        lines += ["", "loop truncation (every region at k loops)"
                  + (" — elastic checkpoint" if s["elastic_eval"] else "") + ":", ""]
        lines += _table(["k", "loss", q, "KL(p_k+1‖p_k)", "Δloss k→k+1"],
                        [[r["k"], r["loss"], r["quality"], r.get("kl_next"), r.get("d_loss_next")]
                         for r in s["truncation"]])
    if s.get("elastic_recorded"):
        lines += ["", "the trainer's elastic evaluation (result.json):", ""]
        lines += _table(["k", q, "projection FLOPs/token"],
                        [[p["k"], p["quality"], p["compute"]] for p in s["elastic_recorded"]])
    lines += ["", f"cross-position influence after each mixer application (one sequence, "
              f"T = {s['data']['jacobian_len']}):", ""]
    lines += _table(["application", "erank(C)", "cross frac", "new ‖ΔC‖/‖C‖", "erank(ΔC)"],
                    [[r["label"], r["erank"], r["cross_frac"], r["new"], r["new_erank"]]
                     for r in s["transport"]])
    tr, off = s["traces"], s.get("traces_gate_off")
    lines += ["", "traces (residual stream entering each application; final = before the last norm):", ""]
    attn = any(r["first_token_mass"] is not None for r in tr)
    keys = ["rms", "max_abs"] + (["first_token_mass"] if attn else [])
    names = ["RMS", "max abs h"] + (["first-token mass"] if attn else [])
    head = ["point", *names] + ([f"{n} (gate off)" for n in names] if off else [])
    rows = [[r["label"], *(r[k] for k in keys)] + ([off[i][k] for k in keys] if off else [])
            for i, r in enumerate(tr)]
    lines += _table(head, rows)
    return "\n".join(lines) + "\n"


__all__ = ["Loaded", "diagnose", "load_run", "markdown"]
