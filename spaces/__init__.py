"""Shipped architectures (``spaces/archs/*.yaml``) and search spaces."""
from __future__ import annotations

from pathlib import Path

ARCHS = Path(__file__).parent / "archs"


def arch_names() -> list[str]:
    return sorted(p.stem for p in ARCHS.glob("*.yaml"))


def arch_path(name: str) -> Path | None:
    p = ARCHS / f"{name}.yaml"
    return p if p.is_file() else None


__all__ = ["ARCHS", "arch_names", "arch_path"]
