"""The remedies of a one-shot ranking (issue #31, ``oneshot.remedy``): each does what it says
on a tiny supernet (CPU, seconds): fine-tuning trains the fraction's steps and scores other
weights than the supernet's; sandwich sampling runs the largest and smallest sub-networks
every step and distils from the largest's detached logits; few-shot trains one supernet per
option of layer 0 from one warm start and scores each candidate with its branch's; per-loop
gates give T = 1 gates of its own, and a looped sub-network still equals its unrolled twin."""
import json
import textwrap

import pytest
import torch

from builders.model import build_model
from nas import oneshot as one
from nas.errors import SpecError
from nas.space import load_space
from runners.checkpoint import CHECKPOINT
from runners.oneshot import remedies
from runners.oneshot.remedies import LoopGates, distill_loss, finetune, finetune_config, finetune_steps, train_remedied
from runners.oneshot.search import Scorer, extract
from runners.oneshot.supernet import supernet_config
from runners.results.records import read_trials
from runners.tasks import make_task
from runners.train import eval_batches, evaluate
from runners.weights import load_source

SPACE = """\
name: osr
base:
  name: osr_tiny
  model:
    vocab_size: 32
    width: 16
    defaults:
      attn: {num_heads: 2}
      gdn: {num_heads: 2, head_dim: 8, expand_v: 1}
      swiglu: {hidden_size: 32}
  num_layers: 2
  hybrid: {ratio: {attn: 1, gdn: 1}, placement: interleave}
  loop: {boundary: block, T: 2, update: {kind: residual_gate, shared: true}}
objectives:
  - {metric: eval_loss, direction: minimize}
  - {metric: projection_flops, direction: minimize}
proxy: {task: mqar, task_params: {vocab_size: 32, seq_len: 16, num_kv_pairs: 2}, steps: 20,
        batch_size: 8, eval_every: 100, eval_batches: 1, lr: 0.01}
"""


def space_file(tmp_path, oneshot: str, base: str = SPACE):
    path = tmp_path / "space.yaml"
    path.write_text(base + "oneshot:\n" + textwrap.indent(textwrap.dedent(oneshot), "  "))
    return path


def loaded(tmp_path, remedy: str, steps: int = 4, loops: str = "[1, 2, 3]"):
    """A tiny one-shot space with ``remedy``, its supernet trained ``steps`` steps."""
    return load_space(space_file(tmp_path, f"loops: {loops}\ntrain: {{steps: {steps}}}\nremedy: {remedy}\n"
                                           "search: {strategy: exhaustive}\ncheck: false\n"))


# the option


@pytest.mark.parametrize("oneshot, base_edit, field, message", [
    ("remedy: {finetune: {fraction: 0}}\n", None, "oneshot.remedy.finetune.fraction", ""),
    ("remedy: {finetune: {fraction: 1.5}}\n", None, "oneshot.remedy.finetune.fraction", ""),
    ("remedy: {few_shot: {split: layer1}}\n", None, "oneshot.remedy.few_shot.split", ""),
    ("remedy: {few_shot: {warm: 1}}\n", None, "oneshot.remedy.few_shot.warm", ""),
    ("remedy: {sandwich: {random: -1}}\n", None, "oneshot.remedy.sandwich.random", ""),
    ("remedy: {sandwich: true}\n", None, "oneshot.remedy.sandwich", "give oneshot.loops"),
    ("remedy: {per_loop_gates: true}\n", None, "oneshot.remedy.per_loop_gates", "oneshot.loops"),
    ("loops: [1, 2]\nremedy: {per_loop_gates: true}\n", ("{kind: residual_gate, shared: true}", "{kind: plain}"),
     "oneshot.remedy.per_loop_gates", "no residual gate"),
    ("remedy: {distill: true}\n", None, "oneshot.remedy.distill", ""),
])
def test_a_bad_remedy_names_its_field(tmp_path, oneshot, base_edit, field, message):
    base = SPACE if base_edit is None else SPACE.replace(*base_edit)
    with pytest.raises(SpecError) as err:
        load_space(space_file(tmp_path, oneshot, base))
    assert any(p.path == field and message in p.message for p in err.value.problems), err.value


