"""Train a one-shot space's supernet with the proxy trainer, and load it back.

The supernet trains like any proxy (``runners.train``: progress bar, checkpoints, resume):
random placement resamples every switch each forward pass (``sampling: ratio``: exactly the
base ratio's counts, LT2's sampler; ``uniform``: every layer on its own, each mixer equally
likely), elastic depth mixes the loop counts inside every update.
"""
from __future__ import annotations

from pathlib import Path

from builders.model import LoopLM, build_model
from nas.errors import LoopnasError, SpecError
from nas.oneshot import supernet
from nas.proxy import with_budget
from nas.space import Space
from nas.spec import ArchSpec
from runners.tasks import make_task
from runners.checkpoint import CHECKPOINT, RESULT, checkpoint_cap, load
from runners.sweep.preflight import preflight
from runners.train import TrainConfig, TrainResult, train, with_vocab


class OneShotError(LoopnasError):
    """A one-shot run cannot start (a usage problem): one line, exit code 2."""


def supernet_config(space: Space) -> TrainConfig:
    """The space's proxy settings with ``oneshot.train`` over them, checkpointing at every
    evaluation (so an interrupted supernet resumes), checked before it trains
    (:func:`runners.sweep.preflight.preflight`)."""
    one = space.spec.oneshot
    data = with_budget(space.spec.proxy.trainer(), one.train)
    data.update(seed=space.spec.search.seed, freeze_ffn=one.freeze_ffn)
    data.setdefault("checkpoint_every", data.get("eval_every", 50))
    if one.init_from is not None:
        path = Path(one.init_from)
        data["init_from"] = str(path if path.is_absolute() else space.source.parent / path)
    try:
        return preflight(data, ("oneshot.train / proxy",), str(space.source))
    except SpecError as exc:
        raise OneShotError(str(exc)) from None


def eval_task(space: Space, config: TrainConfig):
    """The task that scores sub-networks (``oneshot.search.task``; default the proxy's)."""
    search = space.spec.oneshot.search
    params = search.task_params if search.task else {**config.task_params, **search.task_params}
    try:
        trained = make_task(config.task, **config.task_params)
        task = make_task(search.task or config.task, **params)
    except (TypeError, ValueError) as exc:
        raise OneShotError(f"{space.source}: oneshot.search.task: {exc}") from None
    if task.vocab_size != trained.vocab_size:
        raise OneShotError(f"{space.source}: oneshot.search.task: vocabulary {task.vocab_size}, but the "
                           f"supernet trains on {trained.vocab_size}; set its vocab_size to match")
    return task


def train_supernet(space: Space, out: Path, progress: bool = True) -> TrainResult:
    """Train (or finish training) the supernet in ``out``; a finished one is read back."""
    if (out / RESULT).is_file() and (out / CHECKPOINT).is_file():
        from runners.results.records import read_optional

        done = read_optional(out / RESULT, TrainResult)  # bounded; unreadable: one warning, trained on
        if done is not None:
            return done
    config = supernet_config(space).model_copy(update={"progress": progress})
    net = supernet(space)
    resume = out / CHECKPOINT if (out / CHECKPOINT).is_file() else None
    return train(net, config, out_dir=out, resume=resume)


def load_supernet(space: Space, out: Path) -> tuple[LoopLM, ArchSpec]:
    """The trained supernet (eval mode) and its canonical spec at the task's vocabulary."""
    config = supernet_config(space)
    task = make_task(config.task, **config.task_params)
    arch = with_vocab(supernet(space), task.vocab_size)
    model = build_model(arch, backend=config.backend, device=config.device)
    model.load_state_dict(load(out / CHECKPOINT, cap=checkpoint_cap(arch))["model"])
    return model.eval(), arch


__all__ = ["OneShotError", "supernet_config", "eval_task", "train_supernet", "load_supernet"]
