"""One clear line per problem: source, field path, what is wrong and what would be valid."""
from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

_UNION_TAGS = {
    "gdn", "deltanet", "kda", "mamba2", "attn", "dsa", "nsa", "parallel", "switch",
    "swiglu", "moe", "none", "plain", "residual_gate", "gated_step", "reinject",
}


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def render(self, source: str | None) -> str:
        where = f"{source}: " if source else ""
        at = f"{self.path}: " if self.path else ""
        return f"{where}{at}{self.message}"


class SpecError(ValueError):
    """A spec (or space) is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem], source: str | None = None):
        self.problems = problems
        self.source = source
        super().__init__("\n".join(p.render(source) for p in problems))

    def with_source(self, source: str) -> "SpecError":
        return SpecError(self.problems, source)


def fail(path: str, message: str) -> SpecError:
    return SpecError([Problem(path, message)])


def format_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union bookkeeping (discriminator tags, type names) from a loc."""
    kept = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or "(" in part or part[:1].isupper()):
            continue
        if isinstance(part, str) and part in _UNION_TAGS:
            continue
        kept.append(part)
    return tuple(kept)


def _model_classes(tp) -> list[type[BaseModel]]:
    """Every pydantic model class reachable inside a type annotation."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _model_classes(arg)]


def _container(root: type[BaseModel], loc: tuple, tag: str | None) -> list[type[BaseModel]]:
    """Candidate model classes holding the last element of ``loc``."""
    current = [root]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        nxt = []
        for cls in current:
            field = cls.model_fields.get(part)
            if field is not None:
                nxt.extend(_model_classes(field.annotation))
        current = nxt or current
    if tag:
        tagged = [c for c in current if "kind" in c.model_fields
                  and c.model_fields["kind"].default == tag]
        current = tagged or current
    return current


def _describe(err: dict, root: type[BaseModel]) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        loc = err["loc"]
        tags = [p for p in loc if isinstance(p, str) and p in _UNION_TAGS]
        names = sorted({n for c in _container(root, _clean_loc(loc), tags[-1] if tags else None)
                        for n in c.model_fields})
        field = str(loc[-1])
        close = difflib.get_close_matches(field, names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"unknown field '{field}'; {hint}valid fields: {', '.join(names)}"
    if err["type"] == "missing":
        return "field required"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if "input" in err and err["type"] not in ("union_tag_invalid",):
        got = repr(err["input"])
        if len(got) <= 40 and not isinstance(err["input"], dict):
            msg += f" (got {got})"
    return msg


def from_validation_error(exc: ValidationError, root: type[BaseModel], prefix: tuple = ()) -> SpecError:
    problems, seen = [], set()
    for err in exc.errors():
        path = format_path(prefix + _clean_loc(err["loc"]))
        text = _describe(err, root)
        if (path, text) not in seen:
            seen.add((path, text))
            problems.append(Problem(path, text))
    return SpecError(problems)
