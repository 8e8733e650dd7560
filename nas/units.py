"""Numbers as people read them, the one formatter of counts and sizes for every command,
report and README loopnas writes (no torch)."""
from __future__ import annotations

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def si(x: float | None, unit: str = "", digits: int = 4) -> str:
    """``digits`` significant digits with an SI prefix: 46.58M, 1.929P, 3.2kB/s; ``—`` for None."""
    if x is None:
        return "—"
    for scale, prefix in _SI:
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g}{prefix}{unit}"
    return f"{x:.{digits}g}{unit}"


def nbytes(x: float | None, digits: int = 4) -> str:
    """A size in binary units: 5.722 MiB, 512 B; ``—`` for None."""
    if x is None:
        return "—"
    for scale, prefix in _BINARY:
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {prefix}"
    return f"{x:.0f} B"


__all__ = ["nbytes", "si"]
