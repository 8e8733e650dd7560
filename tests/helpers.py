"""Helpers shared by test modules, whichever room they live in (pyproject's pytest
``pythonpath`` puts tests/ on sys.path)."""
from pathlib import Path

from nas import load_arch
from spaces import ARCHS

TESTS = Path(__file__).resolve().parent  # tests/: its fixtures/ and assets/
REPO = TESTS.parent


def arch(name: str):
    """A shipped architecture by name: spaces/archs/NAME.yaml."""
    return load_arch(ARCHS / f"{name}.yaml")


def randomize(module, seed: int = 0, vector_std: float = 1.0):
    """Random weights everywhere, norms and biases included, so every parameter matters:
    N(0, 0.3) for matrices, N(0, ``vector_std``) for vectors. Returns ``module``."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.3 if p.dim() > 1 else vector_std)
    return module


def cli(capsys, *argv) -> tuple[int, str, str]:
    """``loopnas ARGV`` in this process: its exit code, stdout and stderr."""
    from runners.cli import main

    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def one_line(rc: int, out: str, err: str, *needles: str, after: int = 0) -> str:
    """The single error line of a refused input (exit 2, no traceback), which must contain
    ``needles``; ``after``: the lines a sweep that had started printed before it."""
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 + after, f"one error line expected:\n{err}"
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    return lines[-1]
