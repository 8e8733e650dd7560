"""One clear line per problem: source, field path, what is wrong and what would be valid.

Pydantic reports union bookkeeping inside its error locations (discriminator tags such as
``gdn``, branch labels such as ``tuple[LoopSugar, ...]`` or ``constrained-int``), reports
every branch of a plain union, and words errors in terms of its own types.
:func:`from_validation_error` walks each location alongside the spec's type annotations,
keeps only the parts a user wrote, keeps only the union branch the input was aiming at,
and rewrites the wording in terms of YAML (mapping, list, one of ...).
"""
from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def render(self, source: str | None) -> str:
        where = f"{source}: " if source else ""
        at = f"{self.path}: " if self.path else ""
        return f"{where}{at}{self.message}"


class LoopnasError(ValueError):
    """A problem the user can fix (a spec, a flag, a file, a sweep that cannot start): the
    command line prints its message, ``error:`` before each line, and exits with code 2.
    Every such error derives from it, so ``runners.cli.main`` catches it once."""


class SpecError(LoopnasError):
    """A spec (or space) is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem], source: str | None = None):
        self.problems = problems
        self.source = source
        super().__init__("\n".join(p.render(source) for p in problems))

    def with_source(self, source: str) -> "SpecError":
        return SpecError(self.problems, source)


def fail(path: str, message: str) -> SpecError:
    return SpecError([Problem(path, message)])


def suggest(word: str, options) -> str:
    """``"did you mean 'x'? "`` when ``word`` is a near miss of one of ``options``."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f"did you mean '{close[0]}'? " if close else ""


def format_path(loc: tuple) -> str:
    """``("layers", 3, "mixer")`` → ``layers[3].mixer``; a key that is not a plain word is
    quoted (``model.defaults['my key']``) so a path never runs into the message."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"\w+", part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out


@dataclass
class _Walk:
    """A pydantic loc read against the spec types."""

    path: tuple = ()                # the parts a user wrote
    owner: type | None = None       # the model holding the last field
    tp: Any = Any                   # the annotation at the end of the loc
    branches: list = field(default_factory=list)  # (path, label, deep) per plain-union choice


def _strip(tp):
    """Drop ``Annotated`` and ``| None``: the type a loc part indexes into."""
    while True:
        if typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
        elif _is_union(tp) and len(_members(tp)) == 1:
            tp = _members(tp)[0]
        else:
            return tp


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _members(tp) -> list:
    return [a for a in typing.get_args(tp) if a is not type(None)]


def _is_model(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _tag(tp) -> str | None:
    tp = _strip(tp)
    if _is_model(tp) and "kind" in tp.model_fields:
        return tp.model_fields["kind"].default
    return None


def union_tags(tp) -> list[str]:
    """The ``kind`` values of a discriminated union (empty for anything else)."""
    tp = _strip(tp)
    if not _is_union(tp):
        return []
    tags = [_tag(m) for m in _members(tp)]
    return [] if None in tags else tags


def _branch(members: list, label: str):
    """The member of a plain union that pydantic labels ``label``."""
    for m in members:
        base = _strip(m)
        origin = typing.get_origin(base)
        if _is_model(base) and re.search(rf"\b{base.__name__}\]?$", label):
            return m
        if origin in (tuple, list) and label.startswith(("tuple[", "list[")):
            return m
        if origin is Literal and label.startswith("literal["):
            return m
        if base in (int, float, str, bool) and label.split("-")[-1] == base.__name__:
            return m
    return Any


def _walk(root: type[BaseModel], loc: tuple) -> _Walk:
    w = _Walk(tp=root)
    for i, part in enumerate(loc):
        tp = _strip(w.tp)
        if _is_union(tp):
            members = _members(tp)
            if part in union_tags(tp):
                w.tp = next(m for m in members if _tag(m) == part)
            else:
                w.branches.append((w.path, str(part), i < len(loc) - 1))
                w.tp = _branch(members, str(part))
            continue
        if part == "[key]":
            continue
        if _is_model(tp):
            w.owner, part = tp, str(part)
            f = tp.model_fields.get(part)
            w.tp = f.annotation if f is not None else Any
        elif typing.get_origin(tp) in (tuple, list) and isinstance(part, int):
            args = typing.get_args(tp)
            ellipsis = typing.get_origin(tp) is list or (len(args) == 2 and args[1] is Ellipsis)
            w.tp = args[0] if ellipsis else (args[part] if part < len(args) else Any)
        elif typing.get_origin(tp) is dict:
            w.tp, part = typing.get_args(tp)[1], str(part)
        else:
            w.tp = Any
        w.path += (part,)
    return w


_TYPE_WORDS = {
    "model_type": "a mapping", "model_attributes_type": "a mapping", "dict_type": "a mapping",
    "tuple_type": "a list", "list_type": "a list", "int_type": "an integer",
    "int_parsing": "an integer", "int_from_float": "a whole number", "float_type": "a number",
    "float_parsing": "a number", "string_type": "a string", "bool_type": "true or false",
    "bool_parsing": "true or false", "finite_number": "a finite number",
}
_BOUNDS = {"greater_than": ("greater than", "gt"), "greater_than_equal": ("at least", "ge"),
           "less_than": ("less than", "lt"), "less_than_equal": ("at most", "le")}


def _got(x) -> str:
    if isinstance(x, dict):
        return "a mapping"
    text = repr(x)
    if isinstance(x, (list, tuple)) and len(text) > 40:
        return f"a list of {len(x)} items"
    return text if len(text) <= 40 else text[:37] + "..."


def _expected(err: dict) -> str | None:
    """What the input should have been, as a phrase ("greater than 0", "a list", ...)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _TYPE_WORDS:
        return _TYPE_WORDS[kind]
    if kind in _BOUNDS:
        word, key = _BOUNDS[kind]
        return f"{word} {ctx[key]}"
    if kind == "literal_error":
        exp = ctx["expected"]
        return f"one of {exp}" if "," in exp or " or " in exp else exp
    return None