def test_true_is_a_remedy_with_its_defaults_and_none_is_the_default(tmp_path):
    space = load_space(space_file(tmp_path, "loops: [1, 2]\nremedy: {finetune: true, sandwich: true, "
                                            "few_shot: true, per_loop_gates: true}\n"))
    remedy = space.spec.oneshot.remedy
    assert remedy.finetune == one.FinetuneSpec() and remedy.sandwich == one.SandwichSpec()
    assert remedy.few_shot == one.FewShotSpec() and remedy.trains_supernet
    assert remedy.names() == ["finetune", "sandwich", "few_shot", "per_loop_gates"]
    plain = load_space(space_file(tmp_path, "loops: [1, 2]\n")).spec.oneshot.remedy
    assert plain.names() == [] and not plain.trains_supernet
    assert not load_space(space_file(tmp_path, "loops: [1, 2]\nremedy: {finetune: false}\n")
                          ).spec.oneshot.remedy.names()


# inherit, then fine-tune


def test_finetune_trains_the_fraction_of_the_stand_alone_steps_and_scores_other_weights(tmp_path, one_thread):
    space = loaded(tmp_path, "{finetune: {fraction: 0.25}}")
    assert finetune_steps(space) == 5  # a quarter of the proxy's 20 stand-alone steps
    config = supernet_config(space)
    net = one.supernet(space)
    model = build_model(net, backend="torch").eval()
    nets = remedies.Supernets(net, {None: model}, {None: None})
    pattern, k = (1, 0), 2
    arch, inherited = extract(model, net, pattern, k)
    before = {n: t.clone() for n, t in inherited.state_dict().items()}
    calls = []
    inherited.register_forward_pre_hook(lambda m, args: calls.append(1))
    tune = finetune_config(space)
    finetune(inherited, tune, make_task(tune.task, **tune.task_params), finetune_steps(space))
    assert len(calls) == 5
    changed = [n for n, t in inherited.state_dict().items() if not torch.equal(t, before[n])]
    assert "embed.weight" in changed and "rho" in changed
    # the scorer scores the fine-tuned weights, not the supernet's
    scorer = Scorer(nets, space)
    _, scored = scorer.subnet(pattern, k)
    assert all(torch.equal(t, inherited.state_dict()[n]) for n, t in scored.state_dict().items())  # deterministic
    task = make_task(config.task, **config.task_params)
    batches = eval_batches(task, config, torch.device("cpu"))
    tuned = scorer.evaluate(task, batches, pattern, k)
    plain = Scorer(nets).evaluate(task, batches, pattern, k)
    assert tuned == evaluate(scored, task, batches) and tuned["eval_loss"] != plain["eval_loss"]
    assert plain == evaluate(model, task, batches, loops=k, pattern=pattern)


# sandwich sampling and in-place distillation


def test_distillation_reaches_the_student_and_never_the_teacher():
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(2, 5, 7, generator=g, requires_grad=True)
    student = torch.randn(2, 5, 7, generator=g, requires_grad=True)
    y = torch.tensor([[1, -100, 2, 3, -100], [0, 0, -100, 6, 1]])
    distill_loss(student, teacher, y).backward()
    assert teacher.grad is None and student.grad is not None
    assert student.grad[0, 1].abs().sum() == 0  # an unlabelled position teaches nothing
    assert distill_loss(teacher.detach(), teacher.detach(), y).abs() < 1e-6


