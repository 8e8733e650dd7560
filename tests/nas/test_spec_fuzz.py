"""Property: ``loopnas validate`` never shows a traceback. A mutated shipped spec, or any
text at all, either validates (exit 0) or fails with exit 2 and ``error:`` lines that each
name the file and, unless the file as a whole is unreadable, a field path."""
import contextlib
import copy
import io
import re
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from nas.spec import MIXER_KINDS, ArchSpec
from runners.cli import main
from spaces import ARCHS


def _args(tp) -> list:
    return [a for arg in typing.get_args(tp) for a in (arg, *_args(arg))]


def _models(cls, seen: set) -> set:
    """Every spec model reachable from ``cls``."""
    if isinstance(cls, type) and issubclass(cls, BaseModel) and cls not in seen:
        seen.add(cls)
        for f in cls.model_fields.values():
            for arg in [f.annotation, *_args(f.annotation)]:
                _models(arg, seen)
    return seen


SHIPPED = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(ARCHS.glob("*.yaml"))}
KINDS = list(MIXER_KINDS) + ["swiglu", "moe", "none", "plain", "residual_gate", "gated_step",
                             "reinject", "rmsnorm", "layernorm", "bogus"]
WORDS = KINDS + ["full", "block", "mixer", "ffn", "elr", "selective", "span", "interleave",
                 "random", "index_budget", "last_loop"]
FIELDS = sorted({f for m in _models(ArchSpec, set()) for f in m.model_fields})
KEY = r"""\[(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\]"""  # a quoted key: ['a b']
PATH = rf"(?:\w+|{KEY})(?:\[\d+\]|\.\w+|{KEY})*"
WHOLE_FILE = ("malformed YAML", "the spec must be a YAML mapping", "not UTF-8 text", "not an architecture spec")
FAST = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# keys: random words, or real field names and kinds (which reach deeper checks)
names = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,9}", fullmatch=True),
                  st.sampled_from(FIELDS + WORDS))
