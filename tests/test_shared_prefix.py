"""Variants that edit their early blocks alike share them (`patching.shared_prefix`): the
same metric as running each variant alone, fewer blocks (hand counts), both backends and Mamba-2."""

from __future__ import annotations

import torch

import gna_interp as gna
from gna_interp.core.compile import head_mask, heads_by_site
from gna_interp.core.plan import Edit, Site, SiteKind
from gna_interp.patching.shared_prefix import shared_prefix_groups
from gna_interp.patching.variants import Variant, run_variants

from .conftest import PROMPTS

TOL = 1e-5


def complement_variants(model, kept_sets):
    """MIB-style circuits: every head outside each kept set zero-ablated (one shared value)."""
    zero = torch.zeros(())
    variants = []
    for kept in kept_sets:
        outside = [h for h in model.heads if h not in kept]
        variants.append(
            Variant(
                [
                    (site, Edit(head_mask(model.layout, site, idx), zero))
                    for site, idx in sorted(heads_by_site(model.layout, outside).items())
                ]
            )
        )
    return variants


def test_circuits_that_differ_in_the_last_layer_share_the_first_blocks(any_model):
    """Three circuits keep heads of the last layer only (they agree on blocks 0 .. L-2), one
    keeps a layer-0 head (it agrees with none): one group branching at L-1, led by the first.
    The metric of every variant equals its own full run (``reuse_prefix=False``) to 1e-5, and
    the meter counts the leader's L blocks, the members' one block each, the lone variant's L
    and the baseline's L, per row."""
    model = any_model
    last = model.n_layers - 1
    kept = [[], [gna.Head(last, 0)], [gna.Head(last, 0), gna.Head(last, 1)], [gna.Head(0, 0)]]
    variants = complement_variants(model, kept)
    [group] = shared_prefix_groups(variants, model.n_layers)
    assert (group.leader, group.members, group.layer) == (0, [1, 2], last)
    batch = model.to_batch(PROMPTS)
    base = model.compile_plan(batch, [])
    metric = gna.logit_diff(5, 6)
    with gna.cost_meter(model) as cost:
        shared_base, shared = run_variants(model, batch, base, variants, metric, batch_size=8, progress=False)
    alone_base, alone = run_variants(model, batch, base, variants, metric, batch_size=8, progress=False, reuse_prefix=False)
    assert abs(shared_base - alone_base) < TOL
    assert (shared - alone).abs().max() < TOL, (shared, alone)
    assert (alone.max() - alone.min()) > 1e-3  # the circuits differ: the check can tell them apart
    rows, n_layers = batch.n_rows, model.n_layers
    assert cost.block_rows == rows * (n_layers + n_layers + 2 * 1 + n_layers)  # baseline, leader, members, the lone one


def test_sweeps_of_single_sites_form_no_group(llama_tlens):
    """One head per variant, or one layer's several masks: nothing is shared (no cost either)."""
    model = llama_tlens
    singles = complement_variants(model, [])  # one variant editing every layer: alone, no group
    per_head = [
        Variant([(Site(SiteKind.HEADS, h.layer), Edit(head_mask(model.layout, Site(SiteKind.HEADS, h.layer), [h.head]), torch.zeros(())))])
        for h in model.heads
    ]
    assert shared_prefix_groups(singles, model.n_layers) == []
    assert shared_prefix_groups(per_head, model.n_layers) == []


def test_agreement_is_exact(llama_tlens):
    """Equal values by content for scalars and by identity for tensors; another tensor with the
    same numbers is not trusted; a residual edit at the branch block rules the branch out."""
    model = llama_tlens
    site0, site2 = Site(SiteKind.HEADS, 0), Site(SiteKind.HEADS, 2)
    mask = head_mask(model.layout, site0, [0])
    value = torch.randn(4, 7, 6, 4)
    other_value = value.clone()

    def variant(first_value, last_head, resid=False):
        edits = [(site0, Edit(mask, first_value)), (site2, Edit(head_mask(model.layout, site2, [last_head]), torch.zeros(())))]
        if resid:
            edits.append((Site(SiteKind.RESID, 2), Edit(torch.ones((), dtype=torch.bool), torch.zeros(()))))
        return Variant(edits)

    same = shared_prefix_groups([variant(value, 0), variant(value, 1)], model.n_layers)
    assert [(g.leader, g.members, g.layer) for g in same] == [(0, [1], 2)]
    assert shared_prefix_groups([variant(value, 0), variant(other_value, 1)], model.n_layers) == []
    scalars = shared_prefix_groups([variant(torch.zeros(()), 0), variant(torch.zeros(()), 1)], model.n_layers)
    assert len(scalars) == 1
    ruled_out = shared_prefix_groups([variant(value, 0, resid=True), variant(value, 1)], model.n_layers)
    assert [(g.leader, g.members, g.layer) for g in ruled_out] == [(0, [1], 1)]  # branches a block earlier