def test_sandwich_runs_the_largest_and_smallest_every_step_and_distils_from_the_largest(
        tmp_path, one_thread, monkeypatch):
    space = loaded(tmp_path, "{sandwich: {random: 1}}", steps=3)
    runs, taught = [], []
    forward, distill = remedies._forward, remedies.distill_loss

    def recorded_forward(model, gates, x, pattern, loops):
        logits, aux = forward(model, gates, x, pattern, loops)
        runs.append((loops, logits))
        return logits, aux

    def recorded_distill(student, teacher, y):
        taught.append((student, teacher))
        return distill(student, teacher, y)

    monkeypatch.setattr(remedies, "_forward", recorded_forward)
    monkeypatch.setattr(remedies, "distill_loss", recorded_distill)
    train_remedied(space, tmp_path / "net")
    assert len(runs) == 3 * 3 and len(taught) == 3 * 2  # largest, smallest, one random; two students
    for step in range(3):
        (k0, largest), (k1, smallest), (k2, sampled) = runs[3 * step:3 * step + 3]
        assert (k0, k1) == (3, 1) and k2 in (1, 2, 3)
        for (student, teacher), mine in zip(taught[2 * step:2 * step + 2], (smallest, sampled)):
            assert student is mine and not teacher.requires_grad and torch.equal(teacher, largest)


def test_sandwich_without_distillation_trains_every_sub_network_on_the_labels(tmp_path, one_thread, monkeypatch):
    space = loaded(tmp_path, "{sandwich: {distill: false, random: 0}}", steps=2)
    taught = []
    monkeypatch.setattr(remedies, "distill_loss", lambda *a: taught.append(a))
    result, _ = train_remedied(space, tmp_path / "net")
    assert not taught and len(result["losses"]["None"]) == 2


# few-shot supernets


def test_few_shot_trains_one_supernet_per_layer0_option_from_one_warm_start(tmp_path, one_thread, monkeypatch):
    space = loaded(tmp_path, "{few_shot: {warm: 0.5}}", steps=4)
    entered, left, patterns = {}, {}, []
    fit, forward = remedies._fit, remedies._forward

    def recorded_fit(s, net, config, task, remedy, loops, steps, total, branch=None):
        entered[branch] = ({n: t.clone() for n, t in s.model.state_dict().items()}, s.model, list(steps))
        out = fit(s, net, config, task, remedy, loops, steps, total, branch)
        left[branch] = {n: t.clone() for n, t in out.model.state_dict().items()}
        return out

    def recorded_forward(model, gates, x, pattern, loops):
        patterns.append((model, list(pattern)))
        return forward(model, gates, x, pattern, loops)

    monkeypatch.setattr(remedies, "_fit", recorded_fit)
    monkeypatch.setattr(remedies, "_forward", recorded_forward)
    result, nets = train_remedied(space, tmp_path / "net")
    assert set(nets.models) == {0, 1} and nets.models[0] is not nets.models[1]
    assert entered[None][2] == [0, 1] and entered[0][2] == entered[1][2] == [2, 3] and result["split"] == 2
    warm = left[None]
    for b in (0, 1):  # each branch starts from the shared warm start, then trains on its own
        assert entered[b][1] is nets.models[b] and entered[b][1] is not entered[None][1]
        assert all(torch.equal(t, warm[n]) for n, t in entered[b][0].items())
        assert not torch.equal(left[b]["embed.weight"], warm["embed.weight"])
        assert all(p[0] == b for m, p in patterns if m is nets.models[b])  # layer 0 fixed to its option
    assert not torch.equal(left[0]["embed.weight"], left[1]["embed.weight"])
    for pattern in one.exhaustive(one.counts(space)):  # each candidate is scored by its branch's supernet
        assert nets.model_for(pattern, 2) is nets.models[pattern[0]]
    # read back, not retrained
    again, back = train_remedied(space, tmp_path / "net")
    assert again == json.loads(json.dumps(result)) and set(back.models) == {0, 1}
    assert all(torch.equal(t, left[1][n]) for n, t in back.models[1].state_dict().items())


# loop-count-aware sharing: per-loop gates


def unrolled(model, gates: LoopGates, x: torch.Tensor, pattern, T: int) -> torch.Tensor:
    """The block loop written out: T weight-tied copies of the two layers, iteration t's
    residual gate the t-th row of the table of T (``h = f(h) + ρ_T[t] ⊙ h``)."""
    rho = gates.at(T)["rho"]
    h = model.embed(x)
    for t in range(T):
        out = h
        for i, block in enumerate(model.layers):
            out = block.mixer_step(out, option=pattern[i])[0]
            out = block.ffn_step(out)[0]
        h = out + rho[t] * h
    return model.head(model.norm(h))


