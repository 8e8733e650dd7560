"""``loopnas bench`` on a tiny spec on CPU, its measurements, and serving objectives in a sweep."""
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from builders.model import build_model
from nas import load_arch
from runners.bench.measure import max_context, measure_train, serving_peak
from runners.bench.memory import peak_memory
from runners.cli import main
from spaces import arch_path
from helpers import REPO

FAST = ["--decode-tokens", "2", "--repeats", "1"]


def test_bench_cli_prints_tables_and_writes_plot_and_json(tmp_path, capsys, one_thread):
    out = tmp_path / "b"
    rc = main(["bench", "tiny_mixerloop", "--contexts", "32,64", "--batch-sizes", "1,2", *FAST,
               "--memory-limit", "2MiB", "--max-context", "4096", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "tiny_mixerloop: tokens/s on cpu" in text and "largest context that fits" in text
    assert (out / "bench.png").stat().st_size > 1000
    result = json.loads((out / "bench.json").read_text())
    assert [(r["batch_size"], r["context"]) for r in result["rows"]] == [(1, 32), (1, 64), (2, 32), (2, 64)]
    for r in result["rows"]:
        assert r["error"] is None
        for key in ("train_tokens_per_s", "prefill_tokens_per_s", "decode_tokens_per_s",
                    "decode_ms_per_token", "peak_memory_bytes", "train_peak_memory_bytes", "train_mfu"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        # a GDN model's cache is its recurrent state: exactly what the cost model prices
        assert r["cache_kv_bytes"] == r["cost_kv_bytes"] == 0
        assert r["cache_state_bytes"] == r["cost_state_bytes"] > 0
    limits = result["limits"]
    assert [l["batch_size"] for l in limits] == [1, 2]
    for l in limits:  # the search stopped where the measured peak crossed the limit
        assert l["fails"] == 2 * l["fits"] and l["peak_at_fit"] <= 2 << 20 and "exceeds" in l["reason"]


def test_bench_cli_json_is_the_written_result(tmp_path, capsys, one_thread):
    out = tmp_path / "j"
    assert main(["bench", "tiny_noloop", "--contexts", "16", "--batch-sizes", "1", *FAST,
                 "--memory-limit", "1MiB", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((out / "bench.json").read_text())
    assert printed["memory_method"].startswith("torch profiler memory events")
    assert printed["serving_backend"] == printed["backend"] == "torch" and printed["peak_flops"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--contexts", "128,abc"], "--contexts '128,abc': expected comma-separated positive integers"),
    (["--batch-sizes", "0"], "--batch-sizes '0': expected comma-separated positive integers"),
    (["--memory-limit", "lots"], "--memory-limit 'lots': expected a size"),
    pytest.param(["--device", "cuda"], "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")),
], ids=["contexts", "batch", "memory", "device"])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert main(["bench", "tiny_noloop", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_bench_loops_measures_that_depth_and_prices_it(tmp_path, capsys, one_thread):
    """--loops k runs every loop region k times; the cache then holds k applications' state,
    exactly what the cost model prices at k (nas.cost.figures_at, any allowed k)."""
    from nas import load_arch
    from nas.cost import cost, figures_at
    arch = load_arch(arch_path("tiny_elr"))
    sheet = cost(arch, seq_len=16, dtype="fp32")
    for k in arch.elastic.eval:  # the sheet's own elastic points are the same figures
        assert figures_at(arch, k, seq_len=16, dtype="fp32") == sheet.at(k)
    rows = {}
    for k in (1, 3):
        assert main(["bench", "tiny_elr", "--loops", str(k), "--contexts", "16", "--batch-sizes", "1", *FAST,
                     "--memory-limit", "1MiB", "--json", "--out", str(tmp_path / str(k))]) == 0
        [rows[k]] = json.loads(capsys.readouterr().out)["rows"]
        want = figures_at(arch, k, seq_len=16, dtype="fp32")
        assert (rows[k]["cache_kv_bytes"], rows[k]["cache_state_bytes"]) == (want.kv_cache_bytes, want.state_bytes)
    assert rows[3]["cache_state_bytes"] > rows[1]["cache_state_bytes"]
    assert main(["bench", "tiny_elr", "--loops", "0"]) == 2
    assert "--loops: loops=0: give a loop count >= 1" in capsys.readouterr().err


def test_cpu_mfu_divides_the_cost_models_training_flops_by_the_models_own_matmuls(monkeypatch, one_thread):
    """On CPU, train_mfu = tokens/s × training FLOPs per token (the cost model's, a truncated
    backward priced as such) ÷ the FLOP/s of the model's own training matmuls at batch ×
    context, timed in the process (runners.bench.mfu)."""
    from nas.cost import figures_at, train_flops_at
    from runners.bench import bench, mfu
    from runners.bench.timing import matmul_shapes, training_matmul_flops

    timed = []

    def spy(shapes, rows, *args, **kw):
        timed.append((sorted(shapes), rows, training_matmul_flops(shapes, rows, *args, **kw)))
        return timed[-1][2]

    monkeypatch.setattr(mfu, "training_matmul_flops", spy)
    arch = load_arch(arch_path("tiny_truncated"))
    [row] = bench(arch, [16], [2], repeats=1, decode_tokens=1, search=False).rows
    shapes = sorted(matmul_shapes(build_model(arch, backend="torch")))
    assert timed == [(shapes, 2 * 16, row.matmul_flops)] and row.matmul_flops > 1e8
    assert 0 < row.train_mfu <= 1
    flops = train_flops_at(arch, None, 16)
    assert flops < 3 * figures_at(arch, None, 16).forward_flops  # the truncated backward is cheaper
    assert row.train_mfu == pytest.approx(row.train_tokens_per_s * flops / row.matmul_flops, rel=1e-9)


def test_unknown_spec_is_an_error_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "runners", "bench", "no_such_spec.yaml"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("error:")


def test_cpu_peak_memory_sees_the_tensors_a_region_allocates():
    def region():
        a = torch.empty(1 << 20, dtype=torch.uint8)   # 1 MiB
        b = torch.empty(3 << 20, dtype=torch.uint8)   # 3 MiB, while a is live
        del a, b
        return torch.empty(2 << 20, dtype=torch.uint8)  # 2 MiB after both are freed
    _, peak = peak_memory(region, torch.device("cpu"), baseline=5)
    assert peak.bytes == (4 << 20) + 5


def test_serving_peak_grows_with_context_and_the_search_stops_at_the_limit(one_thread):
    model = build_model(load_arch(arch_path("tiny_noloop")), backend="torch")
    small, large = (serving_peak(model, 1, n).bytes for n in (64, 512))
    assert large > small > sum(p.numel() * 4 for p in model.parameters())
    found = max_context(model, 1, 64, 1 << 14, limit=(small + large) // 2)
    assert 64 <= found.fits < 512 and found.fails == 2 * found.fits


def test_training_step_changes_the_weights_and_is_timed(one_thread):
    model = build_model(load_arch(arch_path("tiny_noloop")), backend="torch")
    before = model.embed.weight.detach().clone()
    t = measure_train(model, 2, 16, repeats=1)
    assert t.tokens_per_s > 0 and t.peak.bytes > 0
    assert not torch.equal(before, model.embed.weight)


def test_sweep_measures_serving_objectives_per_trial(tmp_path, one_thread):
    from nas.cost import cost
    from nas.spec import ArchSpec
    from runners.export.pick import choose
    from runners.report.data import load
    from runners.results.front import front
    from runners.results.records import read_experiment, read_trials
    from runners.sweep.run import run_sweep

    space = tmp_path / "serving.yaml"
    space.write_text(textwrap.dedent("""\
        name: serving
        base: tiny_noloop
        params:
          boundary: {target: loop.boundary, choices: [none, block]}
          T: {target: loop.T, choices: [2], when: {boundary: [block]}}
        objectives:
          - {metric: acc, direction: maximize}
          - {metric: decode_latency_ms, direction: minimize}
          - {metric: unique_params, direction: minimize}
          - {metric: cache_bytes, direction: minimize, batch_size: 2}
        proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 2, batch_size: 4, eval_every: 2}
        search: {sampler: grid, trials: 2, concurrency: 1}
        seq_len: 32
        """))
    exp = run_sweep(space, out=tmp_path / "exp", engine="optuna", progress=False)
    objectives = read_experiment(exp).objectives
    assert [(o.name, o.quality, o.serving) for o in objectives] == [
        ("acc", True, False), ("decode_latency_ms", False, True), ("unique_params", False, False),
        ("cache_bytes/b2", False, True)]
    trials = {r.params["boundary"]: r for r in read_trials(exp)}
    assert {r.status for r in trials.values()} == {"complete"}, [r.reason for r in trials.values()]
    for r in trials.values():
        values = r.values
        assert math.isfinite(values["decode_latency_ms"]) and values["decode_latency_ms"] > 0
        assert 0 <= values["acc"] <= 1 and values["unique_params"] == r.cost["unique_params"]
        # measured at batch 2: the cost model's recurrent state of two sequences, exactly
        fp32 = cost(ArchSpec.model_validate(r.arch), seq_len=32, dtype="fp32")  # the CPU model's dtype
        assert values["cache_bytes/b2"] == 2 * fp32.figures.state_bytes
    # the looped candidate keeps one recurrent state per loop application
    assert trials["block"].values["cache_bytes/b2"] == 2 * trials["none"].values["cache_bytes/b2"]
    assert front(read_trials(exp), objectives)
    report = load(exp)
    assert report.quality.name == "acc" and len(report.rows) == 2
    assert choose(exp, pick="best-quality").how.count("best acc") == 1
    assert "lowest unique_params" in choose(exp, pick="cheapest").how


def test_experiments_written_before_serving_objectives_still_load():
    from runners.results.records import Objective

    old = Objective.model_validate_json('{"name": "acc", "direction": "maximize", "measured": true}')
    cost = Objective.model_validate_json('{"name": "kv_bytes@4096", "direction": "minimize", "measured": false}')
    assert old.quality and not old.serving and not cost.quality and cost.metric == "kv_bytes"


def test_serving_objectives_with_early_stopping_are_refused_before_any_trial(tmp_path):
    """Pareto halving stops a trial beaten at a rung by one that costs no more; serving costs
    are measured after training, so the space itself is refused (nas.space validation)."""
    from nas.errors import SpecError
    from nas.space import load_space

    space = tmp_path / "es.yaml"
    space.write_text(textwrap.dedent("""\
        name: es
        base: tiny_noloop
        params: {T: {target: loop.T, choices: [2]}}
        objectives: [{metric: acc, direction: maximize}, {metric: peak_memory_bytes, direction: minimize}]
        proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 4, batch_size: 4, eval_every: 2}
        search: {trials: 2, early_stopping: {rungs: [2]}}
        """))
    with pytest.raises(SpecError, match="search.early_stopping: cannot be combined with serving objectives "
                                        r"\(peak_memory_bytes\)"):
        load_space(space)


def test_a_model_whose_backend_cannot_decode_is_served_by_its_torch_twin(one_thread):
    from runners.bench.measure import for_serving

    fla = build_model(load_arch(arch_path("tiny_noloop")), backend="fla")  # built on CPU, never run
    served, backend = for_serving(fla, torch.float32)
    assert fla.backend == "fla" and backend == served.backend == "torch"
    theirs, ours = fla.state_dict(), served.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    logits, cache = served.prefill(torch.zeros(1, 3, dtype=torch.long))
    assert logits.shape == (1, 3, 256) and cache.pos == 3


def test_an_elastic_trial_measures_serving_at_each_loop_count(tmp_path, one_thread):
    from runners.results.records import read_trials
    from runners.sweep.run import run_sweep

    space = tmp_path / "elastic.yaml"
    space.write_text(textwrap.dedent("""\
        name: elastic_serving
        base: tiny_elr
        params: {switch: {target: elastic.switch_at, choices: [0.0]}}
        objectives: [{metric: acc, direction: maximize}, {metric: cache_bytes, direction: minimize}]
        proxy: {task: s5, task_params: {seq_len: 4, degree: 2}, steps: 2, batch_size: 4, eval_every: 2}
        search: {sampler: grid, trials: 1, concurrency: 1}
        seq_len: 16
        """))
    [record] = read_trials(run_sweep(space, out=tmp_path / "exp", engine="optuna", progress=False))
    assert record.status == "complete", record.reason
    assert [p.k for p in record.points] == [1, 2, 3, 4]
    from nas.cost import cost
    from nas.spec import ArchSpec
    fp32 = cost(ArchSpec.model_validate(record.arch), seq_len=16, dtype="fp32")  # the CPU model's dtype
    for p in record.points:  # the cost sheet's bytes at that k
        sheet = fp32.at(p.k)
        assert p.values["cache_bytes"] == sheet.kv_cache_bytes + sheet.state_bytes
    held = [p.values["cache_bytes"] for p in record.points]
    assert held == sorted(held) and len(set(held)) == 4  # one recurrent state per loop application
