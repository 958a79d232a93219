"""The prefix cache serves a batch row by row (`gna_interp.models.prefix.AssembledRows`): a batch
whose rows were cached in other chunks (or in one larger batch) starts from their streams, with
the numbers of the uncached forward (1e-5) and the blocks it really runs (`gna.cost_meter`), on
both backends; a batch with a row no entry holds runs in full."""

from __future__ import annotations

import itertools

import pytest
import torch

import gna_interp as gna
from gna_interp.core.inputs import Batch
from gna_interp.core.plan import Plan, Site, SiteKind
from gna_interp.models.prefix import AssembledRows
from gna_interp.zoo.deep import deep_toy

from .conftest import assert_close_on_tokens

TOL = 1e-5
# 8 prompts, the longest among the first 7 (a batch with the 8th replaced keeps the width)
PROMPTS = ["w5 w6 w7", "w8 w9 w10 w11 w12 w13", "w14 w15", "w16 w17 w18 w19", "w20", "w21 w22 w23 w24 w25", "w26 w27 w28", "w29 w30"]
NEW = "w40 w41 w42"  # a prompt no cached batch holds
PERMUTATION = [5, 2, 7, 0, 3, 6, 1, 4]


@pytest.fixture(scope="module", params=["tlens", "mamba2"])
def model(request, llama_tlens, mamba2):
    return llama_tlens if request.param == "tlens" else mamba2


def _rows(batch: Batch, rows: list[int]) -> Batch:
    return Batch(batch.input_ids[rows], batch.attention_mask[rows])


def _all_layers(model) -> set[Site]:
    """The residual stream entering blocks 1 .. L (a capture at 0 runs block 0 on: no reuse)."""
    return {Site(SiteKind.RESID, layer) for layer in range(1, model.n_layers + 1)}


def test_rows_cached_in_chunks_serve_the_whole_batch_permuted(model):
    """Chunks of 3 and 5 rows cached; then the whole batch (no block runs: the final norm and
    unembedding from the assembled last stream), its rows permuted with a head ablated at
    layer 1 (L - 1 blocks per row) and its residual stream captured (no block): the uncached
    numbers. A batch with one row no chunk holds runs in full (L blocks per row)."""
    batch, n_layers = model.to_batch(PROMPTS), model.n_layers
    permuted, ablate = _rows(batch, PERMUTATION), [gna.Ablate([gna.Head(1, 0)])]
    other = model.to_batch([*PROMPTS[:7], NEW])
    assert other.n_pos == batch.n_pos and torch.equal(other.input_ids[:7], batch.input_ids[:7])
    full = model.backend.run(batch, Plan(), capture=_all_layers(model))
    expected = {"permuted": model.logits(permuted, ablate), "other": model.logits(other)}
    with model.prefix_cache() as cache, gna.cost_meter(model) as cost:
        for part in (slice(0, 3), slice(3, 8)):
            model.logits(batch.rows(part))
        assert cost.block_rows == 8 * n_layers and len(cache.entries) == 2
        served = cache.lookup(permuted)
        assert isinstance(served, AssembledRows) and list(served) == list(range(n_layers + 1))
        spent = [cost.block_rows]
        clean = model.logits(batch)
        spent.append(cost.block_rows)
        ablated = model.logits(permuted, ablate)
        spent.append(cost.block_rows)
        captured = model.run_plan(permuted, Plan(), capture=_all_layers(model)).acts
        spent.append(cost.block_rows)
        assert len(cache.entries) == 2  # assembled on each lookup, not stored
        mixed = model.logits(other)
        spent.append(cost.block_rows)
        assert len(cache.entries) == 3  # the full run's stream is stored
    steps = [b - a for a, b in itertools.pairwise(spent)]
    assert steps == [0, 8 * (n_layers - 1), 0, 8 * n_layers]
    assert_close_on_tokens(clean, full.logits, batch.attention_mask.bool())
    assert_close_on_tokens(ablated, expected["permuted"], permuted.attention_mask.bool())
    assert_close_on_tokens(mixed, expected["other"], other.attention_mask.bool())
    for site, stream in captured.items():
        assert (stream - full.acts[site][PERMUTATION]).abs().max() < TOL, site


