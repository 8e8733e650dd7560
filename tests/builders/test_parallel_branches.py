"""Per-branch norm and scale inside parallel mixers (Hymba): the spec lowers ``branch_norm:
true`` to the model's norm, the cost model counts the norms and scales exactly, the built
mixer computes ``combine(β_i ⊙ norm_i(branch_i(x)))`` (checked against a hand-written
reference), decoding reproduces the forward, and the diagram says what the mixer does."""
from __future__ import annotations

import itertools

import pytest
import torch

from builders.model import build_model
from nas.cost import cost, op_params, unique_params
from nas.errors import SpecError
from nas.graph import describe, folded_graph
from nas.load import load_arch, loads_arch, resolve, spec_from_dict
from nas.spec import NormSpec
from runners.cli import main
from spaces import arch_path

pytestmark = pytest.mark.usefixtures("one_thread")

V = 64
GDN = {"kind": "gdn", "num_heads": 2, "head_dim": 16, "expand_v": 1}
SWA = {"kind": "attn", "num_heads": 2, "window": 5}
EXACT = dict(rtol=0, atol=1e-10)


def _arch(norm="rmsnorm", branch_norm=True, branch_scale=True, combine="mean", **extra):
    mixer = {"kind": "parallel", "combine": combine, "branch_norm": branch_norm,
             "branch_scale": branch_scale, "branches": [GDN, SWA]}
    return resolve(spec_from_dict({"model": {"vocab_size": V, "width": 32, "norm": {"kind": norm}},
                                   "num_layers": 2, "layer": {"mixer": mixer, "ffn": {"kind": "swiglu",
                                                                                     "hidden_size": 48}},
                                   **extra}))


def _model(arch, seed: int = 0):
    """float64, with the branch norms' weights (and biases) and scales random, so none of
    them is the identity."""
    torch.manual_seed(seed)
    model = build_model(arch, backend="torch").double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".mixer.norms." in name or name.endswith(".mixer.scale") or name.startswith("loops."):
                p.uniform_(0.5, 1.5)
    return model


