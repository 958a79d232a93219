"""The evidence a `GnaCircuit` holds: each examined head's (`HeadEvidence`), what each role
needs to collapse accuracy (`RoleNeed`), a role spread wider than the search (`SpreadRole`),
a head's standing in its role (`Standing`) and the circuit's stability over prompt samples
(`Stability`); each round-trips through JSON (``to_dict`` / ``from_dict``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.errors import GnaValueError
from ..core.heads import Head
from .group_testing import SpreadGroup
from .roles import RoleScores, scores_from_dict

if TYPE_CHECKING:
    import pandas as pd

ROLES = ("gather", "aggregate")


@dataclass
class HeadEvidence:
    """One examined head."""

    head: Head
    role: str | None
    """``"gather"``, ``"aggregate"`` or ``None`` (examined, no role)."""
    ablated_accuracy: float | None
    """Task accuracy with this head zero-ablated alone (``None``: not measured)."""
    verified: bool
    """Ablated alone (``False``: only screened as part of a group)."""
    scores: RoleScores | None = None
    entry: dict[str, float] | None = None
    """Where the head's effect enters the residual stream: accuracy with the head ablated
    only at the ``final`` position, only on the ``segments`` (every option token, its
    segment end included), and only at the segment ``ends``; ``None``: not measured."""
    pattern_agrees: bool | None = None
    """Whether the pattern shows the role clearly above chance (`roles.pattern_shortfall`):
    a Gather head's segment-end rows favour their own segment (``gather_ratio >= 1.5``);
    an Aggregate head's final row reads the options and prefers the correct one (``lift
    >= 1.5``, ``selectivity`` at least 0.05 above ``1 / n_options``). Thresholds:
    `RoleThresholds`, recorded in ``GnaCircuit.settings``."""
    joint: bool = False
    """Given its role by the joint search: little harm alone, needed with the others (a
    backup head)."""
    kind: str | None = None
    """``"attention"`` or ``"ssm"``: which kind of mixer the head belongs to (in hybrids, both occur)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "head": str(self.head),
            "role": self.role,
            "ablated_accuracy": self.ablated_accuracy,
            "verified": self.verified,
            "scores": None if self.scores is None else self.scores.to_dict(),
            "entry": self.entry,
            "pattern_agrees": self.pattern_agrees,
            "joint": self.joint,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadEvidence:
        scores = None if data["scores"] is None else scores_from_dict(data["scores"])
        item = cls(Head.parse(data["head"]), data["role"], data["ablated_accuracy"], bool(data["verified"]), scores)
        item.entry = data.get("entry")
        item.pattern_agrees = data.get("pattern_agrees")
        item.joint = bool(data.get("joint", False))
        item.kind = data.get("kind")
        return item


@dataclass
class RoleNeed:
    """How many heads of a role, ablated together, collapse accuracy, and the curve that
    got there: accuracy as the set grew head by head."""

    heads: list[Head]
    accuracy: float
    reached_chance: bool
    curve: list[tuple[Head, float]] = field(default_factory=list)
    """``(head added, accuracy with it and every earlier head ablated)``, in order: the
    joint search's steps (ablated at ``curve_positions``), or the cumulative ablations of
    the confirmation's fallback (at every position)."""
    curve_positions: str = "all"
    """Where the curve's heads were ablated: ``"final"``, ``"segments"`` or ``"all"``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "heads": [str(h) for h in self.heads],
            "accuracy": self.accuracy,
            "reached_chance": self.reached_chance,
            "curve": [{"head": str(head), "accuracy": accuracy} for head, accuracy in self.curve],
            "curve_positions": self.curve_positions,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoleNeed:
        curve = [(Head.parse(point["head"]), point["accuracy"]) for point in data.get("curve", [])]
        return cls(
            [Head.parse(h) for h in data["heads"]],
            data["accuracy"],
            bool(data["reached_chance"]),
            curve,
            data.get("curve_positions", "all"),
        )

    def describe_curve(self) -> str:
        """``"L1H0 0.230, +L1H2 0.210"``: accuracy after each head joins the set."""
        return ", ".join(f"{'+' if i else ''}{head} {accuracy:.3f}" for i, (head, accuracy) in enumerate(self.curve)) or "-"

    def describe(self, role: str | None = None) -> str:
        """``"gather needs 5 head(s): 0.330 with them ablated at every position (to chance);
        0.315 where the joint search ablated them, on the segments"``: each figure with
        the positions it was measured at (``role=None``: from ``"needs"``)."""
        verdict = "to chance" if self.reached_chance else "not to chance"
        text = f"{'' if role is None else role + ' '}needs {len(self.heads)} head(s): {self.accuracy:.3f} with them ablated "
        text += f"{POSITIONS['all']} ({verdict})"
        if self.curve and self.curve_positions != "all":
            text += f"; {self.curve[-1][1]:.3f} where the joint search ablated them, {POSITIONS[self.curve_positions]}"
        return text


POSITIONS = {"all": "at every position", "final": "at the final position", "segments": "on the segments", "ends": "at the segment ends"}
"""Where a figure's heads were ablated, in words (`RoleNeed.curve_positions`)."""


