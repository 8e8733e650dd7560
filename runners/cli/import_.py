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


def write_spec(out: Path, text: str) -> None:
    """Write ``text`` to ``out`` and nowhere else: into a temporary file beside it, then
    renamed over it (a symlink at ``out`` is replaced, not followed; a failed write leaves
    no partial file). Missing parent folders are made, and removed again if the write fails."""
    from runners.checkpoint import write_text

    made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text(out, text)
    except BaseException:
        for folder in made:  # innermost first
            try:
                folder.rmdir()
            except OSError:
                break
        raise


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
    from nas.graph import summary
    from nas.load import dump_yaml
    from runners.export.native import Blocker, import_config

    if out.suffix not in (".yaml", ".yml"):
        raise UsageError(f"--out {out} should be a .yaml file")
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give the spec file to write (.yaml)")
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UsageError(f"--out {out}: {blocking} is a file, not a folder")
    try:
        arch = import_config(config, name)
    except Blocker as exc:
        whole = Path(exc.path) in (config, config / "config.json")  # the file itself: it names it
        raise UsageError(f"cannot import {exc}" if whole else f"cannot import {config}: {exc}") from None
    try:
        write_spec(out, dump_yaml(arch))
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write: {exc.strerror or exc}") from None
    console.print(f"wrote {out}: {arch.name}, {summary(arch)}, {unique_params(arch):,} unique params", markup=False)
