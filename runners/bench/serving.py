"""Serving objectives of a sweep (``nas.space.SERVING_METRICS``), measured on a trial's
trained model on the trial's own hardware, after training.

Objectives that share a (context, batch size) share one measurement: one prefill + decode
timing, one peak-memory run, one timed training step (on a copy, so the trained weights
are untouched). Each is the median of ``repeats`` after a warm-up, like ``loopnas bench``.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from .measure import measure_serving, measure_train, serving_peak

DECODE_TOKENS = 8
_SERVING = {"prefill_tokens_per_s", "decode_tokens_per_s", "decode_latency_ms", "cache_bytes"}


def _one(model, train_model, metrics: set[str], seq_len: int, batch_size: int, loops: int | None,
         dtype: torch.dtype, repeats: int) -> dict[str, float]:
    out: dict[str, float] = {}
    if metrics & _SERVING:
        s = measure_serving(model, batch_size, seq_len, DECODE_TOKENS, loops, repeats)
        out.update(prefill_tokens_per_s=s.prefill_tokens_per_s, decode_tokens_per_s=s.decode_tokens_per_s,
                   decode_latency_ms=s.decode_ms_per_token,
                   cache_bytes=float(s.cache_kv_bytes + s.cache_state_bytes))
    if "peak_memory_bytes" in metrics:
        out["peak_memory_bytes"] = float(serving_peak(model, batch_size, seq_len, loops).bytes)
    if "train_tokens_per_s" in metrics:
        trainee = copy.deepcopy(train_model).float()
        out["train_tokens_per_s"] = measure_train(trainee, batch_size, seq_len, dtype, loops, repeats).tokens_per_s
    return out


def serving_values(model, objectives: list[dict[str, Any]], loops: int | None = None,
                   dtype: torch.dtype = torch.float32, repeats: int = 3, train_model=None) -> dict[str, float]:
    """``objectives``: ``{"name", "metric", "seq_len", "batch_size"}`` each; returns each
    objective's measured value by name. ``model``: in its serving dtype (see
    :func:`runners.bench.measure.for_serving`); ``train_model``: the model as trained
    (its backend; default ``model``), copied for the timed training step under ``dtype``
    autocast."""
    groups: dict[tuple[int, int], set[str]] = {}
    for o in objectives:
        groups.setdefault((o["seq_len"], o["batch_size"]), set()).add(o["metric"])
    measured = {key: _one(model, train_model or model, metrics, *key, loops, dtype, repeats)
                for key, metrics in groups.items()}
    return {o["name"]: measured[(o["seq_len"], o["batch_size"])][o["metric"]] for o in objectives}


__all__ = ["DECODE_TOKENS", "serving_values"]
