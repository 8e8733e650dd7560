"""The one place loopnas writes and reads checkpoints, and its one atomic file write.

A checkpoint holds plain data only: tensors, numbers, strings, and dicts, lists and tuples
of them (specs and configs as their JSON dumps). So :func:`load` always unpickles with
``weights_only=True``, and a checkpoint that would run code when loaded is refused, never
executed: a checkpoint is as safe to open as the safetensors an export writes. torch is
imported inside the functions, so the CLI can name :class:`CheckpointError` without it.

A checkpoint is never read past its cap (issue #34): :func:`checkpoint_cap` of the model it
should hold when that is known (its weights and AdamW's two moments, with room, plus a
fixed allowance), else :data:`MAX_CHECKPOINT`; a larger file is refused before it is read.

A proxy run's checkpoint is a :class:`TrainState`, written by :func:`save_state` and read by
:func:`load_state` as the same dict every earlier trainer wrote, so an old experiment resumes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nas.errors import LoopnasError

if TYPE_CHECKING:
    import torch

CHECKPOINT = "checkpoint.pt"
RESULT = "result.json"
_PLAIN = (str, bytes, int, float, bool, type(None))
# a trainer checkpoint holds the weights (fp32: 4 bytes a parameter) and AdamW's two moments
# (8 more): 16 bytes a parameter leaves a third of room; the allowance holds the RNG states,
# the loss history (a float a step), the evaluations and the config
BYTES_PER_PARAM = 16
ALLOWANCE = 128 << 20
MAX_CHECKPOINT = 8 << 30  # a checkpoint whose model is known only from the file itself
VOCAB_ROOM = 1 << 18  # the vocabulary assumed where a run trained on a task's that the spec does not state


class CheckpointError(LoopnasError):
    """A file that cannot be loaded as a loopnas checkpoint: one line, exit code 2."""


@contextlib.contextmanager
def atomic(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; it replaces ``path`` when the block
    ends, so readers see the old file or the new one, never half of either. A failed write
    (a full disk, an exception) leaves the old file and no temporary file behind."""
    path = Path(path)
    # an unpredictable name (no one can plant a symlink there first), with the permissions
    # a plain open would give (mkstemp's are 0600); os.replace swaps a symlink at ``path``
    # itself, never its target
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise


