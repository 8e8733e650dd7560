"""``loopnas graph SPEC --out FILE``: the architecture diagram (folded graph)."""
from __future__ import annotations

from pathlib import Path

from . import app
from .common import OutOpt, SpecArg, UsageError, console, load


@app.command("graph")
def graph_cmd(spec: SpecArg, out: OutOpt = None) -> None:
    """Draw an architecture: one box per sublayer, loop regions as labelled brackets.

    The suffix of --out picks the format: .png or .svg (a picture), .dot (Graphviz
    text), .mmd or .mermaid (Mermaid text). Default: <spec name>.png; a directory
    gets <spec name>.png inside it.

    Examples:

      loopnas graph mixerloop_15m

      loopnas graph spaces/archs/elr_hybrid.yaml --out elr.svg

      loopnas graph tiny_selective -o tiny_selective.mmd
    """
    from nas.spec import named_path
    from runners.render import FORMATS, render  # matplotlib only when drawing

    if out is not None and not out.is_dir() and out.suffix.lower() not in FORMATS:
        raise UsageError(f"--out {out}: unknown format '{out.suffix}'; use one of "
                         f"{', '.join(FORMATS)}")
    arch = load(spec)
    path = out if out is not None and not out.is_dir() else named_path(out or Path(), arch.name, ".png")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        render(arch, path)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot write: {exc.strerror or exc}") from None
    console.print(f"wrote {path}", highlight=False, markup=False)
