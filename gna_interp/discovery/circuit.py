"""`GnACircuit`: what discovery found, with its evidence; JSON round-trips exactly."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.heads import Head
from .roles import RoleScores, scores_from_dict

if TYPE_CHECKING:
    import pandas as pd


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
    """Whether the pattern shows the role: a Gather head's segment-end rows favour their
    own segment over a uniform row (``gather_ratio > 1``); an Aggregate head's final row
    puts more mass on the correct option than a uniform row (``uniform_ratio > 1``)."""
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
        path_patching: the Gather -> Aggregate edge: the clean and corrupt logit difference
            (clean answer minus corrupted answer), the metric when only that path carries
            the Gather heads' corruption, and the share of the effect it carries.
        settings: thresholds and knobs used.
        attribution: ``[layer][head]`` attribution estimate of each head's zero-ablation
            effect on the candidate logit difference, when the prescreen ran (``None``
            otherwise; see `discover`'s ``prescreen_above``).
        cost: what discovery ran (`gna_interp.cost.Cost`): ``forwards``, ``rows``,
            ``block_rows``, ``passes`` (block_rows / (prompts x layers)), ``requests``
            (remote round trips), ``backwards``, ``seconds``.
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

    # ----- tables and serialisation ---------------------------------------------
    def evidence(self, head: Head) -> HeadEvidence:
        for item in self.heads:
            if item.head == head:
                return item
        raise KeyError(f"{head} was not examined")

    def to_frame(self) -> pd.DataFrame:
        """One row per examined head: role, ablation accuracy, pattern scores."""
        import pandas as pd

        rows = []
        for item in self.heads:
            row = {"head": str(item.head), "layer": item.head.layer, "index": item.head.head, "kind": item.kind, "role": item.role}
            row |= {"ablated_accuracy": item.ablated_accuracy, "verified": item.verified}
            row |= {f"{where}_ablated_accuracy": value for where, value in (item.entry or {}).items()}
            row |= {"pattern_agrees": item.pattern_agrees, "joint": item.joint}
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
        parts = [
            f"{self.model} on {self.task} ({self.n_prompts} prompts)",
            f"  gather    {self.named(self.gather)}",
            f"  aggregate {self.named(self.aggregate)}",
            "  accuracy  " + "  ".join(f"{k} {v:.3f}" for k, v in acc.items()),
        ]
        for role, need in self.needs.items():
            verdict = "collapses to chance" if need.reached_chance else "does not reach chance"
            parts.append(f"  {role:9s} needs {len(need.heads)} head(s): {verdict} ({need.accuracy:.3f})")
            if need.curve:
                parts.append(f"            curve ({need.curve_positions}): {need.describe_curve()}")
        if self.path_patching is not None:
            share = self.path_patching["fraction_of_effect"]
            parts.append(f"  path patching gather -> aggregate carries {share:.1%} of the clean - corrupt logit difference")
        if self.cost is not None:
            parts.append(f"  cost      {describe_cost(self.cost)}")
        parts += [f"  note: {note}" for note in self.warnings]
        return "\n".join(parts)


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
