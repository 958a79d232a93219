"""Discovery's budget at width (issue 27, item 4): an evaluation already made in a `discover`
call is not paid twice (`memo.accuracy_memo`), the layer scan's value of a layer that is
its one mixer answers group testing's first group, and a local scan searches only the
spread groups the report shows. Each against a run without it: the same circuit, fewer
forwards."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.core.interventions import SkipLayers, Truncate
from gna_interp.discovery import memo as memos
from gna_interp.discovery.group_testing import group_testing, search_needed
from gna_interp.models.structure import ablating_every_head_skips, mixer_is_the_block
from gna_interp.models.tiny import tiny_model, word_tokenizer


@pytest.fixture(scope="module")
def mamba2():
    return gna.load_toy("mamba2_counting"), gna.toy_task("mamba2_counting", 60, seed=4242)


def _discover(model, task, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gna.discovery.PositionalAnswerWarning)
        return gna.discover(model, task, progress=False, **options)


@pytest.mark.slow
def test_a_memoised_discovery_equals_one_without_the_memo_at_fewer_forwards(mamba2, monkeypatch):
    """The Mamba-2 toy with both layers group-tested (``screen_above=4``), a Gather role
    spread beyond 2 heads (a spread group reported; sized by its curve, so its needed heads
    are left to the curve, `SpreadGroup.skipped`): the circuit equals, field by field but the
    cost, that of a run with no memo, and the forwards saved are exactly the evaluations the
    memo answered (one forward each: 60 prompts are one batch)."""
    model, task = mamba2
    options = {"max_heads_per_role": 2, "screen_above": 4, "thresholds": gna.discovery.RoleThresholds(min_effect=0.2)}
    opened, original = [], memos.accuracy_memo

    @contextlib.contextmanager
    def spied(of):
        with original(of) as memo:
            opened.append(memo)
            yield memo

    monkeypatch.setattr(memos, "accuracy_memo", spied)
    memoised = _discover(model, task, **options)
    monkeypatch.setattr(memos, "accuracy_memo", lambda of: contextlib.nullcontext())
    plain = _discover(model, task, **options)
    assert memoised.spread["gather"].groups, "no spread group reported: the test cannot compare the searches"
    assert all(g.skipped for g in memoised.spread["gather"].groups if g.searched)
    first, second = memoised.to_dict(), plain.to_dict()
    assert [k for k in first if first[k] != second[k]] == ["cost"]
    [memo] = opened
    assert memo.hits >= 3
    assert plain.cost["forwards"] - memoised.cost["forwards"] == memo.hits, (plain.cost, memoised.cost, memo.hits)
    assert memoised.cost["passes"] < plain.cost["passes"]


@pytest.mark.slow
def test_the_layer_scans_value_answers_group_testings_first_group_in_discover(mamba2, monkeypatch):
    """End to end: with the prescreen on (``prescreen_above=8``) and both layers group-tested,
    the layer scan's value stands in for every head ablated in each costly layer. The circuit
    equals, field by field but the cost, a run where that value is not recorded, and the
    forwards saved are exactly the layers it was recorded for (60 prompts: one batch)."""
    model, task = mamba2
    options = {"prescreen_above": 8, "screen_above": 4, "max_heads_per_role": 2}
    recorded, original = [], memos.remember

    def spied(of, on, interventions, value):
        done = original(of, on, interventions, value)
        recorded.append(done)
        return done

    monkeypatch.setattr(memos, "remember", spied)
    shortcut = _discover(model, task, **options)
    monkeypatch.setattr(memos, "remember", lambda *args: False)
    plain = _discover(model, task, **options)
    assert recorded and all(recorded), recorded
    first, second = shortcut.to_dict(), plain.to_dict()
    assert [k for k in first if first[k] != second[k]] == ["cost"]
    assert plain.cost["forwards"] - shortcut.cost["forwards"] == len(recorded), (plain.cost, shortcut.cost, recorded)


def test_a_bool_position_is_not_keyed_as_position_one():
    """``True == 1`` in Python: the memo must not answer ``positions=True`` from ``positions=1``."""
    heads = [gna.Head(0, 0)]
    assert memos.memo_key([gna.Ablate(heads, positions=1)]) is not None
    with pytest.raises(TypeError, match="positions=True"):
        memos._positions_key(True)


def test_the_memo_keys_everything_that_changes_the_forward(mamba2):
    """The same evaluation is answered without a forward; the order of a zero ablation's
    heads does not matter; other positions, another task object, an ambient ablation and
    kinds the memo cannot key (a mean ablation) each run their forward, and give what
    `evaluate` gives."""
    model, task = mamba2
    encoded = task.encode()
    heads = [gna.Head(0, 3), gna.Head(0, 1)]
    assert memos.memo_key([gna.Ablate(heads)]) == memos.memo_key([gna.Ablate(heads[::-1])])
    assert memos.memo_key([gna.Ablate(heads, positions=encoded.final)]) != memos.memo_key([gna.Ablate(heads)])
    assert memos.memo_key([SkipLayers([1])]) != memos.memo_key([Truncate(1)])
    assert memos.memo_key([gna.Ablate(heads, how="mean", corrupt=task.prompts[:2])]) is None
    with memos.accuracy_memo(model) as memo:
        with gna.cost_meter(model) as first:
            value = memos.accuracy(model, task, [gna.Ablate(heads)])
        with gna.cost_meter(model) as again:
            assert memos.accuracy(model, task, [gna.Ablate(heads[::-1])]) == value
        assert first.forwards == 1 and again.forwards == 0 and memo.hits == 1
        other = gna.toy_task("mamba2_counting", 60, seed=7)
        ends = encoded.segment_ends
        with gna.cost_meter(model) as distinct:
            at_ends = memos.accuracy(model, task, [gna.Ablate(heads, positions=ends)])
            on_other = memos.accuracy(model, other, [gna.Ablate(heads)])
            with model.ablated([gna.Head(1, 6)]):
                ambient = memos.accuracy(model, task, [gna.Ablate(heads)])
                reference = gna.evaluate(model, task, [gna.Ablate(heads)]).accuracy
            mean = gna.Ablate(heads, how="mean", corrupt=task.prompts)
            memos.accuracy(model, task, [mean])
            memos.accuracy(model, task, [mean])
        assert memo.hits == 1 and distinct.forwards >= 6
    assert at_ends == gna.evaluate(model, task, [gna.Ablate(heads, positions=ends)]).accuracy
    assert on_other == gna.evaluate(model, other, [gna.Ablate(heads)]).accuracy
    assert ambient == reference != value


@pytest.mark.parametrize("name", ["mamba", "mamba2_counting", "llama", "falcon_h1_counting"])
def test_every_head_ablated_is_the_layer_skipped_exactly_where_discovery_takes_it_so(name):
    """Where `ablating_every_head_skips` says so (a block that is its one mixer, no
    out-projection bias: the Mamba toys), every head of a layer ablated gives the layer
    scan's scores exactly, so its value answers group testing's first group. A block with
    an MLP (Llama) or two mixers (FalconH1) does not qualify."""
    if name not in gna.toy_names():
        pytest.skip(f"the {name} toy is not bundled")
    model, task = gna.load_toy(name), gna.toy_task(name, 16, seed=4242)
    expected = name.startswith("mamba")
    for layer in range(model.n_layers):
        assert ablating_every_head_skips(model, layer) is expected
        if expected:
            every = [gna.Head(layer, h) for h in range(model.heads_per_layer[layer])]
            skipped = gna.evaluate(model, task, [SkipLayers([layer])]).scores
            assert torch.equal(gna.evaluate(model, task, [gna.Ablate(every)]).scores, skipped)


@pytest.mark.parametrize("name", ["mamba2", "llama"])
def test_the_layer_scans_single_layer_values_answer_every_head_ablated(name):
    """`stages.remember_layers`: a layer the layer scan skipped alone answers its every head
    ablated (a joint pool or a role's set of exactly its heads) without a forward, with the
    accuracy `evaluate` gives that ablation (the reference, outside the memo); a layer with an
    MLP (Llama) is not taken so."""
    from gna_interp.discovery import layer_scans
    from gna_interp.discovery.stages import remember_layers

    model, task = gna.load_toy(name), gna.toy_task(name, 24, seed=4242)
    clean = gna.evaluate(model, task).accuracy
    with memos.accuracy_memo(model):
        scan = layer_scans.screened_layer_scan(model, task, clean, 0.02, progress=False)
        kept = remember_layers(model, task, scan.accuracy, scan.skipped)
        with gna.cost_meter(model) as cost:
            answered = {
                q: memos.accuracy(model, task, [gna.Ablate([gna.Head(q, h) for h in range(model.heads_per_layer[q])])]) for q in kept
            }
    assert kept == ([] if name == "llama" else [q for q, pair in enumerate(scan.skipped) if pair == (q, q)]) and (name == "llama" or kept)
    assert cost.forwards == 0
    for q, value in answered.items():
        assert value == gna.evaluate(model, task, [gna.Ablate([gna.Head(q, h) for h in range(model.heads_per_layer[q])])]).accuracy


def test_an_out_projection_bias_keeps_the_layer_scan_apart():
    """A Mamba-1 whose out-projection has a bias writes the bias with every channel ablated:
    not the layer skipped, and the pipeline does not take it so."""
    hf = tiny_model("mamba", seed=3, use_bias=True)
    with torch.no_grad():
        hf.backbone.layers[0].mixer.out_proj.bias.normal_(generator=torch.Generator().manual_seed(0))  # HF starts it at 0
    model = gna.load(hf, tokenizer=word_tokenizer())
    assert not ablating_every_head_skips(model, 0)
    prompts = ["w4 w5 w6 w7", "w8 w9 w10 w11"]
    every = [gna.Head(0, h) for h in range(model.heads_per_layer[0])]
    assert not torch.equal(model.logits(prompts, [gna.Ablate(every)]), model.logits(prompts, [SkipLayers([0])]))


def test_a_registered_architecture_that_is_not_declared_pre_norm_is_not_taken_as_one():
    """A post-norm block (``norm(x + mixer(x))``) passes the one-mixer, no-bias test, yet
    every head zeroed gives ``norm(x)`` where a skip gives ``x``. A row that does not declare
    ``pre_norm_residual`` is therefore neither cleared by the layer scan nor answered by it;
    the same model with the built-in row is."""
    import dataclasses

    model = gna.load(tiny_model("mamba", seed=3), tokenizer=word_tokenizer())
    assert model.arch.pre_norm_residual and mixer_is_the_block(model, 0) and ablating_every_head_skips(model, 0)
    model.arch = dataclasses.replace(model.arch, pre_norm_residual=False)
    assert not mixer_is_the_block(model, 0) and not ablating_every_head_skips(model, 0)


def test_a_deferred_spread_search_finds_what_the_scan_would():
    """Heads 5, 70, 100 together cost 0.7 (none alone), heads 20, 21 together 0.3: two
    spread groups (the layer, redundant, and L0H20-L0H23, which needs the pair). Scanned
    with ``search=False`` they are kept unsearched; `search_needed` on each then names exactly
    the heads the eager scan names (those a brute force over the group finds), and the tests
    of scan and searches add up to the eager scan's."""
    spread, pair = {gna.Head(0, i) for i in (5, 70, 100)}, {gna.Head(0, 20), gna.Head(0, 21)}

    def measure(groups):
        return [1.0 - (0.7 if spread <= set(g) else 0.0) - (0.3 if pair <= set(g) else 0.0) for g in groups]

    heads = [gna.Head(0, i) for i in range(128)]
    eager = group_testing(measure, heads, clean=1.0, min_effect=0.02)
    deferred = group_testing(measure, heads, clean=1.0, min_effect=0.02, search=False)
    assert len(eager.spread) == len(deferred.spread) >= 2
    assert all(group.needed == [] for group in deferred.spread) and deferred.tests < eager.tests
    searched = sum(search_needed(measure, group, 1.0, 0.02) for group in deferred.spread)
    assert [g.needed for g in deferred.spread] == [g.needed for g in eager.spread]
    for group in eager.spread:  # brute force: a head is needed if, the rest of the group ablated, the effect goes
        brute = [h for h in group.heads if 1.0 - measure([[x for x in group.heads if x != h]])[0] < 0.02]
        assert group.needed == brute
    assert [h for g in eager.spread for h in g.needed] == sorted(pair)  # the whole layer's effect is redundant
    assert deferred.tests + searched == eager.tests
    assert (deferred.singles, deferred.screened) == (eager.singles, eager.screened)


@pytest.mark.parametrize("name", ["llama", "mamba2_counting"])
def test_the_edge_check_takes_its_clean_and_corrupt_metric_from_path_patching(name):
    """`discover`'s Gather -> Aggregate check: its clean and corrupt metric (the candidate
    logit difference) equal those of separate final-position logits of the clean and the
    corrupted task, its path-patched value equals `path_patching`'s, and it runs exactly the
    forwards of `path_patching` alone (two fewer than separate logits and path patching)."""
    from gna_interp.discovery.confirm import gather_to_aggregate as _gather_to_aggregate
    from gna_interp.patching.metrics import logit_diff, reduce_metric

    model, task = gna.load_toy(name), gna.toy_task(name, 40, seed=4242)
    circuit = _discover(model, task, stages=("heads", "entry", "roles"))
    assert circuit.gather and circuit.aggregate
    corrupt = task.corrupted()
    clean_enc, corrupt_enc = task.encode(), corrupt.encode()
    rows = torch.arange(len(task))
    metric = logit_diff(clean_enc.candidate_ids[rows, clean_enc.correct], corrupt_enc.candidate_ids[rows, corrupt_enc.correct])
    with gna.cost_meter(model) as edge:
        found = _gather_to_aggregate(model, task, circuit)
    with gna.cost_meter(model) as alone:
        path = gna.patching.path_patching(model, task, corrupt, metric, senders=circuit.gather, receivers=circuit.aggregate)
    assert found is not None and found["gather->aggregate"] == path
    assert found["clean"] == reduce_metric(metric(model.logits(task, logits_to_keep=1)))
    assert found["corrupt"] == reduce_metric(metric(model.logits(corrupt, logits_to_keep=1)))
    assert edge.forwards == alone.forwards
