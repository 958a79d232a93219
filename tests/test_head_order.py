"""The order in which group testing splits a wide layer (issue 52, item 8): heads largest write
first (`head_order`). On an oracle the ordered search finds exactly the brute force's costly
heads in fewer tests where the order gathers them; `write_sizes` equals each head's write
computed by raw torch hooks on the out-projections (Mamba-1 channels, attention heads, a
hybrid's two mixers with their multipliers; TransformerLens, nnsight, a remote model in one
request); a reordered spread group is described by its heads, not its ends."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.cost import cost_meter
from gna_interp.discovery.group_testing import SpreadGroup, StagedGroupTesting, block_size, group_testing, speculated
from gna_interp.discovery.head_order import by_size, write_sizes
from gna_interp.discovery.spread_group import heads_text

COSTLY = (5, 30, 59)


def _oracle(groups: list[list[gna.Head]]) -> list[float]:
    """Accuracy 1.0, each of `COSTLY` ablated costs 0.05 (additive, monotone)."""
    return [1.0 - 0.05 * sum(h.head in COSTLY for h in group) for group in groups]


def test_the_ordered_search_finds_the_brute_forces_heads_in_fewer_tests():
    """64 heads, 3 costly (5, 30, 59: scattered by index), sizes largest at exactly those. Brute
    force (each head alone) names them; group testing in index order and in `by_size` order both
    find exactly them (measured alone) and screen the rest. Tests, counted by hand: index order
    1 + 2 (halves) + 2 + 2 (quarters: 0-15, 16-31, 48-63 costly after 32-47 cleared) + 3 x 2 + 3 x 2
    (eighths, sixteenths) + 3 x 4 (singles) = 31; ordered, the 3 heads are the first 3: one costly
    group per level, 1 + 2 x 4 (down to 4 heads) + 4 singles = 13."""
    heads = [gna.Head(0, i) for i in range(64)]
    sizes = torch.ones(64, dtype=torch.float64)
    sizes[list(COSTLY)] = torch.tensor([3.0, 2.0, 5.0], dtype=torch.float64)
    order = by_size(heads, sizes)
    assert order[:3] == [gna.Head(0, 59), gna.Head(0, 5), gna.Head(0, 30)] and order[3:] == [h for h in heads if h.head not in COSTLY]
    brute = {h for h in heads if 1.0 - _oracle([[h]])[0] >= 0.02}
    plain, ordered = (group_testing(_oracle, order_, clean=1.0, min_effect=0.02) for order_ in (heads, order))
    for found in (plain, ordered):
        assert set(found.singles) == brute == {gna.Head(0, i) for i in COSTLY}
        assert set(found.screened) == set(heads) - brute and not found.spread
        assert all(found.singles[h] == pytest.approx(0.95) for h in brute)
    assert (plain.tests, ordered.tests) == (31, 13)


def test_by_size_breaks_ties_by_index_and_checks_the_sizes():
    heads = [gna.Head(2, i) for i in (3, 0, 2, 1)]
    assert by_size(heads, torch.tensor([1.0, 2.0, 1.0, 2.0])) == [gna.Head(2, 1), gna.Head(2, 3), gna.Head(2, 0), gna.Head(2, 2)]
    assert by_size(heads, None) == sorted(heads)
    with pytest.raises(GnaValueError, match="do not fit 2 sizes"):
        by_size(heads, torch.ones(2))


def test_a_reordered_spread_group_is_described_by_its_heads():
    """A group split in size order holds its heads out of index order: the description lists them
    sorted, runs as ends (not its first and last head, ``L0H9-L0H4``)."""
    group = SpreadGroup([gna.Head(0, 9), gna.Head(0, 2), gna.Head(0, 4), gna.Head(0, 3)], 0.5, (0.9, 0.95), [gna.Head(0, 9)])
    assert group.describe() == "L0H2-L0H4, L0H9 (4 heads) 0.500 together, parts 0.900 / 0.950; needs L0H9"
    many = [gna.Head(1, i) for i in (0, 1, 2, 5, 7, 9, 11, 13, 15, 17, 20, 21)]
    assert heads_text(many[::-1]) == "L1H0-L1H2, L1H5, L1H7, L1H9, L1H11, L1H13, L1H15, ..., L1H20-L1H21"
    assert heads_text(many[:-2]) == "L1H0-L1H2, L1H5, L1H7, L1H9, L1H11, L1H13, L1H15, L1H17"  # 8 runs: all
    assert heads_text([gna.Head(0, i) for i in range(128)][::-1]) == "L0H0-L0H127"


def _hooked_writes(model, task, layers) -> dict[int, torch.Tensor]:
    """The reference: the HF model's own forward, a forward hook on each mixer's out-projection
    reading its input ``[batch, pos, n_heads * d_head]``; each head's slice through its weight
    columns, times the config's multiplier (FalconH1), its norm summed over the real positions."""
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    config, out, handles = model.hf_model.config, {}, []
    for layer in layers:
        out[layer] = torch.zeros(model.heads_per_layer[layer], dtype=torch.float64)
        for mixer in model.layer_specs[layer].mixers:
            module = model.hf_model.get_submodule(mixer.out_proj_path)
            scale = 1.0
            if config.model_type == "falcon_h1":
                scale = config.attention_out_multiplier if mixer.kind is gna.LayerKind.ATTENTION else config.ssm_out_multiplier

            def hook(module, inputs, output, layer=layer, mixer=mixer, scale=scale):
                x, weight, width = inputs[0].detach().double(), module.weight.detach().double(), mixer.head_dim
                real = encoded.batch.attention_mask.bool()
                for h in range(mixer.n_heads):
                    write = x[..., h * width : (h + 1) * width] @ weight[:, h * width : (h + 1) * width].T * scale
                    out[layer][mixer.offset + h] += write.norm(dim=-1)[real].sum()

            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model.hf_model(input_ids=encoded.batch.input_ids, attention_mask=encoded.batch.attention_mask)
    finally:
        for handle in handles:
            handle.remove()
    return out


