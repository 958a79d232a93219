"""The rows of the report's tables (`viz.report`), as plain dicts of column -> value: the
role table, the examined heads, the accuracy under each ablation, path patching, and what
discovery cost in passes and time. Nothing is measured here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..discovery.ablation_kinds import holds, table
from ..discovery.estimate import passes_range
from ..discovery.evidence import POSITIONS, ROLES, Standing
from ..discovery.positions import POSITION_CLASSES
from ..discovery.roles import entry_shares
from .report_html import DASH

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit


def contrast_rows(circuits: list[GnaCircuit]) -> list[dict[str, Any]]:
    """Per model and role: the role's set, the heads with the role outright, heads needed to
    collapse accuracy, and the sharpness of the role's rows."""
    rows = []
    for circuit in circuits:
        for role in ROLES:
            heads = getattr(circuit, role)
            need = circuit.needs.get(role)
            scores = [circuit.evidence(h).scores for h in heads]
            entropies = [getattr(s, f"{role}_entropy") for s in scores if s is not None]
            tops = [getattr(s, f"{role}_top1") for s in scores if s is not None]
            standings = [circuit.standing(h) for h in heads]
            shown = sum(s is not None and s.shortfall == () for s in standings)
            outright = circuit.outright(role)
            named = f": {circuit.named(outright)}" if outright else ""
            rows.append(
                {
                    "model": circuit.model,
                    "mechanism": circuit.mechanism or "-",
                    "role": circuit.role_name(role),
                    "set": circuit.named(heads),
                    "role outright (effect alone, pattern)": f"{len(outright)} of {len(heads)}{named}",
                    "pattern shows the role": f"{shown} of {len(heads)}",
                    "heads needed": None if need is None else f"{len(need.heads)}: {circuit.named(need.heads)}",
                    "collapses to chance": None if need is None else ("yes" if need.reached_chance else "no"),
                    "accuracy, needed heads ablated at every position": None if need is None else need.accuracy,
                    "mean entropy (nats)": sum(entropies) / len(entropies) if entropies else None,
                    "mean top-1 mass": sum(tops) / len(tops) if tops else None,
                }
            )
    return rows


def _short(circuit: GnaCircuit, head: Any) -> str:
    """A head's label in a figure: ``L1H0``, or in a hybrid ``L1H0 attn`` / ``L1H5 ssm``."""
    return circuit.named([head]).replace(" (attention)", " attn").replace(" (ssm)", " ssm")


_ROLE_AT = {(role, positions): f"{role} ({where})" for role in ROLES for positions, where in POSITIONS.items()}


