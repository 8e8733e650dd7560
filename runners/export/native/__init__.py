"""Export to transformers' own model families, and import from their configs.

A canonical spec that is exactly one of ``qwen3_next``, ``olmo_hybrid``, ``nemotron_h``,
``falcon_h1``, ``qwen3`` or ``llama`` (no loop, only mixers and norms the family has, one size
per op kind) exports as that family's ``config.json`` and ``model.safetensors`` with converted
weights, so ``AutoModelForCausalLM.from_pretrained(dir)`` loads it without remote code. The
families are disjoint on the spec (zero-centred norms, OLMo's post-norm attention, q/k norm or
none, FFN-less Mamba2/NoPE-attention blocks, parallel Mamba2 + attention layers), so at most
one fits; :func:`fit` says which, or the first field that stops each. ``kimi_linear`` and
``inkling2_loop`` are registered only to refuse, naming the first field (loopnas's KDA biases
its output gate, kimi_linear's does not; inkling2_loop's passes restart and exchange messages).
:func:`import_config` is the reverse: a family's ``config.json`` as a loopnas spec.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from nas.spec import ArchSpec

from . import falcon_h1, inkling2_loop, kimi_linear, llama, nemotron_h, olmo_hybrid, qwen3, qwen3_next
from .common import Blocker

FAMILIES: dict[str, ModuleType] = {m.MODEL_TYPE: m for m in (qwen3_next, olmo_hybrid, nemotron_h, falcon_h1, qwen3,
                                                              llama, kimi_linear, inkling2_loop)}


@dataclass(frozen=True)
class Fit:
    """``family``: the model type ``arch`` is exactly (None: none); ``blockers``: for every
    family that does not fit, the first field that stops it."""

    family: str | None
    blockers: dict[str, Blocker]

    def why_not(self) -> str:
        """One line: the blockers, the families that all stop at the spec's loop merged."""
        at_loop = [name for name, b in self.blockers.items() if b.path == "loops[0]"]
        if len(at_loop) < 2:
            return "; ".join(f"{name}: {b}" for name, b in self.blockers.items())
        rest = [f"{name}: {b}" for name, b in self.blockers.items() if name not in at_loop]
        return "; ".join([f"loops[0]: a loop region; {', '.join(at_loop)} run each layer once", *rest])


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
    stops each family; ``auto``: native where exact and transformers can serve it (a family's
    ``caveat``, such as a GDN-only qwen3_next that cannot generate, keeps remote code), remote
    code otherwise."""
    from ..pick import ExportError

    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    if fmt == "remote":
        return Format(None, "remote code (--format remote): loads with trust_remote_code=True")
    found = fit(arch)
    if found.family is not None:
        module = FAMILIES[found.family]
        cls, caveat = module.ARCHITECTURE, getattr(module, "caveat", lambda a: None)(arch)
        if caveat is not None and fmt == "auto":  # exact, but not fit to serve: remote code can
            return Format(None, f"remote code: the spec is exactly {found.family}, but {caveat}; "
                                "--format native writes it anyway")
        return Format(found.family, f"native {found.family}: the spec is exactly transformers' {cls}, "
                                    "which loads with trust_remote_code=False"
                                    + (f"; note: {caveat}" if caveat is not None else ""))
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


MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes; a bigger file is not one

# Size fields of the families' configs: each, where the config gives it, must be a whole
# number at least this (checked before transformers' config class divides by them).
_SIZES = {k: 1 for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                         "num_key_value_heads", "intermediate_size", "linear_num_key_heads",
                         "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                         "linear_conv_kernel_dim", "num_experts_per_tok", "moe_intermediate_size",
                         "decoder_sparse_step", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
                         "conv_kernel", "mamba_n_heads", "mamba_d_state", "mamba_d_conv")} | {
    "head_dim": 1, "num_experts": 0, "shared_expert_intermediate_size": 0}


def _first_line(exc: BaseException) -> str:
    """The message of ``exc`` as one line of at most 200 characters. huggingface_hub's
    validation errors are a header line (``Validation error for field 'x':``) over the
    cause (``TypeError: ...``): the cause, without its class name, is the message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [exc.__class__.__name__]
    text = lines[0]
    if len(lines) > 1 and text.endswith(":"):
        text = re.sub(r"^[A-Za-z_]\w*(Error|Exception): ", "", lines[1])
    return text if len(text) <= 200 else text[:197] + "..."