def test_a_chunk_is_served_from_a_larger_cached_batch(model):
    """The whole batch cached; then a contiguous chunk (its streams are views of the entry's)
    and repeated, reordered rows, each with a head ablated at layer 1: the uncached numbers,
    L - 1 blocks per row."""
    batch, n_layers = model.to_batch(PROMPTS), model.n_layers
    ablate = [gna.Ablate([gna.Head(1, 0)])]
    chunk, scattered = batch.rows(slice(2, 5)), _rows(batch, [6, 1, 1, 4])
    expected = [model.logits(rows, ablate) for rows in (chunk, scattered)]
    with model.prefix_cache() as cache, gna.cost_meter(model) as cost:
        model.logits(batch)
        entry = cache.entries[cache.key(batch)]
        served = cache.lookup(chunk)
        assert served is not None and served[1].data_ptr() == entry[1][2].data_ptr()  # a view
        for rows, logits in zip((chunk, scattered), expected, strict=True):
            before = cost.block_rows
            assert_close_on_tokens(model.logits(rows, ablate), logits, rows.attention_mask.bool())
            assert cost.block_rows - before == rows.n_rows * (n_layers - 1)
        assert len(cache.entries) == 1


def test_entries_dropped_from_the_cache_serve_no_row(llama_tlens):
    """A cache that holds one chunk at a time: the row index forgets dropped entries, and a
    batch whose rows were dropped runs in full."""
    model = llama_tlens
    batch = model.to_batch(PROMPTS)
    chunks = [batch.rows(slice(0, 4)), batch.rows(slice(4, 8))]
    per_layer = 4 * batch.n_pos * model.d_model * 4  # one layer of a 4-row chunk
    with model.prefix_cache(max_mb=3 * per_layer / 2**20) as cache, gna.cost_meter(model) as cost:
        for rows in chunks:
            model.logits(rows)
        assert cache.layers_to_keep(chunks[0]) == [0, model.n_layers]  # 2 layers: one entry fits
        assert len(cache.entries) == 1 and cache.lookup(chunks[0]) is None and cache.lookup(chunks[1]) is not None
        assert len(cache.holders) == 4 and cache.lookup(batch) is None
        before = cost.block_rows
        model.logits(batch.rows(slice(0, 2)))
        assert cost.block_rows - before == 2 * model.n_layers


@pytest.mark.parametrize("family", ["llama", "mamba2_counting"])
def test_a_clean_forward_after_evaluate_runs_no_block(family):
    """`evaluate` in chunks of 4 (4 + 4 + 2 prompts) fills the cache; a clean forward of the
    whole task's batch then runs no block, and an ablation at layer k runs L - k per row:
    the uncached logits."""
    model, task = deep_toy(family, 4), gna.toy_task(family, 10, seed=4242)
    batch, k = task.encode().batch, 2
    ablate = [gna.Ablate([gna.Head(k, 0)])]
    expected = [model.logits(batch), model.logits(batch, ablate)]
    with model.prefix_cache() as cache, gna.cost_meter(model) as cost:
        gna.evaluate(model, task, batch_size=4)
        assert len(cache.entries) == 3 and cost.block_rows == 10 * 4
        spent = [cost.block_rows]
        actual = [model.logits(batch)]
        spent.append(cost.block_rows)
        actual.append(model.logits(batch, ablate))
        spent.append(cost.block_rows)
    assert [b - a for a, b in itertools.pairwise(spent)] == [0, 10 * (4 - k)]
    for logits, reference in zip(actual, expected, strict=True):
        assert (logits - reference).abs().max() < TOL
