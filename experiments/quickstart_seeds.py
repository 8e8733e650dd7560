"""Does the quickstart's proxy separate its candidates? A call of ``loopnas calibrate``:
every candidate of ``spaces/quickstart.yaml`` trained with several seeds, exactly as a sweep
trains them, then per parameter the effect, its seed standard error and a permutation test.
Writes ``runs/quickstart/calibration/`` (where the quickstart sweep's report finds it) and
prints the table; ``experiments/results/quickstart_seeds.md`` is its committed output.

    python experiments/quickstart_seeds.py            # the space's proxy.seeds (5)
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from nas.space import load_space
from runners.calibrate import CALIBRATION, run_calibration, write
from runners.cli.calibrate import print_calibration
from runners.sweep.driver import default_out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="spaces/quickstart.yaml")
    ap.add_argument("--seeds", type=int, default=None, help="default: the space's proxy.seeds")
    ap.add_argument("--budgets", default="1", help="multiples of the proxy's steps, e.g. 1,2")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    space = load_space(args.space)
    out = args.out or default_out(space) / CALIBRATION
    start = time.perf_counter()
    cal = run_calibration(space, out, seeds=args.seeds or max(space.spec.proxy.seeds, 3), budgets=tuple(float(b) for b in args.budgets.split(",")))
    write(cal, out)
    print_calibration(cal)
    print(f"{time.perf_counter() - start:.0f} s; {out / 'calibration.md'}")


if __name__ == "__main__":
    main()
