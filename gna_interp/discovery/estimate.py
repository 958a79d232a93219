"""How long `discover` will take, said before it starts: a rough estimate of its passes over
the task (`estimate_passes`), and the bar over its stages with an ETA (`StageBar`).

A pass is the cost of one forward over every prompt through every layer
(`gna_interp.cost`: ``block_rows / (n_prompts x n_layers)``); a forward that starts from a
cached clean prefix at layer ``l`` costs ``(L - l) / L`` of one. The estimate counts:

- fixed: the baseline, the label check, the truncation scan (nothing locally: each
  truncation starts from the cached prefix at its last kept layer and runs no block;
  ``(L + 1) / 2`` on a remote model, which has no prefix cache), the layer scan (locally
  screened in groups from cached prefixes, `SCREEN_PASSES`; ``2 (L - 1)`` remotely, every
  range the screen may ask for in one request), the pattern scores
  (one), the confirmation (about six) and MIB's circuit score (a clean and a corrupt forward,
  and a pass per circuit size);
- the position scan: each costly layer (about `COSTLY_LAYERS`) ablated at each of the
  task's six position classes (`positions.POSITION_CLASSES`) remotely; locally screened
  (`SCREENED_POSITION_FORWARDS` per layer), at the mean prefix share;
- the cover step (local runs): per role about `COVER_PER_DOUBLING` forwards per doubling of the
  widest scanned layer (the spread sets' size curves, the collapses' bisection);
- the head scan: each head of the scanned layers ablated once, ``(L - l) / L`` per head;
  past ``prescreen_above`` heads only the ``prescreen_keep`` ranked heads (plus an
  attribution pass; each at the mean share ``(L + 1) / (2 L)``, its layer unknown), and
  for each layer of more than ``screen_above`` heads about
  ``2 k log2 N`` group tests (``k = 1``: one costly group);
- the candidates (at most ``max_candidates``): their entry scan, joint search and
  confirmation curves, about ``ENTRY_JOINT_PER_CANDIDATE`` weighted passes each.

Calibrated on the bundled toys at 64 prompts (toy_task seed 0; measured / middle 0.96 - 1.31: Llama 1.31,
Mamba-2 0.99, FalconH1 0.96, Mamba 1.27) and the 32-layer deep toys at 200 prompts (Llama 0.66, Mamba-2 0.73),
with the ordered joint search and the entry scan that measures what the labels read (2026-11-27; before them
the constant was 3.5); it is stated as a range, ``low = mid / RANGE`` to ``high = mid * RANGE``. A model at chance stops after
the baseline (one pass), below the range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..progress import progress_bar
from ..scoring.circuit_scores import MIB_FRACTIONS, realised_sizes

if TYPE_CHECKING:
    from ..cost import Cost
    from ..models.handle import GnaModel

ENTRY_JOINT_PER_CANDIDATE = 2.5
"""Passes per candidate head (weighted by its layer's prefix share) for the entry scan, the
joint search and the confirmation curves."""

SCREEN_PASSES = 2.0
"""The screened layer scan's passes on a local model (`layer_scans.screen_layers`): about
four forwards from cached prefixes near the middle (2.06 on the 32-layer deep toys; at most
``(L - 1) / 2``, every layer alone). A model whose every layer costs accuracy takes up to
twice ``(L - 1) / 2``."""

POSITION_CLASSES_SCANNED = 6
"""The position classes the position scan measures per layer (`positions.POSITION_CLASSES`;
fewer where one holds the positions of another or none)."""

SCREENED_POSITION_FORWARDS = (2 + 1 + POSITION_CLASSES_SCANNED) / 2
"""The screened position scan's forwards per costly layer on a local model
(`positions.position_scan`): the G&A pair's mean of two for the Aggregate layer (the final
position, then every other class together, which costs nothing) and seven for the Gather
layer (those two, then each of the five other classes alone)."""

COVERED_ROLES = ("gather", "aggregate")
COVER_PER_DOUBLING = 1.5
"""The cover step's forwards per role per doubling of the widest scanned layer (`confirm.enter_spread`'s size
curve and `confirm.cover_collapses`' bisection: about ``log2`` of the width each, where a role is spread or a
collapse is not yet covered; set from the bundled toys, 2026-11-29)."""

RANGE = 1.6
"""The estimate's range: ``mid / RANGE`` to ``mid * RANGE`` (the stated factor)."""


