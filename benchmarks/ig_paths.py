"""Benchmark: which integration path ranks the hybrid toy's heads like full patching.

Issue 29 asks integrated gradients for a Spearman >= 0.9 against `patching_sweep` at <= 10
steps; on the hybrid toy (``toy-falcon_h1``, 2 layers x (4 attention + 8 SSM) heads) the
joint path (every head gated at once, `attribution_patching(steps=k)`) does not reach it.
This measures the alternatives, each an integrated-gradients sum over gates
(``gna_interp.patching.attribution.integrated_effects``) along a different path:

``joint``
    every head moves from its corrupt to its clean output together (the library's path);
    ``k`` points.
``layer``
    one path per layer: that layer's heads move together, every other layer's heads run
    free (as in the sweep); ``layers x k`` points.
``site``
    one path per head site (a layer's attention heads, its SSM heads); ``sites x k`` points.
``head``
    one path per head (converges to the sweep itself); ``heads x k`` points.

Same prompts, corruption and metric as ``benchmarks/attribution.py`` (``toy_case``), denoise
direction. Printed: Spearman over the live heads against the sweep.

Run: ``python benchmarks/ig_paths.py [--prompts 32] [--steps 1 2 4 8] [--threads 1]``
"""

from __future__ import annotations

import torch
from _common import parser, set_threads, spearman, toy_case

import gna_interp as gna

# Private, on purpose: integrated_effects with paths other than the public ones, over the
# backend's own captured activations (heads_by_site, logits_read), to compare path choices.
from gna_interp.core.compile import heads_by_site
from gna_interp.patching.attribution import integrated_effects
from gna_interp.patching.metrics import logits_read


def main() -> None:
    arguments = parser(__doc__, threads=1, json_file=False)
    arguments.add_argument("--prompts", type=int, default=32)
    arguments.add_argument("--steps", type=int, nargs="+", default=[1, 2, 4, 8])
    arguments.add_argument("--rules", nargs="+", default=["left", "midpoint"])
    arguments.add_argument("--paths", nargs="+", default=["joint", "layer", "site", "head"])
    arguments.add_argument("--seed", type=int, default=0)
    args = arguments.parse_args()
    set_threads(args.threads)
    _, model, clean, corrupt, metric = toy_case("falcon_h1_counting", args.prompts, args.seed)
    exact = gna.patching_sweep(model, clean, corrupt, metric, progress=False).effects()
    run, source = model.to_batch(corrupt), model.to_batch(clean)  # denoise: run corrupt, patch clean values in
    heads = list(model.heads)
    sites = sorted(heads_by_site(model.layout, heads))
    keep = logits_read(metric)
    clean_acts = model.backend.run(source, model.compile_plan(source, []), capture=set(sites), logits_to_keep=keep).acts
    own_acts = model.backend.run(run, model.compile_plan(run, []), capture=set(sites), logits_to_keep=keep).acts

    def table(effects: dict) -> torch.Tensor:
        out = torch.zeros(model.n_layers, model.n_heads)
        for head in heads:
            site, index = model.head_site(head)
            out[head.layer, head.head] = effects[head] if isinstance(effects.get(head), float) else effects[site].sum(0)[index]
        return out

    def score(estimate: torch.Tensor) -> float:
        a, e = estimate.flatten(), exact.flatten()
        live = (a != 0) | (e != 0)
        return spearman(a[live], e[live])

    groups = {
        "joint": [sites],
        "layer": [[s for s in sites if s.layer == layer] for layer in range(model.n_layers)],
        "site": [[s] for s in sites],
    }
    print(f"toy-falcon_h1, {args.prompts} prompts, {len(heads)} heads; Spearman against patching_sweep (denoise)")
    print(f"{'path':<6} {'rule':<9} {'steps':>5} {'points':>6} {'spearman':>8}")
    for path in args.paths:
        for rule in args.rules:
            for steps in args.steps:
                effects: dict = {}
                if path == "head":
                    for head in heads:
                        site, index = model.head_site(head)
                        target = own_acts[site].clone()
                        target[:, :, index] = clean_acts[site][:, :, index]  # only this head moves
                        got, _ = integrated_effects(model, run, [], {site: target}, metric, steps, rule)
                        effects[head] = float(got[site].sum(0)[index])
                    points = len(heads) * steps
                else:
                    for group in groups[path]:
                        got, _ = integrated_effects(model, run, [], {s: clean_acts[s] for s in group}, metric, steps, rule)
                        effects.update(got)
                    points = len(groups[path]) * steps
                print(f"{path:<6} {rule:<9} {steps:>5} {points:>6} {score(table(effects)):>8.3f}", flush=True)


if __name__ == "__main__":
    main()
