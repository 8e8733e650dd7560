"""Measured cost: training, prefill and decode throughput, peak memory, cache bytes, the
largest context that fits (``loopnas bench``), and the serving objectives of a sweep."""
from .measure import (
    ContextLimit, Serving, TrainTiming, for_serving, max_context, measure_decode, measure_prefill,
    measure_serving, measure_train, serving_peak,
)
from .memory import Peak, peak_memory
from .mfu import matmul_rate, model_flops
from .run import BenchResult, BenchRow, bench
from .serving import serving_values
from .timing import matmul_peak_flops, median_seconds

__all__ = ["BenchResult", "BenchRow", "ContextLimit", "Peak", "Serving", "TrainTiming", "bench",
           "for_serving", "matmul_peak_flops", "matmul_rate", "max_context", "measure_decode", "measure_prefill",
           "measure_serving", "measure_train", "median_seconds", "model_flops", "peak_memory", "serving_peak",
           "serving_values"]
