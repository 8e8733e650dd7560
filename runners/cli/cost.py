"""``loopnas cost SPEC``: the cost sheet of a spec, as tables or JSON. Imports no torch."""
from __future__ import annotations

import json
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from nas.metrics import DEFAULT_SEQ_LEN
from nas.units import nbytes, si

from . import app
from .common import (
    JsonOpt,
    SeqLenOpt,
    SpecArg,
    TokensOpt,
    UsageError,
    console,
    load,
    token_count,
)

if TYPE_CHECKING:
    from nas.cost import CostSheet, Figures


class Dtype(str, Enum):
    bf16 = "bf16"
    fp32 = "fp32"


DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Bytes per cached element.")]




def _figure_rows(f: Figures) -> list[tuple[str, str]]:
    p = f.projection
    return [("projection FLOPs/token", si(p.total)),
            ("  mixer", si(p.mixer)), ("  ffn", si(p.ffn)), ("  head", si(p.head)),
            ("loop-extra FLOPs/token", si(f.loop_extra_flops)),
            ("seq-mixing FLOPs/token", si(f.seq_mixing_flops)),
            ("forward FLOPs/token", si(f.forward_flops)),
            ("KV cache/sequence", nbytes(f.kv_cache_bytes)),
            ("state/sequence", nbytes(f.state_bytes))]


def summary(sheet: CostSheet) -> Table:
    table = Table(title=f"{escape(sheet.name)}: cost at context {sheet.seq_len}, {sheet.dtype}")
    table.add_column("quantity", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    rows = [("unique params", f"{sheet.unique_params:,}"),
            ("non-embedding params", f"{sheet.non_embedding_params:,}"),
            *_figure_rows(sheet.figures),
            ("train FLOPs/token (3×fwd)", si(sheet.train_flops_per_token))]
    if sheet.train_flops is not None:
        rows.append((f"train FLOPs, {si(sheet.tokens)} tokens", si(sheet.train_flops)))
    for name, value in rows:
        table.add_row(name, value)
    return table


def per_k(sheet: CostSheet) -> Table:
    table = Table(title="elastic depth: one checkpoint evaluated at k loops")
    table.add_column("quantity", no_wrap=True)
    for f in sheet.per_k:
        table.add_column(f"k={f.loops}", justify="right", no_wrap=True)
    for i, (name, _) in enumerate(_figure_rows(sheet.figures)):
        table.add_row(name, *(_figure_rows(f)[i][1] for f in sheet.per_k))
    return table


MAX_ROWS = 64  # a table of thousands of rows takes rich minutes to lay out


def breakdown(sheet: CostSheet) -> Table:
    ops = sheet.figures.ops
    more = f"; the first {MAX_ROWS} of {len(ops)}, --json lists every one" if len(ops) > MAX_ROWS else ""
    table = Table(title=f"per sublayer: FLOPs/token over all runs, memory/sequence{more}", box=box.SIMPLE)
    for col in ("sublayer", "kind", "params", "runs", "proj", "seq", "KV", "state"):
        table.add_column(col, justify="left" if col in ("sublayer", "kind") else "right", no_wrap=True)
    for r in ops[:MAX_ROWS]:
        table.add_row(f"{r.layer}.{r.op}", r.kind, f"{r.params:,}", str(r.applications),
                      si(r.projection_flops), si(r.seq_mixing_flops),
                      nbytes(r.kv_cache_bytes), nbytes(r.state_bytes))
    return table


def extras(sheet: CostSheet) -> Table:
    table = Table(title="loop extras (FLOPs/token over all runs)", box=box.SIMPLE)
    for col in ("parameter", "params", "FLOPs"):
        table.add_column(col, justify="left" if col == "parameter" else "right", no_wrap=True)
    for e in sheet.figures.extras:
        table.add_row(e.name, f"{e.params:,}", si(e.flops))
    return table


@app.command("cost")
def cost_cmd(
    spec: SpecArg,
    seq_len: SeqLenOpt = DEFAULT_SEQ_LEN,  # tokens: training tokens, for the training FLOPs of a run
    json_out: JsonOpt = False,
    dtype: DtypeOpt = Dtype.bf16,
    tokens: TokensOpt = None,
) -> None:
    """Price a spec: parameters, projection compute (MixerLoop §3.3), sequence mixing,
    training FLOPs and inference memory.

    Example: loopnas cost mixerloop_15m --seq-len 4096 --tokens 52.43e9
    """
    from nas.cost import cost
    from nas.space import MAX_SEQ_LEN

    if not 1 <= seq_len <= MAX_SEQ_LEN:
        raise UsageError(f"--seq-len must be an integer in 1..{MAX_SEQ_LEN} (got {str(seq_len)[:20]})")
    tokens = token_count(tokens)
    sheet = cost(load(spec), seq_len=seq_len, dtype=dtype.value,
                 tokens=tokens)
    if json_out:
        typer.echo(json.dumps(sheet.to_dict(), indent=2))
        return
    console.print(summary(sheet))
    if sheet.per_k:
        console.print(per_k(sheet))
    console.print(breakdown(sheet))
    if sheet.figures.extras:
        console.print(extras(sheet))