scalars = st.one_of(
    st.integers(0, 8), st.sampled_from(WORDS),  # plausible values reach lowering and checks
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(), st.text(max_size=12),
    st.sampled_from([0, -1, -(2**31), 2**63, 10**400, 1e300, 0.5, float("inf")]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(names, inner, max_size=4), max_leaves=8)


def _positions(node, out):
    """Every (container, key) slot of a YAML tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in list(items):
        out.append((node, key))
        _positions(child, out)
    return out


def _containers(node, kind):
    found = [node] if isinstance(node, kind) else []
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    return found + [c for child in children for c in _containers(child, kind)]


def mutate(data, tree: dict) -> None:
    """One random edit of ``tree`` in place."""
    op = data.draw(st.sampled_from(["delete", "replace", "replace", "insert", "kind",
                                    "shuffle", "truncate", "copy"]))
    slots = _positions(tree, [])
    lists = [l for l in _containers(tree, list) if l]
    kinded = [d for d in _containers(tree, dict) if "kind" in d]
    if op == "delete" and slots:
        parent, key = data.draw(st.sampled_from(slots))
        del parent[key]
    elif op == "insert":
        target = data.draw(st.sampled_from(_containers(tree, dict)))
        target[data.draw(names)] = data.draw(values)
    elif op == "kind" and kinded:
        data.draw(st.sampled_from(kinded))["kind"] = data.draw(st.sampled_from(KINDS))
    elif op == "shuffle" and lists:
        target = data.draw(st.sampled_from(lists))
        target[:] = data.draw(st.permutations(target))
    elif op == "truncate" and lists:
        target = data.draw(st.sampled_from(lists))
        del target[data.draw(st.integers(0, len(target) - 1)):]
    elif op == "copy" and slots:  # a subtree moved elsewhere: right shape, wrong place
        src, dst = data.draw(st.sampled_from(slots)), data.draw(st.sampled_from(slots))
        dst[0][dst[1]] = copy.deepcopy(src[0][src[1]])
    elif slots:
        parent, key = data.draw(st.sampled_from(slots))
        parent[key] = data.draw(values)


def run_validate(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["validate", str(path)])
    return rc, out.getvalue(), err.getvalue()


def check(path: Path, rc: int, out: str, err: str, top_keys=None) -> None:
    assert "Traceback" not in out + err
    if rc == 0:
        assert out.startswith(f"ok  {path}") and not err
        return
    assert rc == 2, (rc, err)
    lines = err.splitlines()
    assert lines, "exit 2 without a reason"
    head = f"error: {path}: "
    for line in lines:
        assert line.startswith(head), line
        rest = line[len(head):]
        if rest.startswith(WHOLE_FILE):
            assert top_keys is None, f"a YAML mapping was reported as unreadable: {line}"
            continue
        m = re.match(rf"({PATH}): \S", rest)
        assert m, f"no field path in: {line}"
        if top_keys is not None:
            first = re.match(rf"\w+|{KEY}", m.group(1)).group(0)
            assert first in ArchSpec.model_fields or first in top_keys or first[2:-2] in top_keys, line


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@settings(FAST, max_examples=300)
@given(data=st.data(), name=st.sampled_from(sorted(SHIPPED)))
def test_mutated_shipped_specs(data, name, workdir):
    tree = yaml.safe_load(yaml.safe_dump(SHIPPED[name]))
    for _ in range(data.draw(st.integers(1, 3))):
        mutate(data, tree)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    rc, out, err = run_validate(path)
    check(path, rc, out, err, top_keys=set(tree))
    event(f"exit {rc}")


YAMLISH = st.lists(st.sampled_from(["model", "layers", "kind", "gdn", ":", " ", "  ", "\t", "\n",
                                    "- ", "[", "]", "{", "}", ",", "'", '"', "&a", "*a", "!!int",
                                    "4", "-1", "1e9", "null", "#", "?", "%YAML", "---", "\\"]),
                    max_size=30).map("".join)


@settings(FAST, max_examples=120)
@given(text=st.one_of(st.text(max_size=80), YAMLISH))
def test_random_text(text, workdir):
    path = workdir / "random.yaml"
    path.write_text(text, encoding="utf-8")
    rc, out, err = run_validate(path)
    assert rc == 2
    check(path, rc, out, err)


@settings(FAST, max_examples=40)
@given(blob=st.binary(max_size=40))
def test_random_bytes(blob, workdir):
    path = workdir / "random.bin.yaml"
    path.write_bytes(blob)
    rc, out, err = run_validate(path)
    assert rc == 2
    check(path, rc, out, err)


# Loop-count distributions are tabulated before their fields are validated (LoopDist._tabulate
# reads the raw mapping): each of these once escaped as a traceback (TypeError: unhashable
# type: 'list', '>' not supported, unsupported operand; OverflowError; a numpy RuntimeWarning).
@pytest.mark.parametrize("train, where", [
    ({"kind": ["x"]}, "elastic.train.kind: should be one of"),
    ({"kind": {"a": 1}}, "elastic.train.kind: should be one of"),
    ({"kind": "poisson_lognormal", "mean": [], "sigma": 0.5, "max": 8}, "elastic.train.mean: should be a number"),
    ({"kind": "poisson_lognormal", "mean": "", "sigma": 0.5, "max": 8}, "elastic.train.mean: should be a number"),
    ({"kind": "poisson_lognormal", "mean": 4, "sigma": {"a": 1}, "max": 8}, "elastic.train.sigma: should be a number"),
    ({"kind": "poisson_lognormal", "mean": 10**400, "sigma": 0.5, "max": 8}, "elastic.train.mean: should be a number"),
    ({"kind": "poisson_lognormal", "mean": float("inf"), "sigma": 0.5, "max": 8}, "elastic.train.mean: should be a finite number"),
    ({"kind": "poisson_lognormal", "mean": 4, "sigma": 1e300, "max": 8}, "elastic.train: poisson_lognormal with mean=4, sigma=1e+300 has no finite probabilities"),
    ({"kind": "fixed", "k": 2, "values": 5}, "elastic.train.values: should be a list"),
    ({"kind": "fixed", "k": 2, "values": [2], "weights": ["a"]}, "elastic.train.weights[0]: should be a number"),
    ({"kind": "uniform", "low": [1], "high": 3}, "elastic.train.low: should be an integer"),
])
def test_malformed_loop_distribution_names_the_field(train, where, workdir):
    tree = yaml.safe_load(yaml.safe_dump(SHIPPED["tiny_huginn"]))
    tree["elastic"]["train"] = train
    path = workdir / "bad_dist.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    rc, out, err = run_validate(path)
    check(path, rc, out, err, top_keys=set(tree))
    assert rc == 2 and len(err.splitlines()) == 1 and where in err, err  # one line, naming the field
