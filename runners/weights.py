"""Weights across related architectures: a supernet and its sub-networks, a base model and
the supernet built on it.

Parameter names follow ``builders.model``: a switch layer's options live under
``layers.{i}.mixer.options.{j}.``, a plain mixer under ``layers.{i}.mixer.``. Layer i of
the target takes its mixer weights from the source's layer i when the two mixer specs are
equal, or when one is a switch holding the other as an option. Every other tensor is taken
by name; per-loop tables (ρ, loop conditioning: one row per iteration) keep their leading
rows when the loop counts differ, so a sub-network at ``k`` loops takes rows ``0..k-1``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from nas.spec import ArchSpec, SwitchSpec, stored_spec
from runners.checkpoint import load

_LOOP_TABLES = ("rho", "index_emb", "budget_emb")


def _mixer_prefixes(target: ArchSpec, source: ArchSpec) -> dict[str, str]:
    """Target name prefix → source name prefix, for every layer whose mixer maps. The target
    is compared as migrated, like the stored source (:func:`load_source`): a written
    ``chunk_size: 256`` on both sides still maps (the chunk holds no weights)."""
    target = stored_spec(target.model_dump())
    out = {}
    for i, (t, s) in enumerate(zip(target.layers, source.layers)):
        here = f"layers.{i}.mixer."
        if t.mixer == s.mixer:
            out[here] = here
        elif isinstance(s.mixer, SwitchSpec) and t.mixer in s.mixer.options:
            out[here] = f"{here}options.{s.mixer.options.index(t.mixer)}."
        elif isinstance(t.mixer, SwitchSpec) and s.mixer in t.mixer.options:
            out[f"{here}options.{t.mixer.options.index(s.mixer)}."] = here
    return out


def _source_name(name: str, prefixes: dict[str, str]) -> str | None:
    if ".mixer." not in name:
        return name
    for t, s in prefixes.items():
        if name.startswith(t):
            return s + name[len(t):]
    return None  # a mixer with no counterpart (another switch option, another kind)


def inherit(model: torch.nn.Module, target: ArchSpec, state: dict[str, torch.Tensor],
            source: ArchSpec) -> list[str]:
    """Copy into ``model`` (built from ``target``) every tensor of ``state`` (a model of
    ``source``) that corresponds; returns the names of ``model``'s tensors left as they
    were. Shapes must agree, except the leading rows of per-loop tables."""
    prefixes = _mixer_prefixes(target, source)
    own = model.state_dict()
    left = []
    with torch.no_grad():
        for name, tensor in own.items():
            src = _source_name(name, prefixes)
            value = state.get(src) if src is not None else None
            if value is None:
                left.append(name)
            elif value.shape == tensor.shape:
                tensor.copy_(value)
            elif name.rsplit(".", 1)[-1] in _LOOP_TABLES and value.shape[1:] == tensor.shape[1:]:
                rows = min(len(value), len(tensor))
                tensor[:rows].copy_(value[:rows])
                if rows < len(tensor):
                    left.append(name)
            else:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} here, {tuple(value.shape)} "
                                 f"in the source ({src}); the architectures differ in size")
    return left


def load_source(path: str | Path) -> tuple[ArchSpec, dict[str, torch.Tensor]]:
    """A trainer checkpoint (or an extracted sub-network's weights): its spec (read through
    :func:`nas.spec.migrate_arch`, as every stored spec is) and tensors."""
    ckpt = load(path)
    if "model" not in ckpt or "arch" not in ckpt:
        raise ValueError(f"{path} is not a loopnas checkpoint (no saved spec and weights)")
    return stored_spec(ckpt["arch"]), ckpt["model"]


__all__ = ["inherit", "load_source"]
