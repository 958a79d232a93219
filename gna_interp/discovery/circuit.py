"""`GnACircuit`: what discovery found, with its evidence; JSON round-trips exactly."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..core.heads import Head
from .group_testing import SpreadGroup
from .roles import RoleScores, RoleThresholds, pattern_shortfall, scores_from_dict

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
    `RoleThresholds`, recorded in ``GnACircuit.settings``."""
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
    """

    role: str
    positions: str
    layers: dict[int, float]
    layer: int | None
    best: RoleNeed | None
    max_heads: int
    groups: list[SpreadGroup] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "positions": self.positions,
            "layers": {str(layer): value for layer, value in self.layers.items()},
            "layer": self.layer,
            "best": None if self.best is None else self.best.to_dict(),
            "max_heads": self.max_heads,
            "groups": [group.to_dict() for group in self.groups],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpreadRole:
        best = None if data["best"] is None else RoleNeed.from_dict(data["best"])
        layers = {int(layer): value for layer, value in data["layers"].items()}
        groups = [SpreadGroup.from_dict(group) for group in data.get("groups", [])]
        return cls(data["role"], data["positions"], layers, data["layer"], best, int(data["max_heads"]), groups)

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
    """What the evidence supports for one head of a role's set (`GnACircuit.standing`).

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


