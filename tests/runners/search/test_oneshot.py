"""One-shot search: supernet ↔ sub-network weights, sampling, frozen FFNs, the search, and
a one-shot sweep end to end (tiny, CPU)."""
import itertools
import json
import os
import random
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import torch

from builders.model import LoopLM, build_model
from builders.sampling import sample_pattern
from nas import oneshot as one
from nas.errors import SpecError
from nas.space import load_space
from runners.oneshot.search import extract
from runners.oneshot.supernet import load_supernet, supernet_config
from runners.weights import inherit, load_source
from runners.results.records import read_trials
from runners.tasks import make_task
from runners.train import CHECKPOINT, eval_batches, evaluate, train, with_vocab

BASE = """\
base:
  name: os_tiny
  model:
    vocab_size: 32
    width: 16
    defaults:
      attn: {num_heads: 2}
      gdn: {num_heads: 2, head_dim: 8, expand_v: 1}
      swiglu: {hidden_size: 32}
  num_layers: 4
  hybrid: {ratio: {attn: 1, gdn: 1}, placement: interleave}
  loop: {boundary: block, T: 2, update: {kind: residual_gate}, conditioning: index_budget}
objectives:
  - {metric: acc, direction: maximize}
  - {metric: projection_flops, direction: minimize}
proxy: {task: mqar, task_params: {vocab_size: 32, seq_len: 16, num_kv_pairs: 2}, steps: 4,
        batch_size: 8, eval_every: 2, eval_batches: 1, lr: 0.01}
"""


def space_file(tmp_path: Path, oneshot: str, base: str = BASE) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(f"name: os\n{base}oneshot:\n{textwrap.indent(textwrap.dedent(oneshot), '  ')}")
    return path


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every tensor random (ρ and the conditioning tables start at zero: they must count)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


@pytest.mark.parametrize("loops", [(1, 2, 3), None], ids=["loops1-3", "baseT"])
def test_extracted_subnet_is_the_supernet_with_its_switches_fixed(tmp_path, one_thread, loops):
    oneshot = f"loops: {list(loops)}\n" if loops else "sampling: ratio\n"
    space = load_space(space_file(tmp_path, oneshot))
    net = one.supernet(space)
    model = perturbed(build_model(net, backend="torch")).eval()
    x = torch.randint(0, 32, (2, 11), generator=torch.Generator().manual_seed(1))
    for pattern in one.exhaustive(one.counts(space)):
        for k in one.loop_choices(space):
            arch, sub = extract(model, net, pattern, k)
            assert all(l.mixer.kind == one.mixer_names(space)[p] for l, p in zip(arch.layers, pattern))
            assert arch.random_placement is None and arch.elastic is None
            assert arch.loops[0].T == (k or 2)
            with torch.no_grad():
                h, _ = model.hidden(x, loops=k, pattern=list(pattern))
                want = model.head(h)
                got = sub(x).logits
            assert torch.equal(got, want), (pattern, k)
    # the supernet's other options differ: a sub-network is not any pattern's twin
    first = list(one.exhaustive(one.counts(space))[0])
    assert first != list(pattern)
    assert not torch.equal(model.head(model.hidden(x, loops=k, pattern=first)[0]), want)


def test_ratio_constrained_sampling_never_leaves_the_ratio(tmp_path, one_thread, monkeypatch):
    space = load_space(space_file(tmp_path, "loops: [1, 2]\nsampling: ratio\n"))
    net = one.supernet(space)
    want = dict(zip(range(2), one.counts(space)))
    g = torch.Generator().manual_seed(0)
    drawn = {tuple(sample_pattern(net, net.L, g)) for _ in range(2000)}
    assert all(Counter(p) == want for p in drawn)
    assert drawn == set(one.exhaustive(one.counts(space)))  # and reaches every placement
    seen = []
    draw = LoopLM._pattern

    def spy(model):  # the trainer's own forward passes, as the supernet trains
        seen.append(tuple(draw(model)))
        return list(seen[-1])

    monkeypatch.setattr(LoopLM, "_pattern", spy)
    train(net, supernet_config(space).model_copy(update={"progress": False}))
    assert len(seen) >= 4 and all(Counter(p) == want for p in seen)
    seen.clear()
    uniform = load_space(space_file(tmp_path, "loops: [1, 2]\nsampling: uniform\n"))
    model = build_model(one.supernet(uniform), backend="torch")
    for _ in range(200):
        model._pattern()
    assert any(Counter(p) != want for p in seen)  # the check can fail


