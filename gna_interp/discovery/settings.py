"""`DiscoverySettings`: what `discover` (and `stability`) is asked to do, defined, checked and
documented once."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..core.errors import GnaTypeError, GnaValueError
from .ablation_kinds import CHECKED as ABLATION_CHECKS
from .joint import check_joint_search
from .roles import RoleThresholds

CIRCUIT_KEYS = (
    "stages",
    "layers",
    "max_candidates",
    "max_heads_per_role",
    "chance_margin",
    "thresholds",
    "pattern_prompts",
    "check_labels",
    "prescreen_above",
    "prescreen_keep",
    "search_at_chance",
    "joint_search",
)
"""The settings a circuit's ``settings`` dict records, in its order (`DiscoverySettings.circuit_dict`)."""

STAGES = ("truncation", "layers", "positions", "heads", "entry", "roles", "joint", "confirm", "cover")
"""The optional stages `discover` may run (``stages=``, `DiscoverySettings.stages`)."""
SEARCH_STAGES = ("layers", "heads", "entry", "roles", "joint")
"""The stages that decide which heads a role's set holds: `stability` re-runs only these
(the truncation scan and the confirmation measure, they do not choose)."""


@dataclass(frozen=True)
class DiscoverySettings:
    """`discover`'s settings, checked on construction (a bad value: `GnaValueError` /
    `GnaTypeError` naming it and what was expected; an unknown keyword: a "did you mean").

    ``discover(model, task, max_candidates=8)`` builds one; so does
    ``discover(model, task, settings=DiscoverySettings(max_candidates=8))``. A circuit records
    them in ``circuit.settings`` (`circuit_dict`), and `from_dict` reads them back from it.

    Attributes:
        stages: which optional stages to run (`STAGES`; ``"heads"`` and ``"roles"`` are needed
            for any head to be found).
        layers: layers to head-scan; default (``None``) every layer.
        max_candidates: heads examined for roles: the most harmful ones when ablated
            (every head of the scanned layers, if there are at most this many).
        max_heads_per_role: largest head set tried when measuring what a role needs: a
            role whose heads together do not collapse accuracy keeps growing up to it (the
            curve of accuracy against heads ablated is in ``circuit.needs[role].curve``).
        chance_margin: "collapsed" means accuracy at most chance + this.
        thresholds: role-label thresholds (`RoleThresholds`; default ``RoleThresholds()``).
        pattern_prompts: prompts used for the pattern scores.
        screen_above: layers with more heads are scanned by adaptive group testing
            (`group_testing.group_testing`: about ``2 k log2 N`` group forwards for ``k`` costly
            heads among ``N``), not head by head.
        check_labels: on multiple-choice tasks, measure the accuracy with the labels
            shuffled (`tasks.shuffle_labels`), as ``accuracy["shuffled_labels"]``.
        prescreen_above: when the scanned layers hold more heads than this, only some are
            ablated one by one (`head_scans.prescreen`): every head of the layers whose removal
            costs at least ``thresholds.min_effect`` (layer scan; such a layer of more than
            ``screen_above`` heads by group testing instead), and the
            ``prescreen_keep`` heads with the largest attribution estimate. The others are not
            measured (NaN in ``head_scan``).
        prescreen_keep: see ``prescreen_above``; default (``None``) ``2 * max_candidates``
            (`keep`).
        search_at_chance: search even when there is no retrieval to explain (to exercise the
            stages on a random model). By default, a clean accuracy below
            `stages.retrieval_floor` (chance + ``max(chance_margin, 2 sqrt(chance (1 - chance)
            / n_prompts))``: two binomial standard errors, stated in prompts in the circuit's
            note) stops discovery after the baseline: the circuit's ``mechanism`` is
            ``"none"``, it names no role heads, and its summary, JSON and report say "no
            retrieval to explain" with the numbers.
        joint_search: how the joint stage grows each role's set (`joint.JOINT_SEARCHES`):
            ``"ordered"`` tries the pool's heads that cost accuracy alone, in the order of
            their own effect at the role's positions (the entry scan's), one forward per head
            tried, and where they fall short of chance continues by the greedy search over
            the whole pool from the heads it kept (`search.role_set`); ``"greedy"`` runs only
            that search, which re-ranks the rest after each head, one forward per pool head at
            each step.
        ablation_kinds: after the confirmation, the kinds of ablation besides discovery's zero
            under which each role's set (and both together) is ablated again, at every
            position and at the role's positions (`kinds.kinds_check`, the ``"kinds"``
            stage; `ablation_kinds` has the keys): ``"mean"`` (the head's mean output over
            the task's tokens), ``"resample"`` (its output on the corrupted prompts: skipped,
            with a note, where the task has none). The circuit says which roles hold
            (collapse accuracy to chance) under which kinds. Default ``()``: not checked
            (it costs about 10 passes on the 2-layer toys: 12 forwards over the task).
    """

    stages: tuple[str, ...] = STAGES
    layers: tuple[int, ...] | None = None
    max_candidates: int = 16
    max_heads_per_role: int = 8
    chance_margin: float = 0.10
    thresholds: RoleThresholds | None = None
    pattern_prompts: int = 64
    screen_above: int = 64
    check_labels: bool = True
    prescreen_above: int = 64
    prescreen_keep: int | None = None
    search_at_chance: bool = False
    joint_search: str = "ordered"
    ablation_kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stages, str) or not isinstance(self.stages, Sequence):
            raise GnaTypeError(f"stages={self.stages!r}: expected a sequence of stage names, some of {STAGES}")
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise GnaValueError(f"unknown stages {unknown}: expected a subset of {STAGES}")
        object.__setattr__(self, "stages", tuple(self.stages))
        if self.layers is not None:
            if isinstance(self.layers, (str, bytes)) or not isinstance(self.layers, Sequence):
                raise GnaTypeError(f"layers={self.layers!r}: expected a sequence of layer indices, or None for every layer")
            bad = [layer for layer in self.layers if isinstance(layer, bool) or not isinstance(layer, int)]
            if bad:
                raise GnaTypeError(f"layers={list(self.layers)!r}: {bad[0]!r} is not a layer index (an int)")
            object.__setattr__(self, "layers", tuple(self.layers))
        for name in ("max_candidates", "max_heads_per_role", "pattern_prompts", "screen_above", "prescreen_above", "prescreen_keep"):
            value = getattr(self, name)
            if value is None and name == "prescreen_keep":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "prescreen_above" else 1):
                least = 0 if name == "prescreen_above" else 1
                raise GnaValueError(f"{name}={value!r}: expected an int of at least {least}")
        margin = self.chance_margin
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise GnaValueError(f"chance_margin={margin!r}: expected a number in [0, 1)")
        if self.thresholds is not None and not isinstance(self.thresholds, RoleThresholds):
            raise GnaTypeError(f"thresholds={self.thresholds!r}: expected a RoleThresholds, or None for the defaults")
        for name in ("check_labels", "search_at_chance"):
            if not isinstance(getattr(self, name), bool):
                raise GnaTypeError(f"{name}={getattr(self, name)!r}: expected True or False")
        check_joint_search(self.joint_search)
        kinds = self.ablation_kinds
        if isinstance(kinds, str) or not isinstance(kinds, Sequence) or any(k not in ABLATION_CHECKS for k in kinds):
            raise GnaValueError(f"ablation_kinds={kinds!r}: expected a sequence of some of {ABLATION_CHECKS} (or () for none)")
        object.__setattr__(self, "ablation_kinds", tuple(dict.fromkeys(kinds)))

    @classmethod
    def build(cls, where: str = "discover", **settings: Any) -> DiscoverySettings:
        """The settings from keywords, an unknown one refused with the closest names."""
        known = [f.name for f in fields(cls)]
        unknown = [name for name in settings if name not in known]
        if unknown:
            hints = [
                f"{name!r}: did you mean {' or '.join(repr(c) for c in close)}?"
                for name in unknown
                if (close := difflib.get_close_matches(name, known, n=3))
            ]
            hint = f" ({'; '.join(hints)})" if hints else ""
            raise GnaTypeError(f"{where} got unknown discover settings {unknown}{hint}: expected some of {known}")
        return cls(**settings)

    @property
    def keep(self) -> int:
        """``prescreen_keep``, its default (``2 * max_candidates``) filled in."""
        return 2 * self.max_candidates if self.prescreen_keep is None else self.prescreen_keep

    @property
    def role_thresholds(self) -> RoleThresholds:
        """``thresholds``, the default `RoleThresholds()` filled in."""
        return self.thresholds or RoleThresholds()

    def to_dict(self) -> dict[str, Any]:
        """Every setting, JSON-ready (``thresholds`` as its dict; ``None`` kept)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["stages"] = list(self.stages)
        data["ablation_kinds"] = list(self.ablation_kinds)
        data["layers"] = None if self.layers is None else list(self.layers)
        data["thresholds"] = None if self.thresholds is None else self.thresholds.to_dict()
        return data

    def circuit_dict(self, scan_layers: list[int]) -> dict[str, Any]:
        """What ``circuit.settings`` records (`CIRCUIT_KEYS`, in that order): the layers
        scanned and ``prescreen_keep`` resolved, the thresholds used."""
        data = self.to_dict()
        data["layers"] = scan_layers
        data["prescreen_keep"] = self.keep
        data["thresholds"] = self.role_thresholds.to_dict()
        return {key: data[key] for key in CIRCUIT_KEYS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiscoverySettings:
        """The settings of `to_dict` or of a circuit's ``settings`` (its other keys, what the
        run measured, are skipped; ``screen_above``, which a circuit does not record, takes
        its default there)."""
        known = {f.name for f in fields(cls)}
        kept = {key: value for key, value in data.items() if key in known}
        if isinstance(kept.get("thresholds"), Mapping):
            kept["thresholds"] = RoleThresholds(**kept["thresholds"])
        return cls(**kept)
