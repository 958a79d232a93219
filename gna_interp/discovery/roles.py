"""Role scores of heads from their attention patterns (softmax or implicit).

Every pattern row is first made a distribution over keys, ``p_s = |w_s| / sum_k |w_k|``,
so softmax and SSM heads are scored on one scale. With ``S_i`` the tokens of option
``i`` without its segment end (``[start_i, end_i)``: label and text; the text alone in
the label-last layout, whose segment end is the label) and ``S_i+`` the same with it:

- **gather score**: the mass of row ``end_i`` (each option's segment end) on ``S_i``,
  averaged over options and prompts. A Gather head summarises its own segment into the
  segment end: high score. Uniform causal attention gives about ``|S_i| / end_i``.
- **gather ratio**: the same mass divided by what a uniform causal row puts on ``S_i``
  (``|S_i|`` over the real keys up to ``end_i``), averaged. It does not favour early
  options, whose rows have fewer keys. 1 = no preference for the own segment.
- **aggregate mass**: the mass of the final row on all options ``S_i+``.
- **end mass**: the final row's mass on the segment-end tokens themselves (the paper's
  Aggregate pattern: reading the segment summaries).
- **selectivity**: the final row's mass on the correct option's ``S_c+`` divided by the
  aggregate mass (``1 / n_options`` for a row spread evenly over the options).
- **lift**: position-controlled selectivity: for each option slot ``j``, the mean mass on
  ``S_j+`` over prompts where ``j`` is correct and over prompts where it is not; lift is
  the sum over slots of the first divided by the sum of the second. 1 = the row does not
  depend on which option is correct (a recency-biased SSM row, or a head that always
  reads one fixed slot), above 1 = it prefers the correct option. Pooling over slots
  keeps slots the row never reads from dominating with ratios of tiny masses.
- **uniform ratio**: the correct option's mass divided by what a uniform causal row
  would put there (``|S_c+|`` over the number of real keys).
- **sharpness** of the row a role uses (segment-end rows for Gather, the final row for
  Aggregate): entropy (nats) and top-1 mass, averaged.

Thresholds (`RoleThresholds`) turn scores into labels; they are recorded in every result.

**Whether the pattern shows the role** (`pattern_shortfall`, `pattern_agrees`) needs the
scores clearly above what a row blind to the task gives (chance), by stated margins:

- Gather: ``gather_ratio >= RoleThresholds.gather_ratio`` (1.5; chance 1);
- Aggregate: the final row reads the options (``aggregate_mass >=
  RoleThresholds.aggregate_mass``, 0.3), prefers the correct one when its place is
  controlled for (``lift >= RoleThresholds.lift``, 1.5; chance 1), and puts more than its
  share on it (``selectivity >= 1 / n_options + RoleThresholds.selectivity_margin``,
  0.05 above chance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..attention.pattern import attention_pattern
from ..attention.sharpness import entropy, top1_mass
from ..core.errors import GnaValueError
from ..core.heads import Head
from ..core.inputs import Batch

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import EncodedTask


@dataclass(frozen=True)
class RoleThresholds:
    """How evidence becomes labels. Only heads whose single ablation costs at least
    ``min_effect`` accuracy get a role.

    With the entry stage (the default), roles follow where a head's effect enters the
    residual stream, as the mechanism says: an Aggregate head writes the answer at the
    final position, a Gather head writes summaries into the segments. ``share_final`` /
    ``share_segments`` are the fractions of the head's ablation effect reproduced by
    ablating it only there:

    - **Aggregate**: ``share_final >= entry_share``, ``share_final >= share_segments``
      and the final row reads the options (``aggregate_mass``);
    - **Gather**: ``share_segments >= entry_share``, ``share_segments > share_final``.

    Without it, the pattern alone decides: Aggregate if the final row reads the options
    and either reads the segment ends (``end_mass``, the paper's pattern) or prefers the
    correct option (``lift``); otherwise Gather if its segment-end rows favour their own
    segment (``gather_ratio``). Either way, `discover` then keeps the roles in the order of
    the heads' positions (``(layer, stage)``; a Gather head before every Aggregate head it
    feeds), and `HeadEvidence.pattern_agrees` records whether the pattern shows the role:
    ``gather_ratio`` for Gather; ``aggregate_mass``, ``lift`` and ``selectivity_margin``
    (above chance, ``1 / n_options``) for Aggregate (`pattern_shortfall`).

    A head of a role whose single ablation costs less than ``min_effect`` (a backup head
    the joint search added), or whose pattern does not show the role, is a member of the
    role's set, not a head of that role outright (`GnaCircuit.standing`)."""

    min_effect: float = 0.02
    entry_share: float = 0.5
    aggregate_mass: float = 0.3
    gather_ratio: float = 1.5
    end_mass: float = 0.5
    lift: float = 1.5
    selectivity_margin: float = 0.05

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class RoleScores:
    gather: float
    gather_ratio: float
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


