"""``loopnas show SPEC``: the canonical form, as YAML, with a summary table."""
from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from . import app
from .common import SpecArg, console, load


MAX_ROWS = 64  # a table of thousands of rows takes rich minutes to lay out


def summary(arch) -> Table:
    from nas.graph import describe  # networkx: only when a command draws (status starts without it)
    from nas.plan import applications
    from nas.spec import OpAddr

    runs = applications(arch)
    more = f" (the first {MAX_ROWS}; the YAML below lists every one)" if len(arch.layers) > MAX_ROWS else ""
    table = Table(title=f"{escape(arch.name)}: {len(arch.layers)} layers, width {arch.model.width}, "
                        f"vocab {arch.model.vocab_size}{more}")
    for col in ("layer", "mixer", "ffn", "mixer runs", "ffn runs", "loops"):
        table.add_column(col)
    for i, layer in enumerate(arch.layers[:MAX_ROWS]):
        regions = [str(j) for j, r in enumerate(arch.loops)
                   if r.start.flat <= 2 * i + 1 and 2 * i <= r.end.flat]
        mixer_runs = runs[OpAddr(layer=i, op="mixer")]
        ffn_runs = runs[OpAddr(layer=i, op="ffn")]
        table.add_row(str(i), describe(layer.mixer), describe(layer.ffn), str(mixer_runs),
                      str(ffn_runs), ",".join(regions) or "-")
    return table


@app.command("show")
def show_cmd(
    spec: SpecArg,
    yaml_only: Annotated[bool, typer.Option("--yaml", help="Print only the canonical YAML.")] = False,
) -> None:
    """Print the canonical form of a spec (explicit layers and loop regions).

    Example: loopnas show mixerloop_15m
    """
    from nas.graph import update_label
    from nas.load import dump_yaml

    arch = load(spec)
    if not yaml_only:
        console.print(summary(arch))
        for j, r in enumerate(arch.loops[:MAX_ROWS]):
            rules = update_label(arch, r)
            console.print(f"loop {j}: {r.start} .. {r.end}  T={r.T}  update={r.update.kind}"
                          f"  conditioning={r.conditioning}" + (f"  ({rules})" if rules else ""),
                          highlight=False)
        if len(arch.loops) > MAX_ROWS:
            console.print(f"... {len(arch.loops) - MAX_ROWS} more loop regions (in the YAML below)",
                          highlight=False)
        if arch.elastic is not None:
            d = arch.elastic.train
            console.print(f"elastic: train {d.kind} over {len(d.values)} loop counts, drawn per "
                          f"{d.per.replace('_', '-')}; switch at {arch.elastic.switch_at:g}; "
                          f"eval {list(arch.elastic.eval)}", highlight=False)
        console.rule("canonical spec")
    typer.echo(dump_yaml(arch))
