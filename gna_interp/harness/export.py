"""`write_task`: a gna_interp `Task` as an lm-eval task folder (offline, no hub).

The folder holds ``<name>.jsonl`` (one document per prompt) and ``<name>.yaml``, a task
config that reads it through ``dataset_path: json``; pass the folder as
``include_path`` to `gna_interp.lm_eval` or to lm-eval's CLI. Each document keeps the
prompt's exact text and candidates, so lm-eval asks the model exactly what
`gna_interp.evaluate` asks:

- multiple choice: context = the prompt, choices = the task's candidates
  (``" A"``... with the leading space, so ``target_delimiter`` is empty), metric ``acc``;
- ``generative=True``: greedy generation after the prompt until a newline, compared with
  the correct candidate (both stripped of surrounding whitespace), metric ``exact_match``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..core.errors import GnaValueError
from ..tasks.base import Task, not_a_task

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def write_task(task: Task, folder: str | Path, name: str | None = None, *, generative: bool = False, max_gen_toks: int = 8) -> Path:
    """Write ``task`` as an lm-eval task ``name`` into ``folder`` (created if needed).

    Args:
        task: any `Task` (toy, MMLU, KV retrieval...).
        folder: the ``include_path`` to give lm-eval.
        name: the lm-eval task name (default: the task's name, ``:`` made ``_``).
        generative: a ``generate_until`` task instead of multiple choice.
        max_gen_toks: generation length of a generative task.

    Returns:
        ``folder`` (as a `Path`).
    """
    if not isinstance(task, Task):
        raise not_a_task(task, "write_task")
    name = name if name is not None else task.name.replace(":", "_")
    if not isinstance(name, str) or not _NAME.match(name):
        raise GnaValueError(f"task name {name!r}: expected letters, digits, '_', '.' or '-' (an lm-eval task name)")
    if isinstance(max_gen_toks, bool) or not isinstance(max_gen_toks, int) or max_gen_toks < 1:
        raise GnaValueError(f"max_gen_toks={max_gen_toks!r}: expected a positive int")
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    data = (root / f"{name}.jsonl").resolve()
    rows = [{"prompt": e.text, "choices": list(e.candidates), "answer": e.correct, "target": e.candidates[e.correct].strip()} for e in task]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = _generative(name, data, max_gen_toks) if generative else _multiple_choice(name, data)
    # JSON is YAML: no YAML writer needed, and every string is quoted exactly.
    (root / f"{name}.yaml").write_text(json.dumps(config, indent=1) + "\n")
    return root


def _common(name: str, data: Path) -> dict[str, Any]:
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "doc_to_text": "prompt",
        "metadata": {"version": 1.0, "source": "gna_interp.harness.write_task"},
    }


def _multiple_choice(name: str, data: Path) -> dict[str, Any]:
    return {
        **_common(name, data),
        "output_type": "multiple_choice",
        "doc_to_choice": "choices",
        "doc_to_target": "answer",
        "target_delimiter": "",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }


def _generative(name: str, data: Path, max_gen_toks: int) -> dict[str, Any]:
    return {
        **_common(name, data),
        "output_type": "generate_until",
        "doc_to_target": "target",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": max_gen_toks, "do_sample": False},
        "filter_list": [{"name": "strip", "filter": [{"function": "remove_whitespace"}, {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
    }
