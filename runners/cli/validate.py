"""``loopnas validate FILE...``: check specs and search spaces; exit 2 with one line per problem."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nas.errors import SpecError

from . import app
from .common import console, console_err, load


def is_space(path: Path) -> bool | dict:
    """A search space: a .py file, or YAML with objectives (a spec has none), then its
    parsed mapping (so it is parsed once)."""
    if path.suffix == ".py":
        return True
    from spaces import space_path
    if not path.exists() and space_path(str(path)) is not None:
        return True
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return False
    from nas.load import parse_yaml, read_text
    try:
        text, source = read_text(path)
        if "objectives" not in text:  # a spec: parsed once, by load()
            return False
        data = parse_yaml(text, source)
    except SpecError:
        return False  # load() reports it
    return data if "objectives" in data else False


def check(path: Path) -> tuple[str, list[str]]:
    """One line describing a valid file, and the lines below it (a space's scales);
    raises SpecError otherwise."""
    if found := is_space(path):
        from nas.space import grid_size, load_space
        space = load_space(path, found if isinstance(found, dict) else None)
        size = grid_size(space)
        if space.spec.oneshot is not None:
            from nas.oneshot import loop_choices
            loops = len(loop_choices(space))
            what = (f"one-shot, {size // loops} placements × {loops} loop "
                    f"count{'s' if loops > 1 else ''} ({space.spec.oneshot.search.strategy} search)")
        elif space.sample_fn is not None:
            what = "define-by-run sample(trial, base)"
        else:
            many = f"{size}" if (size or 0) < 10**12 else f"about 10^{len(str(size)) - 1}"
            n = len(space.spec.params)
            what = f"{n} parameter{'s' * (n != 1)}" + (f" ({many} grid points)" if size else "")
        from nas.space import local_problem
        note = local_problem(space.spec)  # a Ray cluster's nodes may have the CPUs: a note, not an error
        return (f"space {space.name}: {what}"
                + f", {len(space.constraints)} constraints, objectives "
                + ", ".join(f"{o.direction} {o.name}" for o in space.spec.objectives)), \
            scale_lines(space) + ([f"note: {note}"] if note else [])
    arch = load(path)
    return f"{arch.name}: {len(arch.layers)} layers, {len(arch.loops)} loop regions", []


def scale_lines(space) -> list[str]:
    """The base at each of the space's scales: width, unique parameters, projection FLOPs."""
    from nas.cost import projection_flops, unique_params
    from nas.space import scale_base
    from nas.units import si
    scaled = scale_base(space)
    width = max((len(s.label) for s, _ in scaled), default=0)
    return [f"scale {s.label:>{width}}: width {a.model.width:,}, {unique_params(a):,} unique params, "
            f"{si(projection_flops(a).total)} projection FLOPs/token" for s, a in scaled]


@app.command("validate")
def validate_cmd(
    specs: Annotated[list[Path], typer.Argument(help="Spec or space files, or shipped names.", show_default=False)],
) -> None:
    """Validate architecture specs and search spaces.

    Examples:
      loopnas validate spaces/archs/mixerloop_15m.yaml
      loopnas validate spaces/quickstart.yaml spaces/*.yaml

    A space with scales: [1, 2, {unique_params: 2e5}] also prints its base at each scale.
    """
    failed = False
    for spec in specs:
        try:
            line, details = check(spec)
        except SpecError as exc:
            failed = True
            for line in str(exc).splitlines():
                console_err.print(f"error: {line}", markup=False, highlight=False)
            continue
        console.print(f"ok  {spec}  ({line})", highlight=False, markup=False)
        for detail in details:
            console.print(f"    {detail}", highlight=False, markup=False)
    if failed:
        raise typer.Exit(2)
