"""The report's first screen per model: one figure (`overview_figure`) and one sentence
(`headline`), both drawn from a `ReportInputs` measured before (no forward here).

The figure has three panels: every head by layer and index, coloured by its role (filled:
the role outright; hatched: a member of the role's set only); accuracy as each role's
needed heads are ablated together (the collapse curves); and the circuit kept alone
against every head and none, each accuracy with its 95% Wilson interval over the prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .figures import Drawing, to_svg

if TYPE_CHECKING:
    from ..discovery.circuit import GnaCircuit
    from ..discovery.report_inputs import ReportInputs

ROLE_COLOURS = {"gather": "#2166ac", "aggregate": "#d6604d", "both": "#7b3294"}
CHANCE, CLEAN = "#888888", "#1a9850"


def head_grid(circuit: GnaCircuit) -> tuple[int, int, dict[tuple[int, int], tuple[str, bool]]]:
    """``(layers, heads per layer, {(layer, index): (role, outright)})``: the grid's shape
    (the head scan's, else the largest head examined) and each role head's cell; ``role``
    is ``"gather"``, ``"aggregate"`` or ``"both"``."""
    scan = circuit.head_scan or []
    known = [item.head for item in circuit.heads] + [*circuit.gather, *circuit.aggregate]
    layers = max([len(scan), *(h.layer + 1 for h in known)])
    width = max([max((len(row) for row in scan), default=0), *(h.head + 1 for h in known)])
    cells: dict[tuple[int, int], tuple[str, bool]] = {}
    for head in dict.fromkeys([*circuit.gather, *circuit.aggregate]):
        roles = [role for role in ("gather", "aggregate") if head in getattr(circuit, role)]
        outright = any(head in circuit.outright(role) for role in roles)
        cells[head.layer, head.head] = ("both" if len(roles) == 2 else roles[0], outright)
    return layers, width, cells


def _grid_panel(axes: Any, circuit: GnaCircuit) -> None:
    from matplotlib.patches import Patch, Rectangle

    layers, width, cells = head_grid(circuit)
    for layer in range(layers):
        for index in range(width):
            role, outright = cells.get((layer, index), ("", False))
            colour = ROLE_COLOURS.get(role, "#f0f0f0")
            face = colour if outright or not role else "white"
            axes.add_patch(
                Rectangle(
                    (index - 0.45, layer - 0.45), 0.9, 0.9, facecolor=face, edgecolor=colour, hatch=None if outright or not role else "///"
                )
            )
    kinds = {(item.head.layer, item.head.head): item.kind for item in circuit.heads if item.kind}
    if "ssm" in kinds.values():  # a hybrid: each examined head's kind in its cell
        for (layer, index), kind in kinds.items():
            axes.text(index, layer, "s" if kind == "ssm" else "a", ha="center", va="center", fontsize=7, color="#333333")
    axes.set_xlim(-0.6, width - 0.4)
    axes.set_ylim(-0.6, layers - 0.4)
    axes.set_xticks(range(width))
    axes.set_yticks(range(layers))
    axes.set_xlabel("head (index in its layer)")
    axes.set_ylabel("layer")
    hybrid = any(item.kind == "ssm" for item in circuit.heads)
    axes.set_title("Heads by layer and index, by role" + (" (a: attention, s: SSM)" if hybrid else ""), fontsize=9, loc="left")
    handles = [Patch(facecolor=ROLE_COLOURS[r], label=r.capitalize()) for r in ("gather", "aggregate")]
    if any(role == "both" for role, _ in cells.values()):  # a head in both sets
        handles.append(Patch(facecolor=ROLE_COLOURS["both"], label="in both sets"))
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="///", label="member of the set only"))
    axes.legend(handles=handles, fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0, -0.18), ncol=3 if len(handles) == 3 else 2)


def _collapse_panel(axes: Any, circuit: GnaCircuit) -> None:
    clean, chance = circuit.accuracy["clean"], circuit.accuracy["chance"]
    for role, need in sorted(circuit.needs.items()):
        if need.curve:
            values = [clean, *(a for _, a in need.curve)]
            axes.plot(range(len(values)), values, "o-", color=ROLE_COLOURS[role], label=f"{role.capitalize()} heads ablated")
    axes.axhline(chance, color=CHANCE, lw=0.8, ls=":", label="chance")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("heads ablated together (every position)")
    axes.set_ylabel("accuracy")
    axes.set_title("Collapse: accuracy as the needed heads are ablated", fontsize=9, loc="left")
    axes.legend(fontsize=7, frameon=False)


def _share_panel(axes: Any, inputs: ReportInputs) -> None:
    curve = inputs.faithfulness
    axes.set_xlim(0, 1.02)
    axes.set_title("The circuit alone (95% intervals)", fontsize=9, loc="left")
    if curve is None or curve.circuit_point is None:
        axes.text(0.5, 0.5, "no heads: nothing kept", ha="center", va="center", transform=axes.transAxes)
        axes.set_yticks([])
        return
    rows = [
        ("every head", "clean", CLEAN),
        (f"circuit ({len(curve.circuit)} heads)", "alone", ROLE_COLOURS["both"]),
        ("none", "ablated", CHANCE),
    ]
    for y, (_, which, colour) in enumerate(rows):
        value = {"clean": curve.clean, "alone": curve.circuit_point, "ablated": curve.ablated}[which]["accuracy"]
        low, high = inputs.interval(which) or (value, value)
        axes.barh(y, value, color=colour, height=0.6)
        axes.errorbar([value], [y], xerr=[[max(0.0, value - low)], [max(0.0, high - value)]], color="black", capsize=3, lw=1)
        inside = value > 0.5  # the label inside a long bar, after a short one
        where, colour = (0.02, "white") if inside else (high + 0.02, "black")
        axes.annotate(f"{value:.3f} [{low:.3f}, {high:.3f}]", (where, y), va="center", fontsize=8, color=colour, weight="bold")
    axes.axvline(curve.chance, color=CHANCE, lw=0.8, ls=":")
    axes.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    axes.invert_yaxis()
    axes.set_xlabel(f"accuracy, other heads {curve.how}-ablated ({curve.n_prompts} prompts)")


def overview_figure(inputs: ReportInputs) -> Drawing:
    """The first screen's figure of one circuit: role grid, collapse curves, the circuit alone."""
    circuit = inputs.circuit

    def draw(figure: Any) -> None:
        grid, collapse, share = figure.subplots(1, 3, gridspec_kw={"width_ratios": [1.0, 1.1, 1.1]})
        _grid_panel(grid, circuit)
        _collapse_panel(collapse, circuit)
        _share_panel(share, inputs)

    return to_svg(draw, (12.0, 3.4))


def headline(inputs: ReportInputs) -> str:
    """One sentence of what was measured: the circuit kept alone against every head and none
    (with the interval), and each role's set ablated."""
    circuit, curve = inputs.circuit, inputs.faithfulness
    acc = circuit.accuracy
    n_g, n_a = len(circuit.gather), len(circuit.aggregate)
    parts = []
    if curve is not None and curve.circuit_point is not None:
        alone = curve.circuit_point["accuracy"]
        low, high = inputs.interval("alone") or (alone, alone)
        parts.append(
            f"Kept alone (every other head {curve.how}-ablated), the circuit's {len(curve.circuit)} heads ({n_g} Gather, {n_a} "
            f"Aggregate) answer {alone:.3f} of {curve.n_prompts} prompts (95% interval {low:.3f}-{high:.3f}), against "
            f"{curve.clean['accuracy']:.3f} with every head and {curve.ablated['accuracy']:.3f} with none: "
            f"{curve.recovered(alone):.0%} of the gap"
        )
    sets = (("-gather", "Gather", n_g), ("-aggregate", "Aggregate", n_a))
    ablated = [f"the {name} set {acc[key]:.3f}" for key, name, n in sets if key in acc and n]  # an empty set is never ablated
    if ablated:
        parts.append(f"ablating {' and '.join(ablated)} (chance {acc['chance']:.3f})")
    if not parts:
        return f"Clean accuracy {acc['clean']:.3f} (chance {acc['chance']:.3f}); no Gather or Aggregate heads were found."
    sentence = "; ".join(parts) + "."
    return sentence[0].upper() + sentence[1:]
