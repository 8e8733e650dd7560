"""The proxy's pre-flight: trainer settings read as the trainer will read them and their
task built once, so a bad field or task parameter is one clear error before anything
trains, not the same failure in every trial. The one check a sweep
(:func:`.driver.check_proxy`), ``loopnas train`` and a one-shot supernet make."""
from __future__ import annotations

from typing import Any

from nas.errors import Problem, SpecError, from_validation_error
from nas.proxy import TrainConfig


def preflight(data: dict[str, Any], where: tuple[str, ...] = (), source: str | None = None) -> TrainConfig:
    """``data`` as a :class:`TrainConfig`, its task (a curriculum's: its first stage's)
    built once. A problem is a :class:`SpecError` whose paths start with ``where`` (the
    settings' place in the file ``source``: ``("proxy",)``)."""
    from pydantic import ValidationError

    from runners.tasks import Curriculum, make_task

    try:
        config = TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, TrainConfig, where).with_source(source) from None
    try:
        if config.curriculum is not None:
            Curriculum(config.curriculum.stages, config.curriculum.threshold).task(**config.task_params)
        else:
            make_task(config.task, **config.task_params)
    except (TypeError, ValueError, FileNotFoundError) as exc:
        raise SpecError([Problem(".".join((*where, f"task {config.task!r}")), str(exc))], source) from None
    return config


__all__ = ["preflight"]