@dataclass
class SpreadRole:
    """A role that no set of up to ``max_heads`` heads takes to chance: spread wider than
    the search (`discover`'s ``max_heads_per_role``), reported rather than dropped.

    Attributes:
        role: ``"gather"`` or ``"aggregate"``.
        positions: where the role enters: ``"final"`` (Aggregate: the final position) or
            ``"ends"`` (Gather: the segment ends).
        layers: accuracy with every head of each costly layer (layer scan) ablated at
            ``positions`` only, by layer.
        layer: where the role enters: the layer whose ablation at ``positions`` costs most
            (at least ``min_effect``); ``None``: no layer ablated there costs accuracy.
        best: the best set found, with its curve (the role's joint set or confirmation
            set when there is one; else the entry layer's most harmful heads, added one by
            one at ``positions``).
        max_heads: the search's bound (``max_heads_per_role``).
        groups: spread groups of the head scan's group testing (`group_testing.SpreadGroup`).
        sizes: the role's size curve (`discovery.sizes`): ``(k, accuracy)`` with the ``k``
            most important heads of the entry layer ablated at ``positions``, ``k``
            increasing from 0 (clean) to the layer's width (the whole layer); the points
            between are those the bisection measured. Empty: not measured (no entry layer,
            a remote model, or a circuit written before it was recorded).
        order: the entry layer's head indices by importance (`sizes.RANKED_BY`): the curve's
            ``k`` heads are its first ``k``. What the curve and its ordering cost is in the
            circuit's cost (``GnaCircuit.cost["size_curves"][role]``).
    """

    role: str
    positions: str
    layers: dict[int, float]
    layer: int | None
    best: RoleNeed | None
    max_heads: int
    groups: list[SpreadGroup] = field(default_factory=list)
    sizes: list[tuple[int, float]] = field(default_factory=list)
    order: list[int] = field(default_factory=list)

    @property
    def width(self) -> int | None:
        """Heads in the entry layer (the curve's last ``k``; ``None``: no curve)."""
        return self.sizes[-1][0] if self.sizes else None

    def heads_for(self, fraction: float) -> int:
        """The fewest heads (most important first) whose ablation at the role's positions
        carries ``fraction`` (in ``(0, 1]``) of the whole layer's effect, where an effect is
        clean accuracy minus accuracy with the heads ablated: the smallest measured ``k``
        reaching it. Between measured points nothing is interpolated: this is the upper end of
        the bracket the curve holds (exact where the bisection pinned it, `sizes.SIZE_FRACTIONS`;
        else a doubling-grid point, at most twice the true count on a monotone curve)."""
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise GnaValueError(f"heads_for: fraction={fraction!r}: expected a number in (0, 1]")
        if not self.sizes:
            raise GnaValueError(f"heads_for: the {self.role} role has no size curve (not measured)")
        clean, whole = self.sizes[0][1], self.sizes[-1][1]
        target = fraction * (clean - whole) - 1e-9
        return min(k for k, accuracy in self.sizes if clean - accuracy >= target)

    def describe_size(self, fraction: float = 0.5, unit: str = "heads") -> str | None:
        """``"the Aggregate role needs 40 of 128 heads for half of the layer's effect (layer 1
        ablated at the final position: 1.000 -> 0.290)"`` (``None``: no curve); ``unit``: what a
        head is called (a Mamba-1 head is a channel)."""
        if not self.sizes:
            return None
        share = {0.5: "half", 1.0: "all"}.get(fraction, f"{fraction:.0%}")
        clean, whole = self.sizes[0][1], self.sizes[-1][1]
        return (
            f"the {self.role.capitalize()} role needs {self.heads_for(fraction)} of {self.width} {unit} for {share} of the "
            f"layer's effect (layer {self.layer} "
            f"ablated {POSITIONS[self.positions]}: {clean:.3f} -> {whole:.3f})"
        )

    def describe_curve(self) -> str:
        """``"0: 1.000, 1: 0.965, 2: 0.950, ..., 128: 0.290"``: the size curve's points."""
        return ", ".join(f"{k}: {accuracy:.3f}" for k, accuracy in self.sizes) or "-"

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "positions": self.positions,
            "layers": {str(layer): value for layer, value in self.layers.items()},
            "layer": self.layer,
            "best": None if self.best is None else self.best.to_dict(),
            "max_heads": self.max_heads,
            "groups": [group.to_dict() for group in self.groups],
            "sizes": [[k, accuracy] for k, accuracy in self.sizes],
            "order": list(self.order),
            "size": self.describe_size(),  # words for readers; not read back
            "heads_for_half": self.heads_for(0.5) if self.sizes else None,  # not read back
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpreadRole:
        best = None if data["best"] is None else RoleNeed.from_dict(data["best"])
        layers = {int(layer): value for layer, value in data["layers"].items()}
        groups = [SpreadGroup.from_dict(group) for group in data.get("groups", [])]
        sizes = [(int(k), float(accuracy)) for k, accuracy in data.get("sizes", [])]
        item = cls(data["role"], data["positions"], layers, data["layer"], best, int(data["max_heads"]), groups, sizes)
        item.order = [int(h) for h in data.get("order", [])]
        return item

    def describe(self) -> str:
        """``"spread beyond the search: no set of up to 8 heads reaches chance (best: 8
        head(s), 0.310 at every position); enters at layer 1, at the final position (layer
        ablated there: 0.305)"``; for an empty role whose layers cost nothing at its
        positions, that it was not found there (not spread)."""
        where = POSITIONS[self.positions]
        if self.layer is None and (self.best is None or not self.best.heads):
            return f"not found: no layer ablated {where} costs accuracy (absent, not spread beyond the search)"
        if self.best is not None and self.best.reached_chance:
            text = f"no head labelled, but {len(self.best.heads)} head(s) of its layer reach chance together ({self.best.accuracy:.3f})"
        else:
            text = f"spread beyond the search: no set of up to {self.max_heads} heads reaches chance"
            if self.best is not None and self.best.heads:
                text += f" (best: {len(self.best.heads)} head(s), {self.best.accuracy:.3f} at every position)"
        if self.layer is None:
            return text + f"; no layer ablated {where} costs accuracy"
        return text + f"; enters at layer {self.layer}, {where} (layer ablated there: {self.layers[self.layer]:.3f})"


