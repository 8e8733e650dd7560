"""Loop diagnostics: what each extra iteration contributes (definitions in ``measures``)."""
from .measures import Evaluator, effective_rank, interventions, kl, traces, transport, truncation
from .probes import applications, capture, closed_at, context_closed
from .run import Loaded, diagnose, load_run

__all__ = ["Evaluator", "Loaded", "applications", "capture", "closed_at", "context_closed",
           "diagnose", "effective_rank", "interventions", "kl", "load_run", "traces", "transport",
           "truncation"]
