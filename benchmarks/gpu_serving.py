"""One-file GPU serving benchmark: the three serving benchmarks on the fla path at the
papers' geometry, one JSON file.

Run on one CUDA GPU (sized for an H200, at most about 8 minutes; ``--budget-s`` stops
starting new measurements after that many seconds, and the JSON says what was skipped):

    python benchmarks/gpu_serving.py --out benchmarks/results/gpu_serving.json

1. decode: FullLoop T=4 with GDN mixers vs its full-attention twin (same width, heads, FFN),
   15M and 110M, contexts 1k–32k, batch 1 and 8; prefill, then one decode step of each model
   in turn, median ms per token and the GDN ÷ attention throughput (LT2: flat vs collapsing,
   about 3× at batch 1 and 32k).
2. KV memory: the ELR hybrid (attention inside the looped block) prefilled at 32k under
   per-loop and last-loop KV policies at k = 1..4: the cache's measured bytes beside the
   cost model's, and the measured peak memory (ELR: last-loop KV stays at the one-loop size).
3. prefill: NoLoop, MixerLoop and FullLoop (15M, 110M) in turn, median of 5, contexts 1k–32k
   at batch 1 and 1k–8k at batch 8: MixerLoop ÷ FullLoop throughput of the forward pass
   without a cache (the fla path) and of the cache-building prefill (MixerLoop reports up to
   1.52×), beside the cost model's FLOPs ratio.

bf16 weights and caches; models are built on the fla backend. Where fla's layers cannot
decode incrementally, prefill and decode run on the model's torch twin with the same
weights (torch SDPA attention, loopnas's chunked/recurrent GDN) and every row names the
backend it ran on. Every measurement that fails (out of memory, a kernel error) is recorded
with its error and the run goes on. ``--smoke`` runs the same
code on CPU with the tiny specs, float32, torch backend, tiny contexts, in seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

# run as a script, sys.path starts at this folder, whose spaces/ would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from builders.model import build_model
from nas.cost import cost
from runners.bench.compare import interleaved_decode, round_robin, variant, with_mixer
from runners.bench.measure import for_serving, random_ids, serving_peak

FULL = {
    "decode": {"pairs": [("fullloop_15m", 4), ("fullloop_110m", 12)], "contexts": [1024, 4096, 16384, 32768],
               "batch_sizes": [1, 8], "steps": 32},
    "kv": {"spec": "elr_hybrid", "context": 32768, "batch_size": 1, "loops": [1, 2, 3, 4]},
    "prefill": {"sets": [("noloop_15m", "mixerloop_15m", "fullloop_15m"),
                         ("noloop_110m", "mixerloop_110m", "fullloop_110m")],
                "contexts": [1024, 4096, 16384, 32768], "batch_sizes": [1, 8], "max_tokens": 65536, "repeats": 5},
}
SMOKE = {
    "decode": {"pairs": [("tiny_fullloop", 2)], "contexts": [32, 64], "batch_sizes": [1, 2], "steps": 3},
    "kv": {"spec": "tiny_elr", "context": 16, "batch_size": 1, "loops": [1, 2, 4],
           "placement": ["gdn", "attn", "gdn", "gdn"]},
    "prefill": {"sets": [("tiny_noloop", "tiny_mixerloop", "tiny_fullloop")], "contexts": [32, 64],
                "batch_sizes": [1, 2], "max_tokens": 128, "repeats": 1},
}


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.end


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"


def _free(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def _build(arch, device: str, backend: str, dtype: torch.dtype):
    """(model in dtype, ready to decode; the backend it runs: torch where fla's layers
    cannot decode incrementally)."""
    torch.manual_seed(0)
    return for_serving(build_model(arch, backend=backend, device=device), dtype)


def decode(cfg: dict, device: str, backend: str, dtype: torch.dtype, budget: Budget) -> list[dict]:
    rows = []
    for base, heads in cfg["pairs"]:
        archs = {"gdn": variant(base), "attn": with_mixer(base, {"kind": "attn", "num_heads": heads})}
        built = {name: _build(a, device, backend, dtype) for name, a in archs.items()}
        pair = {name: m for name, (m, _) in built.items()}
        backends = {f"{name}_backend": used for name, (_, used) in built.items()}
        for b in cfg["batch_sizes"]:
            for c in cfg["contexts"]:
                row = {"spec": base, "batch_size": b, "context": c, **backends}
                if not budget.left():
                    rows.append({**row, "skipped": "time budget"})
                    continue
                try:
                    r = interleaved_decode(pair, b, c, cfg["steps"])
                    row.update({f"{m}_{k}": v for m, d in r.items() for k, v in d.items()},
                               gdn_over_attn=r["gdn"]["tokens_per_s"] / r["attn"]["tokens_per_s"])
                except Exception as exc:  # recorded: the rest of the run goes on
                    row["error"] = _error(exc)
                _free(device)
                rows.append(row)
                print("decode", json.dumps(row), flush=True)
        del pair
        _free(device)
    return rows


def kv(cfg: dict, device: str, backend: str, dtype: torch.dtype, budget: Budget) -> list[dict]:
    from nas.load import parse_yaml
    from spaces import arch_path

    edits = {}
    if cfg.get("placement"):
        edits["hybrid"] = {**parse_yaml(arch_path(cfg["spec"]).read_text())["hybrid"], "placement": cfg["placement"]}
    name = "fp32" if dtype == torch.float32 else "bf16"
    rows = []
    for policy in ("per_loop", "last_loop"):
        arch = variant(cfg["spec"], kv_policy=policy, **edits)
        model, used = _build(arch, device, backend, dtype)
        sheet = cost(arch, seq_len=cfg["context"], dtype=name)
        ids = random_ids(model, cfg["batch_size"], cfg["context"])
        for k in cfg["loops"]:
            row = {"spec": cfg["spec"], "kv_policy": policy, "k": k, "context": cfg["context"],
                   "batch_size": cfg["batch_size"], "backend": used}
            if not budget.left():
                rows.append({**row, "skipped": "time budget"})
                continue
            try:
                with torch.inference_mode():
                    held = model.prefill(ids, loops=k)[1].nbytes()
                priced = sheet.at(k)
                row.update(kv_bytes=held["kv"], state_bytes=held["state"],
                           cost_kv_bytes=priced.kv_cache_bytes * cfg["batch_size"],
                           cost_state_bytes=priced.state_bytes * cfg["batch_size"],
                           peak_memory_bytes=serving_peak(model, cfg["batch_size"], cfg["context"], k).bytes)
            except Exception as exc:
                row["error"] = _error(exc)
            _free(device)
            rows.append(row)
            print("kv", json.dumps(row), flush=True)
        del model
        _free(device)
    return rows


def prefill(cfg: dict, device: str, backend: str, dtype: torch.dtype, budget: Budget) -> list[dict]:
    """Per context: the forward pass without a cache on the build backend (the fla path) and
    the cache-building prefill on the serving model, each model in turn."""
    rows = []
    dev = torch.device(device)
    for names in cfg["sets"]:
        archs = [variant(n) for n in names]
        built = [_build(a, device, backend, dtype) for a in archs]
        torch.manual_seed(0)
        plain = [build_model(a, backend=backend, device=device).to(dtype).eval() for a in archs]
        for b in cfg["batch_sizes"]:
            for c in (c for c in cfg["contexts"] if b * c <= cfg["max_tokens"]):
                row = {"specs": list(names), "batch_size": b, "context": c, "forward_backend": backend,
                       "prefill_backends": [u for _, u in built]}
                if not budget.left():
                    rows.append({**row, "skipped": "time budget"})
                    continue
                try:
                    ids = random_ids(plain[0], b, c)
                    fns = {f"forward {a.name}": (lambda m=m: m(ids).logits) for a, m in zip(archs, plain)}
                    fns.update({f"prefill {a.name}": (lambda m=m: m.prefill(ids)) for a, (m, _) in zip(archs, built)})
                    with torch.inference_mode():
                        secs = round_robin(fns, dev, cfg["repeats"])
                    flops = [cost(a, seq_len=c).figures.forward_flops for a in archs]
                    for phase in ("forward", "prefill"):
                        tps = {a.name: b * c / secs[f"{phase} {a.name}"] for a in archs}
                        row[f"{phase}_tokens_per_s"] = tps
                        row[f"{phase}_mixerloop_over_fullloop"] = tps[names[1]] / tps[names[2]]
                    row["flops_fullloop_over_mixerloop"] = flops[2] / flops[1]
                except Exception as exc:
                    row["error"] = _error(exc)
                _free(device)
                rows.append(row)
                print("prefill", json.dumps(row), flush=True)
        del built, plain
        _free(device)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_serving.json"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no measurement after this")
    ap.add_argument("--smoke", action="store_true", help="the same code on CPU, tiny specs, seconds")
    args = ap.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        ap.error("no CUDA device here; --smoke runs the same code on CPU with the tiny specs")
    device, backend = ("cpu", "torch") if args.smoke else ("cuda", "fla")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    cfg = SMOKE if args.smoke else FULL
    if args.smoke:
        torch.set_num_threads(1)
    budget, start = Budget(args.budget_s), time.monotonic()
    result = {"command": "python " + " ".join(sys.argv), "smoke": args.smoke, "date": time.strftime("%Y-%m-%d"),
              "device": torch.cuda.get_device_name() if device == "cuda" else platform.machine(),
              "torch": torch.__version__, "backend": backend, "dtype": str(dtype).removeprefix("torch."),
              "config": cfg}
    for section, fn in (("decode", decode), ("kv", kv), ("prefill", prefill)):
        try:
            result[section] = fn(cfg[section], device, backend, dtype, budget)
        except Exception as exc:  # a section that cannot even start (a model that will not build)
            result[section] = [{"error": _error(exc), "traceback": traceback.format_exc(limit=6)}]
        result["wall_s"] = time.monotonic() - start
        _write(args.out, result)  # after every section: a run cut short keeps what it measured
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")


def _write(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
