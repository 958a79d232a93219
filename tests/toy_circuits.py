"""Discovery on the bundled toy models, run once per session and shared by the test
modules that need a circuit (test_discovery re-measures it, test_report draws it)."""

from __future__ import annotations

import warnings
from functools import cache

import gna_interp as gna
from gna_interp.discovery import GnaCircuit, PositionalAnswerWarning, discover

TASK_SEED = 4242  # fresh prompts: neither training nor the cards used them
TOYS = tuple(name for name in ("llama", "mamba2_counting") if name in gna.toy_names())


@cache
def discovered(name: str) -> tuple[gna.GnaModel, gna.tasks.Task, GnaCircuit, tuple[warnings.WarningMessage, ...]]:
    """``(model, task, circuit, PositionalAnswerWarnings raised)`` for toy ``name`` on 200
    fresh prompts of its task, with `discover`'s defaults. Callers must not change them."""
    model = gna.load_toy(name)
    task = gna.toy_task(name, 200, seed=TASK_SEED)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("error")  # e.g. a trained toy model must not look like chance
        warnings.simplefilter("always", PositionalAnswerWarning)  # recorded: test_the_label_check_...
        circuit = discover(model, task, progress=False)
    return model, task, circuit, tuple(w for w in caught if issubclass(w.category, PositionalAnswerWarning))
