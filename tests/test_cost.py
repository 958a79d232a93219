"""`gna.cost_meter` against hand counts, and prefix reuse (`GnaModel.prefix_cache`, `Plan.start`):
the same numbers as full forwards, fewer blocks evaluated, on both backends and on Mamba-2."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.core.plan import Plan, Site, SiteKind

from .conftest import CLEAN, CORRUPT, PROMPTS, no_hooks_anywhere

TOL = 1e-5


def test_meter_counts_a_forward_and_a_sweep_by_hand(any_model):
    """One forward of 4 prompts over L blocks; then a sweep of every head with 2 copies of
    the 4 prompts per forward: the baseline (capturing the prefix), then chunks sorted by
    layer, each starting at its layer (layer 0: from the embedding)."""
    model = any_model
    n_layers, heads = model.n_layers, model.heads
    with gna.cost_meter(model) as outer:
        model.logits(PROMPTS)
        assert (outer.forwards, outer.rows, outer.block_rows, outer.requests) == (1, 4, 4 * n_layers, 0)
        with gna.cost_meter(model) as inner:
            gna.ablation_sweep(model, PROMPTS, None, gna.logit_diff(5, 6), batch_size=8, progress=False)
    per_layer = [sum(1 for h in heads if h.layer == layer) for layer in range(n_layers)]
    assert all(n % 2 == 0 for n in per_layer)  # chunks of 2 never straddle two layers
    chunks = sum(n // 2 for n in per_layer)
    expected_blocks = 4 * n_layers + sum((n // 2) * 8 * (n_layers - layer) for layer, n in enumerate(per_layer))
    assert (inner.forwards, inner.rows, inner.block_rows) == (1 + chunks, 4 + 8 * chunks, expected_blocks)
    assert (outer.forwards, outer.rows, outer.block_rows) == (2 + chunks, 8 + 8 * chunks, 4 * n_layers + expected_blocks)
    assert inner.passes(4) == pytest.approx(expected_blocks / (4 * n_layers))
    assert not getattr(model.backend, "_cost_meters", [])  # detached on exit


def test_meter_is_detached_when_the_block_raises(llama_tlens):
    with pytest.raises(ValueError, match="out of range"), gna.cost_meter(llama_tlens):
        llama_tlens.logits(PROMPTS, [gna.Ablate([gna.Head(9, 0)])])
    assert not llama_tlens.backend._cost_meters
    with pytest.raises(TypeError, match="GnaModel"), gna.cost_meter("not a model"):
        pass


def test_uncharged_forwards_reach_no_meter(llama_tlens):
    """Inside `cost.uncharged` a forward counts on no open meter, raising included; after it
    the same meter counts again (by hand: one forward of 4 prompts)."""
    from gna_interp.cost import uncharged

    with gna.cost_meter(llama_tlens) as meter:
        with uncharged(llama_tlens):
            llama_tlens.logits(PROMPTS)
        assert (meter.forwards, meter.rows) == (0, 0)
        with pytest.raises(ValueError, match="out of range"), uncharged(llama_tlens):
            llama_tlens.logits(PROMPTS, [gna.Ablate([gna.Head(9, 0)])])
        llama_tlens.logits(PROMPTS)
        assert (meter.forwards, meter.rows) == (1, 4)


def test_meter_counts_remote_requests(llama_hf, tokenizer):
    """Under ``remote="local"`` every trace is one simulated request."""
    remote = gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, remote="local")
    with gna.cost_meter(remote) as cost:
        remote.logits(CLEAN)
        remote.logits(CLEAN, [gna.Patch(gna.Head(1, 1), source=CORRUPT)])  # + one trace for the source
    assert (cost.forwards, cost.requests, cost.rows) == (3, 3, 9)


def _full_residuals(model, batch):
    sites = {Site(SiteKind.RESID, layer) for layer in range(model.n_layers + 1)}
    return model.backend.run(batch, Plan(), capture=sites)


def _inner_modules(model):
    """The first computing submodule of every block (attention q_proj / the SSM mixer's in_proj)."""
    blocks = model.hf_model.get_submodule(model.arch.layers_path)
    found = []
    for block in blocks:
        block = getattr(block, "original_component", block)
        inner = block.self_attn.q_proj if hasattr(block, "self_attn") else block.mixer.in_proj
        found.append(getattr(inner, "original_component", inner))
    return found


def test_a_forward_started_at_layer_k_runs_no_earlier_block(any_model):
    """`Plan.start = (k, resid)`: logits equal the full forward's, blocks 0..k-1 are never
    entered (counted by hooks inside them), and the meter counts L - k blocks per row."""
    model = any_model
    batch = model.to_batch(PROMPTS)
    full = _full_residuals(model, batch)
    calls: list[int] = []
    handles = [m.register_forward_hook(lambda *_, i=i: calls.append(i)) for i, m in enumerate(_inner_modules(model))]
    try:
        for k in range(1, model.n_layers + 1):
            calls.clear()
            with gna.cost_meter(model) as cost:
                out = model.backend.run(batch, Plan(start=(k, full.acts[Site(SiteKind.RESID, k)])))
            assert calls == list(range(k, model.n_layers)), (k, calls)
            assert cost.block_rows == batch.n_rows * (model.n_layers - k)
            assert (out.logits - full.logits).abs().max() < TOL
    finally:
        for handle in handles:
            handle.remove()
    if model.backend_name == "tlens":
        assert all(not hp._forward_hooks for hp in model.backend.bridge.hook_dict.values())
        assert not any("forward" in block.__dict__ for block in model.backend.bridge.blocks)
    else:
        assert no_hooks_anywhere(model.hf_model)


def test_a_started_forward_that_raises_restores_every_block(llama_tlens):
    model = llama_tlens
    batch = model.to_batch(PROMPTS)
    resid = _full_residuals(model, batch).acts[Site(SiteKind.RESID, 2)]
    plan = Plan(start=(2, resid))
    plan.add(Site(SiteKind.HEADS, 2), gna.core.plan.Edit(torch.ones(3, 1, 1, 1, dtype=torch.bool), torch.zeros(())))  # 3 rows != 4
    with pytest.raises(RuntimeError):
        model.backend.run(batch, plan)
    assert not any("forward" in block.__dict__ for block in model.backend.bridge.blocks)
    assert (model.logits(PROMPTS) - _full_residuals(model, batch).logits).abs().max() == 0


# name -> (interventions, blocks evaluated after the priming forward, with L layers and 3 prompts)
INTERVENTIONS = {
    "zero late head, at the last position": ([gna.Ablate([gna.Head(2, 1)], positions=-1)], lambda L: 3 * (L - 2)),
    "mean head": ([gna.Ablate([gna.Head(1, 2)], how="mean", corrupt=PROMPTS)], lambda L: 4 * L + 3 * (L - 1)),  # + the reference
    "skip": ([gna.SkipLayers([1])], lambda L: 3 * (L - 2)),  # block 1 passes the stream through: start at 2
    "truncate": ([gna.Truncate(1)], lambda L: 0),  # no block runs: final norm and unembedding only
    "patch resid": ([gna.Patch(gna.Resid(2), source=CORRUPT[:1])], lambda L: 1 * L + 3 * (L - 2)),  # + the source
}


@pytest.mark.parametrize("name", list(INTERVENTIONS))
def test_prefix_reused_runs_equal_full_runs(any_model, name):
    """Inside `prefix_cache`, forwards over a batch seen before start from its clean prefix:
    logits equal the uncached forward's to 1e-5, and the meter counts only the blocks after
    the first touched one (hand counts)."""
    model = any_model
    interventions, blocks_after = INTERVENTIONS[name]
    expected = model.logits(CLEAN, interventions)
    with model.prefix_cache() as cache, gna.cost_meter(model) as cost:
        clean = model.logits(CLEAN)  # primes the cache: the one clean forward
        primed = cost.block_rows
        actual = model.logits(CLEAN, interventions)
        spent = cost.block_rows - primed
        again = model.logits(CLEAN)
    assert cache is not None and model._prefix is None  # dropped on exit
    assert primed == 3 * model.n_layers
    assert (actual - expected).abs().max() < TOL
    assert (again - clean).abs().max() < TOL
    assert spent == blocks_after(model.n_layers)
    assert cost.block_rows == primed + spent  # the clean forward again: from the cached last stream


def test_truncation_from_the_cache_equals_the_uncached_truncation(llama_tlens):
    model = llama_tlens
    batch = model.to_batch(PROMPTS)
    with model.prefix_cache():
        model.logits(batch)
        cached = [model.logits(batch, [gna.Truncate(k)]) for k in range(1, model.n_layers + 1)]
    for k, logits in enumerate(cached, start=1):
        assert (logits - model.logits(batch, [gna.Truncate(k)])).abs().max() < TOL


def test_meter_records_the_peak_memory_a_block_adds(llama_tlens):
    """A block that holds a 96 MiB tensor for 0.2 s shows at least that (resident memory on
    the CPU, sampled), and a later block holding 24 MiB shows under 96: the peak is the block's
    own, not the process's lifetime maximum (``ru_maxrss``)."""
    import time

    def hold(mib: int) -> None:
        tensor = torch.ones(mib * 2**18)  # float32: mib MiB, every page written
        time.sleep(0.2)  # the sampler runs every ms; a loaded machine may delay it
        del tensor

    with gna.cost_meter(llama_tlens) as big:
        hold(96)
    with gna.cost_meter(llama_tlens) as small:
        hold(24)
    assert big.memory_source == small.memory_source == "rss"
    assert big.peak_memory_mb >= 96 > small.peak_memory_mb >= 24, (big.peak_memory_mb, small.peak_memory_mb)
    assert big.to_dict()["peak_memory_mb"] == big.peak_memory_mb and "peak memory +" in big.describe(1)


def test_a_given_memory_budget_counts_the_scan_states(mamba2, llama_tlens):
    """``rows_per_forward`` with a budget the caller gives counts, besides the logits and the
    residual-width activations, the largest mixer's float32 intermediates per position (a
    Mamba-2 scan's ``[inner, state]`` states; attention's scores and pattern): by hand from the
    HF configs. The default budget keeps its throughput estimate (no mixer term)."""
    from gna_interp.patching.variants import DEFAULT_MEMORY_BUDGET_MB, rows_per_forward

    n_pos, budget = 16, 1.0
    for model in (mamba2, llama_tlens):
        config = model.backend.config if model is mamba2 else model.backend.root.config
        base = config.vocab_size + 8 * config.hidden_size * (config.num_hidden_layers + 1)
        mixer = config.num_heads * config.head_dim * config.state_size if model is mamba2 else 2 * config.num_attention_heads * n_pos
        assert rows_per_forward(model, n_pos, None, budget) == max(1, int(budget * 2**20 // (4 * n_pos * (base + mixer))))
        default = int(DEFAULT_MEMORY_BUDGET_MB * 2**20 // (4 * n_pos * base))
        assert rows_per_forward(model, n_pos, None, None) == default
    assert rows_per_forward(mamba2, n_pos, None, budget) < rows_per_forward(mamba2, n_pos, None, DEFAULT_MEMORY_BUDGET_MB)
