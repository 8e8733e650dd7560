"""``loopnas export``: a spec, or a sweep's chosen trial, as a transformers model directory."""
from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import UsageError, console, console_err, spec_path


class PickRule(str, Enum):
    knee = "knee"
    best_quality = "best-quality"
    cheapest = "cheapest"


class Format(str, Enum):
    remote = "remote"
    native = "native"
    auto = "auto"


class Vary(str, Enum):
    scale = "scale"
    width = "width"
    ffn_hidden = "ffn_hidden"
    num_layers = "num_layers"


SourceArg = Annotated[Path, typer.Argument(
    help="An experiment directory (with --trial or --pick), or an architecture spec (.yaml or a shipped name).",
    show_default=False)]
ExportOutOpt = Annotated[Path, typer.Option(
    "--out", "-o", help="The export directory: new, empty, or an earlier export (only files it provably "
                        "wrote, by the hashes in its loopnas_export.json, are replaced or deleted; nothing "
                        "else in it is touched).",
    show_default=False)]
TrialOpt = Annotated[str | None, typer.Option("--trial", help="Export this trial (e.g. t0007).")]
PickOpt = Annotated[str | None, typer.Option(
    "--pick", help="Pick a trial from the Pareto front: knee, best-quality or cheapest; RULE@4x (or @largest) "
                   "picks from that scale of the sweep's transfer (loopnas transfer).", show_default=False)]
ScaleOpt = Annotated[float | None, typer.Option(
    "--scale-to", help="Also write scaled/: the architecture resized to this many unique parameters (e.g. 1.3e9).",
    show_default=False)]
VaryOpt = Annotated[Vary, typer.Option(
    "--vary", help="What --scale-to varies: scale (width, heads and FFN together), or one size alone.")]
WeightsOpt = Annotated[bool, typer.Option("--with-weights", help="Include the trial's proxy weights (sweeps).")]
ReplicateOpt = Annotated[int | None, typer.Option(
    "--replicate", min=0, help="With --with-weights, for a seeded sweep: the replicate whose weights to export "
                               "(default: the one whose quality is nearest the candidate's mean).",
    show_default=False)]
FormatOpt = Annotated[Format, typer.Option(
    "--format", help="remote: transformers remote code (any spec); native: a transformers family (qwen3_next, "
                     "olmo_hybrid, qwen3, llama) with converted weights, loaded without remote code; auto: native "
                     "where the spec is exactly such a family and transformers can generate with it, remote code "
                     "otherwise (it prints which and why).")]
CkptOpt = Annotated[Path | None, typer.Option(
    "--checkpoint", help="A trainer checkpoint of the spec whose weights to include (specs).", show_default=False)]


def _warn_unreadable(exp_dir: Path) -> None:
    """One warning line per trial record the export skips (runners.export.pick.read); none
    when the experiment itself is unreadable (the export's error says so). Through the index
    (``records.iter_index``, one digest at a time): only records changed since it was written
    are read again, and an unreadable one always is, so it is named."""
    from runners.results.records import iter_index, read_experiment

    try:
        read_experiment(exp_dir)
    except (OSError, ValueError):
        return
    skipped: list = []
    for _ in iter_index(exp_dir, problems=skipped):
        pass
    for p in skipped:
        console_err.print(f"warning: {p}; skipped", markup=False, highlight=False)


@app.command("export")
def export_cmd(
    source: SourceArg,
    out: ExportOutOpt,
    trial: TrialOpt = None,
    pick: PickOpt = None,
    with_weights: WeightsOpt = False,
    replicate: ReplicateOpt = None,
    checkpoint: CkptOpt = None,
    scale_to: ScaleOpt = None,
    vary: VaryOpt = Vary.scale,
    format: FormatOpt = Format.remote,
) -> None:
    """Write a directory that transformers loads with
    AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True), without loopnas:
    config, modeling code, spec.yaml, cost.json, README.md, optional weights, scaled/.

    Examples: loopnas export experiments/quick --pick knee --with-weights --out chosen/ ;
    loopnas export runs/quickstart --pick knee@4x --out chosen4x/ ;
    loopnas export runs/quickstart --trial t0005 --with-weights --replicate 1 --out t5s1/ ;
    loopnas export mixerloop_15m --out ml15m/ --scale-to 1.3e9 ;
    loopnas export hybrid.yaml --checkpoint ckpt.pt --format auto --out native/
    """
    from runners.export import export_spec, export_trial

    if scale_to is not None and not 0 < scale_to < math.inf:  # nan fails both
        raise UsageError(f"--scale-to: give a finite number of unique parameters > 0, e.g. 1.3e9 (got {scale_to:g})")
    if source.is_dir() or trial is not None or pick is not None:
        if checkpoint is not None:
            raise UsageError("--checkpoint is for a spec; a trial's weights come with --with-weights")
        if pick is not None:
            from runners.export.pick import at_scale
            source, pick = at_scale(source, pick)
            if pick not in {r.value for r in PickRule}:
                raise UsageError(f"--pick: give knee, best-quality or cheapest, optionally @SCALE (got {pick!r})")
        _warn_unreadable(source)
        result = export_trial(source, out, trial=trial, pick=pick,
                              with_weights=with_weights, replicate=replicate, scale_to=scale_to, vary=vary.value,
                              fmt=format.value)
    else:
        if replicate is not None:
            raise UsageError("--replicate picks a replicate of a sweep's trial; a spec's weights come with --checkpoint")
        if with_weights and checkpoint is None:
            raise UsageError("a spec has no trained weights: give --checkpoint CKPT")
        result = export_spec(spec_path(source), out, checkpoint=checkpoint, scale_to=scale_to,
                             vary=vary.value, fmt=format.value)
    console.print(f"exported {result.arch.name} to {result.out}"
                  + (" with weights" if result.with_weights else "")
                  + (f" (loops={result.loops})" if result.loops is not None else ""), markup=False)
    console.print(f"format: {result.why}", markup=False)
    w = result.weights
    if w is not None and w.replicate is not None:
        console.print(f"weights: replicate {w.replicate} (seed {w.seed}) of {w.replicates}: {w.why}", markup=False)
    if result.scaled is not None:
        s = result.scaled
        console.print(f"scaled/: {s.params:,} unique params, {s.miss:.2%} from {s.target:,.0f} "
                      f"(vary {s.vary})", markup=False)