def test_uniform_sampling_draws_every_layer_independently(tmp_path, one_thread):
    space = load_space(space_file(tmp_path, "sampling: uniform\n"))
    net = one.supernet(space)
    assert net.random_placement.sampling == "uniform"
    model = build_model(net, backend="torch")
    torch.manual_seed(0)
    draws = [tuple(model._pattern()) for _ in range(3000)]
    assert {sum(p) for p in draws} == set(range(5))  # 0..4 GDN layers: no ratio constraint
    for layer in range(4):
        share = sum(p[layer] for p in draws) / len(draws)
        assert abs(share - 0.5) < 0.05


def test_frozen_ffns_are_bit_identical_after_training(tmp_path, one_thread):
    base_dir, space_path = tmp_path / "base", space_file(tmp_path, "loops: [1, 2]\n")
    base = load_space(space_path)
    from nas.load import resolve, spec_from_dict

    base_arch = resolve(spec_from_dict(dict(base.base), "base"))
    train(base_arch, supernet_config(base).model_copy(update={"progress": False, "checkpoint_every": 4}),
          out_dir=base_dir)
    source, state = load_source(base_dir / CHECKPOINT)
    space = load_space(space_file(tmp_path, f"loops: [1, 2]\ninit_from: {base_dir / CHECKPOINT}\n"
                                            "freeze_ffn: true\n"))
    config = supernet_config(space).model_copy(update={"progress": False, "checkpoint_every": 4})
    assert config.freeze_ffn and config.init_from == str(base_dir / CHECKPOINT)
    train(one.supernet(space), config, out_dir=tmp_path / "net")
    model, net = load_supernet(space, tmp_path / "net")
    after = model.state_dict()
    frozen = [n for n, t in after.items() if n.split(".")[2:3] in (["ffn"], ["ffn_norm"])]
    assert len(frozen) == 4 * 4  # per layer: ffn_norm, gate, up, down
    assert all(torch.equal(after[n], state[n]) for n in frozen)
    # the rest trained: the embedding, and layer 1's attention option (inherited from the
    # base's layer 1, interleave's attention layer)
    assert not torch.equal(after["embed.weight"], state["embed.weight"])
    inherited = [n for n in after if n.startswith("layers.1.mixer.options.0.") and "weight" in n]
    assert inherited and all(not torch.equal(after[n], state[n.replace("options.0.", "")]) for n in inherited)


def test_inherit_copies_base_mixers_into_the_matching_option(tmp_path, one_thread):
    space = load_space(space_file(tmp_path, "loops: [1, 2]\n"))
    from nas.load import resolve, spec_from_dict

    base_arch = with_vocab(resolve(spec_from_dict(dict(space.base), "base")), 32)
    base = perturbed(build_model(base_arch, backend="torch"), seed=3)
    net = one.supernet(space)
    model = build_model(net, backend="torch")
    left = inherit(model, net, base.state_dict(), base_arch)
    got = model.state_dict()
    pattern = one.pattern_of(base_arch, net)  # interleave: [gdn, attn, gdn, attn]
    for i, j in enumerate(pattern):
        mine = {n: t for n, t in got.items() if n.startswith(f"layers.{i}.mixer.options.{j}.")}
        assert mine and all(torch.equal(t, base.state_dict()[n.replace(f"options.{j}.", "")])
                            for n, t in mine.items())
    assert all(".options." in n for n in left)  # only the other options keep their init
    assert torch.equal(got["layers.0.ffn.down_proj.weight"], base.state_dict()["layers.0.ffn.down_proj.weight"])


def test_beam_search_finds_the_known_optimum_of_a_fabricated_score():
    counts, L = (2, 6), 8
    everything = one.exhaustive(counts)
    assert len(everything) == 28 == len(set(everything))
    for seed in range(6):
        rng = random.Random(seed)
        value = [[rng.gauss(0, 1) for _ in range(2)] for _ in range(L)]
        pair = {ij: rng.gauss(0, 0.2) for ij in itertools.combinations(range(L), 2)}

        def fabricated(p):  # per-layer preferences plus attention-pair interactions
            attn = [i for i, o in enumerate(p) if o == 0]
            return sum(value[i][o] for i, o in enumerate(p)) + sum(pair[ij] for ij in itertools.combinations(attn, 2))

        calls = Counter()

        def score(p):
            calls[p] += 1
            return fabricated(p)

        best, scores = one.beam_search(score, one.rule_placements(("attn", "gdn"), counts), one.swaps,
                                       width=3, depth=10)
        assert best == max(everything, key=fabricated), seed
        assert set(calls.values()) == {1} and set(scores) == set(calls)  # each state scored once
        assert all(Counter(p) == {0: 2, 1: 6} for p in scores)  # moves keep the counts