@pytest.mark.parametrize("name", ["mamba", "llama", "falcon_h1"])
def test_write_sizes_equal_the_writes_of_raw_hooks(name):
    """`write_sizes` on each toy (its own backend: nnsight for Mamba-1 and FalconH1,
    TransformerLens for Llama) equals `_hooked_writes` to 1e-4."""
    model, task = gna.load_toy(name), gna.toy_task(name, 70, seed=7)  # 70 prompts: two chunks of `ROWS`
    layers = list(range(model.n_layers))
    sizes, reference = write_sizes(model, task, layers), _hooked_writes(model, task, layers)
    for layer in layers:
        assert sizes[layer].shape == (model.heads_per_layer[layer],)
        assert torch.allclose(sizes[layer], reference[layer], rtol=1e-4), (layer, sizes[layer], reference[layer])
        assert float(sizes[layer].max()) > 0  # (the Llama toy's zeroed heads write exactly 0, as the hooks say)


def test_a_remote_model_measures_the_write_sizes_in_one_request():
    """``remote="local"`` on the Mamba-1 toy: the same sizes as the local model's (to 1e-5),
    in one request whatever the chunks."""
    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 70, seed=7)
    remote = gna.load(copy.deepcopy(model.hf_model), tokenizer=model.tokenizer, remote="local")
    with cost_meter(remote) as cost:
        far = write_sizes(remote, task, [0, 1])
    near = write_sizes(model, task, [0, 1])
    assert cost.requests == 1 and cost.forwards >= 1
    assert all(torch.allclose(far[layer], near[layer], rtol=1e-5) for layer in (0, 1))


def test_write_sizes_are_measured_under_the_models_active_ablation():
    """Inside ``model.ablated([L0H70])`` (discovery's clean run is the ablated one): L0H70 writes
    exactly 0, every other layer-0 channel what it writes without the ablation (a channel's output
    is its own: zeroing L0H70 at the out-projection's input leaves theirs), and layer 1 reads the
    changed stream (its writes change)."""
    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 16, seed=7)
    plain = write_sizes(model, task, [0, 1])
    with model.ablated([gna.Head(0, 70)]):
        ablated = write_sizes(model, task, [0, 1])
    assert float(ablated[0][70]) == 0.0 < float(plain[0][70])
    others = [h for h in range(128) if h != 70]
    assert torch.allclose(ablated[0][others], plain[0][others], rtol=1e-5)
    assert not torch.allclose(ablated[1], plain[1], rtol=1e-3)


