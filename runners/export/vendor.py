"""Copy the loopnas modules a model needs into an export directory, as flat files.

transformers' remote-code loader (``transformers.dynamic_module_utils``) copies a model
file and, recursively, every file it names in a ``from .x import`` line, resolving ``x``
to ``x.py`` in the same directory: no subpackages, no ``from . import x``, no ``..``.
So each vendored module becomes one flat file (``builders/layers/attention.py`` →
``builders_layers_attention.py``) and its loopnas imports are rewritten to relative
imports of those files. The code is copied at export time, so an export follows the
builders it was made with.

Which modules: everything reachable through module-level imports from what
``modeling_loopnas.py`` imports: ``builders.model`` (the model) and ``builders.inference``
(the decoding cache that ``generate`` holds; it pulls in ``builders.cache``).
An import inside a function of a module outside that set (``nas.load`` in
``build_model``, ``nas.budget`` in ``lower``) becomes ``raise ImportError``: the exported
model never takes those paths. Rewritten lines keep their line numbers, so a traceback
in an exported file points at the same line of the loopnas source.
"""
from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("nas", "builders")
ENTRY = "builders.model"
ENTRIES = (ENTRY, "builders.inference")  # what modeling_loopnas.py imports
MANIFEST = "loopnas_vendored.py"


class VendorError(RuntimeError):
    """A loopnas import the flat layout cannot express."""


def repo_root() -> Path:
    import builders
    return Path(builders.__file__).resolve().parent.parent


def flat_name(module: str) -> str:
    """``builders.layers.attention`` → ``builders_layers_attention``."""
    return module.replace(".", "_")


def module_file(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


@dataclass(frozen=True)
class _Import:
    node: ast.stmt
    lazy: bool                                # inside a function or class body
    modules: tuple[tuple[str, str], ...]      # (module, alias): ``from pkg import module as alias``
    symbols_from: str | None                  # module the other names are imported from
    symbols: tuple[ast.alias, ...]


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _loopnas_imports(module: str, path: Path, root: Path) -> list[_Import]:
    """Every import of a ``nas``/``builders`` module in ``module``'s source."""
    tree = ast.parse(path.read_text(), str(path))
    package = module.split(".") if _is_package(path) else module.split(".")[:-1]
    out: list[_Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                bad = [a.name for a in child.names if a.name.split(".")[0] in ROOTS]
                if bad:
                    raise VendorError(f"{path}:{child.lineno}: 'import {bad[0]}' cannot be vendored; "
                                      f"use 'from ... import ...'")
            elif isinstance(child, ast.ImportFrom):
                imp = _resolve(child, package, lazy, root, path)
                if imp is not None:
                    out.append(imp)
            else:
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                visit(child, inner)

    visit(tree, False)
    return out


def _resolve(node: ast.ImportFrom, package: list[str], lazy: bool, root: Path, path: Path) -> _Import | None:
    if node.level:
        if node.level - 1 > len(package):
            raise VendorError(f"{path}:{node.lineno}: relative import beyond the top package")
        base = package[: len(package) - node.level + 1]
        target = ".".join(base + (node.module.split(".") if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] not in ROOTS:
        return None
    modules, symbols = [], []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if alias.name != "*" and module_file(sub, root) is not None:
            modules.append((sub, alias.asname or alias.name))
        else:
            symbols.append(alias)
    if symbols and module_file(target, root) is None:
        raise VendorError(f"{path}:{node.lineno}: no module {target}")
    return _Import(node, lazy, tuple(modules), target if symbols else None, tuple(symbols))


def closure(root: Path, entries: tuple[str, ...] = ENTRIES) -> dict[str, Path]:
    """The modules reachable from ``entries`` by module-level imports, in discovery order."""
    found: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        module = todo.pop(0)
        if module in found:
            continue
        path = module_file(module, root)
        if path is None:
            raise VendorError(f"no source for module {module}")
        found[module] = path
        for imp in _loopnas_imports(module, path, root):
            if not imp.lazy:
                todo += [m for m, _ in imp.modules]
                todo += [imp.symbols_from] if imp.symbols_from else []
    return found


def _alias(a: ast.alias) -> str:
    return a.name if a.asname is None else f"{a.name} as {a.asname}"


def _rewrite(imp: _Import, vendored: dict[str, Path]) -> str:
    targets = [m for m, _ in imp.modules] + ([imp.symbols_from] if imp.symbols_from else [])
    missing = [t for t in targets if t not in vendored]
    if missing:
        if not imp.lazy:
            raise VendorError(f"module-level import of {missing[0]} outside the vendored set")
        return (f"raise ImportError({missing[0] + ' is not part of the exported loopnas code'!r})")
    parts = []
    if imp.symbols_from:
        parts.append(f"from .{flat_name(imp.symbols_from)} import "
                     + ", ".join(_alias(a) for a in imp.symbols))
    if imp.modules:
        parts.append("from . import " + ", ".join(f"{flat_name(m)} as {a}" for m, a in imp.modules))
    return "; ".join(parts)


def rewrite_source(module: str, path: Path, root: Path, vendored: dict[str, Path]) -> str:
    """``path``'s source with its loopnas imports made relative to the flat layout."""
    lines = path.read_text().splitlines(keepends=True)
    edits = sorted(_loopnas_imports(module, path, root), key=lambda i: i.node.lineno, reverse=True)
    for imp in edits:
        node = imp.node
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        if node.col_offset != len(indent) or lines[node.end_lineno - 1].rstrip()[-1:] == ";":
            raise VendorError(f"{path}:{node.lineno}: an import sharing its line cannot be rewritten")
        tail = lines[node.end_lineno - 1][node.end_col_offset:].rstrip("\n")
        blank = "\n" * (node.end_lineno - node.lineno)  # keep later line numbers unchanged
        lines[node.lineno - 1: node.end_lineno] = [f"{indent}{_rewrite(imp, vendored)}{tail}\n{blank}"]
    return "".join(lines)


def _manifest(vendored: dict[str, Path], root: Path) -> str:
    rows = "\n".join(f"    {flat_name(m)!r}: ({str(p.relative_to(root))!r}, "
                     f"{hashlib.sha256(p.read_bytes()).hexdigest()[:16]!r})," for m, p in vendored.items())
    imports = "\n".join(f"from .{flat_name(m)} import __name__ as _{flat_name(m)}" for m in vendored)
    return (
        '"""The loopnas modules vendored into this directory by ``loopnas export``.\n\n'
        "transformers copies the files that a remote-code module names in ``from .x import``\n"
        "lines, recursively; importing each module here by that form makes it copy all of them\n"
        '(some are imported elsewhere as ``from . import x``, which it does not follow).\n\n'
        "SOURCES: flat file -> (loopnas source path, sha256 prefix of that source).\n"
        '"""\n'
        f"SOURCES = {{\n{rows}\n}}\n\n{imports}\n"
    )


def vendor(out: Path, root: Path | None = None) -> list[str]:
    """Write the flat copies and the manifest into ``out``; the written file names."""
    root = root or repo_root()
    vendored = closure(root)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for module, path in vendored.items():
        name = f"{flat_name(module)}.py"
        (out / name).write_text(rewrite_source(module, path, root, vendored))
        names.append(name)
    (out / MANIFEST).write_text(_manifest(vendored, root))
    return [*names, MANIFEST]


__all__ = ["VendorError", "vendor", "closure", "rewrite_source", "flat_name", "MANIFEST", "ENTRY", "ENTRIES"]