def test_beam_depth_bounds_the_search():
    score = lambda p: -sum(i * o for i, o in enumerate(p))  # optimum: (1, 1, 1, 0, 0, 0)
    start = [(0, 0, 0, 1, 1, 1)]
    best, shallow = one.beam_search(score, start, one.swaps, width=1, depth=1)
    assert len(shallow) == 1 + 9 and best != (1, 1, 1, 0, 0, 0)
    best, deep = one.beam_search(score, start, one.swaps, width=1, depth=5)
    assert best == (1, 1, 1, 0, 0, 0)


@pytest.mark.parametrize("oneshot, base_edit, field, message", [
    ("loops: [1, 2]\n", ("hybrid: {ratio: {attn: 1, gdn: 1}, placement: interleave}", "layer: {mixer: {kind: gdn}}"),
     "base.hybrid", "give the base hybrid"),
    ("loops: [1, 2]\n", ("  loop: {boundary: block, T: 2, update: {kind: residual_gate}, conditioning: index_budget}\n", ""),
     "oneshot.loops", "loop counts need a looped base"),
    ("loops: [2, 1]\n", None, "oneshot.loops", "increasing order"),
    ("loops: [1, 2]\nsearch: {score_loops: 3}\n", None, "oneshot.search.score_loops", "not one of oneshot.loops"),
    ("init_from: missing.pt\n", None, "oneshot.init_from", "no checkpoint at"),
    ("sampling: random\n", None, "oneshot.sampling", ""),
    ("search: {strategy: beam, width: 0}\n", None, "oneshot.search.width", ""),
    ("loops: [1, 2]\n", ("proxy: {", "search: {sampler: grid}\nproxy: {"), "search.sampler", "oneshot.search"),
])
def test_a_bad_oneshot_section_names_its_field(tmp_path, oneshot, base_edit, field, message):
    base = BASE if base_edit is None else BASE.replace(*base_edit)
    with pytest.raises(SpecError) as err:
        load_space(space_file(tmp_path, oneshot, base))
    assert any(p.path == field and message in p.message for p in err.value.problems), err.value


def test_a_oneshot_space_counts_its_placements_and_loops(tmp_path):
    from nas.space import grid_size

    space = load_space(space_file(tmp_path, "loops: [1, 2, 3]\n"))
    assert grid_size(space) == len(one.exhaustive(one.counts(space))) * 3 == 6 * 3
    shipped = load_space("oneshot_placement")
    assert grid_size(shipped) == 15 * 3 and one.counts(shipped) == (2, 4)


def test_the_supernet_length_replaces_the_proxy_length(tmp_path):
    """oneshot.train's steps or tokens replaces the proxy's (nas.proxy.with_budget), never joins it."""
    tokens = supernet_config(load_space(space_file(tmp_path, "loops: [1, 2]\ntrain: {tokens: 4096}\n")))
    kept = supernet_config(load_space(space_file(tmp_path, "loops: [1, 2]\ntrain: {lr: 0.02}\n")))
    assert (tokens.steps, tokens.tokens, tokens.lr) == (None, 4096, 0.01)
    assert (kept.steps, kept.tokens, kept.lr) == (4, None, 0.02)


def test_short_subnet_names_read_as_their_pattern(tmp_path):
    net = one.supernet(load_space(space_file(tmp_path, "loops: [1, 2]\n")))
    assert net.name == "os_supernet"
    assert one.subnet(net, [0, 1, 0, 1], 2).name == "os_attn-gdn-attn-gdn_T2"
    assert one.subnet(net, [1, 1, 0, 0], None).name == "os_gdn-gdn-attn-attn"