def estimate_passes(
    model: GnaModel,
    n_prompts: int,
    stages: Sequence[str],
    layers: Sequence[int],
    max_candidates: int,
    pattern_prompts: int,
    check_labels: bool,
    screen_above: int,
    prescreen_above: int,
    prescreen_keep: int,
    *,
    kinds: int = 0,
) -> dict[str, Any]:
    """A rough estimate of `discover`'s passes over ``n_prompts`` (module docs); ``kinds``:
    the ablation kinds the kinds check adds (`DiscoverySettings.ablation_kinds`), each five
    forwards (each role's set at every position and at its positions, both sets together),
    and two zero ablations at the roles' positions:
    ``{"low", "mid", "high", "stages": {stage: passes}, "n_prompts", "text"}``, with ``text``
    like ``"about 25-63 passes over 64 prompts (a rough estimate)"``."""
    n_layers = model.n_layers

    def share(layer: int) -> float:  # a forward from the cached prefix before ``layer``
        return (n_layers - layer) / n_layers

    per: dict[str, float] = {"baseline": 1.0}
    if check_labels:
        per["label check"] = 1.0
    cached = not model.is_remote  # `GnaModel.prefix_cache`: local models only
    if "truncation" in stages:
        per["truncation"] = 0.0 if cached else (n_layers + 1) / 2
    if "layers" in stages:
        per["layers"] = min(SCREEN_PASSES, (n_layers - 1) / 2) if cached else 2 * (n_layers - 1.0)
    if "positions" in stages:  # each costly layer (about the G&A pair's) ablated at the position classes
        forwards = SCREENED_POSITION_FORWARDS if cached else POSITION_CLASSES_SCANNED
        per["positions"] = min(len(layers), COSTLY_LAYERS) * forwards * ((n_layers + 1) / (2 * n_layers) if cached else 1.0)
    heads = [(layer, model.heads_per_layer[layer]) for layer in layers]
    total = sum(h for _, h in heads)
    if "heads" in stages:
        if total <= prescreen_above:
            per["heads"] = sum(h * share(layer) for layer, h in heads)
            candidates = min(max_candidates, total) * sum(h * share(layer) for layer, h in heads) / max(total, 1)
        else:
            wide = [(layer, h) for layer, h in heads if h > screen_above]
            anywhere = (n_layers + 1) / (2 * n_layers)  # a head's share of a pass, its layer unknown: the mean over layers
            # group tests in the wide layers the layer scan finds costly: all of them up to COSTLY_LAYERS (the G&A pair's)
            tests = sum(2 * math.log2(h) for _, h in wide) * (min(len(wide), COSTLY_LAYERS) / max(len(wide), 1)) * anywhere
            # attribution's and the sweep's clean forwards (locally: the baseline's and the cache's), ranked heads, group tests
            per["heads"] = (0.0 if cached else 2.0) + prescreen_keep * anywhere + tests
            candidates = min(max_candidates, 4) * anywhere  # past the prescreen, few heads stay harmful
        if "entry" in stages or "joint" in stages or "confirm" in stages:
            per["entry, joint"] = ENTRY_JOINT_PER_CANDIDATE * candidates
    if "roles" in stages:
        per["roles"] = min(pattern_prompts, n_prompts) / n_prompts
    if "confirm" in stages:
        per["confirm"] = 6.0
        # a copy per size < all; remotely also its clean and corrupt forwards (locally: the cache's, path patching's)
        per["score"] = len(realised_sizes(MIB_FRACTIONS, len(model.heads))) - (1.0 if cached else -1.0)
        if kinds:
            per["kinds"] = KINDS_PER_KIND * kinds + 2.0
        if "cover" in stages and cached:  # remotely not run (it orders heads by a local backward)
            widest = max((h for _, h in heads), default=1)
            per["cover"] = len(COVERED_ROLES) * COVER_PER_DOUBLING * math.log2(max(widest, 2)) * (n_layers + 1) / (2 * n_layers)
    mid = sum(per.values())
    low, high = mid / RANGE, mid * RANGE
    estimate: dict[str, Any] = {"low": low, "mid": mid, "high": high, "stages": per, "n_prompts": n_prompts}
    estimate["text"] = f"about {passes_range(estimate)} over {n_prompts} prompts (a rough estimate)"
    return estimate


def passes_range(estimate: dict[str, Any]) -> str:
    """An estimate's range in words: ``"24-62 passes"``."""
    return f"{estimate['low']:.0f}-{estimate['high']:.0f} passes"


KINDS_PER_KIND = 5.0
"""Forwards the kinds check runs per ablation kind (`estimate_passes`): measured 10, 11 and 12
passes for two kinds on the Llama, Mamba-2 and Falcon-H1 toys (200 prompts), 12 estimated."""

COSTLY_LAYERS = 2
"""Wide layers the estimate expects the layer scan to find costly (and group testing to
search): the Gather layer and the Aggregate layer. Every wide layer of a 2-layer toy; 2 of
64 at Falcon-Mamba-7B's shape, where counting all of them said 558-1,429 passes for 93.2."""


class StageBar:
    """One bar over `discover`'s stages: its description holds the estimate, its postfix the
    stage running; its count is the passes run so far (from the cost meter) out of the
    estimate's middle, so tqdm's ETA is the estimate's. Hidden as `progress_bar` hides bars;
    the scans' own bars show below it. Drawn from `start` (after the arguments are checked)."""

    def __init__(self, meter: Cost | None, n_prompts: int, show: bool) -> None:
        self.meter, self.n_prompts, self.show = meter, n_prompts, show
        self.bar: Any = None

    def start(self, estimate: dict[str, Any]) -> None:
        total = max(1, round(estimate["mid"]))
        self.bar = progress_bar(show=self.show, desc=f"discover, {estimate['text']}", total=total)

    def stage(self, name: str) -> None:
        """Start stage ``name``: the bar shows it and the passes run so far."""
        if self.bar is None:
            return
        if self.meter is not None:
            self.bar.n = min(round(self.meter.passes(self.n_prompts)), self.bar.total)
        self.bar.set_postfix_str(f"stage {name}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
