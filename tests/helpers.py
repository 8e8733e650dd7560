"""Helpers shared by test modules (pytest puts tests/ on sys.path)."""
from nas import load_arch
from spaces import ARCHS


def arch(name: str):
    """A shipped architecture by name: spaces/archs/NAME.yaml."""
    return load_arch(ARCHS / f"{name}.yaml")