@pytest.mark.parametrize("layers", [64, pytest.param(4096, marks=pytest.mark.slow)])
def test_long_subnet_names_are_hashed_to_fit_a_file_name(tmp_path, layers):
    base = BASE.replace("num_layers: 4", f"num_layers: {layers}")
    net = one.supernet(load_space(space_file(tmp_path, "loops: [1, 2]\n", base)))
    rng = random.Random(0)
    patterns = [[0, 1] * (layers // 2)] + [rng.sample([0, 1] * (layers // 2), layers) for _ in range(20)]
    names = {}
    for pattern in patterns:
        for loops in (1, 2):
            name = one.subnet(net, pattern, loops).name
            assert name == one.subnet(net, pattern, loops).name  # deterministic
            readable = "os_" + "-".join(("attn", "gdn")[p] for p in pattern)
            head = re.fullmatch(rf"(os_[a-z-]+[a-z])-[0-9a-f]{{{one.HASH}}}_T{loops}", name)
            assert head and readable.startswith(head[1]) and len(head[1]) > 100, name
            assert len(name) <= one.SUBNET_NAME
            (tmp_path / name).mkdir()  # a directory name, and a file name with a suffix
            (tmp_path / f"{name}.checkpoint.yaml").write_text("")
            names[name] = (tuple(pattern), loops)
    assert len(names) == len(set(names.values()))  # unique


def test_a_long_space_name_still_names_its_supernet(tmp_path):
    path = space_file(tmp_path, "loops: [1, 2]\n")
    path.write_text(path.read_text().replace("name: os\n", f"name: {'s' * 255}\n", 1))
    net = one.supernet(load_space(path))
    assert len(net.name) == 255 and net.name.endswith("_supernet") and net.name.startswith("s" * 200)
    sub = one.subnet(net, [0, 1, 0, 1], 2)
    assert len(sub.name) == one.SUBNET_NAME and sub.name.startswith("s" * 100) and sub.name.endswith("_T2")


def test_options_with_one_label_get_their_index(tmp_path):
    base = BASE.replace("{ratio: {attn: 1, gdn: 1}, placement: interleave}",
                        "{ratio: {small: 1, big: 1}, placement: interleave, "
                        "mixers: {small: {kind: attn, num_heads: 2}, big: {kind: attn, num_heads: 4}}}")
    net = one.supernet(load_space(space_file(tmp_path, "loops: [1, 2]\n", base)))
    assert one.subnet(net, [0, 1, 1, 0], 1).name == "os_attn.0-attn.1-attn.1-attn.0_T1"


def test_train_init_from_a_bad_file_is_one_line(tmp_path):
    junk = tmp_path / "junk.pt"
    torch.save({"weights": 1}, junk)
    for path, message in [(tmp_path / "none.pt", "no such file"), (junk, "not a loopnas checkpoint")]:
        run = run_cli("train", "tiny_noloop", "--task", "mqar", "--steps", "1", "--init-from", path, timeout=120)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and message in lines[0], run.stderr


def test_a_oneshot_space_takes_no_params(tmp_path):
    path = space_file(tmp_path, "loops: [1, 2]\n", BASE + "params:\n  lr: {target: proxy.lr, choices: [0.01]}\n")
    with pytest.raises(SpecError) as err:
        load_space(path)
    assert [p.path for p in err.value.problems] == ["params"]


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "runners", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_oneshot_sweep_end_to_end(tmp_path, one_thread):
    """``loopnas sweep`` trains the supernet, beam-searches, writes an experiment directory
    that status, report and export read; the extracted front reproduces its scores."""
    path = space_file(tmp_path, "loops: [1, 2]\nsearch: {strategy: beam, width: 1, depth: 1}\ncheck: false\n")
    exp = tmp_path / "exp"
    run = run_cli("sweep", path, "--out", exp)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((exp / "oneshot.json").read_text())
    trials = read_trials(exp)
    assert trials and all(t.status == "complete" for t in trials)
    assert len(trials) == summary["search"]["evaluations"] == len({t.spec_hash for t in trials})
    assert {t.params["T"] for t in trials} == {1, 2} and all(t.cost and t.arch for t in trials)
    assert summary["supernet"]["steps"] == 4 and (exp / "supernet" / CHECKPOINT).is_file()
    assert (exp / "report" / "index.html").is_file()
    status = run_cli("status", exp, "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    data = json.loads(status.stdout)
    assert data["engine"] == "oneshot" and data["complete"] == len(trials) and data["front"]
    # the self-check was switched off, and the sweep's last lines say so (tests/runners/search/test_oneshot_check.py runs it)
    assert data["oneshot_check"]["skipped"] and not (exp / "check").exists()
    assert run.stdout.rindex("one-shot self-check: not checked (oneshot.check is false)") > run.stdout.rindex("Pareto front")
    # the extracted sub-networks give exactly the scores the search recorded
    space = load_space(path)
    config = supernet_config(space)
    task = make_task(config.task, **config.task_params)
    batches = eval_batches(task, config, torch.device("cpu"))
    assert summary["extracted"]
    for rid in summary["extracted"]:
        arch, state = load_source(exp / "trials" / rid / CHECKPOINT)
        sub = build_model(arch, backend="torch")
        sub.load_state_dict(state)
        record = next(t for t in trials if t.id == rid)
        k = record.params["T"]
        metrics = evaluate(sub.eval(), task, batches, pattern=[0] * arch.L)
        assert metrics["acc"] == record.values["acc"] and arch.loops[0].T == k
    exported = run_cli("export", exp, "--trial", summary["extracted"][0], "--with-weights", "--out", tmp_path / "x")
    assert exported.returncode == 0, exported.stderr[-2000:]
    # fine-tune the extracted sub-network from its inherited weights
    rid = summary["extracted"][0]
    tuned = run_cli("train", exp / "trials" / rid / "spec.yaml", "--task", "mqar", "--steps", "2",
                    "--set", "task.vocab_size=32", "--set", "task.seq_len=16", "--set", "task.num_kv_pairs=2",
                    "--set", "batch_size=8", "--set", "eval_batches=1",
                    "--init-from", exp / "trials" / rid / CHECKPOINT, "--json")
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    # resuming a finished one-shot sweep evaluates nothing again
    again = run_cli("sweep", path, "--out", exp, "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(read_trials(exp)) == len(trials)


def test_a_oneshot_sweep_cut_short_resumes_without_evaluating_twice(tmp_path, one_thread):
    from runners.sweep.run import run_sweep

    path = space_file(tmp_path, "loops: [1, 2]\nsearch: {strategy: exhaustive}\ncheck: false\n")
    exp = run_sweep(path, out=tmp_path / "exp", trials=5, progress=False)
    first = {t.id: t for t in read_trials(exp)}
    assert len(first) == 5 and json.loads((exp / "oneshot.json").read_text())["search"]["budget_spent"]
    run_sweep(path, out=exp, resume=True, progress=False)
    done = read_trials(exp)
    assert len(done) == 6 * 2 == len({t.spec_hash for t in done})  # every placement at every T, once
    assert all(t.status == "complete" for t in done)
    assert all(next(t for t in done if t.id == i).finished == r.finished for i, r in first.items())
    assert not json.loads((exp / "oneshot.json").read_text())["search"]["budget_spent"]


def test_bad_supernet_trainer_settings_are_one_error_before_anything_runs(tmp_path):
    from runners.sweep.driver import SweepError
    from runners.sweep.run import run_sweep

    path = space_file(tmp_path, "train: {stepz: 3}\n")
    with pytest.raises(SpecError, match=r"oneshot.train.stepz: unknown field 'stepz'"):  # validate names it
        run_sweep(path, out=tmp_path / "exp", progress=False)
    with pytest.raises(SweepError, match="--address joins a Ray cluster"):  # any engine, but a Ray address needs Ray
        run_sweep(space_file(tmp_path, "sampling: ratio\n"), out=tmp_path / "exp", address="auto", progress=False)
    assert not (tmp_path / "exp").exists()


def test_the_evaluation_task_may_differ_from_the_training_task(tmp_path):
    from runners.oneshot.supernet import eval_task
    from runners.sweep.driver import SweepError
    from runners.sweep.run import run_sweep

    space = load_space(space_file(tmp_path, "search: {task_params: {seq_len: 24, num_kv_pairs: 3}}\n"))
    task = eval_task(space, supernet_config(space))
    assert (task.name, task.seq_len, task.num_kv_pairs, task.vocab_size) == ("mqar", 24, 3, 32)
    bad = space_file(tmp_path, "search: {task: mqar, task_params: {vocab_size: 64}}\n")
    with pytest.raises(SweepError, match="oneshot.search.task: vocabulary 64, but the supernet trains on 32"):
        run_sweep(bad, out=tmp_path / "exp", progress=False)
    assert not (tmp_path / "exp").exists()