@dataclass
class RoleMasses:
    """Per prompt, where the rows each role reads put their mass: rows as distributions
    over keys (``|w| / sum |w|``), aligned by the task's annotations (option slots, not
    token positions). The pattern scores (`role_scores`) and the report's figures are
    both computed from it.

    Attributes:
        ends_on_segments: ``[batch, head, segment, segment]``: the mass of segment ``i``'s
            end row on ``S_j``, option ``j``'s tokens without its segment end (causal:
            zero for ``j > i``). The diagonal is what a Gather head reads.
        final_on_ends: ``[batch, head, segment]``: the final row's mass on each segment-end
            token (the paper's Aggregate pattern).
        final_on_options: ``[batch, head, segment]``: the final row's mass on ``S_j+``
            (option ``j``'s tokens, its segment end included).
        segment_tokens: ``[batch, segment]``: ``|S_j|``.
        end_keys: ``[batch, segment]``: real keys up to each segment end (the row's length).
        final_keys: ``[batch]``: real keys of the final row.
        correct: ``[batch]``: the correct option.
    """

    ends_on_segments: Tensor
    final_on_ends: Tensor
    final_on_options: Tensor
    segment_tokens: Tensor
    end_keys: Tensor
    final_keys: Tensor
    correct: Tensor


def _role_rows(model: GnaModel, encoded: EncodedTask, heads: Sequence[Head], rows: slice) -> Tensor:
    """``[batch, head, segment + 1, key]``: the raw segment-end rows, then the final row."""
    batch = Batch(encoded.batch.input_ids[rows], encoded.batch.attention_mask[rows])
    queries = torch.cat([encoded.segment_ends[rows], encoded.final[rows, None]], 1)  # [batch, segment + 1]
    return attention_pattern(model, batch, list(heads), query_positions=queries).float().cpu()  # the task's masks live on the CPU


def _masses(pattern: Tensor, encoded: EncodedTask, rows: slice) -> RoleMasses:
    weights = pattern.abs()
    p = weights / weights.sum(-1, keepdim=True).clamp_min(1e-30)  # [batch, head, segment + 1, key]
    n_segments, n_pos = p.shape[2] - 1, p.shape[3]
    ends = encoded.segment_ends[rows]
    own = _span_masks(encoded, rows, n_pos, with_end=False).float()  # [batch, segment, key]
    options = _span_masks(encoded, rows, n_pos, with_end=True).float()
    final = p[:, :, n_segments]  # [batch, head, key]
    first_real = encoded.batch.attention_mask[rows].long().argmax(1, keepdim=True)  # [batch, 1] (left padding)
    return RoleMasses(
        ends_on_segments=torch.einsum("bhik,bjk->bhij", p[:, :, :n_segments], own),
        final_on_ends=final.gather(2, ends[:, None].expand(-1, p.shape[1], -1)),
        final_on_options=torch.einsum("bhk,bjk->bhj", final, options),
        segment_tokens=own.sum(-1),
        end_keys=(ends - first_real + 1).float(),
        final_keys=encoded.batch.attention_mask[rows].sum(1).float(),
        correct=encoded.correct[rows],
    )


def role_masses(model: GnaModel, encoded: EncodedTask, heads: Sequence[Head], n_prompts: int = 64) -> RoleMasses:
    """`RoleMasses` of ``heads`` on the first ``n_prompts`` prompts of an encoded task."""
    rows = slice(0, min(n_prompts, encoded.batch.n_rows))
    return _masses(_role_rows(model, encoded, heads, rows), encoded, rows)


def role_scores(model: GnaModel, encoded: EncodedTask, heads: Sequence[Head], n_prompts: int = 64) -> dict[Head, RoleScores]:
    """Scores of ``heads`` on the first ``n_prompts`` prompts of an encoded task."""
    rows = slice(0, min(n_prompts, encoded.batch.n_rows))
    pattern = _role_rows(model, encoded, heads, rows)  # [batch, head, segment + 1, key]
    m = _masses(pattern, encoded, rows)
    n_segments = m.final_on_ends.shape[-1]
    own_mass = m.ends_on_segments.diagonal(dim1=2, dim2=3)  # [batch, head, segment]
    gather = own_mass.mean((0, 2))  # [head]
    uniform_own = m.segment_tokens / m.end_keys  # [batch, segment]
    gather_ratio = (own_mass / uniform_own[:, None]).mean((0, 2))
    per_option = m.final_on_options  # [batch, head, segment]
    total = per_option.sum(-1)
    correct = per_option.gather(2, m.correct.view(-1, 1, 1).expand(-1, len(heads), 1)).squeeze(-1)
    selectivity = (correct / total.clamp_min(1e-30)).mean(0)
    span_len = (encoded.spans[rows, :, 1] - encoded.spans[rows, :, 0]).float()
    uniform = span_len.gather(1, m.correct.view(-1, 1)).squeeze(1) / m.final_keys
    uniform_ratio = (correct / uniform[:, None]).mean(0)
    lift = _lift(per_option, m.correct)
    end_mass = m.final_on_ends.sum(-1).mean(0)
    final = pattern[:, :, n_segments]
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
            gather_ratio=float(gather_ratio[i]),
            aggregate_mass=float(total.mean(0)[i]),
            selectivity=float(selectivity[i]),
            end_mass=float(end_mass[i]),
            lift=float(lift[i]),
            uniform_ratio=float(uniform_ratio[i]),
            **{name: float(values[i]) for name, values in sharp.items()},
        )
    return out


