"""Activation checkpointing of an export: ``gradient_checkpointing_enable()`` and
``Trainer(gradient_checkpointing=True)`` switch on loopnas's own checkpointing
(``LoopLM.set_activation_checkpointing``) for every shipped tiny spec (looped, elastic,
MoE with routing replay, truncated, parallel) and a random-placement hybrid, with the
same loss and gradients as without it."""
import copy
import warnings
from pathlib import Path

import pytest
import torch

from runners.export import export_spec
from helpers import REPO

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' Trainer needs it

ROOT = REPO
TINY = sorted(p.stem for p in (ROOT / "spaces" / "archs").glob("tiny_*.yaml"))
RANDOM = """name: tiny_random_placement
model: {vocab_size: 256, width: 64, defaults: {attn: {num_heads: 4}, gdn: {num_heads: 2, head_dim: 32, expand_v: 1},
        swiglu: {hidden_size: 128}}}
num_layers: 3
hybrid: {ratio: {attn: 1, gdn: 2}, placement: random}
loop: {boundary: mixer, T: 2, update: {kind: residual_gate}}
"""
SPECS = [*TINY, "tiny_random_placement"]
SEQ, STEPS = 16, 3


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    work = tmp_path_factory.mktemp("gc")
    (work / "tiny_random_placement.yaml").write_text(RANDOM)
    out = {}
    for name in SPECS:
        spec = work / f"{name}.yaml" if name == "tiny_random_placement" else ROOT / "spaces" / "archs" / f"{name}.yaml"
        out[name] = export_spec(spec, work / name).out
    return out


def fresh(path: Path):
    """The export as transformers builds it from its config (remote code), seeded."""
    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=True)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=True).train()


def loss_and_grads(model, ids):
    torch.manual_seed(1)  # the same loop-count and placement draws on both runs
    model.zero_grad(set_to_none=True)
    out = model(ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def counting_mixer_calls(model) -> list[int]:
    """A counter of the mixers' forward calls, recomputation included (a pre-hook: the
    recomputation stops as soon as it has what the backward needs, before forward returns)."""
    calls = [0]

    def hook(*_):
        calls[0] += 1
    for block in model.model.layers:
        block.mixer.register_forward_pre_hook(hook)
    return calls


def trainer_run(model, data, out_dir: Path, checkpointing: bool):
    args = transformers.TrainingArguments(
        output_dir=str(out_dir), max_steps=STEPS, per_device_train_batch_size=2, learning_rate=1e-3,
        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, seed=0,
        gradient_checkpointing=checkpointing, disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("name", SPECS)
def test_checkpointing_gives_the_same_loss_and_gradients(exports, name, one_thread):
    model = fresh(exports[name])
    assert model.supports_gradient_checkpointing
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(2))
    calls = counting_mixer_calls(model)
    plain_loss, plain = loss_and_grads(model, ids)
    plain_calls, calls[0] = calls[0], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' alias for activation_checkpointing_enable
        model.gradient_checkpointing_enable()
    assert model.is_gradient_checkpointing and model.model.gradient_checkpointing  # loopnas's own switch
    ckpt_loss, ckpt = loss_and_grads(model, ids)
    # every mixer application that builds a graph runs again in the backward (a truncated
    # loop's iterations before the cut build none)
    assert plain_calls < calls[0] <= 2 * plain_calls
    torch.testing.assert_close(ckpt_loss, plain_loss, rtol=0, atol=0)
    assert plain.keys() == ckpt.keys()
    for n in plain:
        assert (ckpt[n] is None) == (plain[n] is None), n
        if plain[n] is not None:
            torch.testing.assert_close(ckpt[n], plain[n], rtol=1e-6, atol=1e-7, msg=n)
    model.activation_checkpointing_disable()
    assert not model.model.gradient_checkpointing


@pytest.mark.parametrize("name", SPECS)
def test_trainer_with_gradient_checkpointing(exports, name, tmp_path, one_thread):
    """transformers' Trainer trains the export a few steps with ``gradient_checkpointing=True``:
    sublayers are recomputed in the backward, and the losses and final weights equal those of
    the same run without it."""
    gen = torch.Generator().manual_seed(3)
    vocab = transformers.AutoConfig.from_pretrained(exports[name], trust_remote_code=True).vocab_size
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, vocab, (2 * STEPS, SEQ), generator=gen)]
    runs = {}
    for checkpointing in (False, True):
        model = fresh(exports[name])
        init = copy.deepcopy(model.state_dict())
        calls = counting_mixer_calls(model)
        losses = trainer_run(model, data, tmp_path / str(checkpointing), checkpointing)
        runs[checkpointing] = losses, calls[0], copy.deepcopy(model.state_dict())
        assert model.model.gradient_checkpointing == checkpointing
    (plain_losses, plain_calls, plain_state), (ckpt_losses, ckpt_calls, ckpt_state) = runs[False], runs[True]
    assert len(ckpt_losses) == STEPS and all(l == l for l in ckpt_losses)
    assert ckpt_calls > plain_calls  # recomputed in the backward
    assert ckpt_losses == pytest.approx(plain_losses, rel=1e-6)
    for n in plain_state:
        torch.testing.assert_close(ckpt_state[n], plain_state[n], rtol=1e-5, atol=1e-6, msg=n)
    assert any(not torch.equal(plain_state[n], init[n]) for n in plain_state)  # it trained
