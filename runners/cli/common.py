"""Option aliases and helpers shared by the commands."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(soft_wrap=True)
console_err = Console(stderr=True, soft_wrap=True)


class UsageError(ValueError):
    """A bad command-line value: printed as one line, exit code 2."""


SpecArg = Annotated[Path, typer.Argument(help="Architecture spec (.yaml), or the name of a shipped one (e.g. mixerloop_15m).", show_default=False)]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Output file or directory.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.")]
SeedsOpt = Annotated[int | None, typer.Option("--seeds", min=1, help="Seed replicates per candidate (default: the space's proxy.seeds, else 1).")]


def spec_path(spec: Path) -> Path:
    """A path as given, or a shipped architecture by name; a bare name that is neither is a
    SpecError suggesting the nearest shipped name."""
    if spec.exists() or spec.suffix in (".yaml", ".yml"):
        return spec
    from spaces import arch_names, arch_path
    shipped = arch_path(str(spec))
    if shipped is not None:
        return shipped
    if spec.parent == Path("."):
        from nas.errors import Problem, SpecError, suggest
        hint = suggest(spec.name, arch_names()) or f"shipped names: {', '.join(arch_names())}; "
        raise SpecError([Problem("", f"neither a file nor a shipped architecture; {hint}"
                                     "or give the path of a .yaml spec")], str(spec))
    return spec


def load(spec: Path):
    from nas.load import load_arch
    return load_arch(spec_path(spec))