@dataclass
class GnACircuit:
    """The Gather and Aggregate heads of a model on a task, with the evidence.

    Attributes:
        gather, aggregate: the heads in each role, most harmful (when ablated) first.
        heads: every examined head with its role, ablation accuracy and pattern scores.
        accuracy: the confirmation table: ``clean``, ``-gather``, ``-aggregate``,
            ``-both``, ``only_gna`` (every other head of the G&A layers ablated), ``chance``.
        needs: per role, the heads whose joint ablation brings accuracy to ``chance +
            chance_margin`` (at most ``max_heads_per_role``): from the joint search when
            it ran, else the most harmful heads of the role, cumulatively. Its accuracy is
            with those heads ablated at every position; its ``curve``, accuracy as the set
            grew, with each head's name.
        truncation, layer_scan: per layer, accuracy keeping layers ``0..l`` / skipping ``l``.
        head_scan: ``[layer][head]`` single-ablation accuracy (``None``: not scanned).
        critical_layer: from the truncation scan (``None``: no jump found).
        path_patching: the Gather -> Aggregate edge, at the final position: the logit of
            the clean prompt's answer minus that of the corrupted prompt's answer on the
            ``clean`` and the ``corrupt`` prompts, the same on the clean prompts with the
            Gather heads corrupted and only the Aggregate heads of later positions reading
            the change (``gather->aggregate``), and ``fraction_of_effect``: ``(clean -
            gather->aggregate) / (clean - corrupt)``, the share of the clean - corrupt gap
            that path alone reproduces (0: none, 1: all of it).
        settings: thresholds and knobs used.
        attribution: ``[layer][head]`` attribution estimate of each head's zero-ablation
            effect on the candidate logit difference, when the prescreen ran (``None``
            otherwise; see `discover`'s ``prescreen_above``).
        cost: what discovery ran (`gna_interp.cost.Cost`): ``forwards``, ``rows``,
            ``block_rows``, ``passes`` (block_rows / (prompts x layers)), ``requests``
            (remote round trips), ``backwards``, ``seconds``.
        n_segments: the task's options (segments) per prompt: the pattern's chance is
            ``1 / n_segments`` (``None``: a circuit written before it was recorded).
        stability: how often discovery chose each head on other prompt samples
            (`Stability`; ``None``: not measured, see ``discover``'s ``stability``).
        spread: per role that no set of up to ``max_heads_per_role`` heads takes to
            chance (an empty role included), where it enters and the best set found
            (`SpreadRole`): an empty role list with an entry here means "spread beyond the
            search", not "absent".

    A head in a role's list (``gather``, ``aggregate``) is a member of that role's set;
    `standing` says whether the evidence gives it the role outright (an effect alone, and
    a pattern that shows it).
    """

    model: str
    family: str
    task: str
    n_prompts: int
    gather: list[Head]
    aggregate: list[Head]
    heads: list[HeadEvidence]
    accuracy: dict[str, float]
    needs: dict[str, RoleNeed]
    truncation: list[float] | None = None
    layer_scan: list[float] | None = None
    head_scan: list[list[float | None]] | None = None
    critical_layer: int | None = None
    warnings: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    path_patching: dict[str, float] | None = None
    cost: dict[str, Any] | None = None
    attribution: list[list[float | None]] | None = None
    n_segments: int | None = None
    stability: Stability | None = None
    spread: dict[str, SpreadRole] = field(default_factory=dict)

    # ----- tables and serialisation ---------------------------------------------
    def evidence(self, head: Head) -> HeadEvidence:
        for item in self.heads:
            if item.head == head:
                return item
        raise KeyError(f"{head} was not examined")

    @property
    def thresholds(self) -> RoleThresholds:
        """The `RoleThresholds` discovery used (defaults for those a circuit written
        before them lacks)."""
        recorded = self.settings.get("thresholds", {})
        return RoleThresholds(**{f.name: recorded[f.name] for f in fields(RoleThresholds) if f.name in recorded})

    def _n_options(self) -> int:
        return self.n_segments if self.n_segments else round(1 / self.accuracy["chance"])

    def standing(self, head: Head) -> Standing | None:
        """What the evidence supports for ``head`` in its role's set (``None``: no role):
        its ablation alone (at least ``thresholds.min_effect`` below clean) and its pattern
        (`roles.pattern_shortfall`, with the recorded thresholds)."""
        item = self.evidence(head)
        if item.role is None:
            return None
        alone = None if item.ablated_accuracy is None else self.accuracy["clean"] - item.ablated_accuracy >= self.thresholds.min_effect
        shortfall = None if item.scores is None else tuple(pattern_shortfall(item.role, item.scores, self.thresholds, self._n_options()))
        return Standing(item.role, alone, shortfall)

    def outright(self, role: str) -> list[Head]:
        """The heads of ``role``'s set that have the role outright (`Standing.outright`)."""
        return [h for h in getattr(self, role) if (s := self.standing(h)) is not None and s.outright]

    def describe_role(self, role: str) -> str:
        """``"outright: L0H3, L0H2; members of the set only: L0H1 - pattern: not shown"``: the
        heads with the role outright, then the other members of its set, grouped by what
        they lack."""
        outright = self.outright(role)
        groups: dict[str, list[Head]] = {}
        for head in getattr(self, role):
            if head not in outright:
                groups.setdefault(", ".join(self.standing(head).reasons()), []).append(head)  # type: ignore[union-attr]
        text = f"outright: {self.named(outright) if outright else 'none'}"
        if groups:
            text += "; members of the set only: " + "; ".join(f"{self.named(heads)} - {why}" for why, heads in groups.items())
        return text

    def evidence_rule(self) -> str:
        """The thresholds a head needs for its role outright, in words (with their values)."""
        t = self.thresholds
        chance = 1 / self._n_options()
        return (
            f"a head has its role outright when its ablation alone lowers accuracy by at least {t.min_effect:g} and its "
            f"pattern shows the role clearly above chance: Gather, gather ratio >= {t.gather_ratio:g} (chance 1); "
            f"Aggregate, aggregate mass >= {t.aggregate_mass:g}, lift >= {t.lift:g} (chance 1) and selectivity >= "
            f"{chance + t.selectivity_margin:.2f} (chance {chance:.2f} + {t.selectivity_margin:g}). Other heads of a "
            "role's set are members of the set"
        )

    def describe_path(self) -> str | None:
        """The path-patching figures with the share of the clean - corrupt gap beside each."""
        path = self.path_patching
        if path is None:
            return None
        clean, corrupt, value = path["clean"], path["corrupt"], path["gather->aggregate"]
        return (
            f"logit difference (clean answer - corrupted answer, final position) {clean:.3f} clean, {corrupt:.3f} corrupt; "
            f"{value:.3f} with the Gather heads corrupted through the Aggregate heads only "
            f"({_share(path['fraction_of_effect'])} of the clean - corrupt gap)"
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per examined head: role, ablation accuracy, pattern scores."""
        import pandas as pd

        rows = []
        for item in self.heads:
            row = {"head": str(item.head), "layer": item.head.layer, "index": item.head.head, "kind": item.kind, "role": item.role}
            row |= {"ablated_accuracy": item.ablated_accuracy, "verified": item.verified}
            row |= {f"{where}_ablated_accuracy": value for where, value in (item.entry or {}).items()}
            row |= {"pattern_agrees": item.pattern_agrees, "joint": item.joint}
            standing = self.standing(item.head)
            row |= {"standing": None if standing is None else standing.describe(detail=True)}
            row |= item.scores.to_dict() if item.scores is not None else {}
            rows.append(row)
        return pd.DataFrame(rows)

    def accuracy_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([{"condition": k, "accuracy": v} for k, v in self.accuracy.items()])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gather"] = [str(h) for h in self.gather]
        data["aggregate"] = [str(h) for h in self.aggregate]
        data["heads"] = [item.to_dict() for item in self.heads]
        data["needs"] = {role: need.to_dict() for role, need in self.needs.items()}
        data["stability"] = None if self.stability is None else self.stability.to_dict()
        data["spread"] = {role: item.to_dict() for role, item in self.spread.items()}
        return _finite(data)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> GnACircuit:
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text).read_text()
        data = json.loads(text)
        data["gather"] = [Head.parse(h) for h in data["gather"]]
        data["aggregate"] = [Head.parse(h) for h in data["aggregate"]]
        data["heads"] = [HeadEvidence.from_dict(item) for item in data["heads"]]
        data["needs"] = {role: RoleNeed.from_dict(need) for role, need in data["needs"].items()}
        data["stability"] = None if data.get("stability") is None else Stability.from_dict(data["stability"])
        data["spread"] = {role: SpreadRole.from_dict(item) for role, item in data.get("spread", {}).items()}
        return cls(**data)

    # ----- views -------------------------------------------------------------------
    def named(self, heads: list[Head]) -> str:
        """``"L0H1, L1H5"``; in a model with both kinds of heads, each with its kind
        (``"L1H5 (ssm)"``)."""
        kinds = {item.head: item.kind for item in self.heads}
        mixed = len({kind for kind in kinds.values() if kind}) > 1
        return ", ".join(f"{h} ({kinds[h]})" if mixed and kinds.get(h) else str(h) for h in heads) or "-"

    def summary(self) -> str:
        acc = self.accuracy
        parts = [f"{self.model} on {self.task} ({self.n_prompts} prompts)"]
        for role in ROLES:
            parts.append(f"  {role:9s} {self.named(getattr(self, role))}")
            if getattr(self, role):
                parts.append(f"            {self.describe_role(role)}")
            if role in self.spread:
                spread = self.spread[role]
                parts.append(f"            {spread.describe()}")
                if spread.best is not None and spread.best.curve and role not in self.needs:
                    parts.append(f"            curve ({POSITIONS[spread.best.curve_positions]}): {spread.best.describe_curve()}")
        if self.gather or self.aggregate:
            parts.append(f"  evidence  {self.evidence_rule()}")
        parts.append("  accuracy  " + "  ".join(f"{k} {v:.3f}" for k, v in acc.items()))
        parts.append("            (-gather, -aggregate, -both, only_gna: their heads ablated at every position)")
        for role, need in self.needs.items():
            parts.append(f"  {role:9s} {need.describe()}")
            if need.curve:
                parts.append(f"            curve ({POSITIONS[need.curve_positions]}): {need.describe_curve()}")
        if self.path_patching is not None:
            parts.append(f"  path      {self.describe_path()}")
        if self.stability is not None:
            parts += [f"  {'stability' if i == 0 else '':9s} {line}" for i, line in enumerate(describe_stability(self))]
        if self.cost is not None:
            parts.append(f"  cost      {describe_cost(self.cost)}")
        parts += [f"  note: {note}" for note in self.warnings]
        return "\n".join(parts)


def describe_stability(circuit: GnACircuit) -> list[str]:
    """Lines: per role, the set sizes over the samples and how often each head of the
    circuit's set (and any other head chosen) was chosen."""
    stability = circuit.stability
    if stability is None:
        return []
    how = "bootstrap samples" if stability.sampling == "bootstrap" else "prompt samples"
    lines = [f"over {stability.k} {how} of {', '.join(map(str, sorted(set(stability.n_prompts))))} prompts:"]
    counts = stability.counts
    for r, role in enumerate(ROLES):
        found = [(int(counts[r, layer, head]), Head(layer, head)) for layer, head in counts[r].nonzero().tolist()]
        chosen = sorted(found, key=lambda c: -c[0])
        heads = ", ".join(f"{head} {count}" for count, head in chosen) or "-"
        lines.append(f"{role} set sizes {', '.join(map(str, stability.sizes(role)))}; chosen (of {stability.k}): {heads}")
    return lines


def _share(value: float | None) -> str:
    """A fraction as ``"0.93"`` (``"-"`` when undefined: a zero clean - corrupt gap)."""
    return "-" if value is None or value != value else f"{value:.2f}"


def describe_cost(cost: dict[str, Any]) -> str:
    """``"181 forwards, 58.0 passes over 200 prompts x 2 layers, 0 requests, 12.3 s"``."""
    text = f"{cost['forwards']} forwards, {cost['passes']:.1f} passes over {cost['n_prompts']} prompts x {cost['n_layers']} layers"
    text += f", {cost['requests']} requests"
    if cost.get("backwards"):
        text += f", {cost['backwards']} backward(s)"
    return text + f", {cost['seconds']:.1f} s"


def _finite(value: Any) -> Any:
    """NaN / inf -> None, recursively (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
