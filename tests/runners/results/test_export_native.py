"""``loopnas export --format native|auto`` and ``loopnas import``, with transformers' own
classes as the oracle: the loopnas model and the native model loaded from the export
(``trust_remote_code=False``, in a process without loopnas or fla) give equal logits and
parameter counts, on GDN-only, attention-only, interleaved and bookend hybrids of
``qwen3_next`` and ``olmo_hybrid`` (and dense ``qwen3``/``llama``); a spec that cannot map
gets one line naming the first field; imported configs (made by transformers' config
classes, no network) give specs whose parameters and native export match them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from builders.model import build_model
from nas import load_arch, loads_arch, unique_params
from runners.cli import main
from runners.export import ExportError, export_spec
from runners.export.native import FAMILIES, architecture, choose_format, fit
from helpers import REPO, TESTS

transformers = pytest.importorskip("transformers")

LOADER = TESTS / "fixtures" / "export" / "load_native.py"
ROOT = REPO

QWEN_MODEL = "model: {vocab_size: 96, width: 32, tie_embeddings: %s, norm: {eps: 1.0e-6, zero_centered: true}}\n"
QWEN_GDN = "{kind: gdn, num_heads: 2, num_v_heads: 4, head_dim: 8, expand_v: 2, norm_eps: 1.0e-6}"
QWEN_ATTN = ("{kind: attn, num_heads: 4, num_kv_heads: 2, head_dim: 16, output_gate: true, rope_dim: 4, "
             "rope_theta: 50000.0, qk_norm: {eps: 1.0e-6, zero_centered: true}}")
QWEN_MOE = "{kind: moe, num_experts: 4, top_k: 2, expert_hidden: 16, shared_expert_hidden: 24, shared_expert_gate: true}"
OLMO_MODEL = "model: {vocab_size: 96, width: 32, tie_embeddings: %s, norm: {eps: 1.0e-6}}\n"
OLMO_GDN = "{kind: gdn, num_heads: 2, head_dim: 8, expand_v: 2, allow_neg_eigval: true}"
OLMO_ATTN = "{kind: attn, num_heads: 4, num_kv_heads: 2, qk_norm: {eps: 1.0e-6}, qk_norm_over: heads}"
DENSE_MODEL = "model: {vocab_size: 96, width: 32, tie_embeddings: %s}\n"
SWIGLU = "{kind: swiglu, hidden_size: 48}"


def layers(*rows: tuple[str, str, str]) -> str:
    return "layers:\n" + "".join(f"  - {{mixer: {m}, ffn: {f}, norm_placement: {p}}}\n" for m, f, p in rows)


def qwen(mixers: str, ffns: str | None = None) -> list[tuple[str, str, str]]:
    ffns = ffns or "d" * len(mixers)
    return [(QWEN_GDN if m == "g" else QWEN_ATTN, QWEN_MOE if f == "m" else SWIGLU, "pre") for m, f in zip(mixers, ffns)]


def olmo(mixers: str) -> list[tuple[str, str, str]]:
    return [(OLMO_GDN, SWIGLU, "pre") if m == "g" else (OLMO_ATTN, SWIGLU, "post") for m in mixers]


CASES = {  # name: (family, spec text)
    "qwen3_next-gdn": ("qwen3_next", QWEN_MODEL % "true" + layers(*qwen("gg"))),
    "qwen3_next-attn": ("qwen3_next", QWEN_MODEL % "false" + layers(*qwen("aa"))),
    "qwen3_next-interleave-moe": ("qwen3_next", QWEN_MODEL % "false" + layers(*qwen("ggga", "dmmm"))),
    "qwen3_next-bookend": ("qwen3_next", QWEN_MODEL % "true"  # and full rotary (partial_rotary_factor 1)
                           + "num_layers: 4\nlayer: {mixer: {kind: gdn}, ffn: {kind: swiglu, hidden_size: 48}}\n"
                           + f"hybrid: {{ratio: {{a: 1, g: 1}}, placement: bookend, "
                           + f"mixers: {{a: {QWEN_ATTN.replace('rope_dim: 4, ', '')}, g: {QWEN_GDN}}}}}\n"),
    "olmo_hybrid-interleave": ("olmo_hybrid", OLMO_MODEL % "false" + layers(*olmo("ggga"))),
    "olmo_hybrid-bookend": ("olmo_hybrid", OLMO_MODEL % "true" + layers(*olmo("agga"))),
    "olmo_hybrid-nope": ("olmo_hybrid", OLMO_MODEL % "false"  # no rotary (rope_theta None), beta in (0, 1)
                         + layers(*olmo("gag")).replace("qk_norm_over: heads}", "qk_norm_over: heads, rope_theta: null}")
                         .replace("allow_neg_eigval: true", "allow_neg_eigval: false")),
    "qwen3": ("qwen3", DENSE_MODEL % "false" + layers(*[("{kind: attn, num_heads: 4, num_kv_heads: 2, head_dim: 8, "
                                                         "qk_norm: {eps: 1.0e-6}}", SWIGLU, "pre")] * 2)),
    "llama": ("llama", DENSE_MODEL % "true" + layers(*[("{kind: attn, num_heads: 4, num_kv_heads: 1}", SWIGLU, "pre")] * 2)),
}


def checkpoint(arch, path: Path, seed: int) -> Path:
    """Weights far from init: matrices N(0, 1/(4·fan_in)), vectors (norms, zero-centred ones
    included, A_log, dt_bias) moved by N(0, 0.1²), so no conversion hides behind a constant.
    (At N(0, 1/fan_in) logits reach ~4 and fp32 rounding alone, loopnas's fp32 against its
    own float64, is ~3e-5: above the 1e-5 this comparison asks for.)"""
    torch.manual_seed(seed)
    model = build_model(arch, backend="torch")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 * p.shape[-1] ** -0.5)
            else:
                p.add_(0.1 * torch.randn_like(p))
    torch.save({"model": model.state_dict()}, path)
    return path


def loopnas_logits(arch, ckpt: Path, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The loopnas model's logits on ``ids``, and its greedy continuation of ``ids[:1, :4]``
    by 3 tokens (full forwards, no cache: what transformers' cached generate must match)."""
    model = build_model(arch, backend="torch").eval()
    model.load_state_dict(torch.load(ckpt, weights_only=True)["model"])
    with torch.no_grad():
        seq = ids[:1, :4]
        for _ in range(3):
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return model(ids).logits, seq


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """Every case exported natively with weights, then measured by transformers alone."""
    work = tmp_path_factory.mktemp("native")
    ids = torch.randint(0, 96, (2, 21), generator=torch.Generator().manual_seed(0))
    torch.save(ids, work / "ids.pt")
    exports, expected, greedy = {}, {}, {}
    for i, (name, (family, text)) in enumerate(CASES.items()):
        spec = work / f"{name.replace('-', '_')}.yaml"
        spec.write_text(f"name: {spec.stem}\n" + text)
        arch = load_arch(spec)
        ckpt = checkpoint(arch, work / f"{spec.stem}.pt", seed=i)
        exports[name] = export_spec(spec, work / name, checkpoint=ckpt, fmt="native")
        expected[name], greedy[name] = loopnas_logits(arch, ckpt, ids)
    job = {"ids": str(work / "ids.pt"), "dirs": {n: str(e.out) for n, e in exports.items()}}
    (work / "job.json").write_text(json.dumps(job))
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
    assert measured["module"] == f"transformers.models.{family}.modeling_{family}"  # transformers' own class
    assert measured["params"] == unique_params(e.arch)
    assert expected[name].abs().max() > 0.5 and expected[name].std() > 0.1  # logits that say something
    torch.testing.assert_close(measured["logits"], expected[name], rtol=1e-5, atol=1e-5)
    assert not any(p.suffix == ".py" for p in e.out.iterdir())  # no code to trust


