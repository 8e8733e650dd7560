"""Experiment tracking from the sweep driver (MLflow, TensorBoard, W&B) and what the
Optuna dashboard shows of a study (:mod:`runners.track.study`)."""
from .base import BACKENDS, STATE, Curve, Tracker, Tracking, wanted
from .study import annotate, mark_front

__all__ = ["BACKENDS", "STATE", "Curve", "Tracker", "Tracking", "wanted", "annotate", "mark_front"]
