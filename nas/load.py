"""YAML in, YAML out. Every failure is a :class:`SpecError` naming the source."""
from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .budget import match_budget
from .errors import Problem, SpecError, from_validation_error
from .lower import lower, lower_loop
from .placement import placement
from .spec import ArchSpec, LoopSugar
from .validate import validate


class _Loader(yaml.SafeLoader):
    """``safe_load`` that rejects a repeated key instead of silently keeping the last."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r}", key_node.start_mark)
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep)


_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _at(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``line 4, column 1: found unexpected end of stream (while scanning a quoted scalar
    from line 2, column 7)``: where the parser stopped, and what it was in the middle of."""
    mark, context = getattr(exc, "problem_mark", None), getattr(exc, "context", None)
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    text = f"{_at(mark)}: {what}" if mark else what
    start = getattr(exc, "context_mark", None)
    if context and start and (mark is None or start.line != mark.line):
        text += f" ({context} from {_at(start)})"
    return text


def parse_yaml(text: str, source: str | None = None) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise SpecError([Problem("", f"malformed YAML: {_yaml_problem(exc)}")], source) from None
    except ValueError as exc:  # a date-like scalar that is not a date (2024-13-01)
        raise SpecError([Problem("", f"malformed YAML: {exc}")], source) from None
    except RecursionError:
        raise SpecError([Problem("", "malformed YAML: nested too deeply")], source) from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else _KINDS.get(type(data), type(data).__name__)
        raise SpecError([Problem("", "the spec must be a YAML mapping with at least "
                                     f"'model' and 'layers' or 'num_layers' (got {got})")],
                        source)
    return data


def spec_from_dict(data: dict[str, Any], source: str | None = None) -> ArchSpec:
    try:
        return ArchSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, ArchSpec).with_source(source) from None


def _read(path: str | Path) -> tuple[str, str]:
    p = Path(path)
    if not p.is_file():
        raise SpecError([Problem("", "no such file; give the path of a .yaml spec")], str(p))
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except UnicodeDecodeError as exc:
        raise SpecError([Problem("", f"not UTF-8 text (byte {exc.start}); save the spec as "
                                     "UTF-8 YAML")], str(p)) from None
    except OSError as exc:
        raise SpecError([Problem("", f"cannot read the file: {exc.strerror}")], str(p)) from None


def load_spec(path: str | Path) -> ArchSpec:
    """The spec in a YAML file, as written (source form)."""
    text, source = _read(path)
    return spec_from_dict(parse_yaml(text, source), source)


def loads_spec(text: str, source: str | None = "<string>") -> ArchSpec:
    return spec_from_dict(parse_yaml(text, source), source)


_LAYER_PATH = re.compile(r"^layers\[(\d+)\]\.(mixer|ffn)(?:\.(\w+))?(.*)$")


def source_path(spec: ArchSpec, path: str) -> str:
    """Where a problem found on the canonical ``layers[i]`` lives in what the user wrote:
    the ``layer`` template, a ``hybrid.mixers`` entry, or ``model.defaults.<kind>``."""
    m = _LAYER_PATH.match(path)
    if m is None or spec.layers is not None:
        return path
    index, op, field, rest = int(m[1]), m[2], m[3], m[4]
    written = getattr(spec.layer, op, None) if spec.layer is not None else None
    kind, where = (written.kind if written is not None else None), f"layer.{op}"
    if op == "mixer" and spec.hybrid is not None:
        random = spec.hybrid.placement == "random"
        name = list(spec.hybrid.ratio)[0] if random else placement(spec.hybrid, spec.num_layers)[index]
        written = spec.hybrid.mixers.get(name)
        kind = written.kind if written is not None else name
        where = f"hybrid.mixers.{name}" if written is not None else f"hybrid.ratio.{name}"
    if field is None:
        return where + rest
    explicit = written is not None and field in written.model_fields_set
    if not explicit and field in spec.model.defaults.get(kind, {}):
        return f"model.defaults.{kind}.{field}{rest}"
    return f"{where}.{field}{rest}"


_LOOP_PATH = re.compile(r"^loops\[(\d+)\](?:\.(\w+))?(.*)$")


def loop_source_path(spec: ArchSpec, path: str) -> str:
    """Where a problem found on canonical ``loops[j]`` lives in the ``loop`` sugar that
    wrote region j: ``loop.routing_replay``, ``loop[1].T``; regions the user listed under
    ``loops`` keep their path."""
    m = _LOOP_PATH.match(path)
    if m is None or spec.loop is None:
        return path
    j = int(m[1]) - len(spec.loops)  # lower() puts explicit regions first
    sugars = spec.loop if isinstance(spec.loop, tuple) else (spec.loop,)
    try:
        layers = lower(spec.model_copy(update={"loop": None, "match": None})).layers
        sizes = [len(lower_loop(s, layers)) for s in sugars]
    except SpecError:
        return path
    for k, n in enumerate(sizes):
        if 0 <= j < n:
            where = "loop" if isinstance(spec.loop, LoopSugar) else f"loop[{k}]"
            field = m[2] if m[2] in LoopSugar.model_fields else None
            return f"{where}.{field}{m[3]}" if field else where
        j -= n
    return path


def _in_source(spec: ArchSpec, problems: list[Problem]) -> list[Problem]:
    """Problems re-pathed to the source spec, duplicates (one per templated layer) dropped."""
    out: list[Problem] = []
    for p in problems:
        moved = Problem(loop_source_path(spec, source_path(spec, p.path)), p.message)
        if moved not in out:
            out.append(moved)
    return out


def resolve(spec: ArchSpec, source: str | None = None) -> ArchSpec:
    """Lower to canonical form, validate, then solve a ``match`` block (lower → validate →
    match); raises SpecError listing every problem."""
    try:
        canonical = lower(spec)
    except SpecError as exc:
        raise SpecError(_in_source(spec, exc.problems), source or exc.source) from None
    problems = validate(canonical)
    if problems:
        raise SpecError(_in_source(spec, problems), source)
    if spec.match is not None:
        try:
            return match_budget(spec, spec.match)
        except SpecError as exc:
            raise SpecError(_in_source(spec, exc.problems), source or exc.source) from None
    return canonical


def load_arch(path: str | Path) -> ArchSpec:
    """Load, lower and validate a YAML spec file."""
    return resolve(load_spec(path), str(path))


def loads_arch(text: str, source: str | None = "<string>") -> ArchSpec:
    return resolve(loads_spec(text, source), source)


def dump_yaml(spec: ArchSpec) -> str:
    """YAML that loads back to an equal spec. A canonical spec is written in full; a
    source spec only with the fields it sets, so ``model.defaults`` keep applying."""
    if spec.is_canonical:
        data = spec.model_dump(mode="json", exclude={"num_layers", "layer", "hybrid", "loop", "match"})
        data["model"].pop("defaults")
    else:
        data = spec.model_dump(mode="json", exclude_unset=True)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


__all__ = ["parse_yaml", "spec_from_dict", "load_spec", "loads_spec", "resolve",
           "load_arch", "loads_arch", "dump_yaml"]