@pytest.mark.parametrize("name", CASES)
def test_native_generate_equals_loopnas_greedy(native, name):
    """transformers' generate (its cache: KV for attention, conv and recurrent state for the
    GDN) continues greedily as loopnas's full forwards do; a GDN-only qwen3_next cannot
    generate in this transformers (its hybrid cache needs an attention layer), and says so."""
    _, _, got, greedy = native
    out = got[name]["generate"]
    if name == "qwen3_next-gdn" and isinstance(out, str):  # why --format auto keeps remote code for it
        assert "Attention layers" in out, out
        return
    assert isinstance(out, torch.Tensor), out
    assert torch.equal(out, greedy[name])


def test_readme_names_the_caveat(native):
    """The GDN-only qwen3_next export's README says it cannot generate; the others do not."""
    exports = native[0]
    for name, e in exports.items():
        text = (e.out / "README.md").read_text()
        assert ("cannot generate()" in text) == (name == "qwen3_next-gdn"), name
        assert "trust_remote_code" not in text or "No remote code" in text


def test_loaded_without_loopnas_or_fla(native):
    assert native[2]["imported"] == []


def test_layer_layouts_are_the_specs(native):
    """bookend puts attention first and last; the configs say so."""
    exports, _, got, _ = native
    types = {n: got[n]["config"].get("layer_types") for n in ("qwen3_next-bookend", "olmo_hybrid-bookend",
                                                             "qwen3_next-gdn", "qwen3_next-attn")}
    full, lin = "full_attention", "linear_attention"
    assert types["qwen3_next-bookend"] == types["olmo_hybrid-bookend"] == [full, lin, lin, full]
    assert types["qwen3_next-gdn"] == [lin, lin] and types["qwen3_next-attn"] == [full, full]
    assert got["qwen3_next-attn"]["config"]["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert got["qwen3_next-bookend"]["config"]["rope_parameters"]["partial_rotary_factor"] == 1.0
    assert got["olmo_hybrid-nope"]["config"]["linear_allow_neg_eigval"] is False
    assert got["olmo_hybrid-bookend"]["config"]["linear_allow_neg_eigval"] is True


def test_auto_says_which_and_why():
    for name, (family, text) in CASES.items():
        chosen = choose_format(loads_arch(text), "auto")
        if name == "qwen3_next-gdn":  # exact, but transformers' cache cannot generate without attention
            assert chosen.family is None and "exactly qwen3_next" in chosen.why and "generate" in chosen.why
            native = choose_format(loads_arch(text), "native")
            assert native.family == family and "generate" in native.why
        else:
            assert chosen.family == family, name
            assert "generate" not in chosen.why
    looped = load_arch(ROOT / "spaces" / "archs" / "tiny_lt2_interleave.yaml")
    chosen = choose_format(looped, "auto")
    assert chosen.family is None and "remote code" in chosen.why and "loops[0]" in chosen.why
    assert choose_format(loads_arch(CASES["llama"][1]), "remote").family is None


@pytest.mark.parametrize("edit,family,path", [
    (("allow_neg_eigval: true}", "allow_neg_eigval: false}"), "olmo_hybrid", None),
    (("norm_eps: 1.0e-6}", "norm_eps: 1.0e-6, allow_neg_eigval: true}"), "qwen3_next", "layers[0].mixer.allow_neg_eigval"),
    (("zero_centered: true}}", "zero_centered: false}}"), "qwen3_next", "model.norm.zero_centered"),
    (("output_gate: true, ", ""), "qwen3_next", "layers[3].mixer.output_gate"),
    (("rope_dim: 4, rope_theta: 50000.0", "rope_theta: null"), "qwen3_next", "layers[3].mixer.rope_theta"),
    (("qk_norm: {eps: 1.0e-6, zero_centered: true}", "qk_norm: true"), "qwen3_next", "layers[3].mixer.qk_norm"),
    (("shared_expert_gate: true", "shared_expert_gate: false"), "qwen3_next", "layers[1].ffn.shared_expert_gate"),
])
def test_blocker_names_the_first_field(edit, family, path):
    text = CASES["qwen3_next-interleave-moe"][1] if family == "qwen3_next" else CASES["olmo_hybrid-interleave"][1]
    old, new = edit
    assert old in text
    found = fit(loads_arch(text.replace(old, new)))
    if path is None:
        assert found.family == family  # allow_neg_eigval either way: olmo_hybrid has the flag
    else:
        assert found.family is None and found.blockers[family].path == path, found.blockers


def test_olmo_blockers():
    base = CASES["olmo_hybrid-interleave"][1]
    pre = base.replace("norm_placement: post", "norm_placement: pre")
    assert fit(loads_arch(pre)).blockers["olmo_hybrid"].path == "layers[3].norm_placement"
    per_head = base.replace("qk_norm_over: heads", "qk_norm_over: head")
    assert fit(loads_arch(per_head)).blockers["olmo_hybrid"].path == "layers[3].mixer.qk_norm_over"
    gdn_only = OLMO_MODEL % "false" + layers(*olmo("gg"))
    assert fit(loads_arch(gdn_only)).blockers["olmo_hybrid"].path == "layers"
    uneven = base.replace(OLMO_GDN, OLMO_GDN.replace("head_dim: 8", "head_dim: 16"), 1)
    assert fit(loads_arch(uneven)).blockers["olmo_hybrid"].path == "layers[1].mixer.head_dim"


@pytest.mark.parametrize("name,field", [
    ("tiny_mixerloop", "loops[0]"), ("tiny_hymba", "layers[0].mixer.kind: parallel"),
    ("tiny_noloop", "qwen3_next: model.norm.zero_centered"),
])
def test_format_native_refuses_in_one_line(name, field, tmp_path, capsys):
    rc = main(["export", name, "--format", "native", "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and field in err[0], err
    assert not (tmp_path / "x" / "config.json").exists()


def test_cli_auto_prints_the_format(tmp_path, capsys):
    spec = tmp_path / "q.yaml"
    spec.write_text("name: q\n" + CASES["qwen3_next-interleave-moe"][1])
    assert main(["export", str(spec), "--format", "auto", "--out", str(tmp_path / "q")]) == 0
    out = capsys.readouterr().out
    assert "format: native qwen3_next" in out
    assert json.loads((tmp_path / "q" / "config.json").read_text())["model_type"] == "qwen3_next"
    # a re-export into it replaces it (the manifest lists the files); remote code now
    assert main(["export", str(spec), "--format", "remote", "--out", str(tmp_path / "q")]) == 0
    assert json.loads((tmp_path / "q" / "config.json").read_text())["model_type"] == "loopnas"


# ---------------------------------------------------------------- import


def _configs():
    T = transformers
    return {
        "qwen3_next": T.Qwen3NextConfig(
            vocab_size=80, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=16, intermediate_size=48, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=24, decoder_sparse_step=2),
        "qwen3_next-gdn": T.Qwen3NextConfig(
            vocab_size=80, hidden_size=32, num_hidden_layers=2, layer_types=["linear_attention"] * 2,
            linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
            num_experts=0, intermediate_size=40, tie_word_embeddings=True),
        "olmo_hybrid": T.OlmoHybridConfig(
            vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=16,
            pad_token_id=None, eos_token_id=None),
        "qwen3": T.Qwen3Config(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8),
        "llama": T.LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=4, rope_theta=5e5),
    }


@pytest.mark.parametrize("name", list(_configs()))
def test_import_round_trips(name, tmp_path, capsys):
    config = _configs()[name]
    config.save_pretrained(tmp_path / "hub")
    spec = tmp_path / f"{name}.yaml"
    assert main(["import", str(tmp_path / "hub"), "--out", str(spec), "--name", name.replace("-", "_")]) == 0
    assert f"wrote {spec}" in capsys.readouterr().out
    arch = load_arch(spec)  # validates
    with torch.device("meta"):
        native_model = transformers.AutoModelForCausalLM.from_config(config)
    assert unique_params(arch) == native_model.num_parameters()
    e = export_spec(spec, tmp_path / "out", fmt="native")
    assert e.family == config.model_type
    exported = transformers.AutoConfig.from_pretrained(tmp_path / "out").to_dict()
    assert architecture(exported) == architecture(config.to_dict())


def test_import_refuses_what_loopnas_lacks(tmp_path, capsys):
    config = transformers.LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=4, attention_bias=True)
    config.save_pretrained(tmp_path)
    assert main(["import", str(tmp_path / "config.json"), "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attention_bias" in err[0]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    assert main(["import", str(tmp_path), "--out", str(tmp_path / "x.yaml")]) == 2
    assert "model_type" in capsys.readouterr().err


def test_every_family_is_tested():
    """Here and in tests/runners/results/test_export_families.py (nemotron_h, falcon_h1 exact; kimi_linear and
    inkling2_loop refused)."""
    import test_export_families as more

    exported = {f for f, _ in CASES.values()} | {f for f, _ in more.CASES.values()}
    imported = {c.model_type for c in _configs().values()} | {c.model_type for c in more._configs().values()}
    assert exported == imported == set(FAMILIES) - {"kimi_linear", "inkling2_loop"}
    assert all(FAMILIES[f].blocker(loads_arch(text)) is not None for f in ("kimi_linear", "inkling2_loop")
               for _, text in (*CASES.values(), *more.CASES.values()))


def test_native_refusal_is_an_export_error():
    with pytest.raises(ExportError, match="loops"):
        choose_format(load_arch(ROOT / "spaces" / "archs" / "tiny_mixerloop.yaml"), "native")


def test_nope_stays_nope(native):
    """olmo_hybrid without rotary embeddings: transformers builds no rotary_emb from rope_theta None."""
    assert native[2]["olmo_hybrid-nope"]["config"]["rope_parameters"]["rope_theta"] is None


# ---------------------------------------------------------------- import: bad input, no code, only --out

LLAMA = {"model_type": "llama", "vocab_size": 80, "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 2, "num_attention_heads": 4}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("content,argv,expect", [
    ("[1, 2]", [], "a JSON list, not a config object"),
    (b"\xff\xfe{", [], "not a readable JSON config"),
    ("{model_type: llama", [], "not a readable JSON config"),
    ({"model_type": "mamba"}, [], "model_type: 'mamba'; loopnas imports"),
    ({"hidden_size": 32}, [], "model_type: None"),
    (LLAMA | {"num_attention_heads": 0}, [], "num_attention_heads: 0; a whole number at least 1"),
    (LLAMA | {"hidden_size": "32"}, [], "hidden_size: '32'; a whole number"),
    (LLAMA | {"vocab_size": 1e400}, [], "vocab_size: inf"),
    (LLAMA | {"num_hidden_layers": 10 ** 8}, [], "num_hidden_layers: 100000000; loopnas takes at most"),
    (LLAMA | {"hidden_size": 30}, [], "transformers refuses this llama config: The hidden size (30) is not a multiple"),
    (LLAMA | {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": "x"}}, [], "gives no valid loopnas spec"),
    (LLAMA | {"attention_bias": True}, [], "attention_bias: true"),
    ({**LLAMA, "model_type": "qwen3_next", "layer_types": "linear"}, [], "layer_types: a list of layer names"),
    (LLAMA, ["--name", "../evil"], "--name: '../evil' cannot name a file"),
    (LLAMA, ["--out", "OUT/spec.json"], "should be a .yaml file"),
    (LLAMA, ["--out", "OUT/dir.yaml"], "is a directory"),
    (LLAMA, ["--out", "FILE/spec.yaml"], "is a file, not a folder"),
    (None, [], "no such file"),
], ids=["list", "not-utf8", "not-json", "unknown-type", "no-type", "zero-heads", "string-size", "infinite",
        "deep", "transformers-refuses", "bad-rope", "unmapped-field", "layer-types", "bad-name", "not-yaml",
        "out-dir", "out-under-file", "missing"])
def test_import_refuses_bad_input_in_one_line(content, argv, expect, tmp_path, capsys):
    """Exit 2, one line naming what is wrong, no traceback, and nothing written anywhere."""
    src = tmp_path / "src" / "config.json"
    src.parent.mkdir()
    if content is not None:
        src.write_bytes(content if isinstance(content, bytes) else
                        (content if isinstance(content, str) else json.dumps(content)).encode())
    (tmp_path / "OUT" / "dir.yaml").mkdir(parents=True)
    (tmp_path / "FILE").write_text("a file\n")
    argv = [a.replace("OUT", str(tmp_path / "OUT")).replace("FILE", str(tmp_path / "FILE")) for a in argv]
    before = _files(tmp_path)
    out = [] if "--out" in argv else ["--out", str(tmp_path / "new" / "spec.yaml")]
    assert main(["import", str(src.parent), *out, *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0], err
    assert "Traceback" not in captured.out + captured.err
    assert _files(tmp_path) == before


def test_import_reads_only_the_json(tmp_path, capsys):
    """A model directory with remote code (``auto_map``) and a pickled checkpoint: import
    reads config.json through transformers' own config class and nothing else, so no code
    in the directory runs."""
    model = tmp_path / "model"
    model.mkdir()
    marker = tmp_path / "MARKER"
    code = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (model / "configuration_evil.py").write_text(code + "from transformers import LlamaConfig as EvilConfig\n")
    (model / "modeling_evil.py").write_text(code)
    (model / "__init__.py").write_text(code)
    (model / "config.json").write_text(json.dumps(LLAMA | {"auto_map": {
        "AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"}}))
    (model / "pytorch_model.bin").write_bytes(b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00truep\x01\x85R.")
    spec = tmp_path / "spec.yaml"
    assert main(["import", str(model), "--out", str(spec)]) == 0, capsys.readouterr().err
    assert not marker.exists()
    assert load_arch(spec).name == "model" and len(load_arch(spec).layers) == 2


def test_import_writes_only_out(tmp_path, capsys):
    """A symlink at --out is replaced, not written through; no temporary file is left; missing
    parents are made."""
    outside = tmp_path / "outside.yaml"
    outside.write_text("keep me\n")
    src = tmp_path / "config.json"
    src.write_text(json.dumps(LLAMA))
    link = tmp_path / "specs" / "link.yaml"
    link.parent.mkdir()
    link.symlink_to(outside)
    assert main(["import", str(src), "--out", str(link)]) == 0
    assert outside.read_text() == "keep me\n"
    assert not link.is_symlink() and load_arch(link).model.width == 32
    nested = tmp_path / "a" / "b" / "spec.yaml"
    assert main(["import", str(src), "--out", str(nested)]) == 0
    assert sorted(_files(tmp_path)) == ["a", "a/b", "a/b/spec.yaml", "config.json", "outside.yaml",
                                        "specs", "specs/link.yaml"]


def test_native_export_loads_weights_only(tmp_path, capsys):
    """--format native reads a checkpoint as remote export does: weights only, so a pickle
    that would run code is refused (one line, exit 2) and runs nothing."""
    import pathlib

    class Touch:
        def __reduce__(self):
            return pathlib.Path.touch, (tmp_path / "MARKER",)

    spec = tmp_path / "q.yaml"
    spec.write_text("name: q\n" + CASES["qwen3_next-gdn"][1])
    state = build_model(load_arch(spec), backend="torch").state_dict()
    torch.save({"model": state, "extra": Touch()}, tmp_path / "evil.pt")
    rc = main(["export", str(spec), "--checkpoint", str(tmp_path / "evil.pt"), "--format", "native",
               "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "would run code" in err[0], err
    assert not (tmp_path / "MARKER").exists() and not (tmp_path / "x").exists()


def test_validate_and_cost_import_no_torch():
    """The export and import commands are registered on the CLI, yet validate and cost still
    import neither torch nor transformers nor safetensors."""
    probe = ("import json, sys\nfrom runners.cli import main\n"
             "codes = [main(['validate', 'tiny_elr']), main(['cost', 'tiny_elr', '--json']), main(['import', '--help'])]\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'safetensors'))\n"
             "print(json.dumps({'codes': codes, 'heavy': heavy[:5]}))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"codes": [0, 0, 0], "heavy": []}


@pytest.mark.parametrize("name", ["qwen3_next", "olmo_hybrid"])
def test_imported_layout_scales_and_searches(name, tmp_path, capsys):
    """A production layout, imported, is a space's base (its candidates stay native), and
    --scale-to resizes it to a native scaled/ whose transformers model has the parameters
    the export reports."""
    _configs()[name].save_pretrained(tmp_path / "hub")
    assert main(["import", str(tmp_path / "hub"), "--out", str(tmp_path / "base.yaml"), "--name", name]) == 0
    (tmp_path / "space.yaml").write_text(
        f"name: from_{name}\nbase: base.yaml\nparams:\n  vocab: {{target: model.vocab_size, choices: [64, 80]}}\n"
        "objectives:\n  - {metric: eval_loss, direction: minimize}\nproxy: {task: mqar, steps: 2}\n"
        "search: {sampler: grid, trials: 2}\n")
    assert main(["validate", str(tmp_path / "space.yaml")]) == 0
    import optuna
    from nas.space import load_space

    arch = load_space(tmp_path / "space.yaml").candidate(optuna.trial.FixedTrial({"vocab": 64}))[0]
    assert arch.model.vocab_size == 64 and fit(arch).family == name
    e = export_spec(tmp_path / "base.yaml", tmp_path / "out", fmt="native", scale_to=2e6)
    scaled = transformers.AutoConfig.from_pretrained(tmp_path / "out" / "scaled")
    assert scaled.model_type == name and e.scaled is not None
    with torch.device("meta"):
        assert transformers.AutoModelForCausalLM.from_config(scaled).num_parameters() == e.scaled.params
    assert abs(e.scaled.params - 2e6) / 2e6 < 0.05
