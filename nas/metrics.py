"""The metrics a space's objectives and constraints name, and the role each objective plays.

- :data:`COST_METRICS`: what the cost model prices before training, each with the fields of
  ``CostSheet.to_dict()`` it sums (:func:`nas.cost.sheet_value`): the sweep prices
  candidates with it, the report reads records with it;
- :data:`SERVING_METRICS`: what ``runners.bench`` measures on a trained model;
- :data:`DEFAULT_SEQ_LEN`: the context a metric is priced at when nothing names one;
- :class:`ObjectiveRole`: quality, serving cost or cost-model value, from an objective's
  ``measured`` and ``serving``; a space's objectives (:class:`nas.space.ObjectiveSpec`) and
  an experiment's records (``runners.results.records.Objective``) both answer with it.

No imports: ``validate``, ``status`` and the command line read it without loading the cost model.
"""
from __future__ import annotations

from typing import NamedTuple

DEFAULT_SEQ_LEN = 1024
"""The context length cost metrics are priced at when neither the call nor the space names one."""


class CostMetric(NamedTuple):
    description: str
    fields: tuple[str, ...]
    """The fields of ``CostSheet.to_dict()`` (or of one of its ``per_k`` entries) it sums."""


COST_METRICS = {
    "unique_params": CostMetric("unique parameters", ("unique_params",)),
    "non_embedding_params": CostMetric("unique parameters less embeddings", ("non_embedding_params",)),
    "projection_flops": CostMetric("projection FLOPs per token (MixerLoop §3.3)", ("projection_flops_per_token",)),
    "forward_flops": CostMetric("projection + loop extras + sequence mixing FLOPs per token",
                                ("forward_flops_per_token",)),
    "seq_mixing_flops": CostMetric("sequence-mixing FLOPs per token at seq_len", ("seq_mixing_flops_per_token",)),
    "train_flops": CostMetric("training FLOPs per token", ("train_flops_per_token",)),
    "kv_bytes": CostMetric("KV cache + recurrent state bytes per sequence at seq_len",
                           ("kv_cache_bytes", "state_bytes")),
    "kv_cache_bytes": CostMetric("KV cache bytes per sequence at seq_len", ("kv_cache_bytes",)),
    "state_bytes": CostMetric("recurrent state bytes per sequence", ("state_bytes",)),
}
"""Cost-model metrics by name (a space's objective or constraint name)."""
SERVING_METRICS = {
    "train_tokens_per_s": "training throughput (forward + backward + step) at seq_len",
    "prefill_tokens_per_s": "prefill throughput at context seq_len",
    "decode_tokens_per_s": "decode throughput (tokens/s over the batch) after a seq_len prefill",
    "decode_latency_ms": "milliseconds per decoded token after a seq_len prefill",
    "peak_memory_bytes": "peak memory of prefill + decode at seq_len",
    "cache_bytes": "bytes the inference cache holds after a seq_len prefill",
}
"""Measured serving cost (``runners.bench``), one measurement per trial on the trial's own
hardware, at the objective's ``seq_len`` (default: the space's) and ``batch_size`` (default 1)."""


class ObjectiveRole:
    """An objective's role, from its ``measured`` (trained or benchmarked, not priced) and
    ``serving`` (a serving cost from ``runners.bench``), whether the two are fields or
    derived from the metric's name."""

    @property
    def quality(self) -> bool:
        """The proxy's quality metric: measured, not a serving cost."""
        return self.measured and not self.serving


__all__ = ["DEFAULT_SEQ_LEN", "COST_METRICS", "SERVING_METRICS", "CostMetric", "ObjectiveRole"]
