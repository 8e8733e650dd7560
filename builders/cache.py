"""The incremental-decoding contract every mixer follows.

``mixer(x, *, cache=None, commit=True, **overrides)``:

- ``cache=None``: the whole-sequence forward used in training (unchanged).
- ``cache`` a dict (empty for a fresh sequence): ``x`` (B, t, D) holds the next ``t``
  tokens after the ``cache["pos"]`` tokens already seen (0 when absent). The output for
  those ``t`` tokens is computed from the cached past plus ``x`` itself, and must equal
  the matching rows of the whole-sequence forward over past + ``x``. Prefill is one call
  with the prompt; decode is one call per token (or any chunking).
- ``commit=True``: the layer appends the new keys/values (or advances its recurrent
  state) into the dict and adds ``t`` to ``cache["pos"]``. ``commit=False`` leaves the
  dict unchanged: ELR's ``last_loop`` KV policy, where the earlier iterations of a loop
  read the one shared cache that only the last iteration writes.

Tensors the layer keeps are stored under names starting ``kv.`` (KV cache: keys, values,
indexer keys, compressed blocks) or ``state.`` (recurrent state, conv tails);
:func:`cache_nbytes` counts them for the cost model's ``kv_cache_bytes`` / ``state_bytes``.
Other entries (``pos``, Python scalars) are bookkeeping and hold no memory worth pricing.
A composite mixer (parallel branches, a switch) keeps one sub-dict per branch or option
under its own entries; :func:`cache_nbytes` counts them too.
"""
from __future__ import annotations

import torch


def cache_nbytes(cache: dict) -> dict[str, int]:
    """Bytes held by one layer's cache dict and its sub-dicts: ``{"kv": ..., "state": ...}``."""
    out = {"kv": 0, "state": 0}
    for name, value in cache.items():
        if isinstance(value, dict):
            for kind, n in cache_nbytes(value).items():
                out[kind] += n
            continue
        if not isinstance(value, torch.Tensor):
            continue
        kind = name.split(".", 1)[0]
        if kind in out:
            out[kind] += value.numel() * value.element_size()
    return out


def cache_pos(cache: dict) -> int:
    """Tokens already seen by the layer owning ``cache``."""
    return int(cache.get("pos", 0))


def advance(cache: dict, t: int, commit: bool) -> None:
    """Count ``t`` more tokens seen, when the call commits."""
    if commit:
        cache["pos"] = cache_pos(cache) + t


__all__ = ["advance", "cache_nbytes", "cache_pos"]
