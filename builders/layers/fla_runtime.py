"""Where fla's Triton kernels can run: CUDA, or the CPU under Triton's interpreter.

The interpreter (``TRITON_INTERPRET=1``, set before triton is first imported) executes
each kernel as numpy code, one program at a time: slow, but the real kernel, so a CPU
can check the ``fla`` backend against the ``torch`` one. Two gaps stand between fla and
the interpreter, closed by :func:`install_interpreter_shims`:

1. An autotuner benchmarks its configs on a GPU driver; with none, every
   ``Autotuner`` keeps only its first config.
2. fla's kernels loop with Python's ``range`` and call ``.to(...)`` on the index, which
   a plain int lacks. While an interpreted kernel runs, its module's ``range`` yields
   interpreter tensors instead.
"""
from __future__ import annotations

import builtins
import functools
import importlib.util
import os

import torch

from nas.errors import LoopnasError

__all__ = ["FlaUnavailableError", "install_interpreter_shims", "interpreting", "require", "unavailable_reason"]


class FlaUnavailableError(LoopnasError, RuntimeError):
    """``backend="fla"`` asked for where fla's kernels cannot run (a usage problem: one line,
    exit code 2)."""


def interpreting() -> bool:
    """True when this process runs Triton kernels through the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def unavailable_reason(device) -> str | None:
    """Why fla's kernels cannot run on ``device`` (None: they can)."""
    missing = [m for m in ("triton", "fla") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed"
    if interpreting() or torch.device(device).type == "cuda":
        return None
    return (f"fla's Triton kernels need a CUDA device, not {torch.device(device).type!r} "
            "(or TRITON_INTERPRET=1 set before triton is imported, for tests)")


def require(x: torch.Tensor) -> None:
    """Raise one clear error, instead of a Triton traceback, where fla cannot run on ``x``."""
    reason = unavailable_reason(x.device)
    if reason is not None:
        raise FlaUnavailableError(f"backend='fla': {reason}; use backend='torch' or 'auto'")


def _tensor_range(*args):
    """``range`` whose items are int32 interpreter scalars, as compiled Triton makes them."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    bounds = [int(a.handle.data.item()) if isinstance(a, tl.tensor) else int(a) for a in args]
    for i in builtins.range(*bounds):
        yield tl.tensor(TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)


def _first_config_only(run):
    @functools.wraps(run)
    def wrapper(self, *args, **kwargs):
        self.configs = self.configs[:1]
        return run(self, *args, **kwargs)
    return wrapper


def _kernel_range(call):
    @functools.wraps(call)
    def wrapper(self, *args, **kwargs):
        scope, missing = self.fn.__globals__, object()
        saved = scope.get("range", missing)
        scope["range"] = _tensor_range
        try:
            return call(self, *args, **kwargs)
        finally:
            if saved is missing:
                del scope["range"]
            else:
                scope["range"] = saved
    return wrapper


@functools.cache
def install_interpreter_shims() -> bool:
    """Patch triton for fla under the interpreter, once; False (untouched) when it is off."""
    if not interpreting():
        return False
    from triton.runtime import autotuner, interpreter

    autotuner.Autotuner.run = _first_config_only(autotuner.Autotuner.run)
    interpreter.GridExecutor.__call__ = _kernel_range(interpreter.GridExecutor.__call__)
    return True
