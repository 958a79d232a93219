"""The G&A picture of a circuit, averaged over a task: what the report draws.

The paper shows the mechanism in attention plots: an **Aggregate** head's final row
reads the segment ends, most of all the correct option's; a **Gather** head's
segment-end rows read their own segment. `role_picture` measures both over the task's
prompts, aligned by the task's annotations (option slots, not token positions), from
the same `roles.RoleMasses` the role scores come from. Rows are distributions over keys
(``|w| / sum |w|``), so softmax and SSM heads share one scale.

Per **Aggregate** head (`AggregateMass`), the final row's mass:

- on the correct option's segment end, and on another option's (the mean over the
  ``n - 1`` others); on the whole correct option ``S_c+`` and on another's;
- ``uniform_end``: what a uniform causal row puts on one token (``1 / keys``);
- ``end_argmax``: the share of prompts whose largest segment-end mass is the correct one.

Per **Gather** head (`GatherMass`), each segment end's row's mass:

- on its own segment ``S_i`` (the mean over segments: the ``gather`` score), and on
  another segment ``S_j``, ``j < i`` (the mean over the earlier segments it can see:
  the first segment has none);
- ``uniform_own`` / ``uniform_other``: what a uniform causal row puts there;
- ``own_above_uniform``: the share of rows whose own segment gets more mass than a
  uniform causal row puts there (the row favours its own segment).

`choose_prompt` picks the single prompt the report shows with circuitsvis: one the model
answers correctly, whose Aggregate rows (segment-end and option masses) are the most
typical of the task's (a medoid).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..core.heads import Head
from ..core.interventions import Ablate
from ..scoring.evaluation import evaluate
from .roles import RoleMasses, role_masses

if TYPE_CHECKING:
    import pandas as pd

    from ..models.handle import GnaModel
    from ..tasks.base import Task
    from .circuit import GnaCircuit


@dataclass
class AggregateMass:
    """One Aggregate head's final row, averaged over the prompts (see the module doc)."""

    head: Head
    correct_end: float
    other_end: float
    uniform_end: float
    correct_option: float
    other_option: float
    end_argmax: float


@dataclass
class GatherMass:
    """One Gather head's segment-end rows, averaged over prompts and segments."""

    head: Head
    own: float
    other: float
    uniform_own: float
    uniform_other: float
    own_above_uniform: float


@dataclass
class RolePicture:
    """The averaged patterns of a circuit's heads, and the prompt the report shows.

    Attributes:
        n_prompts: prompts averaged over (the task's first ones).
        aggregate, gather: one entry per head of the role, in the circuit's order.
        masses: the per-prompt masses, heads ordered ``[*aggregate, *gather]``.
        answered: ``[batch]`` bool: the model answers the prompt correctly.
        prompt: the prompt shown (`choose_prompt`); ``None``: none answered correctly.
    """

    n_prompts: int
    aggregate: list[AggregateMass]
    gather: list[GatherMass]
    masses: RoleMasses
    answered: Tensor
    prompt: int | None

    def to_frame(self) -> pd.DataFrame:
        """One row per head: its role and averaged masses."""
        import pandas as pd

        items: list[AggregateMass | GatherMass] = [*self.aggregate, *self.gather]
        roles = ["aggregate"] * len(self.aggregate) + ["gather"] * len(self.gather)
        rows = [
            {"head": str(item.head), "role": role} | {f.name: getattr(item, f.name) for f in fields(item)[1:]}
            for item, role in zip(items, roles, strict=True)
        ]
        return pd.DataFrame(rows)


def aggregate_masses(masses: RoleMasses, heads: list[Head], index: list[int]) -> list[AggregateMass]:
    """`AggregateMass` of ``heads``, which are ``masses``' heads ``index``."""
    ends, options = masses.final_on_ends[:, index], masses.final_on_options[:, index]  # [batch, head, segment]
    correct = masses.correct.view(-1, 1, 1).expand(-1, len(index), 1)
    others = 1 - torch.nn.functional.one_hot(masses.correct, ends.shape[-1]).float()[:, None]  # [batch, 1, segment]
    n_others = ends.shape[-1] - 1

    def split(values: Tensor) -> tuple[Tensor, Tensor]:  # [head]: the correct option's mass, another's
        return values.gather(2, correct).squeeze(2).mean(0), ((values * others).sum(-1) / n_others).mean(0)

    (correct_end, other_end), (correct_option, other_option) = split(ends), split(options)
    argmax = (ends.argmax(-1) == masses.correct[:, None]).float().mean(0)
    uniform = float((1 / masses.final_keys).mean())
    per_head = torch.stack([correct_end, other_end, correct_option, other_option, argmax], 1).tolist()  # [head, 5]
    return [
        AggregateMass(h, c_end, o_end, uniform, c_opt, o_opt, top)
        for h, (c_end, o_end, c_opt, o_opt, top) in zip(heads, per_head, strict=True)
    ]


