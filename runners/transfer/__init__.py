"""``loopnas transfer``: does a proxy sweep's order survive growth?

A proxy sweep exists to choose what to train at full scale. Transfer retrains its chosen
candidates (the front and its nearest rivals) at larger widths with the sweep's seeds, each
scale an ordinary experiment directory (``EXP/transfer/scale-2x/``), and reports, per
scale, every candidate's quality ± s.e. and cost, Kendall τ and Spearman ρ against the base
with seed-resampling intervals, and what became of every pair the base separates beyond
seed noise: kept, flipped beyond noise, or now within noise. A ranking that does not
transfer is a result, not a failure. :mod:`.plan` chooses and grows, :mod:`.run` trains and
reads, :mod:`.analysis` compares, :mod:`.output` writes.
"""
from .analysis import Transfer, scale_verdict
from .output import markdown, write
from .plan import STEPS_RULES, TransferError, choose, parse_candidates
from .run import TRANSFER, analyse, find, prepare, run_transfer, status_entry, summary_json, train

__all__ = ["STEPS_RULES", "TRANSFER", "Transfer", "TransferError", "analyse", "choose", "find", "markdown",
           "parse_candidates", "prepare", "run_transfer", "scale_verdict", "status_entry", "summary_json", "train",
           "write"]
