"""YAML in, YAML out. Every failure is a :class:`SpecError` naming the source."""
from __future__ import annotations

import gc
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .budget import match_budget
from .errors import Problem, SpecError, from_validation_error, suggest
from .lower import lower, lower_loop
from .placement import placement
from .spec import ArchSpec, LoopSugar
from .validate import validate


MAX_BYTES = 1 << 20
"""The largest spec or space file read: 1 MiB, five times a 4096-layer explicit spec (and a
second or two of parsing)."""
MAX_NODES = 500_000
"""The most YAML nodes a document may hold once its aliases are expanded: aliases are
references while parsing, but copies once validated, hashed and written (billion laughs)."""


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml parses 5x faster
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


class _AliasLoader(_Loader):
    """:class:`_Loader` that also refuses a document whose aliases expand beyond
    :data:`MAX_NODES` nodes (only a document with an anchor can have aliases)."""

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


class _TooLarge(yaml.YAMLError):
    """A document that parses but must not be built."""


def _check_expansion(root) -> None:
    """Count the nodes of ``root`` with every alias expanded, each shared node once
    (linear in the document), and refuse a cycle or more than :data:`MAX_NODES`."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes and not done:
            continue
        children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        if done:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > MAX_NODES:
                raise _TooLarge(f"its aliases expand to more than {MAX_NODES:,} YAML nodes; "
                                "use fewer aliases (anchors are copied wherever they are used)")
            continue
        sizes[id(node)] = -1  # being expanded: met again below itself, it is a cycle
        stack.append((node, True))
        for child in children:
            if sizes.get(id(child)) == -1:
                raise _TooLarge(f"{_at(child.start_mark)}: this node contains an alias to itself; "
                                "a spec is a tree, remove the alias")
            if id(child) not in sizes:
                stack.append((child, False))


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
    if len(text) > MAX_BYTES:
        raise SpecError([Problem("", f"{len(text):,} characters is larger than any spec or space "
                                     f"(at most {MAX_BYTES:,}); is this the right file?")], source)
    collect = gc.isenabled()
    gc.disable()  # a document allocates only trees; the collector would double the time
    try:  # without an anchor there is no alias to count
        data = yaml.load(text, Loader=_AliasLoader if "&" in text else _Loader)
    except _TooLarge as exc:
        raise SpecError([Problem("", str(exc))], source) from None
    except yaml.YAMLError as exc:
        raise SpecError([Problem("", f"malformed YAML: {_yaml_problem(exc)}")], source) from None
    except ValueError as exc:  # a date-like scalar that is not a date (2024-13-01), or 5000 digits
        what = "a number with more than 4300 digits" if "int_max_str_digits" in str(exc) else exc
        raise SpecError([Problem("", f"malformed YAML: {what}")], source) from None
    except RecursionError:
        raise SpecError([Problem("", "malformed YAML: nested too deeply")], source) from None
    finally:
        if collect:
            gc.enable()
    if not isinstance(data, dict):
        got = "an empty file" if data is None else _KINDS.get(type(data), type(data).__name__)
        raise SpecError([Problem("", "the spec must be a YAML mapping with at least "
                                     f"'model' and 'layers' or 'num_layers' (got {got})")],
                        source)
    return data


_STRUCTURE = sorted(set(ArchSpec.model_fields) - {"name", "description"})


def not_a_spec(data: dict[str, Any]) -> str | None:
    """Why a mapping is not an architecture spec at all (None: it is one, or near enough
    that its field errors are the useful answer): none of its keys is a field of a spec's
    structure, so it is some other file (a space, ``/proc/self/status``)."""
    unknown = [k for k in data if k not in ArchSpec.model_fields]
    if not unknown or any(k in _STRUCTURE for k in data):
        return None
    shown = ", ".join(repr(str(k))[:40] for k in unknown[:4]) + (", ..." if len(unknown) > 4 else "")
    hint = next((h for h in (suggest(str(k), _STRUCTURE) for k in unknown[:100]) if h), "")
    return (f"not an architecture spec: none of its {len(unknown)} keys ({shown}) is a spec field; "
            f"{hint}a spec has model, and layers or num_layers")


def spec_from_dict(data: dict[str, Any], source: str | None = None) -> ArchSpec:
    problem = not_a_spec(data) if isinstance(data, dict) else None
    if problem is not None:
        raise SpecError([Problem("", problem)], source)
    try:
        return ArchSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, ArchSpec).with_source(source) from None


def read_text(path: str | Path, what: str = "spec") -> tuple[str, str]:
    """The UTF-8 text of a spec or space file, at most :data:`MAX_BYTES`, and its name."""
    p = Path(path)
    if not p.is_file():
        why = "not a regular file" if p.exists() else "no such file"
        raise SpecError([Problem("", f"{why}; give the path of a .yaml {what}")], str(p))
    try:
        with p.open("rb") as f:  # at most one byte past the cap: a file may grow, /proc's say size 0
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            size = max(p.stat().st_size, len(raw))
            raise SpecError([Problem("", f"{size:,} bytes is larger than any {what} "
                                         f"(at most {MAX_BYTES:,}); is this the right file?")], str(p))
        return raw.decode("utf-8"), str(p)
    except UnicodeDecodeError as exc:
        raise SpecError([Problem("", f"not UTF-8 text (byte {exc.start}); save the {what} as "
                                     "UTF-8 YAML")], str(p)) from None
    except OSError as exc:
        raise SpecError([Problem("", f"cannot read the file: {exc.strerror}")], str(p)) from None


def load_spec(path: str | Path) -> ArchSpec:
    """The spec in a YAML file, as written (source form)."""
    text, source = read_text(path)
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
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False,
                     default_flow_style=None, width=100)


__all__ = ["MAX_BYTES", "MAX_NODES", "read_text", "parse_yaml", "not_a_spec", "spec_from_dict", "load_spec", "loads_spec", "resolve",
           "load_arch", "loads_arch", "dump_yaml"]
