"""`GnaCircuit`: what discovery found, with its evidence (`evidence`); JSON round-trips exactly."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.heads import Head
from ..scoring.carries import carries_from_curve
from ..scoring.verdicts import Verdict, collapse_verdict, count_difference_verdict
from .ablation_kinds import describe_kinds
from .estimate import passes_range
from .evidence import POSITIONS, ROLES, HeadEvidence, RoleNeed, SpreadRole, Stability, Standing
from .positions import PositionScan, describe_coverage
from .positions import describe as describe_positions
from .roles import RoleThresholds, pattern_shortfall

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class GnaCircuit:
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
        truncation, layer_scan: per layer, accuracy keeping layers ``0..l`` / skipping ``l``;
            a layer the screened layer scan cleared in a group (`layer_scans.screen_layers`)
            holds its group's accuracy, with the layers skipped in
            ``settings["layer_scan"]["skipped"][l]`` (``[l, l]``: skipped alone).
        head_scan: ``[layer][head]`` single-ablation accuracy (``None``: not scanned).
        critical_layer: from the truncation scan (``None``: no jump found).
        path_patching: the Gather -> Aggregate edge, at the final position: the logit of
            the clean prompt's answer minus that of the corrupted prompt's answer on the
            ``clean`` and the ``corrupt`` prompts, the same on the clean prompts with the
            Gather heads corrupted and only the Aggregate heads of later positions reading
            the change (``gather->aggregate``), and ``fraction_of_effect``: ``(clean -
            gather->aggregate) / (clean - corrupt)``, the share of the clean - corrupt gap
            that path alone reproduces (0: none, 1: all of it).
        score: MIB's circuit score of discovery's ranking (`gna.circuit_score`'s
            ``to_dict()``: ``cpr``, ``cmd``, ``faithfulness`` per size, ``ranking``; the
            circuit's heads first), on the clean prompts against the corrupted ones
            (``None``: not measured, see `confirm.mib_score`).
        positions: where each costly layer acts (`positions.PositionScan`: accuracy with
            its heads ablated together at each position class; ``None``: not measured).
        settings: thresholds and knobs used.
        attribution: ``[layer][head]`` attribution estimate of each head's zero-ablation
            effect on the candidate logit difference, when the prescreen ran (``None``
            otherwise; see `discover`'s ``prescreen_above``).
        cost: what discovery ran (`gna_interp.cost.Cost`): ``forwards``, ``rows``,
            ``block_rows``, ``passes`` (block_rows / (prompts x layers)), ``requests``
            (remote round trips), ``backwards``, ``seconds``; ``size_curves``: per spread role
            sized (`SpreadRole.sizes`), what its curve and ordering cost (part of the totals);
            ``stages``: what each stage of `plan.PLAN` cost, the same counts and ``passes``
            (`pipeline.stage_costs`; their sums are the totals); ``confirm``: the same for each
            part of the confirmation that ran (`cost.tally`; they sum to its stage: on a remote
            model ``needs`` is its first request, which carries the spread check's and the
            position scan's evaluations too); ``estimate``: the passes estimated beforehand.
        n_segments: the task's options (segments) per prompt: the pattern's chance is
            ``1 / n_segments`` (``None``: a circuit written before it was recorded).
        stability: how often discovery chose each head on other prompt samples
            (`Stability`; ``None``: not measured, see ``discover``'s ``stability``).
        spread: per role that no set of up to ``max_heads_per_role`` heads takes to
            chance (an empty role included), where it enters and the best set found
            (`SpreadRole`): an empty role list with an entry here means "spread beyond the
            search", not "absent".
        mechanism: what the model's answers rest on: ``"g&a"`` (it reads the options'
            labels: the roles are Gather and Aggregate), ``"counting"`` (the label check:
            with the labels shuffled it falls to chance, it answers by the option's place;
            the role sets then hold counting heads, named by where they act, ``count@seg``
            on the segments and ``count@end`` at the final position), ``"none"`` (clean
            accuracy below ``settings["retrieval_floor"]``: no retrieval to explain, no role
            heads), ``"partly"`` (it reads the labels in part: with them shuffled, above
            chance but below clean), ``"undetermined"`` (the label check's interval straddles
            a line: its verdict says how many prompts would settle it). ``None``: a circuit
            written before it was recorded. ``headline()`` says it in words (also the JSON's
            ``"headline"``).
        verdicts: the tested verdicts (`scoring.verdicts.Verdict`: word, estimate, interval,
            line, prompts to settle): ``"labels"`` (the mechanism, `verdicts.label_verdict`),
            with its tests ``"labels_vs_chance"`` and ``"labels_vs_clean"``; after the
            confirmation, whether each role's set and each ablation of the table collapses
            accuracy to chance (``"collapses:gather"``, ``"collapses:-both"``...: `collapse_verdicts`),
            and whether each head of a set, ablated alone, has an effect (``"alone:L1H0"``:
            `alone_verdicts`).

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
    mechanism: str | None = None
    score: dict[str, Any] | None = None
    positions: PositionScan | None = None
    verdicts: dict[str, Verdict] = field(default_factory=dict)

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

    def to_dict(self, finite: bool = True) -> dict[str, Any]:
        """JSON-ready values; ``finite=False`` keeps NaN and infinities as they are (for
        ``json.dumps(allow_nan=True)``: a run directory's exact copy, `records`)."""
        data = asdict(self)
        data["gather"] = [str(h) for h in self.gather]
        data["aggregate"] = [str(h) for h in self.aggregate]
        data["heads"] = [item.to_dict() for item in self.heads]
        data["needs"] = {role: need.to_dict() for role, need in self.needs.items()}
        data["stability"] = None if self.stability is None else self.stability.to_dict()
        data["spread"] = {role: item.to_dict() for role, item in self.spread.items()}
        data["positions"] = None if self.positions is None else self.positions.to_dict()
        data["verdicts"] = {name: verdict.to_dict() for name, verdict in self.verdicts.items()}
        data["headline"] = None if self.mechanism is None else self.headline()  # words for readers; not read back
        return _finite(data) if finite else data

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> GnaCircuit:
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            text = Path(text).read_text()
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GnaCircuit:
        """The circuit of `to_dict` (its ``headline`` dropped: words, not read back)."""
        data = dict(data)
        data.pop("headline", None)
        data["gather"] = [Head.parse(h) for h in data["gather"]]
        data["aggregate"] = [Head.parse(h) for h in data["aggregate"]]
        data["heads"] = [HeadEvidence.from_dict(item) for item in data["heads"]]
        data["needs"] = {role: RoleNeed.from_dict(need) for role, need in data["needs"].items()}
        data["stability"] = None if data.get("stability") is None else Stability.from_dict(data["stability"])
        data["spread"] = {role: SpreadRole.from_dict(item) for role, item in data.get("spread", {}).items()}
        data["positions"] = None if data.get("positions") is None else PositionScan.from_dict(data["positions"])
        data["verdicts"] = {name: Verdict.from_dict(item) for name, item in data.get("verdicts", {}).items()}
        return cls(**data)

    # ----- views -------------------------------------------------------------------
    def named(self, heads: list[Head]) -> str:
        """``"L0H1, L1H5"``; in a model with both kinds of heads, each with its kind
        (``"L1H5 (ssm)"``)."""
        kinds = {item.head: item.kind for item in self.heads}
        mixed = len({kind for kind in kinds.values() if kind}) > 1
        return ", ".join(f"{h} ({kinds[h]})" if mixed and kinds.get(h) else str(h) for h in heads) or "-"

    def unit(self) -> str:
        """What a head of the model is called: ``"channels"`` in a Mamba-1 model, else ``"heads"``."""
        return "channels" if self.family in ("mamba", "falcon_mamba") else "heads"

    def role_name(self, role: str) -> str:
        """``role`` as the circuit's mechanism names it: ``"gather"`` / ``"aggregate"``, or for
        a counting circuit ``"count@seg"`` / ``"count@end"`` (where its heads act)."""
        return COUNTING_NAMES[role] if self.mechanism == "counting" else role

    def _tested(self) -> str:
        """`` [0.950, 0.988]``: the label check's interval of the shuffled accuracy (``""``: none recorded)."""
        tested = self.verdicts.get("labels")
        return "" if tested is None else f" [{tested.interval[0]:.3f}, {tested.interval[1]:.3f}]"

    def headline(self) -> str:
        """What the circuit shows, in one sentence with its numbers: the mechanism
        (``"no retrieval to explain: ..."``, ``"counting, not G&A: ..."`` or ``"G&A: ..."``)."""
        acc = self.accuracy
        clean, chance = acc["clean"], acc["chance"]
        if self.mechanism == "none":
            floor = self.settings.get("retrieval_floor") or {}
            needed = f"; needs at least {floor['accuracy']:.3f} ({floor['prompts']} prompts)" if floor else ""
            return (
                f"no retrieval to explain: clean accuracy {clean:.3f} ({round(clean * self.n_prompts)} of {self.n_prompts} prompts), "
                f"chance {chance:.3f}, margin {floor.get('margin', float('nan')):.3f}{needed}; no role heads named"
            )
        if self.mechanism == "counting":
            shuffled = acc.get("shuffled_labels", float("nan"))
            return (
                f"counting, not G&A: with the labels shuffled accuracy falls from {clean:.3f} to {shuffled:.3f}{self._tested()} "
                f"(chance {chance:.3f}): the model answers by the option's place; its heads count options "
                "(count@seg: on the segments, count@end: at the final position)"
            )
        labels = f", {acc['shuffled_labels']:.3f}{self._tested()} with the labels shuffled" if "shuffled_labels" in acc else ""
        tested = self.verdicts.get("labels")
        if self.mechanism == "partly":
            return f"G&A, partly by label: clean accuracy {clean:.3f} (chance {chance:.3f}{labels}): {tested.text if tested else ''}"
        if self.mechanism == "undetermined":
            return f"mechanism undetermined: clean accuracy {clean:.3f} (chance {chance:.3f}{labels}): {tested.text if tested else ''}"
        return f"G&A: clean accuracy {clean:.3f} (chance {chance:.3f}{labels}): the model retrieves by label"

    def summary(self, faithfulness: Any = None) -> str:
        """The circuit in lines; with its ``faithfulness`` curve (`report_inputs.circuit_faithfulness`), whether it carries the task."""
        acc = self.accuracy
        parts = [f"{self.model} on {self.task} ({self.n_prompts} prompts)"]
        if self.mechanism is not None:
            parts.append(f"  mechanism {self.headline()}")
        if self.positions is not None:
            parts.append(f"  where     {describe_positions(self.positions)}")
        if self.settings.get("coverage"):
            parts.append(f"  collapses {describe_coverage(self.settings['coverage'])} (each ablated at those positions)")
        for role in ROLES:
            if self.mechanism == "none" and not getattr(self, role) and role not in self.spread:
                continue
            parts.append(f"  {self.role_name(role):9s} {self.named(getattr(self, role))}")
            if getattr(self, role):
                parts.append(f"            {self.describe_role(role)}")
                if (alone := describe_alone(self, role)) is not None:
                    parts.append(f"            {alone}")
            if role in self.spread:
                spread = self.spread[role]
                parts.append(f"            {spread.describe()}")
                if spread.best is not None and spread.best.curve and role not in self.needs:
                    parts.append(f"            curve ({POSITIONS[spread.best.curve_positions]}): {spread.best.describe_curve()}")
                if spread.sizes:  # the role's size (`discovery.sizes`)
                    spent = (self.cost or {}).get("size_curves", {}).get(role)
                    paid = f"; cost {spent['passes']:.1f} passes, {spent['backwards']:.0f} backward(s)" if spent else ""
                    parts.append(f"            size: {spread.describe_size(unit=self.unit())}{paid}")
                    parts.append(f"            size curve (k most important heads, accuracy): {spread.describe_curve()}")
        if self.gather or self.aggregate:
            parts.append(f"  evidence  {self.evidence_rule()}")
        parts.append("  accuracy  " + "  ".join(f"{k} {v:.3f}" for k, v in acc.items() if "@" not in k))  # kinds: below
        if "-gather" in acc:
            parts.append("            (-gather, -aggregate, -both, only_gna: their heads ablated at every position)")
        kinds = describe_kinds(self.accuracy, self.verdicts, self.settings)
        parts += [f"  {'kinds' if i == 0 else '':9s} {line}" for i, line in enumerate(kinds)]
        for role, need in self.needs.items():
            parts.append(f"  {self.role_name(role):9s} {need.describe()}")
            if need.curve:
                parts.append(f"            curve ({POSITIONS[need.curve_positions]}): {need.describe_curve()}")
            if f"collapses:{role}" in self.verdicts:
                parts.append(f"            tested: {self.verdicts[f'collapses:{role}'].text}")
        if self.path_patching is not None:
            parts.append(f"  path      {self.describe_path()}")
        if self.mechanism != "none" and (carried := carries_from_curve(faithfulness)) is not None:
            parts.append(f"  carries   {carried.text}")
        if self.score is not None:
            parts.append(f"  score     {describe_score(self.score)}")
        if self.stability is not None:
            parts += [f"  {'stability' if i == 0 else '':9s} {line}" for i, line in enumerate(describe_stability(self))]
        if self.cost is not None and "passes" in self.cost:  # `discover_records`' circuit holds its stages' parts alone
            parts.append(f"  cost      {describe_cost(self.cost)}")
        parts += [f"  note: {note}" for note in self.warnings]
        return "\n".join(parts)


def collapse_verdicts(circuit: GnaCircuit) -> dict[str, Verdict]:
    """Whether each role's set (``needs``) and each ablation of the confirmation table
    (``-gather``, ``-aggregate``, ``-both``) collapses accuracy: its accuracy against chance +
    ``chance_margin`` (`verdicts.collapse_verdict`, Wilson), from its count of right answers
    over the circuit's prompts (an accuracy that is not a count of them is skipped)."""
    n, chance = circuit.n_prompts, circuit.accuracy["chance"]
    margin = float(circuit.settings.get("chance_margin", 0.10))
    measured = {role: (need.accuracy, f"{role} set ablated ({len(need.heads)} heads, zero)") for role, need in circuit.needs.items()}
    confirmed = [key for key in ("-gather", "-aggregate", "-both") if key in circuit.accuracy]
    measured |= {key: (circuit.accuracy[key], f"{key} ablated (zero)") for key in confirmed}
    found = {}
    for key, (accuracy, kind) in measured.items():
        right = round(accuracy * n)
        if n and abs(right / n - accuracy) < 1e-6:
            found[f"collapses:{key}"] = collapse_verdict([True] * right + [False] * (n - right), chance, margin, kind)
    return found


def alone_verdicts(circuit: GnaCircuit) -> dict[str, Verdict]:
    """Per head of a role's set ablated alone (``verified``): whether its ablation lowers
    accuracy by at least ``thresholds.min_effect`` (`Standing`'s effect alone), clean minus
    ablated against it from the two counts of right answers (`verdicts.count_difference_verdict`,
    Newcombe: unpaired, so conservative for these paired runs). Keys ``"alone:L1H0"``."""
    n, clean = circuit.n_prompts, circuit.accuracy["clean"]
    found = {}
    for item in circuit.heads:
        if item.role is None or not item.verified or item.ablated_accuracy is None or not n:
            continue
        right, ablated = round(clean * n), round(item.ablated_accuracy * n)
        if abs(right / n - clean) < 1e-6 and abs(ablated / n - item.ablated_accuracy) < 1e-6:
            kind = f"{item.head} alone: clean - ablated (zero)"
            words = ("effect", "no effect")
            found[f"alone:{item.head}"] = count_difference_verdict(right, n, ablated, n, circuit.thresholds.min_effect, kind, words=words)
    return found


def describe_alone(circuit: GnaCircuit, role: str) -> str | None:
    """``"tested alone: L1H0 effect, L1H2 undetermined (about 300 prompts)"``: each head of the
    role's set with its `alone_verdicts` verdict (``None``: none recorded)."""
    tested = [(h, circuit.verdicts.get(f"alone:{h}")) for h in getattr(circuit, role)]
    shown = [f"{h} {v.word}" + (f" (about {v.prompts_to_settle} prompts)" if v.prompts_to_settle else "") for h, v in tested if v]
    return f"tested alone: {', '.join(shown)}" if shown else None


COUNTING_NAMES = {"gather": "count@seg", "aggregate": "count@end"}
"""A counting circuit's role sets, named by where their heads act (`GnaCircuit.role_name`)."""


STABLE_FREQUENCY = 0.8
"""A head of the circuit's set chosen in fewer than this share of the stability samples is
marked unstable (`unstable_heads`: the summary and the report say so)."""


def unstable_heads(circuit: GnaCircuit) -> dict[str, list[tuple[Head, float]]]:
    """Per role, each head of the circuit's set with its membership frequency over the
    stability samples (`Stability.frequency`) when below `STABLE_FREQUENCY` (empty: none
    measured, or every head stable)."""
    stability = circuit.stability
    if stability is None:
        return {}
    frequency = stability.frequency
    found = {}
    for r, role in enumerate(ROLES):
        low = [(h, float(frequency[r, h.layer, h.head])) for h in getattr(circuit, role)]
        low = [(h, f) for h, f in low if f < STABLE_FREQUENCY]
        if low:
            found[role] = low
    return found


def describe_stability(circuit: GnaCircuit) -> list[str]:
    """Lines: per role, the set sizes over the samples and how often each head of the
    circuit's set (and any other head chosen) was chosen; the heads of the set chosen in
    fewer than `STABLE_FREQUENCY` of the samples marked."""
    stability = circuit.stability
    if stability is None:
        return []
    how = "bootstrap samples" if stability.sampling == "bootstrap" else "prompt samples"
    lines = [f"over {stability.k} {how} of {', '.join(map(str, sorted(set(stability.n_prompts))))} prompts:"]
    counts, unstable = stability.counts, unstable_heads(circuit)
    for r, role in enumerate(ROLES):
        found = [(int(counts[r, layer, head]), Head(layer, head)) for layer, head in counts[r].nonzero().tolist()]
        chosen = sorted(found, key=lambda c: -c[0])
        heads = ", ".join(f"{head} {count}" for count, head in chosen) or "-"
        lines.append(f"{role} set sizes {', '.join(map(str, stability.sizes(role)))}; chosen (of {stability.k}): {heads}")
        if role in unstable:
            marked = ", ".join(f"{h} {f:.2f}" for h, f in unstable[role])
            lines.append(f"unstable {role} heads (in fewer than {STABLE_FREQUENCY:.0%} of the samples): {marked}")
    return lines


def describe_score(score: dict[str, Any]) -> str:
    """``"MIB CPR 0.91 (higher is better), CMD 0.08 (lower is better) over 8 heads, ..."``."""
    return (
        f"MIB CPR {score['cpr']:.3f} (area under f, higher is better), CMD {score['cmd']:.3f} (area under |1 - f|, lower is "
        f"better): f = (m(C) - m(empty)) / (m(N) - m(empty)) of the top-k of {score['n_units']} {score['unit']}s (circuit's "
        f"{score['circuit_size']} first; the rest ablated {score['how']}) at {len(score['sizes'])} sizes, m = the logit "
        f"difference, {score['metric_full']:.3f} clean, {score['metric_empty']:.3f} with every head {score['how']}"
    )


def _share(value: float | None) -> str:
    """A fraction as ``"0.93"`` (``"-"`` when undefined: a zero clean - corrupt gap)."""
    return "-" if value is None or value != value else f"{value:.2f}"


def describe_cost(cost: dict[str, Any]) -> str:
    """``"181 forwards, 58.0 passes over 200 prompts x 2 layers, 0 requests, 12.3 s"``."""
    text = f"{cost['forwards']} forwards, {cost['passes']:.1f} passes over {cost['n_prompts']} prompts x {cost['n_layers']} layers"
    text += f", {cost['requests']} requests"
    if cost.get("backwards"):
        text += f", {cost['backwards']} backward(s)"
    text += f", {cost['seconds']:.1f} s"
    if cost.get("estimate"):
        text += f" (estimated beforehand: {passes_range(cost['estimate'])})"
    return text


def _finite(value: Any) -> Any:
    """NaN / inf -> None, recursively (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