def gather_masses(masses: RoleMasses, heads: list[Head], index: list[int]) -> list[GatherMass]:
    """`GatherMass` of ``heads``, which are ``masses``' heads ``index``."""
    cross = masses.ends_on_segments[:, index]  # [batch, head, segment i (row), segment j (key)]
    n_segments = cross.shape[-1]
    own = cross.diagonal(dim1=2, dim2=3)  # [batch, head, segment]
    earlier = torch.ones(n_segments, n_segments).tril(-1)  # [i, j]: j < i
    other = (cross * earlier).sum((2, 3)) / earlier.sum()  # [batch, head]
    uniform = masses.segment_tokens[:, None, :] / masses.end_keys[:, :, None]  # [batch, i, j]: uniform row i on S_j
    uniform_own = uniform.diagonal(dim1=1, dim2=2)  # [batch, segment]
    uniform_other = (uniform * earlier).sum((1, 2)).mean() / earlier.sum()
    above = (own > uniform_own[:, None]).float().mean((0, 2))  # [head]
    return [
        GatherMass(h, float(own[:, i].mean()), float(other[:, i].mean()), float(uniform_own.mean()), float(uniform_other), float(above[i]))
        for i, h in enumerate(heads)
    ]


def _correct_first(values: Tensor, correct: Tensor) -> Tensor:
    """``[batch, head, segment]`` masses reordered: the correct option's, then the others
    from largest (nonnegative masses: the placeholder -1 sorts last and is dropped)."""
    index = correct.view(-1, 1, 1).expand(-1, values.shape[1], 1)
    others = values.scatter(2, index, -1.0).sort(-1, descending=True).values[:, :, :-1]
    return torch.cat([values.gather(2, index), others], -1)


def choose_prompt(masses: RoleMasses, answered: Tensor, n_aggregate: int) -> int | None:
    """The prompt to show: of those answered correctly (``answered``, ``[batch]`` bool),
    the medoid, whose rows are in total closest to those of the others. The profile of an
    Aggregate head's final row is its segment-end masses, then its option masses, each
    with the correct option's first and the others sorted from largest; the distance is
    the L1 distance over the Aggregate heads (the first ``n_aggregate`` of ``masses``), or
    over the Gather heads' own-segment masses when there is no Aggregate head. A medoid,
    not the prompt nearest the mean: a head that reads the correct option fully on some
    prompts and not at all on others has no prompt near its mean. ``None`` if no prompt
    is answered correctly."""
    if not bool(answered.any()):
        return None
    if n_aggregate:
        ends, options = masses.final_on_ends[:, :n_aggregate], masses.final_on_options[:, :n_aggregate]  # [batch, head, segment]
        profile = torch.cat([_correct_first(ends, masses.correct), _correct_first(options, masses.correct)], -1)
    else:
        profile = masses.ends_on_segments.diagonal(dim1=2, dim2=3)
    flat = profile.flatten(1)  # [batch, feature]
    candidates = answered.nonzero()[:, 0]
    total = torch.cdist(flat[candidates], flat[candidates], p=1).sum(1)  # [answered]
    return int(candidates[total.argmin()])


def role_picture(circuit: GnaCircuit, model: GnaModel, task: Task, n_prompts: int | None = None) -> RolePicture:
    """The averaged patterns of the circuit's Aggregate and Gather heads on ``task``'s
    first ``n_prompts`` prompts (default: the circuit's ``pattern_prompts``, 64), and the
    prompt to show (`choose_prompt`)."""
    n = min(len(task), n_prompts or int(circuit.settings.get("pattern_prompts", 64)))
    heads = [*circuit.aggregate, *circuit.gather]
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    masses = role_masses(model, encoded, heads, n)
    n_aggregate = len(circuit.aggregate)
    answered = evaluate(model, task[:n], progress=False).is_correct.cpu()
    return RolePicture(
        n_prompts=n,
        aggregate=aggregate_masses(masses, circuit.aggregate, list(range(n_aggregate))),
        gather=gather_masses(masses, circuit.gather, list(range(n_aggregate, len(heads)))),
        masses=masses,
        answered=answered,
        prompt=choose_prompt(masses, answered, n_aggregate),
    )


def need_curve(model: GnaModel, task: Task, heads: list[Head], accuracy: float | None = None) -> list[float]:
    """Accuracy with the first ``k`` of ``heads`` ablated together (at every position),
    for ``k = 1..len(heads)``; ``accuracy``, if given, is the last value, already
    measured (a `RoleNeed`'s)."""
    known = [] if accuracy is None else [accuracy]
    steps = range(1, len(heads) + 1 - len(known))
    return [evaluate(model, task, [Ablate(heads[:k])], progress=False).accuracy for k in steps] + known
