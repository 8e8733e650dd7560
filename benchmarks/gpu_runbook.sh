#!/usr/bin/env bash
# The GPU runbook: what a session lent a GPU runs once (under 10 minutes on one H200), then
# commits benchmarks/results/gpu/. Each step has a time cap, a failed step does not stop the
# others, and gpu_runbook.md / gpu_runbook.json say what each step did and how long it took.
#
#   bash benchmarks/gpu_runbook.sh                    # on the GPU machine
#   bash benchmarks/gpu_runbook.sh --smoke --out DIR  # the same steps on CPU, tiny, in CI
#   bash benchmarks/gpu_runbook.sh --skip gpu_check   # leave steps out (comma-separated)
#
# Steps:
#   doctor     loopnas doctor --json: torch build, GPUs, fla/triton, and a GDN layer through fla
#   gpu_check  benchmarks/gpu_check.py: every fla op against its torch twin, train throughput
#   sweep      a short mixerloop sweep, proxy.backend fla, resources.gpu 0.25 (four trials on
#              each GPU, each capped at a quarter of its memory): status, devices, peak memory
#   bench      loopnas bench mixerloop_110m: train/prefill/decode throughput, memory, largest context
#
# --smoke: doctor as is, gpu_check --smoke, the sweep on the torch backend with 4 steps (its
# trials ask for a quarter GPU each and, finding none, train on CPU with one warning), bench
# of tiny_mixerloop at tiny contexts. Results go to --out (default: a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."

SMOKE=0
OUT=""
SKIP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --out) OUT="$2"; shift ;;
    --skip) SKIP="$2"; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
for s in ${SKIP//,/ }; do
  case "$s" in doctor|gpu_check|sweep|bench) ;; *) echo "error: --skip: no step $s" >&2; exit 2 ;; esac
done
if [ -z "$OUT" ]; then
  if [ "$SMOKE" = 1 ]; then OUT="$(mktemp -d)"; else OUT="benchmarks/results/gpu"; fi
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/work"          # sweep experiment (checkpoints): never committed
[ "$SMOKE" = 1 ] || WORK="runs/gpu_runbook"
rm -rf "$WORK" && mkdir -p "$WORK"
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
SMOKE_FLAG=""
[ "$SMOKE" = 1 ] && SMOKE_FLAG="--smoke"

ROWS=()
FAILED=0
CAP_SCALE=1
[ "$SMOKE" = 1 ] && CAP_SCALE=4  # the caps are the GPU run's budget; a shared CI CPU is slower
step() {  # step NAME CAP_SECONDS: the function NAME, in a shell that timeout can stop
  local name="$1" cap=$(($2 * CAP_SCALE))
  if [[ ",$SKIP," == *",$name,"* ]]; then
    ROWS+=("$name|skipped|0|0"); echo "== $name: skipped"; return
  fi
  echo "== $name (at most ${cap}s)"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$cap" bash -c "$name" > "$OUT/$name.log" 2>&1
  rc=$?
  local took=$((SECONDS - t0)) state=ok
  [ $rc -eq 0 ] || { state=failed; FAILED=1; [ $rc -eq 124 ] && state="timed out"; }
  ROWS+=("$name|$state|$rc|$took")
  echo "   $state (exit $rc) in ${took}s; log: $OUT/$name.log"
  [ $rc -eq 0 ] || tail -5 "$OUT/$name.log" | sed 's/^/   | /'
}

doctor() { "$PY" -m runners doctor --json > "$OUT/doctor.json"; }

gpu_check() { "$PY" benchmarks/gpu_check.py $SMOKE_FLAG --out "$OUT/gpu_check.json"; }

