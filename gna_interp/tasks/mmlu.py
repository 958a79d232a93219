"""MMLU in the lm-eval-harness 0-shot format, from the hub (``cais/mmlu``) or local files.

Prompt (exactly lm-eval's ``mmlu`` task; underscores in the subject become spaces)::

    The following are multiple choice questions (with answers) about <subject>.

    <question>
    A. <choice 0>
    B. <choice 1>
    C. <choice 2>
    D. <choice 3>
    Answer:

scored by the log-probabilities of the continuations ``" A"`` ... ``" D"`` (tokenized
after the prompt, so each tokenizer gets its own answer tokens).

Local files use ``cais/mmlu``'s schema: ``question`` (str), ``subject`` (str),
``choices`` (list of 4 str) and ``answer`` (int 0-3, or a letter). Parquet, JSONL/JSON
and CSV are read; in CSV, ``choices`` is a JSON list, or four columns ``A B C D``.
"""

from __future__ import annotations

import difflib
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.errors import GnaValueError
from .base import Task
from .mcq import LETTERS, mcq_example, rotate_options

SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge", "college_biology",
    "college_chemistry", "college_computer_science", "college_mathematics", "college_medicine", "college_physics",
    "computer_security", "conceptual_physics", "econometrics", "electrical_engineering", "elementary_mathematics",
    "formal_logic", "global_facts", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
    "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history", "high_school_world_history",
    "human_aging", "human_sexuality", "international_law", "jurisprudence", "logical_fallacies", "machine_learning",
    "management", "marketing", "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law", "professional_medicine",
    "professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
    "world_religions",
)  # fmt: skip
SPLITS = ("test", "validation", "dev", "auxiliary_train")
N_CHOICES = 4
_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")


def mmlu_prompt_header(subject: str, question: str) -> str:
    """Everything before the first option."""
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n{question.strip()}\n"


def mmlu(
    subjects: str | Sequence[str] | None = None,
    n: int | None = None,
    split: str = "test",
    path: str | Path | None = None,
    *,
    seed: int | None = None,
) -> Task:
    """MMLU questions as a `Task` (no tokenizer of its own: it takes the model's).

    Args:
        subjects: one subject, a list, or ``None`` for all 57.
        n: keep the first ``n`` questions (after shuffling with ``seed``, if given).
        split: ``"test"``, ``"validation"``, ``"dev"`` or ``"auxiliary_train"``.
        path: a local file or folder in ``cais/mmlu``'s schema; ``None`` reads the hub
            through ``datasets`` (``pip install gna-interp[data]``).
        seed: shuffle the questions before taking ``n``.
    """
    chosen = _check_subjects(subjects)
    if split not in SPLITS:
        raise GnaValueError(f"unknown split {split!r}: expected one of {SPLITS}")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise GnaValueError(f"n={n!r}: expected a positive number of questions, or None for all")
    rows = _local_rows(Path(path), split) if path is not None else _hub_rows(chosen, split)
    if chosen is not None:
        wanted = set(chosen)
        rows = [r for r in rows if r[1].get("subject") in wanted]
        if not rows:
            raise GnaValueError(f"no questions for subjects {sorted(wanted)} in {path or 'cais/mmlu'} (split {split!r})")
    if seed is not None:
        random.Random(seed).shuffle(rows)
    examples = [_example(where, row) for where, row in rows[:n]]
    if not examples:
        raise GnaValueError(f"no MMLU questions found in {path or 'cais/mmlu'} (split {split!r})")
    return Task("mmlu", examples, corrupter=rotate_options)


