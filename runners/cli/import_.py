"""``loopnas import``: a transformers config (qwen3_next, olmo_hybrid, qwen3, llama) as a loopnas spec."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import app
from .common import UsageError, console

ConfigArg = Annotated[Path, typer.Argument(
    help="A config.json, or a model directory holding one (qwen3_next, olmo_hybrid, qwen3 or llama).",
    show_default=False)]
SpecOutOpt = Annotated[Path, typer.Option("--out", "-o", help="The spec file to write (.yaml).", show_default=False)]
NameOpt = Annotated[str | None, typer.Option("--name", help="The spec's name (default: the config's directory).")]


@app.command("import")
def import_cmd(config: ConfigArg, out: SpecOutOpt, name: NameOpt = None) -> None:
    """Write the loopnas spec of a transformers config (qwen3_next, olmo_hybrid, qwen3, llama).

    Every layer is explicit, the parameters are the transformers model's, and `loopnas export
    SPEC --format native` gives the config's architecture back. A space's `base:` may name
    the spec, and --scale-to / `vary: scale` resize it for a search.

    Examples: loopnas import ~/models/Qwen3-Next-80B-A3B/config.json --out qwen3_next.yaml ;
    loopnas import olmo-hybrid/ --out olmo_hybrid.yaml --name olmo_hybrid_7b
    """
    from nas.cost import unique_params
    from nas.load import dump_yaml
    from runners.export.native import Blocker, import_config

    if out.suffix not in (".yaml", ".yml"):
        raise UsageError(f"--out {out} should be a .yaml file")
    try:
        arch = import_config(config, name)
    except Blocker as exc:
        raise UsageError(f"cannot import {config}: {exc}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dump_yaml(arch))
    kinds: dict[str, int] = {}
    for layer in arch.layers:
        kinds[layer.mixer.kind] = kinds.get(layer.mixer.kind, 0) + 1
    mix = ", ".join(f"{n} {k}" for k, n in kinds.items())
    console.print(f"wrote {out}: {arch.name}, {len(arch.layers)} layers ({mix}), width {arch.model.width}, "
                  f"{unique_params(arch):,} unique params", markup=False)
