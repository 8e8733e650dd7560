"""YAML in, YAML out. Every failure is a :class:`SpecError` naming the source."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import Problem, SpecError, from_validation_error
from .lower import lower
from .spec import ArchSpec
from .validate import validate


def parse_yaml(text: str, source: str | None = None) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError([Problem("", f"malformed YAML: {where}{what}")], source) from None
    if not isinstance(data, dict):
        raise SpecError([Problem("", "the spec must be a YAML mapping with at least "
                                     f"'model' and 'layers' or 'num_layers' (got {type(data).__name__})")],
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
    return p.read_text(), str(p)


def load_spec(path: str | Path) -> ArchSpec:
    """The spec in a YAML file, as written (source form)."""
    text, source = _read(path)
    return spec_from_dict(parse_yaml(text, source), source)


def loads_spec(text: str, source: str | None = "<string>") -> ArchSpec:
    return spec_from_dict(parse_yaml(text, source), source)


def resolve(spec: ArchSpec, source: str | None = None) -> ArchSpec:
    """Lower to canonical form and validate; raises SpecError listing every problem."""
    try:
        canonical = lower(spec)
    except SpecError as exc:
        raise exc.with_source(source) if source else exc
    problems = validate(canonical)
    if problems:
        raise SpecError(problems, source)
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
