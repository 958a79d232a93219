"""Retrieval tasks with position annotations: the toy task, MMLU, KV retrieval."""

from .base import EncodedTask, Example, Segment, Task
from .kv import kv_retrieval
from .mcq import mcq_example, shuffle_labels
from .mmlu import mmlu, mmlu_subjects
from .toy import toy_mcq, toy_tokenizer

__all__ = [
    "EncodedTask",
    "Example",
    "Segment",
    "Task",
    "kv_retrieval",
    "mcq_example",
    "mmlu",
    "mmlu_subjects",
    "shuffle_labels",
    "toy_mcq",
    "toy_tokenizer",
]
