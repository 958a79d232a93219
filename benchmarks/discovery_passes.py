"""Where discovery's passes go: `discover`'s cost per stage on the models of the pass budgets,
and an estimate of what a suffix cache would take off each stage.

The models (``--models``): the 32-layer deep copies of the bundled toys (``deep_llama``,
``deep_mamba2``: the label-reading Mamba-2, ``deep_mamba2_counting``; the slow budget tests'
30-pass line), the Mamba-1 toy (``mamba_toy``, 2 x 128 channels; line 100) and the wide deep
Mamba-1 (``wide_mamba``, 8 layers x 512 channels, 64 prompts; line 100). Each runs
``discover(model, task, progress=False)`` on ``--prompts`` prompts (seed ``--seed``) and prints
``circuit.cost["stages"]``: passes (rows x blocks run / (prompts x layers)) and forwards, the
confirmation's by its parts (``circuit.cost["confirm"]``).

The estimate (``suffix``): an ablation whose edits all start at position ``t`` leaves
positions ``0 .. t-1`` of every block clean, so a cache of each block's state there (an SSM's
scan and convolution state, an attention layer's keys and values) would let the forward run
positions ``t ..`` alone. Each forward is counted at ``(n_pos - t) / n_pos`` of its rows x
blocks, ``t`` its earliest edited position over the rows; a forward that skips a block,
captures or reads activations, differentiates, edits every position or none counts whole.
``suffix_final`` counts only the forwards whose edits are all at the final position
(``t = n_pos - 1``) as cheaper: what a one-token step from a cache (HF's Mamba and Mamba-2
step paths) would allow. Token-blocks, an estimate, not a bound: it leaves out the cost of
keeping states at several positions and an attention query's cost growing with its position,
and counts forwards that capture whole. gna_interp has no suffix cache. Example::
Example::

    python benchmarks/discovery_passes.py --models deep_mamba2 mamba_toy
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import _common

import gna_interp as gna

MODELS = ("deep_llama", "deep_mamba2", "deep_mamba2_counting", "mamba_toy", "wide_mamba")
LINES = {"deep_llama": 30, "deep_mamba2": 30, "deep_mamba2_counting": 30, "mamba_toy": 100, "wide_mamba": 100}
"""The pass lines of the slow budget tests (tests/test_discovery_budget.py, tests/test_discovery.py)."""


def build(name: str, prompts: int | None, seed: int, depth: int) -> tuple[Any, Any]:
    """The model and task of ``name`` (`MODELS`)."""
    # Private, on purpose: gna_interp.zoo.deep builds the deep copies of a toy the budget tests measure.
    from gna_interp.zoo.deep import deep_toy

    if name == "mamba_toy":
        return gna.load_toy("mamba"), gna.toy_task("mamba", prompts or 200, seed=seed)
    if name == "wide_mamba":
        return deep_toy("mamba", 8, width=512), gna.toy_task("mamba", prompts or 64, seed=seed)
    family = name.removeprefix("deep_")
    return deep_toy(family, depth), gna.toy_task(family, prompts or 200, seed=seed)


def first_edited(plan: Any, n_pos: int) -> int:
    """The earliest position any edit of ``plan`` touches (0 where a skip or an edit covers
    every position: a mask broadcast along positions, or one below two dimensions; 0 where no
    edit touches a position: a clean forward is the one that would fill the cache)."""
    if plan.skips or not plan.edits:
        return 0
    first = n_pos
    for edits in plan.edits.values():
        for edit in edits:
            mask = edit.mask
            if mask.dim() < 2 or mask.shape[1] == 1:
                return 0
            touched = (mask != 0).reshape(mask.shape[0], mask.shape[1], -1).any(-1).any(0).nonzero()
            if len(touched):
                first = min(first, int(touched[0]))
    return 0 if first == n_pos else first


def watch(model: Any) -> list[tuple[int, float, float]]:
    """Wrap ``model.backend.run`` (this instance only) to record each forward's
    ``(block_rows, suffix block_rows, final-only block_rows)``; the list fills as discovery runs."""
    backend, n_layers, seen = model.backend, model.n_layers, []
    run = backend.run

    def watched(batch: Any, plan: Any, capture: Any = (), *args: Any, **kwargs: Any) -> Any:
        whole = batch.n_rows * (n_layers - (plan.start[0] if plan.start is not None else 0))
        plain = not capture and not kwargs.get("reads") and not kwargs.get("grad")
        first = first_edited(plan, batch.n_pos) if plain else 0
        final = 1 / batch.n_pos if first == batch.n_pos - 1 else 1.0
        seen.append((whole, whole * (batch.n_pos - first) / batch.n_pos, whole * final))
        return run(batch, plan, capture, *args, **kwargs)

    backend.run = watched
    return seen


def measure(name: str, prompts: int | None, seed: int, depth: int) -> dict[str, Any]:
    model, task = build(name, prompts, seed, depth)
    seen = watch(model)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        circuit = gna.discover(model, task, progress=False)
    seconds = time.perf_counter() - started
    stages, per_pass = circuit.cost["stages"], len(task) * model.n_layers
    rows, at = [], 0
    for stage, spent in stages.items():
        # the confirmation's parts (`cost["confirm"]`) run one after another, in the order recorded
        for part, done in (circuit.cost.get("confirm", {}) if stage == "confirm" else {stage: spent}).items():
            forwards = seen[at : at + done["forwards"]]
            at += done["forwards"]
            suffix, final = (sum(f[i] for f in forwards) / per_pass for i in (1, 2))
            label = part if stage != "confirm" else f"confirm: {part}"
            rows.append({"stage": label, "passes": done["passes"], "forwards": done["forwards"], "suffix": suffix, "suffix_final": final})
    if at != len(seen) or sum(f[0] for f in seen) != circuit.cost["block_rows"]:
        raise SystemExit(f"{name}: the backend ran {len(seen)} forwards, the stages count {at}: the estimate cannot be attributed")
    return {
        "model": name,
        "prompts": len(task),
        "layers": model.n_layers,
        "passes": circuit.cost["passes"],
        "suffix": sum(f[1] for f in seen) / per_pass,
        "suffix_final": sum(f[2] for f in seen) / per_pass,
        "line": LINES[name],
        "seconds": seconds,
        "gather": [str(h) for h in circuit.gather],
        "aggregate": [str(h) for h in circuit.aggregate],
        "stages": rows,
    }


def main() -> None:
    args = _common.parser(__doc__)
    args.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    args.add_argument("--prompts", type=int, default=None, help="prompts per model (default: 200; the wide Mamba-1 64)")
    args.add_argument("--seed", type=int, default=4242)
    args.add_argument("--depth", type=int, default=32, help="layers of the deep toys (default: %(default)s)")
    parsed = args.parse_args()
    _common.set_threads(parsed.threads)
    results = []
    for name in parsed.models:
        result = measure(name, parsed.prompts, parsed.seed, parsed.depth)
        results.append(result)
        print(f"\n{name}: {result['prompts']} prompts x {result['layers']} layers, {result['passes']:.2f} passes (line {result['line']}),")
        print(f"  with a suffix cache, in token-blocks: {result['suffix']:.2f} ({result['suffix_final']:.2f} final position only)")
        print(f"  {'stage':28s} {'passes':>7s} {'forwards':>8s} {'suffix':>7s} {'final':>7s}; {result['seconds']:.0f} s")
        for row in result["stages"]:
            if row["forwards"]:
                cells = f"{row['passes']:7.2f} {row['forwards']:8d} {row['suffix']:7.2f} {row['suffix_final']:7.2f}"
                print(f"  {row['stage']:28s} {cells}")
    _common.write_json(parsed.json, {"seed": parsed.seed, "results": results})


if __name__ == "__main__":
    main()
