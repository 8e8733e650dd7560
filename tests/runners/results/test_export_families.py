"""The hybrid families serving engines run, ``nemotron_h`` (Mamba2 / attention blocks) and
``falcon_h1`` (parallel Mamba2 + attention), exported and imported with the checks of
``tests/runners/results/test_export_native.py``: in a process where neither loopnas nor fla can be imported,
transformers' own class gives loopnas's logits within 1e-5 in fp32, the same parameter count
and the same greedy tokens; imported configs give specs with the model's parameter count.
``kimi_linear`` and ``inkling2_loop`` have no exact loopnas form: every spec and config is
refused in one line naming the first field."""
import json
import os
import subprocess
import sys

import pytest
import torch

from nas import load_arch, loads_arch, unique_params
from runners.cli import main
from runners.export import export_spec
from runners.export.native import FAMILIES, architecture, choose_format, fit

from test_export_native import LOADER, ROOT, checkpoint, layers, loopnas_logits

transformers = pytest.importorskip("transformers")

MODEL = "model: {vocab_size: 96, width: 32, tie_embeddings: %s, norm: {eps: 1.0e-5}}\n"
MAMBA = "{kind: mamba2, head_dim: 8, state_size: 16, expand: 2, n_groups: %d}"
NOPE = "{kind: attn, num_heads: 4, num_kv_heads: 2, head_dim: 16, rope_theta: null}"
ROPE = "{kind: attn, num_heads: 4, num_kv_heads: 2, rope_theta: 50000.0}"
NONE, SWIGLU = "{kind: none}", "{kind: swiglu, hidden_size: 48}"


def nemotron(pattern: str, groups: int = 1) -> str:
    rows = [(MAMBA % groups if c == "m" else NOPE, NONE, "pre") for c in pattern]
    return MODEL % "false" + layers(*rows)


def falcon(combine: str, mamba: str, tie: str = "true", n: int = 2) -> str:
    mixer = f"{{kind: parallel, combine: {combine}, branches: [{mamba}, {ROPE}]}}"
    return MODEL % tie + layers(*[(mixer, SWIGLU, "pre")] * n)