def examined_rows(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """The examined-heads table: what a reader needs per head (the full evidence is in the
    JSON). A head of a role's set has the role outright only with an effect alone and a
    pattern that shows it; otherwise it is a member of the set (`GnaCircuit.standing`)."""
    clean = circuit.accuracy["clean"]
    rows = []
    for item in circuit.heads:
        standing = circuit.standing(item.head)
        role = DASH if standing is None else standing.describe() + (" (added by the joint search)" if item.joint else "")
        rows.append(
            {
                "head": str(item.head),
                "kind": item.kind or DASH,
                "role": role,
                "accuracy, ablated alone at every position": _alone(item.ablated_accuracy, item.verified),
                "effect enters at": _entry(clean, item.ablated_accuracy, item.entry),
                "pattern shows the role": _pattern(standing),
            }
        )
    return rows


def _alone(accuracy: float | None, verified: bool) -> float | str | None:
    """A head's accuracy ablated alone; for a head cleared in a group (not verified: the head
    scan's quiet heads, `head_scans.HeadScan.cleared`) its group's, said so."""
    return accuracy if verified or accuracy is None else f"{accuracy:.3f} (cleared in a group)"


def _pattern(standing: Standing | None) -> str:
    """``"yes"``, or ``"no: lift 1.115 < 1.5"``: the thresholds the pattern misses."""
    if standing is None or standing.shortfall is None:
        return DASH
    return "yes" if not standing.shortfall else "no: " + ", ".join(standing.shortfall)


def conditions(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """The accuracy table, each row with what was ablated and where."""

    def heads(n: int) -> str:
        return f"{n} head{'' if n == 1 else 's'}"

    n_gather, n_aggregate = len(circuit.gather), len(circuit.aggregate)
    every = POSITIONS["all"]
    ablated = {
        "clean": "nothing",
        "chance": "(one over the candidates)",
        "shuffled_labels": "nothing; each prompt's labels shuffled",
        "-gather": f"the Gather set ({heads(n_gather)}), {every}",
        "-aggregate": f"the Aggregate set ({heads(n_aggregate)}), {every}",
        "-both": f"both sets ({heads(n_gather + n_aggregate)}), {every}",
        "only_gna": f"every other head of their layers, {every}",
    }
    return [{"condition": k, "ablated": ablated.get(k, DASH), "accuracy": v} for k, v in circuit.accuracy.items() if "@" not in k]


def kinds_rows(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """The kinds check's table (`ablation_kinds.table`): per set, each kind's accuracy at every
    position and at the set's positions, and whether it collapses accuracy (empty: not checked)."""
    checked = circuit.settings.get("kinds_checked")
    if not checked:
        return []
    rows, where = [], checked.get("where", {})
    for row in table(circuit.accuracy, circuit.verdicts, where):
        name = str(row["set"])
        out: dict[str, Any] = {"set": name, "its positions": where.get(name, DASH)}
        for kind in checked["kinds"]:
            if kind in row:
                out[f"{kind}, every position"] = row[kind]
                out[f"{kind}, its positions"] = row.get(f"{kind}:{where.get(name)}", DASH)
                out[f"{kind}: collapses?"] = row.get(f"{kind}?") or DASH
        out["holds under"] = ", ".join(holds([row])[str(row["set"])]) or "none"
        rows.append(out)
    return rows


def path_rows(path: dict[str, float]) -> list[dict[str, Any]]:
    """The path-patching table: each logit difference with its share of the clean ->
    corrupt change, ``(clean - value) / (clean - corrupt)``."""
    clean, corrupt = path["clean"], path["corrupt"]
    gap = clean - corrupt

    def share(value: float) -> float | None:
        return (clean - value) / gap if abs(gap) > 1e-9 else None

    runs = [
        ("clean prompts", clean),
        ("corrupted prompts", corrupt),
        ("clean, Gather heads corrupted, reaching the output only through the Aggregate heads", path["gather->aggregate"]),
    ]
    return [{"run": run, "logit difference": value, "share of the clean → corrupt gap": share(value)} for run, value in runs]


def _entry(clean: float, ablated: float | None, entry: dict[str, float] | None) -> str:
    """Where a head's effect enters the residual stream, with the share of it that ablating
    the head there alone reproduces (`entry_shares`)."""
    if ablated is None or entry is None:
        return DASH
    shares = entry_shares(clean, ablated, entry)
    if shares is None:
        return "no effect"
    final, segments = shares
    if final is None:  # not measured: no label read it (`discover` measures it where one does)
        return f"segments ({segments:.0%}; final position not measured)"
    return f"final position ({final:.0%})" if final >= segments else f"segments ({segments:.0%})"


def cost_rows(cost: dict[str, Any]) -> list[dict[str, Any]]:
    """What discovery ran, in passes and time: a pass is one forward of every prompt through
    every layer (rows x blocks evaluated / (prompts x layers)); the meter's raw counters
    stay in the JSON."""
    rows = [
        {"what": "passes over the prompts (forward)", "value": f"{cost['passes']:.1f}"},
        {"what": "time", "value": f"{cost['seconds']:.1f} s"},
        {"what": "prompts x layers", "value": f"{cost['n_prompts']} x {cost['n_layers']}"},
    ]
    if cost.get("estimate"):
        estimate = cost["estimate"]
        rows.append({"what": "passes estimated beforehand", "value": f"{passes_range(estimate)} (mid {estimate['mid']:.0f})"})
    if cost.get("backwards"):
        rows.append({"what": "backward passes (each about two forwards)", "value": str(cost["backwards"])})
    if cost.get("requests"):
        rows.append({"what": "requests to the remote server", "value": str(cost["requests"])})
    for role, spent in (cost.get("size_curves") or {}).items():
        rows.append({"what": f"{role.capitalize()} size curve", "value": f"{spent['passes']:.1f} passes"})
    for key, what in (("stages", "passes by stage (in the order run)"), ("confirm", "passes of the confirmation's parts")):
        listed = (cost.get(key) or {}).items()
        spent = [f"{name.replace('_', ' ')} {counts['passes']:.1f}" for name, counts in listed if counts["passes"] >= 0.05]
        if spent:
            rows.append({"what": what, "value": ", ".join(spent)})
    return rows


def position_rows(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """The position scan's table (`GnaCircuit.positions`): per scanned layer, the accuracy with
    its heads ablated together at each position class, and the classes where that costs
    (empty: not measured). The classes of a layer the screen cleared together
    (``PositionScan.cleared``) read "with the others" and the group's accuracy."""
    scan = circuit.positions
    if scan is None:
        return []
    names = list(dict.fromkeys(name for values in scan.accuracy.values() for name in values))
    names = [name for name in POSITION_CLASSES if name in names or scan.cleared]
    names = [name for name in names if name not in scan.same]
    rows = []
    for layer, values in scan.accuracy.items():
        row: dict[str, Any] = {"layer": layer}
        for name in names:
            if name in values:
                row[name] = f"{values[name]:.3f}"
            else:
                row[name] = f"with the others {scan.cleared[layer]:.3f}" if layer in scan.cleared else DASH
        row["acts at"] = ", ".join(scan.acting(layer)) or "nowhere alone"
        rows.append(row)
    return rows


def coverage_rows(circuit: GnaCircuit) -> list[dict[str, Any]]:
    """Each collapse the circuit covers (``settings["coverage"]``): the role and layer, where,
    the layer's floor there and the role's heads of that layer ablated there."""
    return [
        {
            "collapse": key,
            "positions": item["positions"],
            "whole layer": f"{item['floor']:.3f}",
            "the role's heads": f"{item['accuracy']:.3f}",
            "heads": ", ".join(item["heads"]),
        }
        for key, item in circuit.settings.get("coverage", {}).items()
    ]
