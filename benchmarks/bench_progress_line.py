"""The sweep's progress line per worker message at 10 to 10,000 candidates (issue #32).

A message is one trial record written by the driver (``Sweep._write``: its records dict
is set) followed by the line being redrawn (``runners.sweep.run._Line``: counts and the
front of the means). Before issue #32 the line recomputed the whole front with the p_front
bootstrap on every message; timed here in the same process, for comparison, one call of
what it called, ``front()`` over all records (now with the pruned bootstrap of issue #32;
with the bootstrap before it, 458 s at 10,000 candidates, as the issue measured). Records are fabricated as in
``bench_status_scale.py`` (copies of real trials, every metric jittered by 5%), held in
memory as the driver holds them.

``python benchmarks/bench_progress_line.py [--sizes 10,100,1000,10000] [--messages 200] [--out FILE.md]``
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from bench_status_scale import MAIN, fabricate, tiny_source  # noqa: E402


def per_message(records: list, objectives, messages: int) -> float:
    """Seconds per message of the new line: the sweep fills up, then each message rewrites one record."""
    from runners.sweep.run import _Line

    sweep = SimpleNamespace(records={r.id: r for r in records}, objectives=objectives, active=set())
    line = _Line(sweep)
    line.text(line.counts())  # the records already there: read once, as at a resume
    t = time.perf_counter()
    for n in range(messages):
        r = records[n % len(records)]
        sweep.records[r.id] = r  # the driver's write
        line.text(line.counts())
    return (time.perf_counter() - t) / messages


def old_line(records: list, objectives) -> float:
    """Seconds for one message of the old line: front() with its bootstrap over every record."""
    from runners.results.front import front

    front(records[:10], objectives)  # imports (scipy) paid before the clock starts
    t = time.perf_counter()
    front(records, objectives)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,100,1000,10000")
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--old-up-to", type=int, default=1000, help="time the old line up to this many candidates")
    ap.add_argument("--source", type=Path, default=MAIN if (MAIN / "experiment.json").is_file() else None)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from runners.results.records import read_experiment, read_trials

    lines = ["| candidates × 5 seeds | progress line µs / message | one front() with the bootstrap, s (what the old line ran per message) |",
             "|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = args.source or tiny_source(tmp)
        for n in map(int, args.sizes.split(",")):
            exp = fabricate(source, tmp / f"x{n}", n)
            records, objectives = read_trials(exp), read_experiment(exp).objectives
            us = per_message(records, objectives, args.messages) * 1e6
            old = f"{old_line(records, objectives):.3f}" if n <= args.old_up_to else "—"
            lines.append(f"| {n:,} | {us:.0f} | {old} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
