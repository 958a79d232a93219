# %% [markdown]
# # Mamba-2 and a hybrid through TransformerLens's bridge
#
# `gna.load(..., backend="tlens")` runs SSMs and hybrids through a TransformerLens
# `TransformerBridge` (nnsight stays their default). Every call gives the numbers the
# nnsight backend gives; this script shows where sites live on the bridge and checks the
# numbers on the bundled toys (offline, a few seconds).

# %%
import gna_interp as gna
from gna_interp.core.plan import Site, SiteKind

TOYS = {"mamba2_counting": [gna.Head(0, 3), gna.Head(1, 6)], "falcon_h1_counting": [gna.Head(0, 2), gna.Head(1, 1), gna.Head(1, 5)]}


def where(model: gna.GnaModel, heads: list[gna.Head]) -> None:
    """Each site's hook: a bridge hook point where the bridge wraps the module."""
    ssm = model.head_site(heads[-1])[0]
    sites = [model.head_site(h)[0] for h in heads] + [Site(SiteKind.RESID, 1), Site(SiteKind.STREAM, ssm.layer, "x", ssm.mixer)]
    for site in sites:
        tap, _ = model.backend.tap(site)
        print(f"  {site.kind.value:6s} layer {site.layer} mixer {site.mixer} {site.stream:2s} -> {tap.hook or 'raw hook on ' + tap.path}")


for name, heads in TOYS.items():
    models = {backend: gna.load_toy(name, backend=backend) for backend in ("tlens", "nnsight")}
    print(models["tlens"])
    where(models["tlens"], heads)

    # %% The same numbers on both backends: ablation, implicit / softmax patterns, attribution.
    task = gna.toy_task(name, 16, seed=1)
    corrupt = task.corrupted(seed=1)
    results = {}
    for backend, model in models.items():
        accuracy = gna.evaluate(model, task, [gna.Ablate(heads)], progress=False).accuracy
        pattern = gna.attention_pattern(model, task.prompts, heads, query_positions=[-1])
        attribution = gna.attribution_patching(model, task.prompts, corrupt.prompts, lambda logits: logits[:, -1].logsumexp(-1)).scores
        results[backend] = (accuracy, pattern, attribution)
        print(f"  {backend:7s} accuracy with {[str(h) for h in heads]} ablated: {accuracy:.3f}")
    (acc_t, pat_t, attr_t), (acc_n, pat_n, attr_n) = results["tlens"], results["nnsight"]
    pattern_diff, attribution_diff = float((pat_t - pat_n).abs().max()), float((attr_t - attr_n).abs().nan_to_num().max())
    print(f"  largest difference: patterns {pattern_diff:.1e}, attribution {attribution_diff:.1e}")
    assert acc_t == acc_n and pattern_diff < 1e-5 and attribution_diff < 1e-4
