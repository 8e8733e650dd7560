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
``loopnas_export.json`` lists the files the export wrote: exporting again into the same
directory replaces those, deletes the ones it no longer writes, and leaves everything else
(a ``.git``, notes) alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

from nas.budget import match_budget
from nas.cost import DEFAULT_SEQ_LEN, cost, unique_params
from nas.load import dump_yaml, load_spec, resolve
from nas.lower import lower
from nas.spec import ArchSpec, MatchSpec
from runners.checkpoint import CHECKPOINT, RESULT, write_text

from . import native, vendor
from .pick import Choice, ExportError, Pick, choose
from .readme import readme
from .scale import proportional

HF_DIR = Path(__file__).parent / "hf"
CODE = ("configuration_loopnas.py", "modeling_loopnas.py")
AUTO_MAP = {"AutoConfig": "configuration_loopnas.LoopnasConfig",
            "AutoModelForCausalLM": "modeling_loopnas.LoopnasForCausalLM"}
SCALE_TOLERANCE = 0.02
MANIFEST = "loopnas_export.json"  # the files an export wrote: all that a re-export may delete
_LEGACY = ("config.json", *CODE, vendor.MANIFEST, "model.safetensors", "spec.yaml", "cost.json",
           "README.md")  # what an export wrote before it kept a manifest
_STAGE = ".loopnas-export-"
_SYSTEM = (Path("/proc"), Path("/sys"))
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


def config_dict(arch: ArchSpec, loops: int | None, dtype: str = "float32") -> dict:
    return {"model_type": "loopnas", "architectures": ["LoopnasForCausalLM"], "auto_map": AUTO_MAP,
            "arch": arch.model_dump(mode="json"), "loops": loops, "backend": "auto",
            "vocab_size": arch.model.vocab_size, "hidden_size": arch.model.width,
            "num_hidden_layers": len(arch.layers), "tie_word_embeddings": arch.model.tie_embeddings,
            "use_cache": True, "dtype": dtype}


def _is_export(folder: Path) -> bool:
    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == "loopnas"
    except (OSError, ValueError, AttributeError):
        return False


def _safe_name(name: object) -> bool:
    """A manifest entry names a file inside the export, never outside it."""
    path = PurePosixPath(name) if isinstance(name, str) else None
    return path is not None and bool(path.parts) and not path.is_absolute() and ".." not in path.parts


def _previous(out: Path) -> list[str]:
    """The files an earlier export wrote into ``out``: its manifest's list (an export from
    before the manifest: the files every export writes). A new or empty directory has
    none; a file, a directory holding anything but an export, /proc or /sys are refused."""
    resolved = out.resolve()
    for root in _SYSTEM:
        if resolved.is_relative_to(root):
            raise ExportError(f"--out {out} is under {root}; choose a directory of your own")
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory")
    if not out.is_dir() or all(p.name.startswith(_STAGE) for p in out.iterdir()):
        return []
    try:
        files = json.loads((out / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        files = None
    if isinstance(files, list):
        return [f for f in files if _safe_name(f)]
    if _is_export(out):
        scaled = [f"scaled/{n}" for n in _LEGACY] if _is_export(out / "scaled") else []
        return [n for n in [*_LEGACY, *scaled] if (out / n).is_file()]
    raise ExportError(f"--out {out} is not empty and holds no loopnas export; choose a new directory")


def _write_manifest(out: Path, files: list[str]) -> None:
    write_text(out / MANIFEST, json.dumps({"format": 1, "files": sorted(set(files))}, indent=1) + "\n")


def _remove(out: Path, name: str) -> None:
    """Delete one file an earlier export wrote, and its folders if that left them empty."""
    path = out / name
    if not path.parent.resolve().is_relative_to(out.resolve()):
        return  # a folder replaced by a link: what it points at is not the export's
    if path.is_symlink() or path.is_file():
        path.unlink()
    for folder in path.relative_to(out).parents[:-1]:
        with contextlib.suppress(OSError):  # not empty: it holds someone else's files
            (out / folder).rmdir()


@contextlib.contextmanager
def _export_dir(out: Path) -> Iterator[Path]:
    """A staging folder to write an export into; on success its files replace ``out``'s,
    and of an earlier export's files only those this one no longer writes are deleted:
    nothing else in ``out`` is touched, and a failed export leaves ``out`` as it was."""
    previous = _previous(out)
    out.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=_STAGE, dir=out))
    try:
        yield stage
        written = [p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file()]
        _write_manifest(out, [*previous, *written])  # an interrupted move leaves no file unlisted
        for name in written:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, out / name)
        for name in sorted(set(previous) - set(written)):
            _remove(out, name)
        _write_manifest(out, written)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # this export's own staging folder


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
    """One loadable directory, new or replacing an earlier export (:func:`_export_dir`)."""
    with _export_dir(out) as stage:
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