def _special_floats(value):
    """transformers writes inf and nan into config.json as ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict):
        tag = value.get("__float__") if len(value) == 1 else None
        if tag in ("Infinity", "-Infinity", "NaN"):
            return float(tag.lower().replace("infinity", "inf"))
        return {k: _special_floats(v) for k, v in value.items()}
    return [_special_floats(v) for v in value] if isinstance(value, list) else value


def _check_sizes(raw: dict) -> None:
    """Every size the config gives is a whole number in range, layers at most MAX_LAYERS."""
    from nas.spec import MAX_LAYERS

    for key, least in _SIZES.items():
        value = raw.get(key)
        if value is None and key in ("head_dim", "num_key_value_heads", "num_experts"):
            continue  # transformers' defaults: hidden_size / heads, heads, no experts
        if key not in raw:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise Blocker(key, f"{value!r}; a whole number{' at least ' + str(least) if least else ''} expected")
    if raw.get("num_hidden_layers", 1) > MAX_LAYERS:
        raise Blocker("num_hidden_layers", f"{raw['num_hidden_layers']}; loopnas takes at most {MAX_LAYERS} layers")
    types = raw.get("layer_types")
    if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
        raise Blocker("layer_types", "a list of layer names (full_attention, linear_attention) expected")


def read_config(source: str | Path) -> dict:
    """A ``config.json`` (or a directory holding one), completed with its transformers
    config class's defaults. Only the JSON is read: no code, no weights, no ``auto_map``;
    anything wrong with it is a :class:`Blocker` (one line)."""
    path = Path(source)
    path = path / "config.json" if path.is_dir() else path
    if not path.exists():
        raise Blocker(str(path), "no such file (give a config.json or a directory holding one)")
    if not path.is_file():
        raise Blocker(str(path), "not a regular file (give a config.json or a directory holding one)")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise Blocker(str(path), f"{path.stat().st_size:,} bytes; not a config.json")
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise Blocker(str(path), f"not a readable JSON config ({exc.__class__.__name__})") from None
    if not isinstance(raw, dict):
        raise Blocker(str(path), f"a JSON {type(raw).__name__}, not a config object")
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise Blocker("model_type", f"{model_type!r}; loopnas imports {', '.join(FAMILIES)}")
    _check_sizes(raw)
    from transformers import AutoConfig

    # for_model: the config class transformers ships for model_type, built from keywords;
    # auto_map (remote code) is never looked at.
    try:
        fields = {k: _special_floats(v) for k, v in raw.items()
                  if k not in ("model_type", "architectures", "transformers_version", "auto_map")}
        return AutoConfig.for_model(model_type, **fields).to_dict()
    except Exception as exc:  # transformers' validation of user data: say it in one line
        raise Blocker(str(path), f"transformers refuses this {model_type} config: {_first_line(exc)}") from None


def _spec_error(exc: Exception) -> str:
    """One line for a spec the config gives that loopnas refuses (the first problem)."""
    from pydantic import ValidationError

    from nas import spec as spec_module
    from nas.errors import SpecError, from_validation_error

    if isinstance(exc, ValidationError):
        root = getattr(spec_module, str(exc.title), None)
        exc = from_validation_error(exc, root) if isinstance(root, type) else exc
    if isinstance(exc, SpecError) and exc.problems:
        first, more = exc.problems[0], len(exc.problems) - 1
        at = f"{first.path}: " if first.path else ""
        return f"{at}{first.message}" + (f" (and {more} more)" if more else "")
    return _first_line(exc)


def import_config(source: str | Path, name: str | None = None) -> ArchSpec:
    """The canonical loopnas spec of a family's config (validated); anything that stops it
    is a :class:`Blocker`."""
    from nas.errors import SpecError
    from nas.load import resolve
    from nas.spec import name_problem

    if name is not None and (problem := name_problem(name)) is not None:
        raise Blocker("--name", problem)
    cfg = read_config(source)
    path = Path(source)
    stem = name or (path.name if path.is_dir() else path.parent.name if path.name == "config.json" else path.stem)
    if name is None:
        stem = re.sub(r"[^\w.+-]", "_", stem).lstrip(".+-")[:100] or cfg["model_type"]
    try:
        spec = FAMILIES[cfg["model_type"]].to_spec(cfg, stem)
        return resolve(spec)
    except Blocker:
        raise
    except KeyError as exc:
        raise Blocker(str(exc.args[0]), "missing from the config") from None
    except (SpecError, ValueError, TypeError, ArithmeticError) as exc:  # ValidationError is a ValueError
        raise Blocker("config", f"gives no valid loopnas spec: {_spec_error(exc)}") from None


__all__ = ["FAMILIES", "FORMATS", "Blocker", "Fit", "Format", "choose_format", "fit", "native_config", "convert",
           "save", "architecture", "read_config", "import_config"]