sweep() {
  local backend=fla steps=300 trials=8 every=50 params="seq_len: 8, degree: 3"
  if [ "$SMOKE" = 1 ]; then backend=torch steps=4 trials=2 every=2 params="seq_len: 4, degree: 2"; fi
  cat > "$WORK/gpu_sweep.yaml" <<EOF
name: gpu_sweep
description: mixerloop on GPUs (benchmarks/gpu_runbook.sh), four trials per GPU
base: tiny_noloop
params:
  boundary: {target: loop.boundary, choices: [none, block, mixer, ffn]}
  T: {target: loop.T, choices: [2, 4], when: {boundary: [block, mixer, ffn]}}
match: {unique_params: 108936, vary: ffn_hidden, tolerance: 0.01}
objectives:
  - {metric: acc, direction: maximize}
  - {metric: projection_flops, direction: minimize}
proxy: {task: s5, task_params: {$params}, steps: $steps, batch_size: 32, lr: 0.01, eval_every: $every, backend: $backend}
search: {sampler: grid, trials: $trials, concurrency: 4, resources: {cpu: 1, gpu: 0.25}}
EOF
  # a file, not stdin: the sweep's spawned workers import the main module
  cat > "$WORK/gpu_sweep.py" <<'EOF'
import json, sys, time
from runners.cli.status import status_data
from runners.results.records import read_trials
from runners.sweep.run import run_sweep

def main() -> int:
    t0 = time.time()
    exp = run_sweep(sys.argv[1], out=sys.argv[2], progress=False)
    data = status_data(exp)
    data["wall_s"] = round(time.time() - t0, 1)
    data["trials"] = [{"id": r.id, "status": r.status, "reason": r.reason, "summary": r.summary, "devices": r.devices,
                       "ran_on": [p.ran_on for p in r.replicates], "peak_memory": r.peak_memory,
                       "wall_time": r.wall_time, "values": r.values} for r in read_trials(exp)]
    open(sys.argv[3], "w").write(json.dumps(data, indent=2))
    bad = [t for t in data["trials"] if t["status"] != "complete"]
    print(f"{len(data['trials'])} trials in {data['wall_s']} s, per device {data['devices']}; not complete: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":  # the sweep's spawned workers import this file too
    sys.exit(main())
EOF
  "$PY" "$WORK/gpu_sweep.py" "$WORK/gpu_sweep.yaml" "$WORK/exp" "$OUT/gpu_sweep.json"
}

bench() {
  if [ "$SMOKE" = 1 ]; then
    "$PY" -m runners bench tiny_mixerloop --contexts 32,64 --batch-sizes 1 --decode-tokens 2 --repeats 1 \
      --max-context 256 --out "$OUT/bench_mixerloop_110m" --json > "$OUT/bench_mixerloop_110m.json"
  else
    "$PY" -m runners bench mixerloop_110m --device cuda --backend fla --contexts 1024,4096,16384 \
      --batch-sizes 1,4 --max-context 262144 --out "$OUT/bench_mixerloop_110m" --json > "$OUT/bench_mixerloop_110m.json"
  fi
}

export SMOKE OUT WORK PY SMOKE_FLAG
export -f doctor gpu_check sweep bench
START=$SECONDS
step doctor 60
step gpu_check 270
step sweep 150
step bench 90

{
  echo "# GPU runbook$([ "$SMOKE" = 1 ] && echo ' (smoke, CPU)')"
  echo
  echo "$(date -u +%Y-%m-%dT%H:%MZ) on $(hostname); $("$PY" -c 'import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device")' 2>/dev/null); $((SECONDS - START)) s in all"
  echo
  echo "| step | result | exit | seconds |"
  echo "|---|---|---|---|"
  for r in "${ROWS[@]}"; do IFS='|' read -r n s c t <<< "$r"; echo "| $n | $s | $c | $t |"; done
} > "$OUT/gpu_runbook.md"
"$PY" - "$OUT" "$SMOKE" "${ROWS[@]}" <<'EOF'
import json, sys
out, smoke, rows = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
steps = [dict(zip(("step", "result", "exit", "seconds"), r.split("|"))) for r in rows]
for s in steps:
    s["exit"], s["seconds"] = int(s["exit"]), int(s["seconds"])
json.dump({"smoke": smoke, "steps": steps}, open(f"{out}/gpu_runbook.json", "w"), indent=2)
EOF
cat "$OUT/gpu_runbook.md"
echo "results: $OUT"
exit $FAILED
