"""`SpreadGroup`: a group of heads whose effect group testing (`group_testing`) finds spread over
many heads, and `heads_text`, a set of heads in words."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..core.heads import Head


@dataclass
class SpreadGroup:
    """A group of heads whose joint ablation costs accuracy that its parts (halves, or single heads for a group of
    at most `SINGLES_AT`) do not explain: none costs ``min_effect`` alone, or their effects add up to less than half
    the group's (`group_testing`): an effect spread over many heads, which single-head ablation cannot see.

    Attributes:
        heads: the group, ablated together.
        accuracy: task accuracy with it ablated.
        parts: accuracy with each part ablated alone.
        needed: heads the group's effect needs: with the rest of the group kept ablated, un-ablating any one of them
            brings accuracy back within ``min_effect`` of clean (empty: the effect is redundant, no head or quarter
            of the group is needed).
        searched: whether ``needed`` was searched: not for a group whose effect is below twice ``min_effect``.
        inside: the costly groups the scan measured inside it, which spare its search tests (`spared`; not saved by
            `to_dict`, not compared).
        skipped: why a group that could be searched was not (``""``: it was, or could not be).
    """

    heads: list[Head]
    accuracy: float
    parts: tuple[float, ...]
    needed: list[Head] = field(default_factory=list)
    searched: bool = True
    skipped: str = ""
    inside: list[frozenset[Head]] = field(default_factory=list, compare=False, repr=False)

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"heads": [str(h) for h in self.heads], "accuracy": self.accuracy, "parts": list(self.parts)}
        data |= {"needed": [str(h) for h in self.needed], "searched": self.searched}
        return data | ({"skipped": self.skipped} if self.skipped else {})

    @classmethod
    def from_dict(cls, data: dict) -> SpreadGroup:
        parts = tuple(float(v) for v in data["parts"])
        needed = [Head.parse(h) for h in data.get("needed", [])]
        heads = [Head.parse(h) for h in data["heads"]]
        return cls(heads, data["accuracy"], parts, needed, bool(data.get("searched", True)), str(data.get("skipped", "")))

    def describe(self) -> str:
        """``"L1H0-L1H127 (128 heads) 0.310 together, parts 0.950 / 0.930; needs L1H3, L1H9"``: the heads
        by index, runs of consecutive ones as ends (`heads_text`), whatever order the scan split them in."""
        parts = " / ".join(f"{v:.3f}" for v in self.parts)
        text = f"{heads_text(self.heads)} ({len(self.heads)} heads) {self.accuracy:.3f} together, parts {parts}"
        if not self.searched or self.skipped:
            return text + f"; needs not searched ({self.skipped or 'its effect is below twice min_effect'})"
        needed = ", ".join(map(str, self.needed)) if self.needed else "no head alone (redundant)"
        return text + f"; needs {needed}"


def heads_text(heads: Sequence[Head], runs: int = 8) -> str:
    """``heads`` sorted, each run of consecutive heads of a layer as its ends: ``"L0H1, L0H4-L0H6"``; beyond
    ``runs`` runs, the first ``runs - 1`` and the last, ``...`` between."""
    parts: list[list[Head]] = []
    for head in sorted(set(heads)):
        if parts and parts[-1][-1].layer == head.layer and parts[-1][-1].head + 1 == head.head:
            parts[-1].append(head)
        else:
            parts.append([head])
    texts = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in parts]
    return ", ".join(texts if len(texts) <= runs else [*texts[: runs - 1], "...", texts[-1]])
