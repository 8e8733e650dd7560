"""``loopnas validate SPEC...``: check specs; exit 2 with one line per problem."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nas.errors import SpecError

from . import app
from .common import console, console_err, load


@app.command("validate")
def validate_cmd(
    specs: Annotated[list[Path], typer.Argument(help="Spec files or shipped names.", show_default=False)],
) -> None:
    """Validate architecture specs.

    Example: loopnas validate spaces/archs/mixerloop_15m.yaml
    """
    failed = False
    for spec in specs:
        try:
            arch = load(spec)
        except SpecError as exc:
            failed = True
            for line in str(exc).splitlines():
                console_err.print(f"error: {line}", markup=False, highlight=False)
            continue
        console.print(f"ok  {spec}  ({arch.name}: {len(arch.layers)} layers, "
                      f"{len(arch.loops)} loop regions)", highlight=False)
    if failed:
        raise typer.Exit(2)
