"""Retrieval tasks with position annotations: the toy task, MMLU, KV retrieval, and
prompts of your own (`mcq_example`, `kv_example`, a JSON-lines or CSV file: `task_file`,
or `Example` and `Segment` by hand)."""

from .base import EncodedTask, Example, Segment, Task, check_example
from .kv import PROBE_PAIRS, kv_example, kv_probe, kv_retrieval, rotate_values
from .mcq import mcq_example, rotate_options, shuffle_labels
from .mmlu import mmlu, mmlu_subjects
from .records import mcq_records, task_file
from .toy import toy_mcq, toy_tokenizer

__all__ = [
    "PROBE_PAIRS",
    "EncodedTask",
    "Example",
    "Segment",
    "Task",
    "check_example",
    "kv_example",
    "kv_probe",
    "kv_retrieval",
    "mcq_example",
    "mcq_records",
    "mmlu",
    "mmlu_subjects",
    "rotate_options",
    "rotate_values",
    "shuffle_labels",
    "task_file",
    "toy_mcq",
    "toy_tokenizer",
]
