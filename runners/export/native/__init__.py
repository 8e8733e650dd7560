"""Export to transformers' own model families, and import from their configs.

A canonical spec that is exactly one of ``qwen3_next``, ``olmo_hybrid``, ``qwen3`` or
``llama`` (no loop, only mixers and norms the family has, one size per op kind) exports as
that family's ``config.json`` and ``model.safetensors`` with converted weights, so
``AutoModelForCausalLM.from_pretrained(dir)`` loads it without remote code. The families
are disjoint on the spec (zero-centred norms, OLMo's post-norm attention, q/k norm or none),
so at most one fits; :func:`fit` says which, or the first field that stops each.
:func:`import_config` is the reverse: a family's ``config.json`` as a loopnas spec.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from nas.spec import ArchSpec

from . import llama, olmo_hybrid, qwen3, qwen3_next
from .common import Blocker

FAMILIES: dict[str, ModuleType] = {m.MODEL_TYPE: m for m in (qwen3_next, olmo_hybrid, qwen3, llama)}


@dataclass(frozen=True)
class Fit:
    """``family``: the model type ``arch`` is exactly (None: none); ``blockers``: for every
    family that does not fit, the first field that stops it."""

    family: str | None
    blockers: dict[str, Blocker]

    def why_not(self) -> str:
        """One line: the blockers, merged where every family stops at the same field."""
        found = list(self.blockers.values())
        if found and all(b.path == found[0].path for b in found) and found[0].path.startswith("loops"):
            return f"{found[0].path}: a loop region; transformers' native families run each layer once"
        return "; ".join(f"{name}: {b}" for name, b in self.blockers.items())


def fit(arch: ArchSpec) -> Fit:
    blockers = {}
    for name, module in FAMILIES.items():
        b = module.blocker(arch)
        if b is None:
            return Fit(name, blockers)
        blockers[name] = b
    return Fit(None, blockers)


FORMATS = ("remote", "native", "auto")


@dataclass(frozen=True)
class Format:
    """What ``--format`` resolved to: ``family`` (None: remote code) and why, in words."""

    family: str | None
    why: str


def choose_format(arch: ArchSpec, fmt: str) -> Format:
    """``remote``: transformers remote code (any spec); ``native``: the family ``arch`` is
    exactly, else an :class:`~runners.export.pick.ExportError` naming the first field that
    stops each family; ``auto``: native where exact, remote code otherwise."""
    from ..pick import ExportError

    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    if fmt == "remote":
        return Format(None, "remote code (--format remote): loads with trust_remote_code=True")
    found = fit(arch)
    if found.family is not None:
        cls = FAMILIES[found.family].ARCHITECTURE
        return Format(found.family, f"native {found.family}: the spec is exactly transformers' {cls}, "
                                    "which loads with trust_remote_code=False")
    if fmt == "native":
        raise ExportError(f"--format native: {arch.name} is no transformers-native family; {found.why_not()}")
    return Format(None, f"remote code: no native family fits ({found.why_not()})")


def native_config(arch: ArchSpec, family: str, dtype: str = "float32") -> dict:
    return FAMILIES[family].config(arch) | {"dtype": dtype}


def convert(arch: ArchSpec, family: str, state: dict) -> dict:
    """loopnas's state dict (``LoopLM`` names) as the family's (``model.layers.0...``)."""
    state = {k.removeprefix("_orig_mod."): v for k, v in state.items()}
    return FAMILIES[family].convert(arch, state)


def save(out: Path, arch: ArchSpec, family: str, state: dict | None) -> str:
    """Write ``config.json`` and, given weights, ``model.safetensors``; returns the dtype."""
    dtype = "float32"
    if state is not None:
        from safetensors.torch import save_file

        tensors = {k: v.detach().cpu().contiguous().clone() for k, v in convert(arch, family, state).items()}
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(native_config(arch, family, dtype), indent=2) + "\n")
    return dtype


def architecture(config: dict) -> dict:
    """The fields of a family config that decide its architecture (dead ones left out)."""
    return FAMILIES[config["model_type"]].architecture(config)


def read_config(source: str | Path) -> dict:
    """A ``config.json`` (or a directory holding one), completed with its transformers
    config class's defaults."""
    path = Path(source)
    path = path / "config.json" if path.is_dir() else path
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise Blocker(str(path), "no such file (give a config.json or a directory holding one)") from None
    except (OSError, ValueError) as exc:
        raise Blocker(str(path), f"not a readable JSON config ({exc.__class__.__name__})") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in FAMILIES:
        raise Blocker("model_type", f"{model_type!r}; loopnas imports {', '.join(FAMILIES)}")
    from transformers import AutoConfig

    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    try:
        return AutoConfig.for_model(model_type, **fields).to_dict()
    except (TypeError, ValueError) as exc:
        raise Blocker(str(path), f"transformers refuses this {model_type} config: {exc}") from None


def import_config(source: str | Path, name: str | None = None) -> ArchSpec:
    """The canonical loopnas spec of a family's config (validated)."""
    from nas.load import resolve

    cfg = read_config(source)
    path = Path(source)
    stem = name or (path.name if path.is_dir() else path.parent.name if path.name == "config.json" else path.stem)
    stem = re.sub(r"[^\w.+-]", "_", stem).lstrip(".+-") or cfg["model_type"]
    try:
        spec = FAMILIES[cfg["model_type"]].to_spec(cfg, stem)
    except KeyError as exc:
        raise Blocker(str(exc.args[0]), "missing from the config") from None
    return resolve(spec)


__all__ = ["FAMILIES", "FORMATS", "Blocker", "Fit", "Format", "choose_format", "fit", "native_config", "convert", "save", "architecture",
           "read_config", "import_config"]
