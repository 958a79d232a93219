"""Multiple-choice prompts from a file: JSON lines or CSV, one prompt per row, each built by
`mcq_example` (MMLU's layout: ``A. <option>`` lines, then ``Answer:``). What ``gna-interp
discover --task FILE`` reads; the format is in docs/tasks.md ("Prompts from a file").

A row has ``question`` (text before the options; may be empty), ``options`` (a list of two
or more option texts; in CSV a JSON list, or one column per option headed ``A``, ``B``...),
``answer`` (the correct option: its label, e.g. ``"B"``, or its index from 0) and, optionally,
``labels`` (the options' labels in order, default ``A``, ``B``...). An error names the file,
the row (counted from 1: a CSV's header and blank JSON lines are not rows), its line and the field.
"""

from __future__ import annotations

import csv
import difflib
import json
import string
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import GnaValueError
from .base import Example, Task
from .mcq import mcq_example, rotate_options

FIELDS = ("question", "options", "answer", "labels")
"""The fields of a row (a CSV may give the options as columns ``A``, ``B``... instead)."""
SUFFIXES = (".jsonl", ".csv")


def task_file(path: str | Path, n: int | None = None, *, name: str | None = None) -> Task:
    """A `Task` of the multiple-choice prompts in a JSON-lines or CSV file.

    Args:
        path: a ``.jsonl`` file (one JSON object per line) or a ``.csv`` file (a header row).
        n: keep the first ``n`` prompts (default: all).
        name: the task's name (default: the file's name without its suffix).

    Raises:
        ValueError: an unknown suffix, an empty file, or a bad row, naming the row, its line
            and the field.
    """
    file = Path(path)
    if file.suffix.lower() not in SUFFIXES:
        raise GnaValueError(f"task file {str(file)!r}: expected a {' or '.join(SUFFIXES)} file of prompts (docs/tasks.md)")
    if not file.is_file():
        raise GnaValueError(f"task file {str(file)!r} does not exist")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise GnaValueError(f"n={n!r}: expected a positive number of prompts, or None for all")
    rows = _jsonl_rows(file) if file.suffix.lower() == ".jsonl" else _csv_rows(file)
    return mcq_records(rows[:n] if n is not None else rows, name=name or file.stem, where=file.name)


def mcq_records(rows: Iterable[tuple[int, Mapping[str, Any]]], *, name: str = "records", where: str = "records") -> Task:
    """A `Task` of ``(line, row)`` pairs, each row a mapping of `FIELDS` (see the module's
    docstring); ``where`` names the source in errors. Every prompt must have as many options
    as the first."""
    examples: list[Example] = []
    first = None
    for number, (line, row) in enumerate(rows, start=1):
        at = f"{where} row {number} (line {line})"
        example = _example(row, at)
        if first is None:
            first = len(example.segments)
        elif len(example.segments) != first:
            raise GnaValueError(
                f"{at}, field 'options': {len(example.segments)} options, but row 1 has {first}: every prompt needs the same number"
            )
        examples.append(example)
    if not examples:
        raise GnaValueError(f"{where}: no prompts (expected one row per prompt: {', '.join(FIELDS[:3])})")
    return Task(name, examples, corrupter=rotate_options)


def _example(row: Mapping[str, Any], at: str) -> Example:
    unknown = [key for key in row if key not in FIELDS]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise GnaValueError(f"{at}: unknown field {key!r}{hint}: a row has {', '.join(FIELDS)}")
    question = row.get("question", "")
    if not isinstance(question, str):
        raise GnaValueError(f"{at}, field 'question': {question!r}: expected text (or leave it out)")
    options = _text_list(row, "options", at, required=True)
    labels = _text_list(row, "labels", at, required=False) or list(string.ascii_uppercase[: len(options)])
    correct = _answer(row, at, labels)
    header = question if not question or question.endswith("\n") else question + "\n"
    try:
        return mcq_example(header, options, correct, labels=labels)
    except ValueError as error:
        raise GnaValueError(f"{at}: {error}") from None


def _text_list(row: Mapping[str, Any], field: str, at: str, required: bool) -> list[str]:
    """``row[field]`` as a list of texts (a JSON list given as text, as in a CSV cell, too)."""
    value = row.get(field)
    if value is None or value == "":
        if required:
            raise GnaValueError(f"{at}: field {field!r} is missing: expected a list of at least 2 texts")
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise GnaValueError(f"{at}, field {field!r}: {value!r} is not a JSON list of texts") from None
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(v, (str, int, float)) and str(v) for v in value):
        raise GnaValueError(f"{at}, field {field!r}: {value!r}: expected a list of at least 2 non-empty texts")
    return [str(v) for v in value]


def _answer(row: Mapping[str, Any], at: str, labels: list[str]) -> int:
    """The correct option's index: ``answer`` as one of ``labels`` or as an index from 0."""
    answer = row.get("answer")
    expected = f"expected a label ({', '.join(labels)}) or an index 0..{len(labels) - 1}"
    if answer is None or answer == "":
        raise GnaValueError(f"{at}: field 'answer' is missing: {expected}")
    text = str(answer).strip()
    if text in labels:
        return labels.index(text)
    if isinstance(answer, bool) or not (isinstance(answer, int) or text.isdigit()):
        raise GnaValueError(f"{at}, field 'answer': {answer!r}: {expected}")
    if not 0 <= int(text) < len(labels):
        raise GnaValueError(f"{at}, field 'answer': {answer!r} is out of range: {expected}")
    return int(text)


def _jsonl_rows(file: Path) -> list[tuple[int, Mapping[str, Any]]]:
    rows: list[tuple[int, Mapping[str, Any]]] = []
    for line, text in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip():
            continue
        at = f"{file.name} row {len(rows) + 1} (line {line})"
        try:
            row = json.loads(text)
        except json.JSONDecodeError as error:
            raise GnaValueError(f"{at}: not valid JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(row, dict):
            raise GnaValueError(f"{at}: {type(row).__name__} {text[:60]!r}: expected a JSON object with {', '.join(FIELDS[:3])}")
        rows.append((line, row))
    return rows


def _csv_rows(file: Path) -> list[tuple[int, Mapping[str, Any]]]:
    """The CSV's rows as mappings; option columns ``A``, ``B``... become ``options``."""
    with file.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        letters = [c for c in string.ascii_uppercase if c in columns]
        if letters and letters != list(string.ascii_uppercase[: len(letters)]):
            raise GnaValueError(f"{file.name}: option columns {letters}: expected A, B, C... without gaps")
        rows: list[tuple[int, Mapping[str, Any]]] = []
        for record in reader:
            row: dict[str, Any] = {k: v for k, v in record.items() if k not in letters}
            if None in row:  # more cells than the header has
                raise GnaValueError(
                    f"{file.name} row {len(rows) + 1} (line {reader.line_num}): more cells than the header's {len(columns)}"
                )
            if letters:
                if "options" in row:
                    raise GnaValueError(f"{file.name}: both an 'options' column and option columns {letters}: give one of them")
                row["options"] = [record[c] for c in letters if record[c]]  # a shorter row leaves its last cells empty
            rows.append((reader.line_num, row))
    return rows
