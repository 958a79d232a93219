"""Which roles hold under which ablation kinds: the keys of the kinds check (`kinds`) and
its text, read from a circuit's accuracies and verdicts (no import of the circuit: it reads
these).

Discovery zero-ablates. The kinds check (the ``"kinds"`` stage, `kinds.kinds_check`)
ablates each role's set (and both together) again with the other kinds, the head's output
replaced by its mean over the task's tokens (``"mean"``) or by its output on the corrupted
prompts (``"resample"``), at every position and at the role's positions (the Gather role's
segment ends, or segments; the Aggregate role's final position). Its accuracies are kept as
``"-gather@mean"`` (every position) and ``"-gather@mean:ends"`` (the role's positions), its
verdicts as ``"collapses:-gather@mean"``; zero ablation at every position is the
confirmation's (``"-gather"``, ``"collapses:-gather"``). A role *holds* under a kind when its
set, so ablated at every position, collapses accuracy to chance + ``chance_margin``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KINDS = ("zero", "mean", "resample")
"""Every ablation kind the check names (zero: the confirmation's)."""
CHECKED = ("mean", "resample")
"""The kinds the check may add (`DiscoverySettings.ablation_kinds`)."""
SETS = ("-gather", "-aggregate", "-both")
"""The ablations it repeats (the confirmation's)."""


def key(name: str, kind: str, where: str | None = None) -> str:
    """The accuracy key of ``name`` (``"-gather"``) ablated by ``kind``, at every position
    (``where`` None) or at ``where`` (``"ends"``, ``"final"``...): zero at every position
    is the confirmation's own key."""
    base = name if kind == "zero" else f"{name}@{kind}"
    return base if where is None else f"{base}:{where}" if kind != "zero" else f"{name}@zero:{where}"


def verdict_key(name: str, kind: str) -> str:
    """The collapse verdict's key of ``name`` ablated by ``kind`` at every position."""
    return f"collapses:{key(name, kind)}"


def table(accuracy: Mapping[str, float], verdicts: Mapping[str, object], where: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per set the check measured: ``set``, and per kind measured its accuracy at every
    position (``kind``), at the role's positions (``kind:where``, ``where`` the set's positions
    name) and its verdict's word (``kind?``: ``"collapses"``, ``"does not collapse"``,
    ``"undetermined"``; ``None`` when not tested)."""
    rows = []
    for name in SETS:
        row: dict[str, Any] = {"set": name}
        for kind in KINDS:
            every = accuracy.get(key(name, kind))
            if every is None or (kind == "zero" and not any(k.startswith(f"{name}@") for k in accuracy)):
                continue
            row[kind] = every
            named = where.get(name)
            if named is not None and key(name, kind, named) in accuracy:
                row[f"{kind}:{named}"] = accuracy[key(name, kind, named)]
            verdict = verdicts.get(verdict_key(name, kind))
            row[f"{kind}?"] = getattr(verdict, "word", None)
        if len(row) > 1:
            rows.append(row)
    return rows


def holds(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Per set of `table`, the kinds under which it collapses accuracy (its verdict's word)."""
    return {str(row["set"]): [kind for kind in KINDS if row.get(f"{kind}?") == "collapses"] for row in rows}


def describe(rows: list[dict[str, Any]], where: Mapping[str, str]) -> list[str]:
    """Lines: per set, each kind's accuracy at every position and at its positions, and the
    kinds it holds under (``"-gather: zero 0.29 (ends 0.27) collapses; mean 0.235 (ends 0.81)
    collapses; ...; holds under zero, mean"``)."""
    lines = []
    held = holds(rows)
    for row in rows:
        name, parts = str(row["set"]), []
        for kind in KINDS:
            if kind not in row:
                continue
            at = f"{kind}:{where.get(name)}"
            inner = f" ({where[name]} {row[at]:.3f})" if at in row else ""
            parts.append(f"{kind} {row[kind]:.3f}{inner} {row.get(f'{kind}?') or 'untested'}")
        kinds = ", ".join(held[name]) or "none"
        lines.append(f"{name}: {'; '.join(parts)}; holds under {kinds}")
    return lines


def describe_kinds(accuracy: Mapping[str, float], verdicts: Mapping[str, object], settings: Mapping[str, Any]) -> list[str]:
    """The summary's lines of the kinds check recorded in a circuit's ``settings``
    (``"kinds_checked"``: none without it): a header, then `describe`'s line per set."""
    checked = settings.get("kinds_checked")
    if not checked:
        return []
    where = checked.get("where", {})
    rows = table(accuracy, verdicts, where)
    kinds = ", ".join(checked["kinds"])
    head = f"the sets ablated by kind ({kinds}), at every position (at the set's positions); holds: collapses to chance"
    return [head, *describe(rows, where)] if rows else []
