"""``loopnas export``: an architecture as a directory that plain transformers loads.

One export directory holds ``config.json`` (``model_type: loopnas``, ``auto_map``, the
canonical spec), the modeling code (``configuration_loopnas.py``, ``modeling_loopnas.py``
and flat copies of the loopnas modules they need, see :mod:`runners.export.vendor`),
``model.safetensors`` when weights are asked for, ``spec.yaml``, ``cost.json`` and a
``README.md``. ``--scale-to`` adds ``scaled/``: the same kind of directory, without
weights, for the architecture resized to a parameter target by the budget matcher.
With ``fmt="native"`` (or ``auto`` where it fits) the directory is instead a
transformers-native model (``qwen3_next``, ``olmo_hybrid``, ``qwen3``, ``llama``): config and
converted weights, no code (:mod:`runners.export.native`).
``loopnas_export.json`` lists the files the export wrote with their hashes, and whose weights
they are: exporting again into the same directory replaces those, deletes the ones it no
longer writes, and leaves everything else (a ``.git``, notes) alone
(:mod:`runners.export.outdir`). Weights come from a trainer checkpoint of the exported spec
(for a seeded sweep, of one replicate: :mod:`runners.export.weights`).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from nas.budget import match_budget
from nas.cost import DEFAULT_SEQ_LEN, cost, unique_params
from nas.load import dump_yaml, load_spec, resolve
from nas.lower import lower
from nas.spec import ArchSpec, MatchSpec, stored_spec
from . import native, vendor
from .outdir import MANIFEST, staged
from .pick import Choice, ExportError, Pick, choose
from .readme import readme
from .scale import proportional
from .weights import Weights, owner, trial_checkpoint

HF_DIR = Path(__file__).parent / "hf"
CODE = ("configuration_loopnas.py", "modeling_loopnas.py")
AUTO_MAP = {"AutoConfig": "configuration_loopnas.LoopnasConfig",
            "AutoModelForCausalLM": "modeling_loopnas.LoopnasForCausalLM"}
SCALE_TOLERANCE = 0.02
_VARIED = {"scale": "width, head counts and FFN widths grown together, head dims kept",
           "width": "the width varied alone by the loopnas budget matcher",
           "ffn_hidden": "the FFN width varied alone by the loopnas budget matcher",
           "num_layers": "the layer count varied by the loopnas budget matcher"}


@dataclass(frozen=True)
class Scaled:
    arch: ArchSpec
    target: float
    vary: str

    @property
    def params(self) -> int:
        return unique_params(self.arch)

    @property
    def miss(self) -> float:
        """Relative distance of the unique parameter count from the target."""
        return abs(self.params - self.target) / self.target


@dataclass(frozen=True)
class Export:
    out: Path
    arch: ArchSpec
    loops: int | None
    with_weights: bool
    scaled: Scaled | None
    how: str
    family: str | None = None  # the transformers-native model type written (None: remote code)
    why: str = ""  # why this format (--format auto says which and why)
    weights: Weights | None = None  # whose weights, when with_weights


def config_dict(arch: ArchSpec, loops: int | None, dtype: str = "float32") -> dict:
    return {"model_type": "loopnas", "architectures": ["LoopnasForCausalLM"], "auto_map": AUTO_MAP,
            "arch": arch.model_dump(mode="json"), "loops": loops, "backend": "auto",
            "vocab_size": arch.model.vocab_size, "hidden_size": arch.model.width,
            "num_hidden_layers": len(arch.layers), "tie_word_embeddings": arch.model.tie_embeddings,
            "use_cache": True, "dtype": dtype}


def write_code(out: Path) -> list[str]:
    for name in CODE:
        shutil.copyfile(HF_DIR / name, out / name)
    return [*CODE, *vendor.vendor(out)]


def _save_weights(path: Path, arch: ArchSpec, state: dict) -> str:
    """Check ``state`` against the model ``arch`` compiles to, then save it as safetensors
    under transformers' names (``model.`` + the loopnas name)."""
    from safetensors.torch import save_file

    state = _checked(arch, state)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
    return str(next(iter(tensors.values())).dtype).removeprefix("torch.")