def test_per_loop_gates_give_each_loop_count_its_own_gates(tmp_path, one_thread):
    space = loaded(tmp_path, "{per_loop_gates: true}", steps=6)
    _, nets = train_remedied(space, tmp_path / "net")
    gates = nets.gates[None]
    t1, t3 = gates.at(1)["rho"], gates.at(3)["rho"]
    assert t1.shape == (1, 16) and t3.shape == (3, 16) and t1 is not t3
    assert t1.abs().sum() > 0 and t3.abs().sum() > 0 and not torch.equal(t1, t3[:1])  # both trained, apart
    assert nets.models[None].rho.abs().sum() == 0  # the supernet's own ρ is never used
    pattern = (1, 0)
    for T, table in ((1, t1), (3, t3)):  # scored and extracted with the gates of their own T
        model = nets.model_for(pattern, T)
        assert torch.equal(model.rho[:T], table) and model is not nets.models[None]
        arch, sub = extract(model, nets.net, pattern, T)
        assert arch.loops[0].T == T and torch.equal(sub.rho, table)


@pytest.mark.parametrize("T", [1, 2, 3])
def test_a_gated_looped_subnet_equals_its_unrolled_weight_tied_twin(tmp_path, one_thread, T):
    space = loaded(tmp_path, "{per_loop_gates: true}", steps=2)
    _, nets = train_remedied(space, tmp_path / "net")
    gates, model = nets.gates[None], nets.models[None]
    with torch.no_grad():
        for table in gates.parameters():  # random gates: each row must count
            table.copy_(torch.randn_like(table))
    nets._scoring.clear()
    x = torch.randint(0, 32, (2, 11), generator=torch.Generator().manual_seed(1))
    for pattern in ((0, 1), (1, 0)):
        with torch.no_grad():
            model.train()
            trained, _ = remedies._forward(model, gates, x, pattern, T)  # as the supernet trains
            want = unrolled(model, gates, x, pattern, T)
            scoring = nets.model_for(pattern, T)
            scored = scoring.head(scoring.hidden(x, loops=T, pattern=list(pattern))[0])  # as it is scored
            _, sub = extract(scoring, nets.net, pattern, T)
            extracted = sub(x).logits
        for got in (trained, scored, extracted):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# all of them in one sweep


def test_a_sweep_with_every_remedy_scores_and_extracts_what_it_scored(tmp_path, one_thread):
    from runners.sweep.run import run_sweep

    space_path = space_file(tmp_path, "loops: [1, 2]\ntrain: {steps: 4}\nsearch: {strategy: exhaustive}\n"
                                      "check: false\nremedy: {finetune: {fraction: 0.1}, sandwich: true, "
                                      "few_shot: true, per_loop_gates: true}\n")
    exp = run_sweep(space_path, out=tmp_path / "exp", progress=False)
    summary = json.loads((exp / "oneshot.json").read_text())
    assert summary["supernet"]["remedy"] == ["finetune", "sandwich", "few_shot", "per_loop_gates"]
    assert summary["supernet"]["split"] == 2 and summary["search"]["finetune_steps"] == 2
    trials = read_trials(exp)
    assert len(trials) == 2 * 2 and all(t.status == "complete" for t in trials)
    space = load_space(space_path)
    config = supernet_config(space)
    task = make_task(config.task, **config.task_params)
    batches = eval_batches(task, config, torch.device("cpu"))
    assert summary["extracted"]
    for rid in summary["extracted"]:
        arch, state = load_source(exp / "trials" / rid / CHECKPOINT)
        sub = build_model(arch, backend="torch")
        sub.load_state_dict(state)
        record = next(t for t in trials if t.id == rid)
        assert evaluate(sub.eval(), task, batches)["eval_loss"] == record.values["eval_loss"]
