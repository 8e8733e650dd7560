"""The cache of one incremental-decoding session of a :class:`builders.model.LoopLM`.

A looped mixer re-reads its own sequence: iteration ``t`` of a loop mixes the iteration-``t``
states of the past tokens, so the cache holds one dict (see :mod:`builders.cache`) per mixer
*application*, keyed by ``(layer, branch, path)`` with ``path`` the iterations of the
enclosing loops, outermost first, ``((region, t), ...)``, and ``branch`` the parallel branch
(None for a plain mixer; a switch runs its pattern's option as a plain mixer).

KV policy (ELR): ``per_loop`` keeps every application's KV. ``last_loop`` keeps one KV cache
per attention layer (or parallel attention branch), written only by the layer's last
application of the token (the last iteration of every enclosing loop); the earlier ones
read the past tokens' last-iteration keys and values plus their own current keys, and
commit nothing. Attention KV then stays at the one-loop size at any loop count. Recurrent
mixers keep per-application state under both policies: it does not grow with the sequence.
Within one call the new tokens see each other's keys of the same iteration, as in forward:
the prompt's logits equal forward's, and a later token's depend on how the tokens after
the prompt were grouped into calls. Where a loop schedule gives the layer's applications
different windows, the shared dict's ``keep`` entry asks the layer to keep the keys the
widest of them reads (None: all), since the earlier iterations read what the last wrote.
"""
from __future__ import annotations

from typing import Literal

from nas.plan import iteration_overrides, plan, unroll
from nas.spec import ArchSpec, AttnSpec, DSASpec, NSASpec, ParallelSpec, SwitchSpec

from .cache import cache_nbytes

KVPolicy = Literal["per_loop", "last_loop"]
KV_SPECS = (AttnSpec, DSASpec, NSASpec)  # mixers whose cache grows with the sequence


class InferenceCache:
    """Everything a decode step needs besides the new tokens: the loop count, the switch
    pattern and KV policy the session was prefilled with, the per-application layer dicts,
    and ``pos``, the tokens seen so far."""

    def __init__(self, arch: ArchSpec, loops: int | None, pattern: list[int] | None,
                 kv_policy: KVPolicy):
        if kv_policy not in ("per_loop", "last_loop"):
            raise ValueError(f"kv_policy must be 'per_loop' or 'last_loop' (got {kv_policy!r})")
        _check_pattern(arch, pattern)
        self.arch, self.loops, self.pattern, self.kv_policy = arch, loops, pattern, kv_policy
        self.pos = 0
        self.layers: dict[tuple, dict] = {}  # (layer, branch, path) -> one leaf mixer's dict
        self._windows: dict[int, set] | None = None

    def _leaf(self, layer: int, branch: int | None, spec, path: tuple, final: bool) -> tuple[dict, bool]:
        """The dict one leaf mixer application reads, and whether it commits."""
        if self.kv_policy == "last_loop" and isinstance(spec, KV_SPECS):
            key = (layer, branch, ())
            if key not in self.layers:
                self.layers[key] = self._shared_dict(layer, spec)
            return self.layers[key], final
        return self.layers.setdefault((layer, branch, path), {}), True

    def _shared_dict(self, layer: int, spec) -> dict:
        """A last-loop KV dict; with ``keep`` when the layer's applications differ in window."""
        if isinstance(spec, NSASpec):  # keeps every key whatever its window
            return {}
        if self._windows is None:
            self._windows = {}
            for addr, path in unroll(plan(self.arch, self.loops)):
                if addr.op == "mixer":
                    window = iteration_overrides(self.arch, addr.layer, path).get("window")
                    self._windows.setdefault(addr.layer, set()).add(window)
        own = getattr(spec, "window", None)
        windows = {own if w is None else None if w == "full" else w for w in self._windows[layer]}
        if len(windows) == 1:
            return {}
        return {"keep": None if None in windows else max(windows)}

    def mixer_cache(self, layer: int, path: tuple, final: bool) -> tuple[dict, bool | tuple[bool, ...]]:
        """``(cache, commit)`` for one application of ``layer``'s mixer at loop ``path``;
        ``final``: the last application of the token. A parallel mixer gets a dict of its
        branches' dicts (``branches.{i}``) and one commit per branch; a switch a dict with
        its pattern's option's dict (``options.{j}``)."""
        spec = self.arch.layers[layer].mixer
        if isinstance(spec, SwitchSpec):
            option = self.pattern[layer]
            sub, commit = self._leaf(layer, None, spec.options[option], path, final)
            return {f"options.{option}": sub}, commit
        if isinstance(spec, ParallelSpec):
            subs = [self._leaf(layer, i, b, path, final) for i, b in enumerate(spec.branches)]
            return {f"branches.{i}": d for i, (d, _) in enumerate(subs)}, tuple(c for _, c in subs)
        return self._leaf(layer, None, spec, path, final)

    def nbytes(self) -> dict[str, int]:
        """Bytes held: ``{"kv": ..., "state": ...}`` over every layer dict."""
        out = {"kv": 0, "state": 0}
        for d in self.layers.values():
            for kind, n in cache_nbytes(d).items():
                out[kind] += n
        return out


def _check_pattern(arch: ArchSpec, pattern: list[int] | None) -> None:
    """A switch pattern names one option of every switch layer."""
    switches = [i for i, l in enumerate(arch.layers) if isinstance(l.mixer, SwitchSpec)]
    if not switches:
        return
    if pattern is None or len(pattern) != len(arch.layers) or any(
            not 0 <= pattern[i] < len(arch.layers[i].mixer.options) for i in switches):
        raise ValueError(f"pattern {pattern!r}: give one option index per layer "
                         f"({len(arch.layers)} layers; switch layers {switches})")


__all__ = ["InferenceCache", "KVPolicy", "KV_SPECS"]
