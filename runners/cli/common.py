"""Option aliases and helpers shared by the commands."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nas.errors import LoopnasError
from nas.proxy import TASK_PARAMS

console = Console(soft_wrap=True)
console_err = Console(stderr=True, soft_wrap=True)


class UsageError(LoopnasError):
    """A bad command-line value: printed as one line, exit code 2."""


SpecArg = Annotated[Path, typer.Argument(help="Architecture spec (.yaml), or the name of a shipped one (e.g. mixerloop_15m).", show_default=False)]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Output file or directory.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.")]
SeedsOpt = Annotated[int | None, typer.Option("--seeds", min=1, help="Seed replicates per candidate (default: the space's proxy.seeds, else 1).")]
SpaceArg = Annotated[Path, typer.Argument(help="Space file (.yaml or .py), or a shipped space name (quickstart).", show_default=False)]
TaskOpt = Annotated[str | None, typer.Option(  # the tasks as nas.proxy knows them: no torch import
    "--task", help=f"Proxy task: {', '.join(TASK_PARAMS)}.", show_default=False)]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", help="key=value (YAML value): a trainer field (lr=1e-3, curriculum.stage_steps=200) "
                  "or a task parameter (task.num_kv_pairs=8). Repeatable.")]
SeqLenOpt = Annotated[int | None, typer.Option(
    "--seq-len", help="Context length at which sequence-mixing FLOPs and memory are priced.", show_default=False)]
TokensOpt = Annotated[float | None, typer.Option(
    "--tokens", help="A token count (e.g. 2e5 or 52.43e9).", show_default=False)]


class Engine(str, Enum):
    """What runs a sweep's trials (``runners.sweep.run``)."""

    optuna = "optuna"
    ray = "ray"


EngineOpt = Annotated[Engine | None, typer.Option(
    "--engine", help="What runs the trials: optuna (local worker processes, the default) or ray (Ray Tune: "
                     "a local instance, or a cluster with --address).", show_default=False)]


def token_count(tokens: float | None) -> int | None:
    """``--tokens`` as an int: a positive finite count, else a UsageError."""
    if tokens is None:
        return None
    if not 1 <= tokens < float("inf"):
        raise UsageError(f"--tokens must be a positive finite number (got {tokens:g})")
    return int(tokens)


def pick_engine(given: Engine | None) -> str | None:
    """``--engine`` as a plain name (None: not given)."""
    return None if given is None else Engine(given).value


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