def write_text(path: str | Path, text: str | list[str]) -> None:
    """Write ``text`` (UTF-8; a list: its parts one after another, never joined in memory)
    to ``path`` atomically (:func:`atomic`)."""
    with atomic(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for part in [text] if isinstance(text, str) else text:
            f.write(part)


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> Path:
    """``fig.savefig(path, **kwargs)`` atomically (:func:`atomic`): a symlink at ``path`` is
    replaced, never written through. The format is ``path``'s suffix unless given."""
    path = Path(path)
    kwargs.setdefault("format", path.suffix.lstrip(".") or "png")  # the temporary name ends .tmp
    with atomic(path) as tmp:
        fig.savefig(tmp, **kwargs)
    return path


class LinkError(LoopnasError):
    """A folder a run would write inside is a symbolic link loopnas must not replace: one
    line, exit code 2."""


def run_folder(top: str | Path, path: str | Path, resume: bool = False) -> Path:
    """``path``, a folder below ``top`` that a training run writes inside (``trials/<id>/``,
    ``trials/<id>/s<i>/``; ``top`` is guarded by its caller), never reached through a
    symlink: a link at it or at a folder between (planted to send a checkpoint and a result
    outside the experiment) is removed, its target untouched, and the trainer makes the
    folder; with ``resume`` (the run continues from what the folder holds) it is a
    :class:`LinkError` naming it, and nothing is removed. Not made here: the trainer makes it."""
    top, path = Path(top), Path(path)
    folder = top
    for part in path.relative_to(top).parts:
        folder = folder / part
        if not folder.is_symlink():
            continue
        if resume:
            raise LinkError(f"--resume: {folder} is a symbolic link (to {os.readlink(folder)}); a resumed run "
                            "writes only inside the experiment directory: put the folder itself there, or start "
                            "a new experiment with another --out")
        folder.unlink()
    return path


def own_dir(path: str | Path) -> Path:
    """The directory ``path``, made if missing. A symlink there (planted to send what is
    written inside elsewhere) is replaced by a directory of its own; its target is untouched."""
    path = Path(path)
    if path.is_symlink():
        path.unlink()
    path.mkdir(exist_ok=True)
    return path


def _plain(value: Any, where: str) -> Any:
    """``value`` as data the weights-only unpickler accepts: numpy scalars become Python
    numbers, pydantic models their JSON dumps; anything else unknown is refused here, so a
    checkpoint that could not be loaded is never written. Unchanged containers are kept as
    they are (a state_dict keeps its ``_metadata``)."""
    import torch
    from pydantic import BaseModel

    if type(value) in _PLAIN or isinstance(value, (torch.Tensor, torch.dtype, torch.device, torch.Size)):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        items = {_plain(k, where): _plain(v, f"{where}.{k}") for k, v in value.items()}
        same = type(value) in (dict, OrderedDict) and all(
            k2 is k and v2 is v for (k2, v2), (k, v) in zip(items.items(), value.items()))
        return value if same else items
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        same = type(value) in (list, tuple) and all(a is b for a, b in zip(items, value))
        return value if same else (tuple if isinstance(value, tuple) else list)(items)
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # a numpy scalar
        return value.item()
    raise TypeError(f"checkpoint field {where}: {type(value).__name__} is not plain data "
                    "(tensors, numbers, strings, dicts, lists)")


def save(path: str | Path, payload: dict[str, Any]) -> None:
    """Write atomically: a crash mid-write never leaves a torn checkpoint."""
    import torch

    with atomic(path) as tmp:
        torch.save(_plain(payload, "checkpoint"), tmp)


def checkpoint_cap(arch: Any, copies: int = 1, any_vocab: bool = False) -> int:
    """The most bytes a checkpoint of ``arch`` (an ArchSpec; ``copies`` models of it, as a
    remedied supernet saves one a branch) may take: :data:`BYTES_PER_PARAM` a parameter of
    the model the spec describes, plus :data:`ALLOWANCE`. ``any_vocab``: the run trained on
    a task's vocabulary the spec does not state (an export): the embedding is counted at
    :data:`VOCAB_ROOM` tokens when the spec's vocabulary is smaller."""
    from nas.cost.sheet import unique_params

    if any_vocab and arch.model.vocab_size < VOCAB_ROOM:
        arch = arch.model_copy(update={"model": arch.model.model_copy(update={"vocab_size": VOCAB_ROOM})})
    return BYTES_PER_PARAM * unique_params(arch) * max(1, copies) + ALLOWANCE


def load(path: str | Path, map_location: Any = "cpu", cap: int | None = None) -> dict[str, Any]:
    """The dict saved at ``path``, unpickled with ``weights_only=True``. A missing,
    unreadable, torn or foreign file, one holding objects that would run code, or one
    larger than ``cap`` bytes (:func:`checkpoint_cap` of the model it should hold; else
    :data:`MAX_CHECKPOINT`), refused before it is read, is a :class:`CheckpointError`
    naming ``path``."""
    import torch

    if not Path(path).is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    limit = MAX_CHECKPOINT if cap is None else cap
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if size > limit:
        raise CheckpointError(f"{path}: {_mb(size)}, more than a checkpoint of "
                              f"{'its model' if cap is not None else 'any model loopnas trains'} can take "
                              f"({_mb(limit)}); not read (a file that is not this model's checkpoint?)")
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol: the error below says it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "GLOBAL" in str(exc):  # the weights-only unpickler met a class or function
            raise CheckpointError(f"{path}: refused: this checkpoint holds Python objects that "
                                  "would run code when loaded (loopnas loads weights only)") from None
        raise CheckpointError(_unreadable(path, exc)) from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except Exception as exc:  # a torn or foreign file: torch raises many kinds
        raise CheckpointError(_unreadable(path, exc)) from None
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


@dataclass
class RngState:
    """Every random stream a proxy run draws from, so a resumed run continues bit for bit."""

    torch: torch.Tensor  # torch's global generator: model init, dropout, sampled placements
    cuda: list[torch.Tensor] | None  # every CUDA device's generator; None for a run on CPU
    data: torch.Tensor  # the training batches' generator
    loops: torch.Tensor  # the loop-count sampler's generator

    @classmethod
    def capture(cls, data: torch.Generator, loops: torch.Generator, cuda: bool) -> RngState:
        import torch

        return cls(torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None,
                   data.get_state(), loops.get_state())

    def restore(self, data: torch.Generator, loops: torch.Generator, cuda: bool) -> None:
        import torch

        torch.set_rng_state(self.torch)
        if cuda:
            torch.cuda.set_rng_state_all(self.cuda)
        data.set_state(self.data)
        loops.set_state(self.loops)


@dataclass
class CurriculumState:
    """Where a state-tracking curriculum stands: its stage and the best value at each n."""

    index: int
    stage_acc: dict[int, float]


@dataclass
class TrainState:
    """A proxy run's checkpoint: the weights, AdamW's state, the progress through the
    schedule and the curriculum, the history so far and every RNG stream. The schedule's
    position is ``step`` and ``stage_start`` (the curriculum stage's first step); the
    learning rate is recomputed from them, so no scheduler state is kept."""

    fingerprint: str  # :func:`fingerprint` of the run's arch and config
    step: int
    arch: dict[str, Any]  # the spec as given to the trainer (JSON), for ``train --resume``
    config: dict[str, Any]  # the TrainConfig (JSON)
    stage_start: int
    tokens: int
    losses: list[float]
    depth_rows: dict[str, int]
    evals: list[dict[str, Any]]  # EvalRecord dumps: {"step", "metrics"}
    model: dict[str, Any]  # the model's state_dict
    optimizer: dict[str, Any]  # the optimizer's state_dict
    rng: RngState
    curriculum: CurriculumState | None

    def matches(self, arch: Any, config: Any) -> bool:
        """Whether a run of ``arch`` and ``config`` may resume from this state (see
        :func:`fingerprint`): the saved arch is read through today's spec first, so a value
        whose meaning is unchanged but whose spelling is (Mamba2's old written-out chunk
        256: :func:`nas.spec.migrate_arch`) still matches. ``arch`` is migrated too: the
        migration cannot tell an old stored 256 from one a person wrote, so both sides read
        alike and a spec that sets ``chunk_size: 256`` resumes its own checkpoint."""
        from nas.spec import migrate_arch, stored_spec

        try:
            saved, config_data = json.loads(self.fingerprint)
            saved = stored_spec(saved).model_dump(mode="json")
        except (ValueError, TypeError):  # an arch that no longer validates
            return False
        ours, our_config = json.loads(fingerprint(arch, config))
        return json.dumps([saved, config_data], sort_keys=True) == json.dumps([migrate_arch(ours), our_config],
                                                                              sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        """The dict a checkpoint file holds (the RNG states and curriculum as nested dicts)."""
        return {**_fields(self), "rng": _fields(self.rng),
                "curriculum": _fields(self.curriculum) if self.curriculum is not None else None}

    @classmethod
    def from_dict(cls, ckpt: dict[str, Any], path: str | Path = "checkpoint") -> TrainState:
        """The state in ``ckpt`` (what :func:`load` returns); a dict that is not a proxy
        run's checkpoint is a :class:`CheckpointError` naming ``path``."""
        try:
            curriculum = ckpt["curriculum"]
            return cls(**{**{f.name: ckpt[f.name] for f in dataclasses.fields(cls)},
                          "rng": RngState(**ckpt["rng"]),
                          "curriculum": None if curriculum is None else CurriculumState(**curriculum)})
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: not a training checkpoint ({type(exc).__name__}: {exc})") from None


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields by name, the values themselves (``asdict`` would copy tensors)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def fingerprint(arch: Any, config: Any) -> str:
    """What a checkpoint of ``arch`` (an ArchSpec) and ``config`` (a TrainConfig) must
    match to be resumed. The progress bar may differ, and so may the step or token budget:
    a resumed run may be extended to more steps."""
    config_data = config.model_dump(mode="json", exclude={"progress", "steps", "tokens"})
    return json.dumps([arch.model_dump(mode="json"), config_data], sort_keys=True)


def save_state(path: str | Path, state: TrainState) -> None:
    """Write a proxy run's checkpoint atomically (:func:`save`)."""
    save(path, state.to_dict())


def load_state(path: str | Path, cap: int | None = None) -> TrainState:
    """The proxy run's checkpoint at ``path`` (:func:`load`: weights only, within ``cap``);
    its tensors on the CPU, where RNG states live (``load_state_dict`` moves the rest)."""
    return TrainState.from_dict(load(path, cap=cap), path)


def _mb(size: int) -> str:
    return f"{size / (1 << 20):,.0f} MB" if size >= 1 << 20 else f"{size:,} bytes"


def _unreadable(path: str | Path, exc: Exception) -> str:
    return (f"{path}: not a readable checkpoint (torn, truncated, or not written by torch.save; "
            f"{type(exc).__name__})")


__all__ = ["ALLOWANCE", "BYTES_PER_PARAM", "CHECKPOINT", "MAX_CHECKPOINT", "RESULT", "VOCAB_ROOM", "CheckpointError",
           "CurriculumState", "LinkError", "RngState", "TrainState", "atomic", "checkpoint_cap", "fingerprint", "load",
           "load_state", "own_dir", "run_folder", "save", "save_figure", "save_state", "write_text"]