def _checked(arch: ArchSpec, state: dict) -> dict:
    """``state`` (without a torch.compile prefix), if its names and shapes are the model's."""
    import torch

    from builders.model import build_model

    state = {k.removeprefix("_orig_mod."): v for k, v in state.items()}  # torch.compile'd trainers
    with torch.device("meta"):
        model = build_model(arch, backend="torch")
    expected = model.state_dict()
    missing, extra = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    wrong = [k for k in expected.keys() & state.keys() if tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or extra or wrong:
        first = (f"missing {missing[0]}" if missing else f"unexpected {extra[0]}" if extra
                 else f"{wrong[0]} has shape {tuple(state[wrong[0]].shape)}, expected {tuple(expected[wrong[0]].shape)}")
        raise ExportError(f"the weights do not fit {arch.name}: {first} "
                          f"({len(missing)} missing, {len(extra)} unexpected, {len(wrong)} mis-shaped)")
    return state


def write_dir(out: Path, arch: ArchSpec, *, loops: int | None, how: str, state: dict | None,
              seq_len: int, extra_readme: str = "") -> None:
    """One loadable directory, new or replacing an earlier export (:func:`outdir.staged`)."""
    with staged(out) as stage:
        _write_files(stage, arch, loops=loops, how=how, state=state, seq_len=seq_len,
                     extra_readme=extra_readme)


def _write_native(out: Path, arch: ArchSpec, family: str, *, how: str, state: dict | None,
                  seq_len: int, extra_readme: str = "") -> None:
    """A transformers-native directory (:mod:`runners.export.native`): config, converted
    weights, spec, cost sheet, README; no code."""
    from .native.readme import native_readme

    out.mkdir(parents=True, exist_ok=True)
    native.save(out, arch, family, _checked(arch, state) if state is not None else None)
    (out / "spec.yaml").write_text(dump_yaml(arch))
    sheet = cost(arch, seq_len=seq_len)
    (out / "cost.json").write_text(json.dumps(sheet.to_dict(), indent=2) + "\n")
    caveat = getattr(native.FAMILIES[family], "caveat", lambda a: None)(arch)
    extra_readme = (extra_readme + f"\n\nNote: {caveat}.").strip() if caveat else extra_readme
    (out / "README.md").write_text(native_readme(arch, sheet, family=family, how=how, with_weights=state is not None,
                                                 architecture=native.FAMILIES[family].ARCHITECTURE,
                                                 extra=extra_readme))


def _write_files(out: Path, arch: ArchSpec, *, loops: int | None, how: str, state: dict | None,
                 seq_len: int, extra_readme: str = "", family: str | None = None) -> None:
    """Config, code, spec, cost sheet, README, optional weights (``family``: a native one)."""
    if family is not None:
        return _write_native(out, arch, family, how=how, state=state, seq_len=seq_len, extra_readme=extra_readme)
    out.mkdir(parents=True, exist_ok=True)
    write_code(out)
    dtype = _save_weights(out / "model.safetensors", arch, state) if state is not None else "float32"
    (out / "config.json").write_text(json.dumps(config_dict(arch, loops, dtype), indent=2) + "\n")
    (out / "spec.yaml").write_text(dump_yaml(arch))
    sheet = cost(arch, seq_len=seq_len)
    (out / "cost.json").write_text(json.dumps(sheet.to_dict(), indent=2) + "\n")
    (out / "README.md").write_text(readme(arch, sheet, loops=loops, how=how,
                                          with_weights=state is not None, extra=extra_readme))


def scale(source: ArchSpec, target: float, vary: str = "scale", family: str | None = None) -> Scaled:
    """``source`` resized to ``target`` unique parameters, keeping the layer pattern and
    the loop regions (boundary, ratio, placement, schedules). ``vary``: ``scale`` grows the
    width, head counts and FFN widths together (:func:`runners.export.scale.proportional`);
    ``width``, ``ffn_hidden``, ``num_layers``: the budget matcher varies that size alone.
    ``family``: a transformers-native family the resized spec must stay (``scale`` only tries
    the widths that keep it)."""
    if target <= 0:
        raise ExportError(f"--scale-to must be positive (got {target:g})")
    if vary == "scale":
        try:
            keep = None if family is None else (lambda a: native.fit(a).family == family)
            arch = proportional(lower(source), float(target), SCALE_TOLERANCE, keep=keep)
        except ValueError as exc:
            raise ExportError(str(exc)) from None
    else:
        arch = match_budget(source, MatchSpec(unique_params=float(target), vary=vary, tolerance=SCALE_TOLERANCE))
    label = f"{target / 1e9:.3g}B" if target >= 1e9 else f"{target / 1e6:.3g}M"
    arch = arch.model_copy(update={"name": f"{source.name}_{label}", "description":
                                   f"{source.name} resized to {unique_params(arch):,} unique parameters."})
    return Scaled(arch, float(target), vary)


def _finish(out: Path, arch: ArchSpec, scale_src: ArchSpec, *, loops, how, weights: Weights | None, seq_len,
            scale_to, vary, fmt: str = "remote") -> Export:
    chosen = native.choose_format(arch, fmt)  # a native family has no loops, so no elastic depth
    scaled = scale(scale_src, scale_to, vary, chosen.family) if scale_to is not None else None
    scaled_family = native.choose_format(scaled.arch, fmt).family if scaled is not None else None
    arch, state = (weights.arch, weights.state) if weights is not None else (arch, None)
    note = weights.sentence() if weights is not None else ""
    if scaled is not None:
        note += (f" `scaled/` holds the same architecture resized for full training: {scaled.params:,} "
                 f"unique parameters for a target of {scaled.target:,.0f} ({scaled.miss:.2%} off; "
                 f"{_VARIED[vary]}); no weights.")
    with staged(out, {"weights": weights.manifest() if weights is not None else None}) as stage:
        _write_files(stage, arch, loops=loops, how=how, state=state, seq_len=seq_len, extra_readme=note.strip(),
                     family=chosen.family)
        if scaled is not None:
            _write_files(stage / "scaled", scaled.arch, loops=loops, seq_len=seq_len, state=None,
                         how=f"Resized to {scaled.target:,.0f} unique parameters ({_VARIED[vary]}) "
                             f"from the architecture chosen as follows. {how}", family=scaled_family)
    return Export(out, arch, loops, state is not None, scaled, how, chosen.family, chosen.why, weights)


def _weights(arch: ArchSpec, path: Path, **source) -> Weights:
    """The checkpoint's weights, once shown to be ``arch``'s (:func:`runners.export.weights.owner`);
    a file that does not load is a CheckpointError."""
    from runners.checkpoint import checkpoint_cap, load

    if not path.exists():
        raise ExportError(f"no checkpoint at {path}")
    ckpt = load(path, cap=checkpoint_cap(arch, any_vocab=True))  # trained on its task's vocabulary
    state = ckpt.get("model", ckpt)
    if not isinstance(state, dict) or not state:
        raise ExportError(f"{path} holds no state_dict (expected a trainer checkpoint with key 'model')")
    return Weights(path, state, owner(arch, path, ckpt, state), **source)


def export_spec(spec_path: str | Path, out: str | Path, *, checkpoint: str | Path | None = None,
                scale_to: float | None = None, vary: str = "scale", loops: int | None = None,
                seq_len: int = DEFAULT_SEQ_LEN, fmt: str = "remote") -> Export:
    """Export a spec file, optionally with the weights of a trainer checkpoint of it.
    ``fmt``: ``remote`` (transformers remote code), ``native`` or ``auto``
    (:func:`runners.export.native.choose_format`)."""
    source = load_spec(spec_path)
    arch = resolve(source, str(spec_path))
    how = f"Exported from the spec {Path(spec_path).name}, outside any sweep"
    weights = None
    if checkpoint is not None:
        weights = _weights(arch, Path(checkpoint))
        how += f", with the weights of {checkpoint}"
    return _finish(Path(out), arch, source, loops=loops, how=how, weights=weights, seq_len=seq_len,
                   scale_to=scale_to, vary=vary, fmt=fmt)


def export_trial(exp_dir: str | Path, out: str | Path, *, trial: str | None = None,
                 pick: Pick | None = None, with_weights: bool = False, replicate: int | None = None,
                 scale_to: float | None = None, vary: str = "scale", fmt: str = "remote") -> Export:
    """Export one trial of an experiment directory, chosen by id or by a Pareto pick;
    ``with_weights``: with its checkpoint's weights (a seeded trial: of the replicate nearest
    its mean, or of ``replicate``)."""
    if replicate is not None and not with_weights:
        raise ExportError("--replicate picks whose weights to export: give --with-weights too")
    choice: Choice = choose(exp_dir, trial, pick)
    arch = stored_spec(choice.trial.arch)
    weights = None
    if with_weights:
        t = choice.trial
        path, rep, why = trial_checkpoint(Path(exp_dir), t, choice.experiment.objectives, choice.k, replicate)
        weights = _weights(arch, path, trial=t.id, replicate=rep.index if rep else None,
                           seed=rep.seed if rep else t.seed, replicates=max(1, len(t.replicates)), why=why)
    how = _how(choice) + " " + scale_check(Path(exp_dir))
    return _finish(Path(out), arch, arch, loops=choice.k, how=how, weights=weights,
                   seq_len=choice.experiment.seq_len, scale_to=scale_to, vary=vary, fmt=fmt)


def scale_check(exp_dir: Path) -> str:
    """At which scale the choice was checked (issue #30): picked from a transfer's larger
    scale (``--pick knee@4x``), from a sweep whose transfer says whether its order holds, or
    from one whose order nothing has checked beyond the proxy."""
    from runners.transfer import TRANSFER, find

    exp_dir = Path(exp_dir)
    if exp_dir.parent.name == TRANSFER and exp_dir.name.startswith("scale-"):
        t = find(exp_dir.parent.parent)
        label = exp_dir.name[len("scale-"):]
        return (f"Chosen from the {label} front of the sweep's transfer (`loopnas transfer`): the candidates "
                f"retrained at {label} width" + (f"; {t.verdict}." if t is not None else "."))
    t = find(exp_dir)
    if t is not None:
        scales = ", ".join(s.label for s in t.scales[1:])
        return f"Chosen at the proxy's scale; its order was checked at {scales} by `loopnas transfer`: {t.verdict}."
    return ("Chosen at the proxy's scale; whether its order holds at larger scale was not checked "
            "(`loopnas transfer EXP` retrains the front wider and says so).")


def _how(c: Choice) -> str:
    values = ", ".join(f"{k} = {v:.6g}" for k, v in c.values.items())
    lines = [f"Experiment `{c.experiment.name}`: {c.how}."]
    if values:
        lines.append(f"Objective values: {values}.")
    if c.front:
        on = c.trial.id in {f.split(' ')[0] for f in c.front}
        lines.append(f"Pareto front ({len(c.front)} points): {', '.join(c.front)}; "
                     f"this trial is {'on' if on else 'not on'} it.")
    if c.trial.summary:
        lines.append(f"Sweep summary: {c.trial.summary}.")
    return " ".join(lines)


__all__ = ["Export", "Scaled", "ExportError", "Weights", "export_spec", "export_trial", "scale", "scale_check", "write_dir",
           "config_dict", "AUTO_MAP", "MANIFEST"]