@pytest.mark.parametrize(("costly", "rounds"), [((0, 9, 30), 0), ((0, 9, 100), 1)])
def test_the_speculated_blocks_spare_the_second_stages_request(costly, rounds):
    """128 heads in their split order, each of ``costly`` (order positions) costing 0.05: with
    `speculated`'s groups known ahead (stage one and the whole tree below the first 4 blocks of 8,
    positions 0-31), `StagedGroupTesting` needs no round of its own where every costly head lies
    in those blocks, and one (the tree below the costly block) where one lies outside; its
    findings are `group_testing`'s either way (the brute force's heads, measured alone)."""
    heads = [gna.Head(0, (37 * i) % 128) for i in range(128)]  # an order that is not the index order
    hit = {heads[i] for i in costly}

    def oracle(groups):
        return [1.0 - 0.05 * len(hit & set(group)) for group in groups]

    calls = []

    def measure(groups):
        calls.append(len(groups))
        return oracle(groups)

    ahead = speculated(heads)
    assert len(ahead) == 31 + 4 * (2 + 8) and block_size(128) == 8  # below a block: its halves, then their heads
    known = {tuple(group): value for group, value in zip(ahead, oracle(ahead), strict=True)}
    [staged] = StagedGroupTesting(measure, [heads], 1.0, 0.02, known).finish()
    adaptive = group_testing(oracle, heads, 1.0, 0.02)
    assert len(calls) == rounds and set(staged.singles) == set(adaptive.singles) == hit
    assert staged.screened == adaptive.screened and staged.spread == adaptive.spread == []


def test_the_order_measured_before_the_baseline_is_its_clean_forward():
    """The Mamba-1 toy (both layers group-tested), 24 prompts: the order is measured before the
    baseline (`stages.early_head_order`), equals `write_sizes`' order measured alone, fills the
    prefix cache, so the baseline stage costs one pass (its forward; `evaluate` after it none), as
    without it; the circuit is the one measured with the order taken in the head scan instead
    (every field; there the head scan runs the order's forward: one pass more)."""
    from gna_interp.discovery import stages
    from gna_interp.discovery.head_order import ordered_layers
    from gna_interp.discovery.pipeline import discover_records
    from gna_interp.discovery.records import record_from_dict, record_to_dict

    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 24, seed=4242)
    circuit, records = discover_records(model, task)
    base = records.baseline
    assert base.order == ordered_layers(model, task, [0, 1])
    assert base.cost["block_rows"] == len(task) * model.n_layers
    assert record_from_dict(record_to_dict(base), None).order == base.order  # a run directory keeps it  # type: ignore[arg-type,attr-defined]
    early = stages.early_head_order
    stages.early_head_order = lambda ctx: None
    try:
        late, late_records = discover_records(model, task)
    finally:
        stages.early_head_order = early
    one_pass = len(task) * model.n_layers
    assert late_records.baseline.order is None and late_records.baseline.cost["block_rows"] == one_pass
    assert late_records.head_scan.cost["block_rows"] - records.head_scan.cost["block_rows"] == one_pass  # its own forward
    mine, theirs = copy.deepcopy(circuit.to_dict()), copy.deepcopy(late.to_dict())
    for key in ("seconds", "peak_memory_mb", "passes", "block_rows", "rows", "forwards", "estimate"):
        mine["cost"].pop(key, None), theirs["cost"].pop(key, None)
    assert mine == theirs
    spent = [sum(r.cost["block_rows"] for r in recs) for recs in (records, late_records)]
    assert spent[0] == spent[1] - one_pass


def test_write_sizes_read_the_first_prompts_that_fit_the_capture_budget(monkeypatch):
    """With `CAPTURE_BYTES` room for 3 prompts' head outputs, `write_sizes` on 24 prompts sums the
    first 3 alone (raw hooks on those 3), and the order is not measured ahead of the baseline on a
    model whose single prompt does not fit (`stages.early_head_order`)."""
    from gna_interp.discovery import head_order

    model, task = gna.load_toy("mamba"), gna.toy_task("mamba", 24, seed=7)
    per_prompt = head_order.bytes_per_prompt(model, [0, 1], task.encode(task.tokenizer_for(model.tokenizer)).batch.n_pos)
    monkeypatch.setattr(head_order, "CAPTURE_BYTES", 3 * per_prompt + 1)
    sizes, reference = write_sizes(model, task, [0, 1]), _hooked_writes(model, task[:3], [0, 1])
    assert all(torch.allclose(sizes[layer], reference[layer], rtol=1e-4) for layer in (0, 1))
    monkeypatch.setattr(head_order, "CAPTURE_BYTES", per_prompt - 1)
    circuit, records = gna.discovery.pipeline.discover_records(model, task, stages=("layers", "heads"))
    assert records.baseline.order is None and set(circuit.settings["group_testing"]) == {"0", "1"}