def _literal_hint(err: dict) -> str:
    if err["type"] != "literal_error" or not isinstance(err["input"], str):
        return ""
    options = re.findall(r"'([^']*)'", err["ctx"]["expected"])
    hint = suggest(err["input"], options)
    return f"; {hint[:-1]}" if hint else ""


def _describe(err: dict, w: _Walk) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        names = sorted(w.owner.model_fields) if w.owner is not None else []
        name = str(err["loc"][-1])
        return f"unknown field '{name}'; {suggest(name, names)}valid fields: {', '.join(names)}"
    if kind == "missing":
        return "field required"
    if kind == "union_tag_invalid":
        tags = re.findall(r"'([^']*)'", ctx["expected_tags"])
        return (f"unknown kind {ctx['tag']!r}; {suggest(ctx['tag'], tags)}"
                f"valid kinds: {', '.join(tags)}")
    if kind == "union_tag_not_found":
        return f"field required; valid kinds: {', '.join(union_tags(w.tp))}"
    if kind in ("too_short", "too_long"):
        n = ctx["min_length"] if kind == "too_short" else ctx["max_length"]
        bound = "at least" if kind == "too_short" else "at most"
        return f"should have {bound} {n} item{'s' * (n != 1)} (got {ctx['actual_length']})"
    if kind == "invalid_key":
        return f"field names must be text (got {_got(err['input'])})"
    if kind in ("value_error", "assertion_error"):  # "Value error, <our message>"
        return err["msg"].split(", ", 1)[-1]
    expected = _expected(err)
    what = f"should be {expected}" if expected else err["msg"]
    return f"{what} (got {_got(err['input'])}){_literal_hint(err)}"


def _prune_branches(items: list[tuple[dict, _Walk]]) -> list[tuple[dict, _Walk]]:
    """At each plain union, keep the branches whose errors go deeper than the branch
    itself (the input matched that branch's shape); drop shallow type mismatches."""
    points = sorted({b[0] for _, w in items for b in w.branches}, key=len)
    for point in points:
        at = [(e, w, next(b for b in w.branches if b[0] == point)) for e, w in items
              if any(b[0] == point for b in w.branches)]
        deep = {b[1] for _, _, b in at if b[2]}
        if deep and len({b[1] for _, _, b in at}) > 1:
            drop = {id(e) for e, _, b in at if b[1] not in deep}
            items = [(e, w) for e, w in items if id(e) not in drop]
    return items


def _merge_shallow(items: list[tuple[dict, _Walk]]) -> list[tuple[tuple, str]]:
    """Shallow errors of one union (``window: -1`` fails both ``int > 0`` and ``'full'``)
    become one line listing every accepted form."""
    groups: dict = {}
    for e, w in items:
        last = w.branches[-1] if w.branches else None
        key = (w.path, last[0]) if last and not last[2] and last[0] == w.path else (w.path, id(e))
        groups.setdefault(key, []).append((e, w))
    out = []
    for (path, _), group in groups.items():
        phrases = [_expected(e) for e, _ in group]
        if len(group) > 1 and all(phrases):
            unique = list(dict.fromkeys(phrases))
            text = f"should be {', or '.join(unique)} (got {_got(group[0][0]['input'])})"
        else:
            text = _describe(*group[0])
        out.append((path, text))
    return out


def _append(head: str, tail: str) -> str:
    if not head or not tail:
        return head + tail
    return head + tail if tail.startswith("[") else f"{head}.{tail}"


def from_validation_error(exc: ValidationError, root: type[BaseModel], prefix: tuple = ()) -> SpecError:
    """The problems of ``exc`` (raised validating ``root``), their paths under ``prefix``:
    path pieces already formatted (``("layers[0].mixer",)``) or list indices."""
    items = [(e, _walk(root, e["loc"])) for e in exc.errors()]
    items = _prune_branches(items)
    for e, w in items:
        if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            w.path += ("kind",)
    # a list's length error is noise when its items have errors of their own
    paths = [w.path for _, w in items]
    items = [(e, w) for e, w in items if not (e["type"] in ("too_short", "too_long") and any(
        len(p) > len(w.path) and p[:len(w.path)] == w.path for p in paths))]
    head = ""
    for part in prefix:
        head = _append(head, f"[{part}]" if isinstance(part, int) else part)
    problems: list[Problem] = []
    for path, text in _merge_shallow(items):
        p = Problem(_append(head, format_path(path)), text)
        if p not in problems:
            problems.append(p)
    return SpecError(problems)