def _ids(B: int = 2, T: int = 13, seed: int = 1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- spec and cost


def test_branch_norm_true_lowers_to_the_model_norm():
    for kind in ("rmsnorm", "layernorm"):
        arch = _arch(norm=kind)
        assert arch.is_canonical
        assert {l.mixer.branch_norm for l in arch.layers} == {NormSpec(kind=kind)}
    own = _arch(norm="rmsnorm", branch_norm={"kind": "layernorm", "eps": 1e-5})
    assert own.layers[0].mixer.branch_norm == NormSpec(kind="layernorm", eps=1e-5)
    assert _arch(branch_norm=False, branch_scale=False).layers[0].mixer.branch_norm is False
    shipped = load_arch(arch_path("tiny_hymba"))
    assert loads_arch(shipped.model_dump_json()) == shipped  # the canonical form loads back


@pytest.mark.parametrize("norm,branch_norm,branch_scale,combine", [
    pytest.param(*c, id="-".join(map(str, c))) for c in itertools.product(
        ["rmsnorm", "layernorm"], [True, False], [True, False], ["mean", "sum", "concat"])])
def test_parameter_count_is_exact(norm, branch_norm, branch_scale, combine):
    """The cost model's count equals the built model's, and the norms and scales add n·d
    (2·n·d for layernorm) and n·d to the mixer."""
    arch = _arch(norm, branch_norm, branch_scale, combine)
    model = build_model(arch, backend="torch", device="meta")
    assert sum(p.numel() for p in model.parameters()) == unique_params(arch) == cost(arch).unique_params
    mixer, d = arch.layers[0].mixer, arch.model.width
    assert sum(p.numel() for p in model.layers[0].mixer.parameters()) == op_params(mixer, d)
    plain = mixer.model_copy(update={"branch_norm": False, "branch_scale": False})
    norm_size = 2 * d * (2 if norm == "layernorm" else 1) if branch_norm else 0
    assert op_params(mixer, d) - op_params(plain, d) == norm_size + (2 * d if branch_scale else 0)
    names = {n for n, _ in model.layers[0].mixer.named_parameters()}
    assert ("norms.0.weight" in names) == branch_norm and ("scale" in names) == branch_scale


def test_norms_and_scales_are_priced_as_mixer_parameters():
    """Projection compute charges 2 FLOPs per mixer parameter, these included; sequence
    mixing and memory are the branches' alone."""
    on, off = cost(_arch()), cost(_arch(branch_norm=False, branch_scale=False))
    d = 32
    assert on.figures.projection.mixer - off.figures.projection.mixer == 2 * 2 * (2 * d + 2 * d)
    for field in ("seq_mixing_flops", "kv_cache_bytes", "state_bytes"):
        assert getattr(on.figures, field) == getattr(off.figures, field), field


@pytest.mark.parametrize("field,value", [("branch_norm", "sometimes"), ("branch_norm", {"kind": "batchnorm"}),
                                         ("branch_scale", [1]), ("branch_norm", {"eps": -1})])
def test_invalid_options_name_the_field(field, value):
    mixer = {"kind": "parallel", "branches": [GDN, SWA], field: value}
    with pytest.raises(SpecError) as err:
        resolve(spec_from_dict({"model": {"vocab_size": V, "width": 32}, "num_layers": 1,
                                "layer": {"mixer": mixer}}))
    assert any(p.path.startswith(f"layer.mixer.{field}") for p in err.value.problems), err.value.problems


# ---------------------------------------------------------------- built model


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt((x - mu).pow(2).mean(-1, keepdim=True) + eps) * w + b


@pytest.mark.parametrize("norm,combine", [("rmsnorm", "mean"), ("layernorm", "concat"), ("rmsnorm", "sum")])
def test_forward_equals_the_hymba_reference(norm, combine):
    """``combine(β_i ⊙ norm_i(branch_i(x)))``, with the norm written out by hand."""
    arch = _arch(norm=norm, combine=combine)
    model = _model(arch)
    mixer, eps = model.layers[0].mixer, arch.layers[0].mixer.branch_norm.eps
    x = torch.randn(2, 11, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    outs = []
    for i, branch in enumerate(mixer.branches):
        n = mixer.norms[i]
        y = _rms(branch(x), n.weight, eps) if norm == "rmsnorm" else _ln(branch(x), n.weight, n.bias, eps)
        outs.append(mixer.scale[i] * y)
    want = {"mean": lambda: (outs[0] + outs[1]) / 2, "sum": lambda: outs[0] + outs[1],
            "concat": lambda: mixer.proj(torch.cat(outs, -1))}[combine]()
    with torch.no_grad():
        torch.testing.assert_close(mixer(x), want, **EXACT)
        plain = _model(_arch(norm=norm, combine=combine, branch_norm=False, branch_scale=False))
        plain.load_state_dict({k: v for k, v in model.state_dict().items()
                               if ".norms." not in k and not k.endswith(".scale")})
        assert (plain(_ids()).logits - model(_ids()).logits).abs().max() > 1e-3  # the options act


def test_scale_starts_at_one_and_trains():
    model = build_model(_arch(), backend="torch")
    scale = model.layers[0].mixer.scale
    assert torch.equal(scale, torch.ones(2, 32))
    model(_ids(), labels=_ids()).loss.backward()
    assert scale.grad is not None and scale.grad.abs().sum() > 0
    assert model.layers[0].mixer.norms[1].weight.grad.abs().sum() > 0


def _decoded(model, ids, prompt: int, **kw):
    logits, cache = model.prefill(ids[:, :prompt], **kw)
    outs = [logits] + [model.decode(cache, ids[:, s:s + 1]) for s in range(prompt, ids.shape[1])]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("case", ["shipped", "mixerloop", "mixerloop_last_loop"])
def test_decode_equals_forward(case):
    """Each branch keeps its own cache under the norm and scale: prefill + token-by-token
    decode equal the whole-sequence forward; in a loop under last_loop, the attention
    branch shares one cache (a different function, checked against per_loop's size)."""
    if case == "shipped":
        arch = load_arch(arch_path("tiny_hymba"))
    else:
        arch = _arch(loop={"boundary": "mixer", "T": 3, "update": {"kind": "residual_gate"}})
    model, ids = _model(arch), torch.randint(0, arch.model.vocab_size, (2, 13),
                                             generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model.head(model.hidden(ids)[0])
    if case == "mixerloop_last_loop":
        _, per = model.prefill(ids, kv_policy="per_loop")
        _, last = model.prefill(ids, kv_policy="last_loop")
        assert 3 * last.nbytes()["kv"] == per.nbytes()["kv"] and last.nbytes()["state"] == per.nbytes()["state"]
        priced = cost(arch.model_copy(update={"kv_policy": "last_loop"}), seq_len=13, dtype="fp32")
        assert last.nbytes()["kv"] == 2 * 2 * priced.figures.kv_cache_bytes  # batch 2, float64
        return
    torch.testing.assert_close(_decoded(model, ids, 5, kv_policy="per_loop"), full, **EXACT)


# ---------------------------------------------------------------- graph and show


def test_graph_and_show_name_the_options(tmp_path, capsys):
    arch = load_arch(arch_path("tiny_hymba"))
    assert describe(arch.layers[0].mixer) == "gdn ∥ attn (norm, β)"
    assert describe(_arch(branch_scale=False).layers[0].mixer) == "gdn ∥ swa 5 (norm)"
    g = folded_graph(arch)
    assert g.nodes["layers.0.mixer"]["label"] == "gdn ∥ attn (norm, β)"
    assert g.nodes["layers.0.mixer"]["branches"] == ("gdn", "attn")
    assert main(["show", "tiny_hymba"]) == 0
    assert "gdn ∥ attn (norm, β)" in capsys.readouterr().out
    assert main(["graph", "tiny_hymba", "--out", str(tmp_path / "hymba.dot")]) == 0
    assert "(norm, β)" in (tmp_path / "hymba.dot").read_text()