@dataclass(frozen=True)
class Standing:
    """What the evidence supports for one head of a role's set (`GnaCircuit.standing`).

    Attributes:
        role: ``"gather"`` or ``"aggregate"``: the set the head belongs to.
        alone: its ablation alone lowers accuracy by at least ``min_effect`` (``None``:
            not measured alone).
        shortfall: what its pattern lacks to show the role (`roles.pattern_shortfall`;
            empty: it shows it; ``None``: no pattern scores).
    """

    role: str
    alone: bool | None
    shortfall: tuple[str, ...] | None

    @property
    def outright(self) -> bool:
        """The head has the role outright: an effect alone, and a pattern that shows it."""
        return self.alone is True and self.shortfall == ()

    def reasons(self, detail: bool = False) -> list[str]:
        """``["alone: no effect", "pattern: not shown"]``: why the head is only a member of
        the set (empty for a head with the role outright); ``detail``: with the scores
        that miss their thresholds."""
        parts = []
        if self.alone is not True:
            parts.append("alone: no effect" if self.alone is False else "alone: not measured")
        if self.shortfall is None:
            parts.append("pattern: not measured")
        elif self.shortfall:
            parts.append("pattern: not shown" + (f" ({', '.join(self.shortfall)})" if detail else ""))
        return parts

    def describe(self, detail: bool = False) -> str:
        """``"Gather"`` (the role outright) or ``"member of the Gather set; alone: no effect"``."""
        name = self.role.capitalize()
        return name if self.outright else "; ".join([f"member of the {name} set", *self.reasons(detail)])


