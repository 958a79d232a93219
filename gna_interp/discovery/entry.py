"""The entry scan of G&A discovery: ablate a head only at the final position, then only
on the segment tokens, then only at the segment ends; a head's output at position ``t``
enters the residual stream at ``t`` alone, so this says where its effect comes in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.interventions import Ablate
from ..models.jobs import is_batched_remote
from ..progress import progress_bar
from ..scoring.evaluation import evaluate_many
from .memo import accuracy as _accuracy

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask, Task


ENTRY_POSITIONS = ("final", "segments", "ends")
"""The entry scan's position sets, in the order it measures them."""


def segment_positions(encoded: EncodedTask) -> Tensor:
    """``[batch, pos]`` bool: every token of every segment (first token to segment end, inclusive)."""
    cols = torch.arange(encoded.batch.n_pos)
    inside = (cols >= encoded.spans[..., :1]) & (cols < encoded.spans[..., 1:2])  # [batch, segment, pos]
    return inside.any(1)


def entry_scan(
    model: GnaModel,
    task: Task,
    encoded: EncodedTask,
    heads: Sequence[Head],
    *,
    progress: bool = True,
    extra: Sequence[list[Head]] = (),
    extra_values: list[float] | None = None,
    where: Sequence[str] = ENTRY_POSITIONS,
    cleared: Mapping[int, float] | None = None,
) -> dict[Head, dict[str, float]]:
    """Per head: task accuracy with it ablated only at each prompt's ``final`` position,
    only on its ``segments`` (`segment_positions`), and only at the segment ``ends`` (the
    paper's Gather writes its summary there; a head writing elsewhere in the segments,
    e.g. tagging each word with its label, shows a small ``ends`` effect). Empty when
    candidates span several tokens: their continuation batches are re-padded, so
    positions move. ``extra``: groups ablated at every position, measured in the same
    request on a remote model (a remote head scan's search), their accuracies appended to
    ``extra_values`` (nothing measured when the scan measures nothing). ``where``: which of
    the three to measure (locally: `discover` measures only what its labels read).
    ``cleared``: ``{layer: accuracy}`` of layers whose heads, ablated together at every
    position but the final one, cost less than the threshold (the position scan's
    `PositionScan.cleared`): locally, a head of such a layer holds that accuracy on its
    segments and at their ends (where neither holds a final position), not measured alone:
    a part of a group that costs nothing costs nothing (group testing's premise), as a
    cleared group's heads hold its accuracy."""
    if not encoded.single_token or not heads:
        return {}
    unknown = [name for name in where if name not in ENTRY_POSITIONS]
    if unknown:
        raise GnaValueError(f"where={list(where)!r}: {unknown[0]!r} is not an entry position set; expected some of {list(ENTRY_POSITIONS)}")
    every = {"final": encoded.final, "segments": segment_positions(encoded), "ends": encoded.segment_ends}
    chosen = {name: every[name] for name in where}
    if is_batched_remote(model):  # every evaluation in one request
        runs = [(task, [Ablate([head], positions=positions)]) for head in heads for positions in chosen.values()]
        results = [result.accuracy for result in evaluate_many(model, [*runs, *((task, [Ablate(g)]) for g in extra)])]
        if extra_values is not None:
            extra_values += results[len(runs) :]
        values = iter(results)
        return {head: {name: next(values) for name in chosen} for head in heads}
    if extra_values is not None:
        extra_values += [_accuracy(model, task, [Ablate(g)]) for g in extra]
    inside = _outside_final(encoded, every)
    out: dict[Head, dict[str, float]] = {}
    for head in progress_bar(list(heads), show=progress, desc="entry scan"):
        group = (cleared or {}).get(head.layer)
        out[head] = {
            name: group if group is not None and name in inside else _accuracy(model, task, [Ablate([head], positions=positions)])
            for name, positions in chosen.items()
        }
    return out


def _outside_final(encoded: EncodedTask, every: dict[str, Tensor]) -> set[str]:
    """The entry position sets of ``every`` that hold no prompt's final position (``"segments"``,
    ``"ends"`` on a task whose segments end before it): parts of every position but the final one."""
    rows = torch.arange(encoded.batch.n_rows)
    final = torch.zeros(encoded.batch.n_rows, encoded.batch.n_pos, dtype=torch.bool)
    final[rows, encoded.final] = True
    masks = {"segments": every["segments"], "ends": torch.zeros_like(final)}
    masks["ends"][rows[:, None].expand_as(encoded.segment_ends), encoded.segment_ends] = True
    return {name for name, mask in masks.items() if not bool((mask & final).any())}
