"""`patching.direct.stacked_writes`: one tensor per sender position, equal to the stack built
sender by sender (each sender's write in its own copy's rows, zero elsewhere, summed), on a
Mamba-1 whose channels are heads: the memory no longer grows with the number of senders
(channel scale ran a lent H200's 139 GB out in MIB's edge budgets)."""

from __future__ import annotations

import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model, word_tokenizer
from gna_interp.patching.direct import EMBED, node_position, node_write, stacked_writes

from .conftest import CLEAN, CORRUPT


def test_one_tensor_per_position_equal_to_the_stack_sender_by_sender():
    model = gna.load(tiny_model("mamba", seed=3), tokenizer=word_tokenizer(), backend="nnsight")
    senders = [EMBED, *model.heads]
    sites = {s for node in senders for s in gna.patching.direct.write_sites(model, node)}
    _, clean = model.capture_sites(CLEAN, sites)
    _, corrupt = model.capture_sites(CORRUPT, sites)
    sets = [[h for h in model.heads if h.layer == 0], [EMBED, *model.heads[-5:]], [model.heads[1]]]
    rows = len(CLEAN)
    got = stacked_writes(model, clean, corrupt, sets, rows)
    positions = sorted({node_position(model, s) for group in sets for s in group})
    assert [p for p, _ in got] == positions  # one per position, however many senders (64 channels at layer 0 alone)
    for upto in [*positions, (model.n_layers, 0)]:
        expected = torch.zeros_like(got[0][1])
        for copy, group in enumerate(sets):  # the old definition: sender by sender
            for sender in group:
                if node_position(model, sender) < upto:
                    expected[copy * rows : (copy + 1) * rows] += node_write(model, sender, clean, corrupt).expand(rows, -1, -1)
        summed = sum((write for position, write in got if position < upto), torch.zeros_like(expected))
        assert (summed - expected).abs().max() <= 1e-5 * max(1.0, float(expected.abs().max()))
