"""Shipped architectures (``spaces/archs/*.yaml``) and search spaces (``spaces/*.yaml``)."""
from __future__ import annotations

from pathlib import Path

ARCHS = Path(__file__).parent / "archs"
SPACES = Path(__file__).parent


def arch_names() -> list[str]:
    return sorted(p.stem for p in ARCHS.glob("*.yaml"))


def arch_path(name: str) -> Path | None:
    p = ARCHS / f"{name}.yaml"
    return p if p.is_file() else None


def space_names() -> list[str]:
    return sorted(p.stem for p in SPACES.glob("*.yaml"))


def space_path(name: str) -> Path | None:
    p = SPACES / f"{Path(name).stem}.yaml"
    return p if p.is_file() and Path(name).stem == name.removesuffix(".yaml") else None


__all__ = ["ARCHS", "SPACES", "arch_names", "arch_path", "space_names", "space_path"]
