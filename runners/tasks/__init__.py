"""Proxy tasks: synthetic probes and text language modelling behind one ``Task`` protocol.

``make_task(name, **params)`` builds any registered task: ``state_tracking``, ``mqar``,
``s5``, ``lm``, ``hop_induction``, ``pointer_chase``.
"""
from runners.tasks.base import (
    IGNORE_INDEX,
    SPLITS,
    Task,
    accuracy_metrics,
    last_answer_accuracy,
    make_task,
    register_task,
    split_generator,
    task_names,
)
from runners.tasks.hop_induction import HopInduction
from runners.tasks.lm import ByteTokenizer, HFTokenizer, LMTask, load_tokenizer, pack
from runners.tasks.mqar import MQAR, ZOOLOGY_TEST, ZOOLOGY_TRAIN
from runners.tasks.pointer_chase import PointerChase
from runners.tasks.state_tracking import Curriculum, StateTracking
from runners.tasks.word_problem import PermutationWordProblem, permutation_table

__all__ = [
    "IGNORE_INDEX",
    "MQAR",
    "SPLITS",
    "ByteTokenizer",
    "Curriculum",
    "HFTokenizer",
    "HopInduction",
    "LMTask",
    "PermutationWordProblem",
    "PointerChase",
    "StateTracking",
    "Task",
    "ZOOLOGY_TEST",
    "ZOOLOGY_TRAIN",
    "accuracy_metrics",
    "last_answer_accuracy",
    "load_tokenizer",
    "make_task",
    "pack",
    "permutation_table",
    "register_task",
    "split_generator",
    "task_names",
]