def _check_subjects(subjects: str | Sequence[str] | None) -> list[str] | None:
    if subjects is None:
        return None
    chosen = [subjects] if isinstance(subjects, str) else list(subjects)
    if not chosen:
        raise GnaValueError("subjects is empty: give subject names, or None for all")
    for subject in chosen:
        if subject not in SUBJECTS:
            near = difflib.get_close_matches(str(subject), SUBJECTS, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else "; the 57 subjects are gna_interp.tasks.mmlu_subjects()"
            raise GnaValueError(f"unknown MMLU subject {subject!r}{hint}")
    return chosen


def mmlu_subjects() -> list[str]:
    return list(SUBJECTS)


def _example(where: str, row: dict[str, Any]) -> Any:
    for name in ("question", "choices", "answer"):
        if row.get(name) is None:
            raise GnaValueError(f"{where}: missing field {name!r} (expected question, subject, choices, answer)")
    choices = row["choices"]
    if isinstance(choices, str):
        choices = json.loads(choices)
    choices = [str(c) for c in list(choices)]
    if len(choices) != N_CHOICES:
        raise GnaValueError(f"{where}: {len(choices)} choices, expected {N_CHOICES}")
    answer = row["answer"]
    if isinstance(answer, str) and answer.strip() in LETTERS[:N_CHOICES]:
        answer = LETTERS.index(answer.strip())
    try:
        index = int(answer)
    except (TypeError, ValueError):
        raise GnaValueError(f"{where}: answer {answer!r} is not an index 0-3 or a letter A-D") from None
    if not 0 <= index < N_CHOICES:
        raise GnaValueError(f"{where}: answer {index} out of range 0..{N_CHOICES - 1}")
    subject = str(row.get("subject") or "")
    header = mmlu_prompt_header(subject, str(row["question"]))
    return mcq_example(header, choices, index, meta={"subject": subject, "source": where})


_OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
"""Names of `datasets.config`'s offline switch across the releases in range."""


def _hub_rows(subjects: list[str] | None, split: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "loading MMLU from the hub needs `datasets`: pip install 'gna-interp[data]', or pass path= to local files"
        ) from None
    from huggingface_hub import constants

    from ..network import PROBE_TIMEOUT_S, hub_reachable

    # the flag's name in datasets' config: HF_HUB_OFFLINE (recent) or HF_DATASETS_OFFLINE (older, e.g. 2.19)
    offline = bool(constants.HF_HUB_OFFLINE or any(getattr(datasets.config, name, False) for name in _OFFLINE_FLAGS))
    if not offline and not hub_reachable():  # datasets would retry every file for half a minute
        raise OSError(
            f"cannot load MMLU: the dataset hub ({constants.ENDPOINT}) did not answer within {PROBE_TIMEOUT_S:.0f} s; "
            "pass path= to local MMLU files (parquet / JSONL / CSV; the CLI's --mmlu-path), or set "
            "HF_DATASETS_OFFLINE=1 to read a copy cached by an earlier download"
        )
    rows = []
    for config in subjects or ["all"]:
        try:
            loaded = datasets.load_dataset("cais/mmlu", config, split=split)
        except ConnectionError as error:  # offline and not cached
            raise OSError(
                f"cannot load MMLU ('cais/mmlu', {config!r}): {error}; pass path= to local MMLU files "
                "(parquet / JSONL / CSV; the CLI's --mmlu-path)"
            ) from None
        for i, row in enumerate(loaded):
            rows.append((f"cais/mmlu:{config}:{split} row {i}", dict(row)))
    return rows


def _local_rows(path: Path, split: str) -> list[tuple[str, dict[str, Any]]]:
    if not path.exists():
        raise FileNotFoundError(f"MMLU path {str(path)!r} does not exist")
    if path.is_file():
        files = [path]
    else:
        found = sorted(p for p in path.rglob("*") if p.suffix in _SUFFIXES)
        files = [p for p in found if p.name.startswith(split)]
        if not files:
            raise GnaValueError(f"no {split!r} files ({', '.join(_SUFFIXES)}) under {str(path)!r}: found {[p.name for p in found][:5]}")
    rows = []
    for file in files:
        subject_from_folder = file.parent.name if file.parent.name in SUBJECTS else None
        for i, row in enumerate(_read_table(file)):
            if not row.get("subject") and subject_from_folder:
                row["subject"] = subject_from_folder
            rows.append((f"{file.name} row {i}", row))
    return rows


def _read_table(file: Path) -> list[dict[str, Any]]:
    import pandas as pd

    if file.suffix == ".parquet":
        frame = pd.read_parquet(file)
    elif file.suffix == ".jsonl":
        frame = pd.read_json(file, lines=True)
    elif file.suffix == ".json":
        frame = pd.read_json(file)
    elif file.suffix == ".csv":
        frame = pd.read_csv(file, keep_default_na=False)
        if "choices" not in frame.columns and set("ABCD") <= set(frame.columns):
            frame["choices"] = frame[list("ABCD")].astype(str).values.tolist()
    else:
        raise GnaValueError(f"unsupported MMLU file {file.name!r}: expected one of {_SUFFIXES}")
    records = frame.to_dict(orient="records")
    return [{str(k): _plain(v) for k, v in record.items()} for record in records]


def _plain(value: Any) -> Any:
    """numpy arrays (parquet list columns) and scalars -> Python values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None  # a field missing from this row only
    return value
