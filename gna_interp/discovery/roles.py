"""Role scores of heads from their attention patterns (softmax or implicit).

Every pattern row is first made a distribution over keys, ``p_s = |w_s| / sum_k |w_k|``,
so softmax and SSM heads are scored on one scale. With ``S_i`` the tokens of option
``i`` (label to text, ``[start_i, end_i)``, its ``\\n`` at ``end_i`` excluded) and
``S_i+`` the same with the ``\\n``:

- **gather score**: the mass of row ``end_i`` (each option's segment end) on ``S_i``,
  averaged over options and prompts. A Gather head summarises its own segment into the
  segment end: high score. Uniform causal attention gives about ``|S_i| / end_i``.
- **aggregate mass**: the mass of the final row on all options ``S_i+``.
- **end mass**: the final row's mass on the segment-end tokens themselves (the paper's
  Aggregate pattern: reading the segment summaries).
- **selectivity**: the final row's mass on the correct option's ``S_c+`` divided by the
  aggregate mass (``1 / n_options`` for a row spread evenly over the options).
- **lift**: position-controlled selectivity: for each option slot ``j``, the mean mass on
  ``S_j+`` over prompts where ``j`` is correct divided by the mean over prompts where it
  is not, averaged over slots. 1 = the row does not depend on which option is correct
  (e.g. a recency-biased SSM row), above 1 = it prefers the correct option.
- **uniform ratio**: the correct option's mass divided by what a uniform causal row
  would put there (``|S_c+|`` over the number of real keys).
- **sharpness** of the row a role uses (segment-end rows for Gather, the final row for
  Aggregate): entropy (nats) and top-1 mass, averaged.

Thresholds (`RoleThresholds`) turn scores into labels; they are recorded in every result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..attention.pattern import attention_pattern
from ..attention.sharpness import entropy, top1_mass
from ..core.heads import Head
from ..models.inputs import Batch

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask


@dataclass(frozen=True)
class RoleThresholds:
    """How scores become labels. Only heads whose single ablation costs at least
    ``min_effect`` accuracy get a role. A head is an **Aggregate** head if its final row
    reads the options (``aggregate_mass``) and either reads the segment ends (``end_mass``,
    the paper's pattern) or puts clearly more mass on the correct option than a uniform
    row would (``uniform_ratio``). Otherwise it is a **Gather** head if its segment-end
    rows stay in their own segment (``gather``) and it sits before the last Aggregate layer."""

    min_effect: float = 0.02
    gather: float = 0.5
    aggregate_mass: float = 0.3
    end_mass: float = 0.5
    uniform_ratio: float = 1.5

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class RoleScores:
    gather: float
    aggregate_mass: float
    selectivity: float
    end_mass: float
    lift: float
    uniform_ratio: float
    gather_entropy: float
    gather_top1: float
    aggregate_entropy: float
    aggregate_top1: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _span_masks(encoded: EncodedTask, rows: slice, n_pos: int, with_end: bool) -> Tensor:
    """``[batch, segment, key]`` bool: the tokens of each option."""
    spans = encoded.spans[rows]
    cols = torch.arange(n_pos)
    start, stop = spans[..., 0:1], spans[..., 1:2] - (0 if with_end else 1)
    return (cols >= start) & (cols < stop)


def role_scores(model: GnaModel, encoded: EncodedTask, heads: Sequence[Head], n_prompts: int = 64) -> dict[Head, RoleScores]:
    """Scores of ``heads`` on the first ``n_prompts`` prompts of an encoded task."""
    rows = slice(0, min(n_prompts, encoded.batch.n_rows))
    batch = Batch(encoded.batch.input_ids[rows], encoded.batch.attention_mask[rows])
    ends = encoded.segment_ends[rows]
    n_rows, n_segments = ends.shape
    queries = torch.cat([ends, encoded.final[rows, None]], 1)  # [batch, segment + 1]
    pattern = attention_pattern(model, batch, list(heads), query_positions=queries).float()  # [batch, head, query, key]
    weights = pattern.abs()
    p = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)
    own = _span_masks(encoded, rows, batch.n_pos, with_end=False)  # [batch, segment, key]
    options = _span_masks(encoded, rows, batch.n_pos, with_end=True)
    gather = (p[:, :, :n_segments] * own[:, None]).sum(-1).mean((0, 2))  # [head]
    final = p[:, :, n_segments]  # [batch, head, key]
    per_option = (final[:, :, None] * options[:, None]).sum(-1)  # [batch, head, segment]
    total = per_option.sum(-1)
    correct = per_option.gather(2, encoded.correct[rows].view(-1, 1, 1).expand(-1, len(heads), 1)).squeeze(-1)
    selectivity = (correct / total.clamp_min(1e-30)).mean(0)
    n_keys = batch.attention_mask.sum(1).float()  # real keys of the final (causal) row
    span_len = (encoded.spans[rows, :, 1] - encoded.spans[rows, :, 0]).float()
    uniform = span_len.gather(1, encoded.correct[rows].view(-1, 1)).squeeze(1) / n_keys
    uniform_ratio = (correct / uniform[:, None]).mean(0)
    lift = _lift(per_option, encoded.correct[rows])
    end_keys = torch.zeros(n_rows, batch.n_pos, dtype=torch.bool).scatter_(1, ends, True)
    end_mass = (final * end_keys[:, None]).sum(-1).mean(0)
    sharp = {
        "gather_entropy": entropy(pattern[:, :, :n_segments]).mean((0, 2)),
        "gather_top1": top1_mass(pattern[:, :, :n_segments]).mean((0, 2)),
        "aggregate_entropy": entropy(final).mean(0),
        "aggregate_top1": top1_mass(final).mean(0),
    }
    out = {}
    for i, head in enumerate(heads):
        out[head] = RoleScores(
            gather=float(gather[i]),
            aggregate_mass=float(total.mean(0)[i]),
            selectivity=float(selectivity[i]),
            end_mass=float(end_mass[i]),
            lift=float(lift[i]),
            uniform_ratio=float(uniform_ratio[i]),
            **{name: float(values[i]) for name, values in sharp.items()},
        )
    return out


def _lift(per_option: Tensor, correct: Tensor) -> Tensor:
    """``[head]``: mean over option slots of mass(slot | correct) / mass(slot | not correct)."""
    ratios = []
    for slot in range(per_option.shape[-1]):
        is_correct = correct == slot
        if bool(is_correct.any()) and bool((~is_correct).any()):
            right = per_option[is_correct, :, slot].mean(0)
            wrong = per_option[~is_correct, :, slot].mean(0)
            ratios.append(right / wrong.clamp_min(1e-30))
    if not ratios:
        return torch.full((per_option.shape[1],), float("nan"))
    return torch.stack(ratios).mean(0)


def label(scores: RoleScores, thresholds: RoleThresholds) -> str | None:
    """``"aggregate"``, ``"gather"`` or ``None`` from a head's pattern scores (the layer
    order and causal checks are applied by `discover`)."""
    reads_options = scores.aggregate_mass >= thresholds.aggregate_mass
    if reads_options and (scores.end_mass >= thresholds.end_mass or scores.uniform_ratio >= thresholds.uniform_ratio):
        return "aggregate"
    if scores.gather >= thresholds.gather:
        return "gather"
    return None


def scores_from_dict(data: dict[str, Any]) -> RoleScores:
    return RoleScores(**{k: float(v) for k, v in data.items()})