def _finish(out: Path, arch: ArchSpec, scale_src: ArchSpec, *, loops, how, state, seq_len,
            scale_to, vary, fmt: str = "remote") -> Export:
    chosen = native.choose_format(arch, fmt)  # a native family has no loops, so no elastic depth
    scaled = scale(scale_src, scale_to, vary, chosen.family) if scale_to is not None else None
    scaled_family = native.choose_format(scaled.arch, fmt).family if scaled is not None else None
    note = ""
    if scaled is not None:
        note = (f"`scaled/` holds the same architecture resized for full training: {scaled.params:,} "
                f"unique parameters for a target of {scaled.target:,.0f} ({scaled.miss:.2%} off; "
                f"{_VARIED[vary]}); no weights.")
    with _export_dir(out) as stage:
        _write_files(stage, arch, loops=loops, how=how, state=state, seq_len=seq_len, extra_readme=note,
                     family=chosen.family)
        if scaled is not None:
            _write_files(stage / "scaled", scaled.arch, loops=loops, seq_len=seq_len, state=None,
                         how=f"Resized to {scaled.target:,.0f} unique parameters ({_VARIED[vary]}) "
                             f"from the architecture chosen as follows. {how}", family=scaled_family)
    return Export(out, arch, loops, state is not None, scaled, how, chosen.family, chosen.why)


def _load_state(path: Path) -> dict:
    """A checkpoint's state_dict; a file that does not load is a CheckpointError."""
    from runners.checkpoint import load

    if not path.exists():
        raise ExportError(f"no checkpoint at {path}")
    ckpt = load(path)
    state = ckpt.get("model", ckpt)
    if not isinstance(state, dict) or not state:
        raise ExportError(f"{path} holds no state_dict (expected a trainer checkpoint with key 'model')")
    return state


def _proxy_arch(arch: ArchSpec, ckpt: Path, state: dict) -> ArchSpec:
    """The arch the weights belong to: the trainer's ``result.json`` next to the checkpoint
    (the proxy task may have rewritten the vocabulary), else ``arch`` with the checkpoint's
    vocabulary."""
    from runners.train import TrainResult, with_vocab

    result = ckpt.parent / RESULT
    if result.is_file():
        return TrainResult.model_validate_json(result.read_text()).arch
    embed = state.get("embed.weight", state.get("_orig_mod.embed.weight"))
    return arch if embed is None else with_vocab(arch, int(embed.shape[0]))


def export_spec(spec_path: str | Path, out: str | Path, *, checkpoint: str | Path | None = None,
                scale_to: float | None = None, vary: str = "scale", loops: int | None = None,
                seq_len: int = DEFAULT_SEQ_LEN, fmt: str = "remote") -> Export:
    """Export a spec file, optionally with the weights of a trainer checkpoint of it.
    ``fmt``: ``remote`` (transformers remote code), ``native`` or ``auto``
    (:func:`runners.export.native.choose_format`)."""
    source = load_spec(spec_path)
    arch = resolve(source, str(spec_path))
    how = f"Exported from the spec {Path(spec_path).name}, outside any sweep"
    state = None
    if checkpoint is not None:
        state = _load_state(Path(checkpoint))
        arch = _proxy_arch(arch, Path(checkpoint), state)
        how += f", with the weights of {checkpoint}"
    return _finish(Path(out), arch, source, loops=loops, how=how, state=state, seq_len=seq_len,
                   scale_to=scale_to, vary=vary, fmt=fmt)


def export_trial(exp_dir: str | Path, out: str | Path, *, trial: str | None = None,
                 pick: Pick | None = None, with_weights: bool = False,
                 scale_to: float | None = None, vary: str = "scale", fmt: str = "remote") -> Export:
    """Export one trial of an experiment directory, chosen by id or by a Pareto pick."""
    choice: Choice = choose(exp_dir, trial, pick)
    arch = ArchSpec.model_validate(choice.trial.arch)
    how = _how(choice)
    state = None
    if with_weights:
        ckpt = Path(exp_dir) / "trials" / choice.trial.id / CHECKPOINT
        if not ckpt.is_file():
            raise ExportError(f"trial {choice.trial.id} has no checkpoint ({ckpt}); export without --with-weights")
        state = _load_state(ckpt)
        arch = _proxy_arch(arch, ckpt, state)
    return _finish(Path(out), arch, ArchSpec.model_validate(choice.trial.arch), loops=choice.k,
                   how=how, state=state, seq_len=choice.experiment.seq_len, scale_to=scale_to, vary=vary,
                   fmt=fmt)


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


__all__ = ["Export", "Scaled", "ExportError", "export_spec", "export_trial", "scale", "write_dir",
           "config_dict", "AUTO_MAP"]
