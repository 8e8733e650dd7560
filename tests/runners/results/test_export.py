"""``loopnas export``: round trip through transformers in a process without loopnas, the
vendored code, Pareto picks on fabricated experiments, --scale-to, CLI errors."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from builders.model import build_model
from nas import load_arch, unique_params
from nas.cost import cost
from nas.spec import ArchSpec
from runners.cli import main
from runners.export import ExportError, choose, export_spec, export_trial
from runners.export.vendor import closure, repo_root
from runners.results.records import (
    ExperimentRecord, Objective, Point, TrialRecord, trial_path, write_json,
)
from runners.train import TrainConfig, train

from helpers import REPO, TESTS, arch

ROOT = REPO
LOADER = TESTS / "fixtures" / "export" / "load_without_loopnas.py"
ROUND_TRIP = ("tiny_mixerloop", "tiny_lt2_interleave", "tiny_elr")  # looped, hybrid, elastic
OBJECTIVES = [Objective(name="acc", direction="maximize", measured=True),
              Objective(name="projection_flops", direction="minimize", measured=False)]
SEED = 7


def write_experiment(exp: Path, trials: list[TrialRecord]) -> Path:
    (exp / "trials").mkdir(parents=True, exist_ok=True)
    write_json(exp / "experiment.json", ExperimentRecord(
        name="fabricated", space={}, objectives=OBJECTIVES, engine="optuna", trials=len(trials),
        created=0.0, seq_len=64))
    for t in trials:
        write_json(trial_path(exp, t.id), t)
    return exp


def record(number: int, name: str, points: list[tuple], status: str = "complete") -> TrialRecord:
    a = arch(name)
    return TrialRecord(
        id=f"t{number:04d}", number=number, status=status, arch=a.model_dump(mode="json"),
        summary=name, cost=cost(a, seq_len=64).to_dict(),
        points=[Point(k=k, values={"acc": acc, "projection_flops": flops}) for acc, flops, k in points])


# ---------------------------------------------------------------- round trip


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """An experiment whose three trials were trained for a few steps by the proxy trainer
    (MQAR at vocabulary 32: the trainer rewrites the specs' vocabulary 256)."""
    exp = tmp_path_factory.mktemp("exp")
    cfg = TrainConfig(task="mqar", task_params={"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
                      steps=3, batch_size=4, lr=1e-2, warmup_steps=0, eval_every=3, eval_batches=1,
                      checkpoint_every=3, progress=False, backend="torch")
    trials = []
    for i, name in enumerate(ROUND_TRIP):
        train(arch(name), cfg, out_dir=exp / "trials" / f"t{i:04d}")
        perturb_loop_parameters(exp / "trials" / f"t{i:04d}" / "checkpoint.pt", seed=i)
        trials.append(record(i, name, [(0.5 + 0.1 * i, 1e6 * (i + 1), None)]))
    return write_experiment(exp, trials)


def perturb_loop_parameters(path: Path, seed: int) -> None:
    """Three steps barely move the zero-initialised loop parameters (ρ, gates, conditioning;
    an elastic run may not even reach its mixed-depth phase), and zeros would round-trip
    even if they were lost: give them values the exported model must reproduce."""
    ckpt = torch.load(path, weights_only=True)
    gen = torch.Generator().manual_seed(seed)
    for name, value in ckpt["model"].items():
        if name == "rho" or name.startswith("loops."):
            value.add_(0.1 * torch.randn(value.shape, generator=gen))
    torch.save(ckpt, path)


@pytest.fixture(scope="module")
def round_trip(trained, tmp_path_factory):
    """Export every trial with weights (and the elastic one scaled up), load them all in one
    process that cannot import loopnas, and return what it measured."""
    work = tmp_path_factory.mktemp("hf")
    exports = {name: export_trial(trained, work / name, trial=f"t{i:04d}", with_weights=True,
                                  scale_to=(3e6 if name == "tiny_elr" else None))
               for i, name in enumerate(ROUND_TRIP)}
    ids = torch.randint(0, 32, (2, 13), generator=torch.Generator().manual_seed(0))
    torch.save(ids, work / "ids.pt")
    job = {"ids": str(work / "ids.pt"), "seed": SEED,
           "pretrained": {n: str(e.out) for n, e in exports.items()},
           "meta_init": {n: str(e.out) for n, e in exports.items()},
           "from_config": {"tiny_elr/scaled": str(work / "tiny_elr" / "scaled")}}
    (work / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_"))}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(LOADER), str(work / "job.json"), str(work / "out.pt")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exports, ids, torch.load(work / "out.pt", weights_only=True)


def loopnas_model(trained: Path, i: int):
    """The trial's weights in loopnas's own model (the arch of the trainer's result.json)."""
    result = json.loads((trained / "trials" / f"t{i:04d}" / "result.json").read_text())
    model = build_model(ArchSpec.model_validate(result["arch"]), backend="torch")
    ckpt = torch.load(trained / "trials" / f"t{i:04d}" / "checkpoint.pt", weights_only=True)
    model.load_state_dict(ckpt["model"])
    return model.eval()


def test_the_loader_never_imports_loopnas(round_trip):
    exports, _, out = round_trip
    assert out["loopnas_modules"] == []
    for name, r in out["pretrained"].items():
        assert r["module"].startswith("transformers_modules."), name


@pytest.mark.parametrize("i,name", list(enumerate(ROUND_TRIP)), ids=ROUND_TRIP)
def test_transformers_logits_equal_loopnas(round_trip, trained, i, name):
    _, ids, out = round_trip
    model = loopnas_model(trained, i)
    r = out["pretrained"][name]
    gates = [p for n, p in model.named_parameters() if n == "rho" or n.startswith("loops.")]
    assert gates and all(g.abs().max() > 0 for g in gates)
    with torch.no_grad():
        torch.testing.assert_close(r["logits"], model(ids).logits, rtol=1e-5, atol=1e-5)
        shifted = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)  # loopnas takes shifted labels
        torch.testing.assert_close(r["loss"], model(ids, labels=shifted).loss, rtol=1e-5, atol=1e-6)
        if name == "tiny_elr":
            torch.testing.assert_close(r["logits_k2"], model(ids, loops=2).logits, rtol=1e-5, atol=1e-5)
            assert not torch.allclose(r["logits_k2"], r["logits"])
    assert r["layers"] == len(model.layers)
    assert torch.equal(r["generate"], r["greedy"])
    assert r["resaved_equal"]


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_meta_construction_then_init_is_loopnas_init(round_trip, name):
    exports, _, out = round_trip
    torch.manual_seed(SEED)
    ref = build_model(exports[name].arch, backend="torch").state_dict()
    got = out["meta_init"][name]
    assert set(got) == {f"model.{k}" for k in ref}
    for k, v in ref.items():
        assert torch.equal(got[f"model.{k}"], v), k


def test_scaled_config_builds_the_target_size(round_trip):
    exports, _, out = round_trip
    scaled = exports["tiny_elr"].scaled
    assert scaled.miss <= 0.02
    assert out["from_config_params"]["tiny_elr/scaled"] == scaled.params


def test_export_directory_contents(round_trip):
    exports, _, _ = round_trip
    e = exports["tiny_elr"]
    files = {p.name for p in e.out.iterdir()}
    assert {"config.json", "configuration_loopnas.py", "modeling_loopnas.py", "model.safetensors",
            "spec.yaml", "cost.json", "README.md", "scaled"} <= files
    config = json.loads((e.out / "config.json").read_text())
    assert config["model_type"] == "loopnas" and "AutoModelForCausalLM" in config["auto_map"]
    assert ArchSpec.model_validate(config["arch"]) == e.arch
    assert load_arch(e.out / "spec.yaml") == e.arch
    assert json.loads((e.out / "cost.json").read_text())["unique_params"] == unique_params(e.arch)
    readme = (e.out / "README.md").read_text()
    assert "t0002" in readme and "trust_remote_code=True" in readme
    assert "LoopnasCache" in readme and "`last_loop`" in readme  # tiny_elr decodes under last_loop
    assert "model.safetensors" not in {p.name for p in (e.out / "scaled").iterdir()}


# ---------------------------------------------------------------- vendored code


def test_vendored_code_is_relative_and_complete(tmp_path):
    from transformers.dynamic_module_utils import get_relative_import_files

    out = export_spec(ROOT / "spaces" / "archs" / "tiny_gdn_dsa.yaml", tmp_path / "x").out
    code = {p.name for p in out.glob("*.py")}
    followed = {Path(f).name for f in get_relative_import_files(str(out / "modeling_loopnas.py"))}
    assert followed == code - {"modeling_loopnas.py"}  # transformers copies every file, no more
    assert {"builders_inference.py", "builders_cache.py"} <= code  # the decoding cache
    for name in code:
        tree = ast.parse((out / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] not in ("nas", "builders", "runners"), (name, node.module)
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] not in ("nas", "builders", "runners") for a in node.names)
    root = repo_root()
    for module, path in closure(root).items():  # line numbers kept: tracebacks match the source
        copy = out / f"{module.replace('.', '_')}.py"
        assert len(copy.read_text().splitlines()) == len(path.read_text().splitlines()), module


# ---------------------------------------------------------------- picks


@pytest.fixture
def fabricated(tmp_path):
    """acc (max) vs projection_flops (min). Front: t0000 (cheapest), t0004 at k=1 and k=2
    (elastic), t0002 (best acc); t0001 is dominated by t0004 at k=2, t0003 by everything.
    Knee: normalised over the front, t0004 at k=2 has the least sum (0.013 + 0.111)."""
    return write_experiment(tmp_path / "exp", [
        record(0, "tiny_noloop", [(0.10, 1.0, None)]),
        record(1, "tiny_mixerloop", [(0.80, 2.0, None)]),
        record(2, "tiny_fullloop", [(0.85, 10.0, None)]),
        record(3, "tiny_lt2_interleave", [(0.05, 5.0, None)]),
        record(4, "tiny_elr", [(0.70, 1.5, 1), (0.84, 2.0, 2)]),
        record(5, "tiny_noloop", [(0.05, 1.0, None)]),          # ties t0000 on flops, worse acc
        record(6, "tiny_noloop", [(0.99, 0.5, None)], status="failed"),
    ])


@pytest.mark.parametrize("pick,trial,k", [("knee", "t0004", 2), ("best-quality", "t0002", None),
                                          ("cheapest", "t0000", None)])
def test_pick(fabricated, pick, trial, k):
    c = choose(fabricated, pick=pick)
    assert (c.trial.id, c.k) == (trial, k)
    assert set(c.front) == {"t0000", "t0004 at k=1", "t0004 at k=2", "t0002"}


def test_knee_of_an_elastic_trial_exports_its_depth(fabricated, tmp_path):
    e = export_trial(fabricated, tmp_path / "knee", pick="knee")
    config = json.loads((e.out / "config.json").read_text())
    assert config["loops"] == 2 and config["arch"]["name"] == "tiny_elr"
    readme = (e.out / "README.md").read_text()
    assert "knee" in readme and "t0004 at k=2" in readme


def test_export_errors(fabricated, tmp_path):
    with pytest.raises(ExportError, match="no trial 't0099'"):
        choose(fabricated, trial="t0099")
    with pytest.raises(ExportError, match="exactly one"):
        choose(fabricated)
    with pytest.raises(ExportError, match="not an experiment directory"):
        choose(tmp_path, pick="knee")
    with pytest.raises(ExportError, match="no checkpoint"):
        export_trial(fabricated, tmp_path / "w", trial="t0001", with_weights=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty"):
        export_trial(fabricated, tmp_path / "busy", trial="t0001")


# ---------------------------------------------------------------- --scale-to


@pytest.mark.parametrize("name,target,vary", [
    ("tiny_lt2_interleave", 5e6, "scale"), ("tiny_coarse_to_fine", 2e7, "scale"),
    ("tiny_moe_replay", 1e7, "scale"), ("tiny_mixerloop", 1.5e6, "width"),
    ("tiny_lt2_interleave", 5e6, "ffn_hidden"),
])
def test_scale_to_keeps_the_structure(tmp_path, name, target, vary):
    e = export_spec(ROOT / "spaces" / "archs" / f"{name}.yaml", tmp_path / name, scale_to=target, vary=vary)
    small = e.arch
    big = ArchSpec.model_validate(json.loads((e.out / "scaled" / "config.json").read_text())["arch"])
    assert abs(unique_params(big) - target) / target <= 0.02
    assert big.loops == small.loops and big.elastic == small.elastic
    assert big.random_placement == small.random_placement
    assert [l.mixer.kind for l in big.layers] == [l.mixer.kind for l in small.layers]
    assert [l.ffn.kind for l in big.layers] == [l.ffn.kind for l in small.layers]
    if vary == "scale":  # everything grows together, each head keeps its size
        assert big.model.width > small.model.width
        for a, b in zip(small.layers, big.layers):
            assert b.mixer.num_heads > a.mixer.num_heads and b.mixer.head_dim == a.mixer.head_dim


def test_scale_to_a_trial_with_the_budget_matcher(fabricated, tmp_path):
    e = export_trial(fabricated, tmp_path / "s", trial="t0004", scale_to=2e6, vary="width")
    assert e.scaled.miss <= 0.02 and e.scaled.arch.loops == e.arch.loops


# ---------------------------------------------------------------- CLI


@pytest.mark.parametrize("argv,message", [
    (["{exp}", "--trial", "t0099"], "no trial 't0099'"),
    (["{tmp}", "--pick", "knee"], "not an experiment directory"),
    (["{exp}"], "exactly one of --trial"),
    (["{exp}", "--trial", "t0000", "--checkpoint", "x.pt"], "--checkpoint is for a spec"),
    (["tiny_noloop", "--with-weights"], "give --checkpoint"),
    (["tiny_noloop", "--checkpoint", "{tmp}/missing.pt"], "no checkpoint at"),
], ids=["bad-trial", "not-an-experiment", "no-choice", "checkpoint-for-trial", "spec-weights", "missing-ckpt"])
def test_cli_errors_are_one_line(fabricated, tmp_path, capsys, argv, message):
    args = [a.format(exp=fabricated, tmp=tmp_path) for a in argv]
    assert main(["export", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err


def test_cli_exports_a_pick(fabricated, tmp_path, capsys):
    assert main(["export", str(fabricated), "--pick", "cheapest", "--out", str(tmp_path / "o")]) == 0
    assert "exported tiny_noloop" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "config.json").read_text())["arch"]["name"] == "tiny_noloop"


# ---------------------------------------------------------------- generate with the cache


GENERATE = TESTS / "fixtures" / "export" / "generate_without_loopnas.py"
RANDOM_SPEC = """name: tiny_random_loop
model:
  vocab_size: 256
  width: 64
  defaults:
    attn: {num_heads: 4, output_gate: true}
    gdn: {num_heads: 2, head_dim: 32, expand_v: 1}
    swiglu: {hidden_size: 128}
num_layers: 4
hybrid: {ratio: {attn: 1, gdn: 3}, placement: random, eval_samples: 2}
loop: {boundary: block, T: 2, update: {kind: residual_gate}}
"""
PATTERN = [1, 1, 0, 1]  # option 0 is attention: attention in layer 2, GDN elsewhere
PROMPT, NEW = 7, 8


def varied_checkpoint(spec: Path, path: Path, seed: int) -> Path:
    """A checkpoint of ``spec`` whose greedy continuations vary: at loopnas's init the tied
    head mostly repeats the last token, and equal runs of one token would hide a wrong
    cache. Every matrix N(0, 1/fan_in), loop parameters N(0, 0.3)."""
    torch.manual_seed(seed)
    model = build_model(load_arch(spec), backend="torch")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "rho" or name.startswith("loops."):
                p.normal_(0.0, 0.3)
            elif p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    torch.save({"model": model.state_dict()}, path)
    return path


def exported_loopnas(e):
    """loopnas's own model holding an export's weights."""
    from safetensors.torch import load_file

    model = build_model(e.arch, backend="torch")
    model.load_state_dict({k.removeprefix("model."): v for k, v in load_file(e.out / "model.safetensors").items()})
    return model.eval()


def _calls(hybrid: Path, elr: Path, rnd: Path) -> list[dict]:
    greedy = {"max_new_tokens": NEW, "do_sample": False}
    sampled = {"max_new_tokens": NEW, "do_sample": True, "top_k": 20, "use_cache": True}
    half = {"max_new_tokens": NEW // 2, "do_sample": False}
    calls = [
        ("hybrid/cached", hybrid, None, None, {**greedy, "use_cache": True}, None),
        ("hybrid/default", hybrid, None, None, greedy, None),
        ("hybrid/uncached", hybrid, None, None, {**greedy, "use_cache": False}, None),
        ("hybrid/sampled", hybrid, None, 3, sampled, None),
        ("hybrid/sampled_again", hybrid, None, 3, sampled, None),
        ("hybrid/fla", hybrid, "fla", None, {**greedy, "use_cache": True}, None),
        ("hybrid/continued", hybrid, None, None, half, half),
        ("elr/cached", elr, None, None, greedy, None),
        ("elr/per_loop", elr, None, None, {**greedy, "kv_policy": "per_loop"}, None),
        ("elr/uncached", elr, None, None, {**greedy, "use_cache": False}, None),
        ("elr/k3", elr, None, None, {**greedy, "loops": 3}, None),
        ("random/cached", rnd, None, None, {**greedy, "pattern": PATTERN}, None),
        ("random/uncached", rnd, None, None, {**greedy, "pattern": PATTERN, "use_cache": False}, None),
        ("random/seeded", rnd, None, 5, greedy, None),
    ]
    return [{"label": l, "path": str(p), "backend": b, "seed": s, "kwargs": kw, "then": then}
            for l, p, b, s, kw, then in calls]


@pytest.fixture(scope="module")
def generated(tmp_path_factory, one_thread):
    """A looped GDN + attention hybrid, the elastic ELR hybrid exported at k = 2 (KV policy
    last_loop) and a looped random-placement hybrid, exported with varied weights, then
    generated from in one process that cannot import loopnas."""
    work = tmp_path_factory.mktemp("gen")
    (work / "tiny_random_loop.yaml").write_text(RANDOM_SPEC)
    specs = {"hybrid": (ROOT / "spaces" / "archs" / "tiny_lt2_interleave.yaml", None),
             "elr": (ROOT / "spaces" / "archs" / "tiny_elr.yaml", 2),
             "random": (work / "tiny_random_loop.yaml", None)}
    exports = {name: export_spec(spec, work / name, loops=loops,
                                 checkpoint=varied_checkpoint(spec, work / f"{name}.pt", seed=i))
               for i, (name, (spec, loops)) in enumerate(specs.items())}
    ids = torch.randint(0, 256, (2, PROMPT), generator=torch.Generator().manual_seed(0))
    torch.save(ids, work / "ids.pt")
    job = {"ids": str(work / "ids.pt"), "calls": _calls(*(e.out for e in exports.values()))}
    (work / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_"))}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(GENERATE), str(work / "job.json"), str(work / "out.pt")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    models = {name: exported_loopnas(e) for name, e in exports.items()}
    return models, ids, torch.load(work / "out.pt", weights_only=True)


def test_generate_prefills_once_then_decodes_one_token_per_step(generated):
    _, _, out = generated
    assert out["loopnas_modules"] == []
    for label in ("hybrid/cached", "hybrid/default", "elr/cached", "random/cached"):
        r = out[label]
        assert r["lengths"] == [PROMPT] + [1] * (NEW - 1), label
        assert r["cache"] == "LoopnasCache" and r["cache_length"] == PROMPT + NEW - 1, label
    assert out["hybrid/uncached"]["lengths"] == list(range(PROMPT, PROMPT + NEW))
    assert out["hybrid/uncached"]["cache"] is None


def test_cached_greedy_equals_uncached_and_loopnas(generated):
    models, ids, out = generated
    hybrid = models["hybrid"].generate(ids, NEW)
    new = hybrid[:, PROMPT:]
    assert all(len(set(row.tolist())) >= 3 for row in new)  # a continuation that can go wrong
    for label in ("hybrid/cached", "hybrid/default", "hybrid/uncached"):
        assert torch.equal(out[label]["tokens"], hybrid), label
    rnd = models["random"].generate(ids, NEW, pattern=PATTERN)
    assert torch.equal(out["random/cached"]["tokens"], rnd)
    assert torch.equal(out["random/uncached"]["tokens"], rnd)


def test_elastic_export_generates_at_its_depth(generated):
    """Exported at k = 2 with kv_policy last_loop: the cached default is loopnas's decoding
    under that policy; per_loop is exact, so it equals the uncached forward; ``loops=3``
    decodes at another depth."""
    models, ids, out = generated
    elr = models["elr"]
    assert torch.equal(out["elr/cached"]["tokens"], elr.generate(ids, NEW, loops=2))
    assert torch.equal(out["elr/per_loop"]["tokens"], out["elr/uncached"]["tokens"])
    assert torch.equal(out["elr/k3"]["tokens"], elr.generate(ids, NEW, loops=3))
    logits_k2, _ = elr.prefill(ids, loops=2)
    logits_k3, _ = elr.prefill(ids, loops=3)
    assert not torch.allclose(logits_k2, logits_k3)  # the depth reaches the logits


def test_sampling_with_a_seed_is_reproducible_and_matches_loopnas(generated):
    models, ids, out = generated
    sampled = out["hybrid/sampled"]["tokens"]
    assert torch.equal(sampled, out["hybrid/sampled_again"]["tokens"])
    assert not torch.equal(sampled, out["hybrid/cached"]["tokens"])
    torch.manual_seed(3)
    assert torch.equal(sampled, models["hybrid"].generate(ids, NEW, temperature=1.0, top_k=20))


def test_random_placement_samples_its_pattern_once_like_loopnas(generated):
    models, ids, out = generated
    torch.manual_seed(5)
    assert torch.equal(out["random/seeded"]["tokens"], models["random"].generate(ids, NEW))


def test_fla_backend_decodes_through_the_torch_layers(generated):
    """A model built with fla's layers (what ``backend: auto`` gives on CUDA) decodes
    through a torch twin sharing its parameters: no fla kernel runs, so this holds on a CPU."""
    _, _, out = generated
    assert out["hybrid/fla"]["mixer"].startswith("Fla") and out["hybrid/cached"]["mixer"] == "GatedDeltaNetTorch"
    assert torch.equal(out["hybrid/fla"]["tokens"], out["hybrid/cached"]["tokens"])


def test_generate_continues_from_a_returned_cache(generated):
    _, _, out = generated
    r = out["hybrid/continued"]
    assert torch.equal(r["continued"], out["hybrid/cached"]["tokens"])
    assert r["continued_lengths"] == [1] * (NEW // 2)  # only the token the cache has not seen


# ---------------------------------------------------------------- whose weights


@pytest.fixture(scope="module")
def gdn_run(tmp_path_factory, one_thread):
    """A trainer run (checkpoint.pt and result.json) of tiny_noloop, a GDN model."""
    run = tmp_path_factory.mktemp("gdn") / "run"
    cfg = TrainConfig(task="mqar", task_params={"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
                      steps=1, batch_size=2, warmup_steps=0, eval_every=1, eval_batches=1,
                      checkpoint_every=1, progress=False, backend="torch")
    train(arch("tiny_noloop"), cfg, out_dir=run)
    return run


def test_a_checkpoint_of_another_spec_is_refused(gdn_run, tmp_path, capsys):
    """issue #34: exporting an attention spec with a GDN run's checkpoint exported the GDN
    model of the result.json beside it, exit 0."""
    argv = ["export", "tiny_ouro", "--checkpoint", str(gdn_run / "checkpoint.pt"), "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "not of tiny_ouro" in err[0], err
    assert "is of tiny_noloop (fingerprint " in err[0]
    assert not (tmp_path / "x").exists()
    e = export_spec(ROOT / "spaces" / "archs" / "tiny_noloop.yaml", tmp_path / "ok", checkpoint=gdn_run / "checkpoint.pt")
    assert e.arch.model.vocab_size == 32 and e.weights.checkpoint == gdn_run / "checkpoint.pt"


@pytest.mark.parametrize("garbage", [b"{not json", b'{"arch": 3}', b"\xff\xfe", b"{" + b" " * (9 << 20)],
                         ids=["torn", "not-a-result", "binary", "oversized"])
def test_a_garbage_result_beside_the_checkpoint_is_one_line(gdn_run, tmp_path, capsys, garbage):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes((gdn_run / "checkpoint.pt").read_bytes())
    (run / "result.json").write_bytes(garbage)
    argv = ["export", "tiny_noloop", "--checkpoint", str(run / "checkpoint.pt"), "--out", str(tmp_path / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "result.json: unreadable trainer result" in err[0], err
    assert not (tmp_path / "x").exists()