@dataclass
class Stability:
    """How often discovery chooses each head when re-run on other prompt samples
    (`gna_interp.discovery.stability`, or ``discover(..., stability=k)``).

    Attributes:
        sampling: ``"bootstrap"``: each sample is ``len(task)`` prompts drawn from the task
            with replacement (`prompt_samples`, seeds ``seed, seed + 1, ...``); ``"tasks"``:
            the samples were given.
        n_prompts: prompts per sample.
        sets: per sample, each role's set (``{"gather": [...], "aggregate": [...]}``).
        shape: ``(layers, heads per layer)`` of `counts`.
        seed: the first bootstrap seed (``None`` for given samples).
        seconds: what the re-runs took.
    """

    sampling: str
    n_prompts: list[int]
    sets: list[dict[str, list[Head]]]
    shape: tuple[int, int]
    seed: int | None = None
    seconds: float = 0.0

    @property
    def k(self) -> int:
        """The number of samples."""
        return len(self.sets)

    @property
    def counts(self) -> Tensor:
        """``[role, layer, head]`` int64: in how many samples each head is in each role's set
        (roles: ``("gather", "aggregate")``, `ROLES`)."""
        out = torch.zeros(len(ROLES), *self.shape, dtype=torch.long)
        for chosen in self.sets:
            for r, role in enumerate(ROLES):
                for head in chosen.get(role, []):
                    out[r, head.layer, head.head] += 1
        return out

    @property
    def frequency(self) -> Tensor:
        """``[role, layer, head]`` float: `counts` over the number of samples."""
        return self.counts.float() / self.k

    def sizes(self, role: str) -> list[int]:
        """The size of ``role``'s set in each sample."""
        return [len(chosen.get(role, [])) for chosen in self.sets]

    def to_frame(self) -> pd.DataFrame:
        """One row per head chosen in at least one sample: ``gather`` / ``aggregate`` (samples
        that chose it for that role) and their shares of the samples, most often chosen first."""
        import pandas as pd

        counts = self.counts
        rows = [
            {"head": str(Head(layer, head)), "layer": layer, "index": head}
            | {role: int(counts[r, layer, head]) for r, role in enumerate(ROLES)}
            | {f"{role}_share": float(counts[r, layer, head]) / self.k for r, role in enumerate(ROLES)}
            for layer, head in counts.sum(0).nonzero().tolist()
        ]
        frame = pd.DataFrame(rows, columns=["head", "layer", "index", *ROLES, *(f"{r}_share" for r in ROLES)])
        order = frame[list(ROLES)].max(axis=1).sort_values(ascending=False, kind="stable").index
        return frame.loc[order].reset_index(drop=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampling": self.sampling,
            "n_prompts": list(self.n_prompts),
            "sets": [{role: [str(h) for h in chosen.get(role, [])] for role in ROLES} for chosen in self.sets],
            "shape": list(self.shape),
            "seed": self.seed,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stability:
        sets = [{role: [Head.parse(h) for h in chosen.get(role, [])] for role in ROLES} for chosen in data["sets"]]
        layers, heads = data["shape"]
        return cls(data["sampling"], list(data["n_prompts"]), sets, (int(layers), int(heads)), data.get("seed"), data.get("seconds", 0.0))
