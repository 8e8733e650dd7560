"""Validation cost at the caps: time and peak Python memory of ``load``-ing, pricing and
building specs whose unrolled depth is large.

Validation walks the plan (regions and layers), never the unrolled applications, so its
cost does not grow with ``T``. Targets (issue 11): any spec within the caps validates in
under 1 s and 200 MB; a 4096-layer MixerLoop in under 1 s.

    python benchmarks/bench_validate.py [--build]

``--build`` also times ``build_model`` on the meta device for the specs that fit the cap.
"""
from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

from nas.cost import cost
from nas.errors import SpecError
from nas.load import resolve, spec_from_dict

GDN = {"kind": "gdn", "num_heads": 2, "head_dim": 32, "expand_v": 1}


def spec(name: str, layers: int, loops: list[dict], layer=None) -> dict:
    return {"name": name, "model": {"vocab_size": 256, "width": 64}, "num_layers": layers,
            "layer": layer or {"mixer": GDN, "ffn": {"kind": "swiglu", "hidden_size": 128}},
            "loops": loops}


def region(a: tuple[int, str], b: tuple[int, str], T: int) -> dict:
    return {"start": {"layer": a[0], "op": a[1]}, "end": {"layer": b[0], "op": b[1]}, "T": T}


def cases() -> list[tuple[str, dict]]:
    nested = lambda L, t1, t2: [region((0, "mixer"), (L - 1, "ffn"), t1)] + [
        region((i, "mixer"), (i, "mixer"), t2) for i in range(L)]
    mixerloop = lambda L, t: [region((i, "mixer"), (i, "mixer"), t) for i in range(L)]
    return [
        ("block 256 x mixer 256, 4 layers", spec("n256", 4, nested(4, 256, 256))),
        ("block 1024 x mixer 1024, 4 layers (over the cap)", spec("n1024", 4, nested(4, 1024, 1024))),
        ("256 layers, block 1024", spec("b1024", 256, [region((0, "mixer"), (255, "ffn"), 1024)])),
        ("4096 layers, block 1024 (over the cap)", spec("b4096", 4096, [region((0, "mixer"), (4095, "ffn"), 1024)])),
        ("4096-layer MixerLoop T=4", spec("ml4096", 4096, mixerloop(4096, 4))),
        ("4096-layer MixerLoop T=255", spec("ml4096b", 4096, mixerloop(4096, 255))),
        ("4096-layer MixerLoop T=256 (over the cap)", spec("ml4096c", 4096, mixerloop(4096, 256))),
        ("4096 layers, 4096 nested spans", spec("deep", 4096, [
            region((i, "mixer"), (4095 - i, "ffn"), 1) for i in range(2048)])),
    ]


def measure(fn, memory: bool = True):
    """(result, error line, seconds, peak MB): timed on its own, then rerun under
    tracemalloc (which slows Python several-fold) for the peak."""
    t0 = time.perf_counter()
    try:
        out, err = fn(), None
    except SpecError as exc:
        out, err = None, str(exc).splitlines()[-1].strip()
    seconds = time.perf_counter() - t0
    if not memory:
        return out, err, seconds, float("nan")
    tracemalloc.start()
    try:
        fn()
    except SpecError:
        pass
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return out, err, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="also build on the meta device")
    args = parser.parse_args()
    if args.build:
        from builders.model import build_model
    print(f"{'case':52} {'resolve s':>9} {'MB':>6} {'cost s':>7}  result")
    for name, data in cases():
        source = spec_from_dict(data)
        arch, err, sec, peak = measure(lambda: resolve(source))
        line = f"{name:52} {sec:9.3f} {peak:6.1f}"
        if arch is not None:
            _, _, csec, _ = measure(lambda: cost(arch), memory=False)
            line += f" {csec:7.3f}  valid"
            if args.build:
                _, _, bsec, _ = measure(lambda: build_model(arch, device="meta"), memory=False)
                line += f", build {bsec:.3f} s"
        else:
            line += f" {'-':>7}  {err}"
        print(line, flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak RSS of this process (imports and all cases): {rss:.0f} MB")


if __name__ == "__main__":
    main()
