"""The kinds check: the circuit's roles ablated by other kinds than discovery's zero
(`ablation_kinds` has the keys and the text). Mean ablation takes each head's mean output
over the task's own tokens; resample ablation its output on the task's corrupted prompts
(`Task.corrupted`; skipped, with a note, for a task without a corruption rule)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate, Intervention
from ..scoring.verdicts import Verdict, collapse_verdict
from .ablation_kinds import key, verdict_key
from .confirm import role_positions

if TYPE_CHECKING:
    from ..tasks.base import EncodedTask, Task
    from .circuit import GnaCircuit
    from .runner import Runner


def kinds_runs(
    task: Task, encoded: EncodedTask | None, circuit: GnaCircuit, kinds: Sequence[str]
) -> tuple[list[str], list[tuple[Task, list[Intervention]]], dict[str, str], str | None]:
    """What the check measures: ``(keys, runs, where, note)``. Per role with heads, its set
    ablated by each of ``kinds`` at every position and at its positions (``encoded`` None:
    every position only), and zero-ablated at its positions; both sets together by each kind
    at every position. ``where``: the positions' name per set (``{"-gather": "ends"}``);
    ``note``: why resample was skipped (the task has no corrupted prompts), else ``None``."""
    note, corrupt = None, {}
    for kind in kinds:
        if kind == "mean":
            corrupt[kind] = task
        elif kind == "resample":
            try:
                corrupt[kind] = task.corrupted()
            except GnaValueError as error:
                note = f"resample ablation not checked: {error}"
        else:
            raise GnaValueError(f"ablation kind {kind!r}: expected 'mean' or 'resample'")
    at = role_positions(circuit, encoded) if encoded is not None else {}
    sets = {f"-{role}": list(getattr(circuit, role)) for role in ("gather", "aggregate") if getattr(circuit, role)}
    if len(sets) == 2:  # both first: its forward over the sources captures every site the others read
        sets = {"-both": [*circuit.gather, *circuit.aggregate], **sets}
    where = {name: at[name[1:]][0] for name in sets if name[1:] in at}
    keys: list[str] = []
    runs: list[tuple[Task, list[Intervention]]] = []
    for kind, source in corrupt.items():
        for name, heads in sets.items():
            keys.append(key(name, kind))
            runs.append((task, [Ablate(heads, how=kind, corrupt=source)]))
            if name in where:
                keys.append(key(name, kind, where[name]))
                runs.append((task, [Ablate(heads, how=kind, corrupt=source, positions=at[name[1:]][1])]))
    for name in where:
        keys.append(key(name, "zero", where[name]))
        runs.append((task, [Ablate(sets[name], positions=at[name[1:]][1])]))
    return keys, runs, where, note


def kinds_check(
    runner: Runner, task: Task, encoded: EncodedTask | None, circuit: GnaCircuit, kinds: Sequence[str], margin: float
) -> tuple[dict[str, float], dict[str, Verdict], dict[str, Any], str | None]:
    """The check's accuracies (`kinds_runs`, measured by ``runner``: one request on a remote
    model), its collapse verdicts at every position (`verdicts.collapse_verdict` against
    chance + ``margin``, from the count of right answers: no forward of their own), the
    setting it records (``{"kinds": [...], "where": {...}}``) and its note."""
    keys, runs, where, note = kinds_runs(task, encoded, circuit, kinds)
    with runner.model.source_cache():  # each kind's sources captured once, not per run and chunk
        accuracy = dict(zip(keys, runner.accuracies(runs), strict=True)) if runs else {}
    n, chance = circuit.n_prompts, circuit.accuracy["chance"]
    verdicts = {}
    for name in ("-gather", "-aggregate", "-both"):
        for kind in kinds:
            value = accuracy.get(key(name, kind))
            if value is None or not n:
                continue
            right = round(value * n)
            if abs(right / n - value) < 1e-6:  # a count of right answers over the prompts
                heads = _count(circuit, name)
                verdicts[verdict_key(name, kind)] = collapse_verdict(
                    [True] * right + [False] * (n - right), chance, margin, f"{name} ablated ({heads} heads, {kind})"
                )
    measured = [kind for kind in kinds if any(k.startswith(f"-gather@{kind}") or k.startswith(f"-aggregate@{kind}") for k in accuracy)]
    return accuracy, verdicts, {"kinds": ["zero", *measured], "where": where}, note


def _count(circuit: GnaCircuit, name: str) -> int:
    sets: dict[str, list[Head]] = {"-gather": circuit.gather, "-aggregate": circuit.aggregate}
    return len(sets[name]) if name in sets else len(circuit.gather) + len(circuit.aggregate)
