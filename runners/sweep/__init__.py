"""Search: sweeps over a space on Ray Tune or Optuna, and the experiment directory they write."""
from runners.results.records import (
    ExperimentRecord, Objective, Point, Rung, TrialRecord, read_experiment, read_trials, write_json,
)

__all__ = ["ExperimentRecord", "Objective", "Point", "Rung", "TrialRecord", "read_experiment",
           "read_trials", "write_json"]