CASES = {  # name: (family, spec text)
    "nemotron_h-hybrid": ("nemotron_h", nemotron("mama")),
    "nemotron_h-groups": ("nemotron_h", nemotron("amm", groups=8)),  # one B/C group per head
    "nemotron_h-mamba": ("nemotron_h", nemotron("mm")),
    "falcon_h1-sum": ("falcon_h1", falcon("sum", MAMBA % 1)),
    "falcon_h1-mean": ("falcon_h1", falcon("mean", (MAMBA % 1).replace("}", ", rmsnorm: false, use_bias: true}"),
                                          tie="false", n=3)),
    "falcon_h1-norm-first": ("falcon_h1", falcon("sum", (MAMBA % 8).replace("}", ", norm_before_gate: true, "
                                                                                  "norm_eps: 1.0e-5}"))),
}
NO_GENERATE = {"nemotron_h-mamba"}  # transformers' hybrid cache needs an attention layer


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """Every case exported natively with weights, then measured by transformers alone."""
    work = tmp_path_factory.mktemp("families")
    ids = torch.randint(0, 96, (2, 21), generator=torch.Generator().manual_seed(0))
    torch.save(ids, work / "ids.pt")
    exports, expected, greedy = {}, {}, {}
    for i, (name, (family, text)) in enumerate(CASES.items()):
        spec = work / f"{name.replace('-', '_')}.yaml"
        spec.write_text(f"name: {spec.stem}\n" + text)
        arch = load_arch(spec)
        ckpt = checkpoint(arch, work / f"{spec.stem}.pt", seed=100 + i)
        exports[name] = export_spec(spec, work / name, checkpoint=ckpt, fmt="native")
        expected[name], greedy[name] = loopnas_logits(arch, ckpt, ids)
    (work / "job.json").write_text(json.dumps({"ids": str(work / "ids.pt"),
                                               "dirs": {n: str(e.out) for n, e in exports.items()}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "HF_"))}
    env.update(HF_HOME=str(work / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(LOADER), str(work / "job.json"), str(work / "out.pt")],
                          cwd=LOADER.parent, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exports, expected, torch.load(work / "out.pt", weights_only=False), greedy


@pytest.mark.parametrize("name", CASES)
def test_native_model_equals_loopnas(native, name):
    exports, expected, got, _ = native
    family, e = CASES[name][0], exports[name]
    assert e.family == family and "exactly transformers'" in e.why
    measured = got[name]
    assert measured["model_type"] == family
    assert measured["module"] == f"transformers.models.{family}.modeling_{family}"
    assert measured["params"] == unique_params(e.arch)
    assert expected[name].abs().max() > 0.5 and expected[name].std() > 0.1
    torch.testing.assert_close(measured["logits"], expected[name], rtol=1e-5, atol=1e-5)
    assert not any(p.suffix == ".py" for p in e.out.iterdir())


@pytest.mark.parametrize("name", CASES)
def test_native_generate_equals_loopnas_greedy(native, name):
    out = native[2][name]["generate"]
    if name in NO_GENERATE:  # why --format auto keeps remote code for it
        assert isinstance(out, str) and "Attention layers" in out, out
        assert choose_format(native[0][name].arch, "auto").family is None
        return
    assert isinstance(out, torch.Tensor), out
    assert torch.equal(out, native[3][name])


def test_loaded_without_loopnas_or_fla(native):
    assert native[2]["imported"] == []


def test_configs_say_the_layout(native):
    got = native[2]
    assert got["nemotron_h-hybrid"]["config"]["layers_block_type"] == ["linear_attention", "full_attention"] * 2
    assert got["nemotron_h-groups"]["config"]["n_groups"] == 8
    mean, total = got["falcon_h1-mean"]["config"], got["falcon_h1-sum"]["config"]
    assert mean["ssm_out_multiplier"] == mean["attention_out_multiplier"] == 0.5
    assert total["ssm_out_multiplier"] == total["attention_out_multiplier"] == 1.0
    assert mean["mamba_rms_norm"] is False and mean["mamba_proj_bias"] is True
    assert got["falcon_h1-norm-first"]["config"]["mamba_norm_before_gate"] is True


def test_auto_picks_the_family():
    for name, (family, text) in CASES.items():
        chosen = choose_format(loads_arch(text), "auto")
        assert chosen.family == (None if name in NO_GENERATE else family), (name, chosen.why)


@pytest.mark.parametrize("text,family,path", [
    (nemotron("ma").replace(NONE, SWIGLU, 1), "nemotron_h", "layers[0].ffn.kind"),
    (nemotron("ma").replace("tie_embeddings: false", "tie_embeddings: true"), "nemotron_h", "model.tie_embeddings"),
    (nemotron("ma").replace("rope_theta: null", "rope_theta: 10000.0"), "nemotron_h", "layers[1].mixer.rope_theta"),
    (nemotron("ma", groups=2), "nemotron_h", "layers[0].mixer.n_groups"),
    (nemotron("ma").replace("n_groups: 1}", "n_groups: 1, norm_before_gate: true}"), "nemotron_h",
     "layers[0].mixer.norm_before_gate"),
    (nemotron("ma").replace("n_groups: 1}", "n_groups: 1, norm_eps: 1.0e-6}"), "nemotron_h", "layers[0].mixer.norm_eps"),
    (falcon("concat", MAMBA % 1), "falcon_h1", "layers[0].mixer.combine"),
    (falcon("sum", MAMBA % 1).replace("combine: sum", "combine: sum, branch_scale: true"), "falcon_h1",
     "layers[0].mixer.branch_scale"),
    (falcon("sum", MAMBA % 1).replace("rope_theta: 50000.0", "rope_theta: 5.0e4, qk_norm: true"), "falcon_h1",
     "layers[0].mixer.branches[1].qk_norm"),
    (falcon("sum", NOPE), "falcon_h1", "layers[0].mixer.branches"),
    (falcon("sum", MAMBA % 1).replace(SWIGLU, NONE), "falcon_h1", "layers[0].ffn.kind"),
])
def test_blocker_names_the_first_field(text, family, path):
    found = fit(loads_arch(text))
    assert found.family is None and found.blockers[family].path == path, found.blockers[family]


@pytest.mark.parametrize("spec,family,path,words", [
    ("kda_hybrid", "kimi_linear", "layers[0].mixer.kind", "g_proj.1.bias"),
    ("attn_only", "kimi_linear", "layers[0].mixer.kind", "MLA"),
    ("tiny_elr", "inkling2_loop", "loops[0].update.kind", "message gates"),
    ("tiny_fullloop", "inkling2_loop", "loops[0].start", "prelude"),
    ("tiny_mixerloop", "inkling2_loop", "loops[1]", "one core span"),
    ("attn_only", "inkling2_loop", "layers[0]", "attention residuals"),
])
def test_refused_families_name_the_field(spec, family, path, words):
    text = {"kda_hybrid": MODEL % "true" + layers(("{kind: kda, num_heads: 2, head_dim: 8}", SWIGLU, "pre"),
                                                  (ROPE, SWIGLU, "pre")),
            "attn_only": MODEL % "true" + layers((ROPE, SWIGLU, "pre"))}.get(spec)
    arch = loads_arch(text) if text else load_arch(ROOT / "spaces" / "archs" / f"{spec}.yaml")
    b = FAMILIES[family].blocker(arch)
    assert b.path == path and words in b.reason, b


def test_native_refusal_of_a_loop_is_one_line(tmp_path, capsys):
    """A FullLoop has no native home: one line, naming loops[0] for the loop-free families and
    inkling2_loop's own first field."""
    rc = main(["export", "tiny_elr", "--format", "native", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "loops[0]: a loop region; qwen3_next" in err[0] and "inkling2_loop: loops[0].update.kind" in err[0]


# ---------------------------------------------------------------- import


def _configs():
    T = transformers
    return {
        "nemotron_h": T.NemotronHConfig(
            vocab_size=80, hidden_size=32, layers_block_type=["linear_attention", "full_attention", "linear_attention"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_num_heads=8, mamba_head_dim=8,
            ssm_state_size=16, n_groups=1, pad_token_id=None, bos_token_id=None, eos_token_id=None),
        "falcon_h1": T.FalconH1Config(
            vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=1,
            mamba_rms_norm=True, pad_token_id=None, bos_token_id=None, eos_token_id=None),
    }


@pytest.mark.parametrize("name", list(_configs()))
def test_import_round_trips(name, tmp_path, capsys):
    config = _configs()[name]
    config.save_pretrained(tmp_path / "hub")
    spec = tmp_path / f"{name}.yaml"
    assert main(["import", str(tmp_path / "hub"), "--out", str(spec), "--name", name]) == 0, capsys.readouterr().err
    arch = load_arch(spec)
    with torch.device("meta"):
        native_model = transformers.AutoModelForCausalLM.from_config(config)
    assert unique_params(arch) == native_model.num_parameters()
    e = export_spec(spec, tmp_path / "out", fmt="native")
    assert e.family == config.model_type
    exported = transformers.AutoConfig.from_pretrained(tmp_path / "out").to_dict()
    assert architecture(exported) == architecture(config.to_dict())


def _refused():
    T = transformers
    return {"kimi_linear": T.KimiLinearConfig(vocab_size=80, hidden_size=32, num_hidden_layers=2, pad_token_id=None,
                                              bos_token_id=None, eos_token_id=None),
            "inkling2_loop": T.Inkling2LoopConfig(
                text_config={"vocab_size": 80, "hidden_size": 32, "num_hidden_layers": 12, "eos_token_id": None},
                vision_config={"model_type": "inkling2_vision", "text_hidden_size": 32})}


@pytest.mark.parametrize("name,config,field", [
    ("nemotron_h-mlp", {"layers_block_type": ["linear_attention", "mlp"]}, "layers_block_type"),
    ("nemotron_h-groups", {"n_groups": 2}, "n_groups"),
    ("falcon_h1-mup", {"embedding_multiplier": 2.0}, "embedding_multiplier"),
    ("falcon_h1-out", {"ssm_out_multiplier": 0.5}, "ssm_out_multiplier"),
    ("kimi_linear", {}, "layer_types"),
    ("inkling2_loop", {}, "model_type"),
])
def test_import_refuses_in_one_line(name, config, field, tmp_path, capsys):
    family = name.split("-")[0]
    base = _configs()[family] if family in _configs() else _refused()[family]
    base.save_pretrained(tmp_path)  # transformers' own encoding (time_step_limit's inf included)
    (tmp_path / "config.json").write_text(json.dumps(json.loads((tmp_path / "config.json").read_text()) | config))
    assert main(["import", str(tmp_path), "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{field}:" in err[0], err
    assert not (tmp_path / "x.yaml").exists()