def _lift(per_option: Tensor, correct: Tensor) -> Tensor:
    """``[head]``: sum over option slots of mean mass(slot | correct), divided by the sum
    over slots of mean mass(slot | not correct)."""
    right, wrong = [], []
    for slot in range(per_option.shape[-1]):
        is_correct = correct == slot
        if bool(is_correct.any()) and bool((~is_correct).any()):
            right.append(per_option[is_correct, :, slot].mean(0))
            wrong.append(per_option[~is_correct, :, slot].mean(0))
    if not right:
        return torch.full((per_option.shape[1],), float("nan"))
    return torch.stack(right).sum(0) / torch.stack(wrong).sum(0).clamp_min(1e-30)


def entry_shares(clean: float, ablated: float, entry: dict[str, float]) -> tuple[float | None, float] | None:
    """``(share_final, share_segments)``: the fractions of a head's ablation effect
    (``clean - ablated``) that ablating it only at the final position / on the segments
    reproduces; ``None`` for a head whose ablation does not lower accuracy. ``share_final``
    is ``None`` where the entry scan did not measure the final position (`discover` skips
    it where no label reads it: `stages.LabelInputs.needs_final`)."""
    effect = clean - ablated
    if effect <= 0:
        return None
    final = entry.get("final")
    return None if final is None else (clean - final) / effect, (clean - entry["segments"]) / effect


def label(scores: RoleScores, thresholds: RoleThresholds, shares: tuple[float | None, float] | None = None) -> str | None:
    """``"aggregate"``, ``"gather"`` or ``None`` from a head's entry shares (see
    `entry_shares`) and pattern scores, or from the pattern alone when ``shares`` is
    ``None``. The minimum effect and the layer order are applied by `discover`."""
    reads_options = scores.aggregate_mass >= thresholds.aggregate_mass
    if shares is not None:
        final, segments = shares
        if final is None:  # read below only for a head that reads the options or reaches the share
            if reads_options or segments >= thresholds.entry_share:
                raise GnaValueError(
                    f"entry shares {shares!r}: this head's label depends on its final-position share, which was not measured"
                )
            return None
        if final >= segments:
            return "aggregate" if final >= thresholds.entry_share and reads_options else None
        return "gather" if segments >= thresholds.entry_share else None
    if reads_options and (scores.end_mass >= thresholds.end_mass or scores.lift >= thresholds.lift):
        return "aggregate"
    if scores.gather_ratio >= thresholds.gather_ratio:
        return "gather"
    return None


def scores_from_dict(data: dict[str, Any]) -> RoleScores:
    """Scores from JSON (``None`` is NaN; fields added since the file was written are NaN)."""
    values = {k: float("nan") if v is None else float(v) for k, v in data.items()}
    return RoleScores(**{f.name: values.get(f.name, float("nan")) for f in fields(RoleScores)})


def pattern_shortfall(role: str, scores: RoleScores, thresholds: RoleThresholds, n_options: int) -> list[str]:
    """What ``scores`` lack for the pattern to show ``role`` clearly above chance (see the
    module doc), one item per threshold missed, e.g. ``"lift 1.115 < 1.5"`` or
    ``"selectivity 0.298 < chance 0.25 + 0.05"``; empty: the pattern shows the role. A
    score not measured (NaN) misses its threshold."""
    if role == "gather":
        checks = [("gather ratio", scores.gather_ratio, thresholds.gather_ratio, f"{thresholds.gather_ratio:g}")]
    elif role == "aggregate":
        chance, margin = 1 / n_options, thresholds.selectivity_margin
        checks = [
            ("aggregate mass", scores.aggregate_mass, thresholds.aggregate_mass, f"{thresholds.aggregate_mass:g}"),
            ("lift", scores.lift, thresholds.lift, f"{thresholds.lift:g}"),
            ("selectivity", scores.selectivity, chance + margin, f"chance {chance:.2f} + {margin:g}"),
        ]
    else:
        raise GnaValueError(f"role={role!r}: expected 'gather' or 'aggregate'")
    return [f"{name} {value:.3f} < {bound}" for name, value, floor, bound in checks if not value >= floor - _TOLERANCE]


_TOLERANCE = 1e-9
"""A score equal to its threshold meets it (``0.25 + 0.05`` is ``0.30000000000000004`` in floats)."""


def pattern_agrees(role: str | None, scores: RoleScores, thresholds: RoleThresholds, n_options: int) -> bool | None:
    """Whether the pattern shows ``role`` clearly above chance (`pattern_shortfall` is
    empty); ``None`` for no role."""
    if role is None:
        return None
    return not pattern_shortfall(role, scores, thresholds, n_options)
