"""`faithfulness_curve` (issue 29, item 3) against independent references:

- each point equals `evaluate` with every other head ablated, built by hand here;
- on the toy Llama, mean ablation redone with raw PyTorch hooks on the HF model, one
  unpadded prompt at a time (no library code on the reference side);
- the two ends: every head kept is the clean evaluation exactly, none kept is every head ablated;
- both backends give the same curve; SSM and hybrid heads take part (nnsight toys);
- the G&A circuit alone carries >= 90% of the Llama toy's clean accuracy.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

import gna_interp as gna
from gna_interp.patching.metrics import candidate_logit_diff
from gna_interp.scoring.faithfulness import FaithfulnessCurve, rank_heads
from gna_interp.zoo.store import toy_path

from .conftest import raw_logits

N_PROMPTS = 24
SEED = 4242


@pytest.fixture(scope="module")
def llama_task():
    return gna.toy_task("llama", N_PROMPTS, seed=SEED)


def by_hand(model, task, kept, how):
    """`evaluate` with every head not in ``kept`` ablated, the ablation built here."""
    others = [head for head in model.heads if head not in set(kept)]
    if not others:
        return gna.evaluate(model, task, progress=False)
    reference = task if how == "mean" else task.corrupted() if how == "resample" else None
    return gna.evaluate(model, task, [gna.Ablate(others, how=how, corrupt=reference)], progress=False)


def check_point(curve: FaithfulnessCurve, index: int, expected: gna.Evaluation) -> None:
    rows = torch.arange(len(expected.correct))
    assert curve.accuracy[index].item() == expected.accuracy
    assert curve.margin[index].item() == pytest.approx(float(expected.margins.double().mean()), abs=1e-9)
    assert curve.logprob[index].item() == pytest.approx(float(expected.scores[rows, expected.correct].double().mean()), abs=1e-9)


@pytest.mark.parametrize("how", ["mean", "resample", "zero"])
def test_each_point_is_evaluate_with_every_other_head_ablated(toy_llamas, llama_task, how):
    model = toy_llamas["tlens"]
    order = [gna.Head(0, 2), gna.Head(1, 0), gna.Head(0, 0), gna.Head(1, 3), gna.Head(0, 1), gna.Head(0, 3), gna.Head(1, 1), gna.Head(1, 2)]
    curve = gna.faithfulness_curve(model, llama_task, order, sizes=[2, 5], how=how, progress=False)
    assert curve.sizes.tolist() == [0, 2, 5, 8]  # both ends always there
    assert curve.order == order
    for index, n in enumerate(curve.sizes.tolist()):
        check_point(curve, index, by_hand(model, llama_task, order[:n], how))
    # The ends: all kept is the clean model exactly; none kept is every head ablated.
    clean = gna.evaluate(model, llama_task, progress=False)
    assert curve.clean["accuracy"] == clean.accuracy and curve.clean["margin"] == float(clean.margins.double().mean())
    assert curve.accuracy[-1].item() == clean.accuracy
    assert all(not point._forward_hooks for point in model.backend.bridge.hook_dict.values())  # none left behind


def test_mean_ablation_matches_raw_hooks_on_the_hf_model(toy_llamas, llama_task):
    """Keeping {L1H0, L0H1} with mean ablation, redone with raw out-projection pre-hooks:
    each ablated head's output replaced by its mean over every token of every prompt
    (each prompt run alone, unpadded), candidates scored from the final logits."""
    kept = [gna.Head(1, 0), gna.Head(0, 1)]
    curve = gna.faithfulness_curve(toy_llamas["nnsight"], llama_task, kept, sizes=[2], how="mean", progress=False)
    hf = AutoModelForCausalLM.from_pretrained(toy_path("llama")).eval()
    encoded = llama_task.encode(llama_task.tokenizer_for(toy_llamas["nnsight"].tokenizer))
    prompts = [ids[mask.bool()].view(1, -1) for ids, mask in zip(encoded.batch.input_ids, encoded.batch.attention_mask, strict=True)]
    n_layers, n_heads = hf.config.num_hidden_layers, hf.config.num_attention_heads
    captured: dict[int, list[torch.Tensor]] = {layer: [] for layer in range(n_layers)}
    hooks = []
    for layer in range(n_layers):

        def keep(module, args, layer=layer):
            captured[layer].append(args[0].reshape(*args[0].shape[:2], n_heads, -1)[0])

        hooks.append(hf.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(keep))
    try:
        with torch.no_grad():
            for ids in prompts:
                hf(input_ids=ids)
    finally:
        for hook in hooks:
            hook.remove()
    means = {layer: torch.cat(captured[layer]).mean(0) for layer in range(n_layers)}  # [head, d_head]
    ablated = {layer: [h for h in range(n_heads) if gna.Head(layer, h) not in kept] for layer in range(n_layers)}

    def edit(layer):
        def apply(heads):
            heads[:, :, ablated[layer]] = means[layer][ablated[layer]]
            return heads

        return apply

    margins, logprobs, right = [], [], 0
    for ids, candidates, correct in zip(prompts, encoded.candidate_ids, encoded.correct, strict=True):
        batch = type("Rows", (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})()
        scores = raw_logits(hf, batch, {layer: edit(layer) for layer in range(n_layers)})[0, -1].log_softmax(-1)[candidates]
        others = torch.cat([scores[:correct], scores[correct + 1 :]])
        margins.append(float(scores[correct] - others.max()))
        logprobs.append(float(scores[correct]))
        right += margins[-1] > 0
    point = curve.sizes.tolist().index(2)
    assert curve.accuracy[point].item() == pytest.approx(right / len(prompts))
    assert curve.margin[point].item() == pytest.approx(sum(margins) / len(margins), abs=1e-4)
    assert curve.logprob[point].item() == pytest.approx(sum(logprobs) / len(logprobs), abs=1e-4)
    assert curve.accuracy[point].item() < curve.clean["accuracy"]  # the reference really ablated something


def test_both_backends_give_the_same_curve(toy_llamas, llama_task):
    curves = {
        name: gna.faithfulness_curve(model, llama_task, [gna.Head(1, 0), gna.Head(0, 0), gna.Head(0, 3)], sizes=[1, 3], progress=False)
        for name, model in toy_llamas.items()
    }
    tlens, nnsight = curves["tlens"], curves["nnsight"]
    assert torch.equal(tlens.sizes, nnsight.sizes)
    assert torch.equal(tlens.accuracy, nnsight.accuracy)
    assert torch.allclose(tlens.margin, nnsight.margin, atol=1e-4)
    assert torch.allclose(tlens.logprob, nnsight.logprob, atol=1e-4)


@pytest.mark.parametrize("name", ["mamba2", "falcon_h1"])
def test_ssm_and_hybrid_heads_take_part(name):
    """Every head kind is kept or ablated: on the hybrid, keeping only the attention heads
    and keeping only the SSM heads are both points of a ranking that lists them first."""
    model, task = gna.load_toy(name, backend="nnsight"), gna.toy_task(name, N_PROMPTS, seed=SEED)
    ssm = [head for head in model.heads if model.layout.head_kind(head) == gna.LayerKind.SSM]
    attention = [head for head in model.heads if model.layout.head_kind(head) == gna.LayerKind.ATTENTION]
    assert len(ssm) + len(attention) == len(model.heads) and ssm and (attention or name == "mamba2")
    order = attention + ssm
    sizes = [len(attention)] if attention else [len(ssm) // 2]
    curve = gna.faithfulness_curve(model, task, order, sizes=sizes, how="mean", progress=False)
    for index, n in enumerate(curve.sizes.tolist()):
        check_point(curve, index, by_hand(model, task, order[:n], "mean"))
    assert curve.accuracy[0].item() < curve.clean["accuracy"] - 0.3  # every head ablated: the task is gone


def test_ranking_by_a_sweep_orders_heads_by_effect_size(toy_llamas):
    model = toy_llamas["tlens"]
    scores = torch.full((model.n_layers, model.n_heads), float("nan"))
    scores[0] = torch.tensor([1.0, 3.5, 2.0, 0.2])  # effects -1, +1.5, 0, -1.8 from baseline 2.0
    scores[1, 0] = -1.0  # effect -3.0: the largest
    sweep = gna.SweepResult(scores, ("layer", "head"), baseline=2.0)
    expected = ["L1H0", "L0H3", "L0H1", "L0H0", "L0H2", "L1H1", "L1H2", "L1H3"]  # NaN heads last, in order
    assert [str(h) for h in rank_heads(model, sweep)] == expected


def test_a_partial_list_ranks_the_heads_it_leaves_out_last(toy_llamas):
    model = toy_llamas["tlens"]
    assert [str(h) for h in rank_heads(model, [gna.Head(1, 2), gna.Head(0, 1)])] == [
        "L1H2", "L0H1", "L0H0", "L0H2", "L0H3", "L1H0", "L1H1", "L1H3",
    ]  # fmt: skip


def test_frame_and_definitions(toy_llamas, llama_task):
    curve = gna.faithfulness_curve(toy_llamas["tlens"], llama_task, [gna.Head(0, 0), gna.Head(1, 0)], sizes=[1, 2], progress=False)
    frame = curve.to_frame()
    assert list(frame.columns) == ["size", "accuracy", "margin", "logprob", "of_clean", "recovered", "added"]
    assert frame["size"].tolist() == [0, 1, 2, 8]
    assert frame["added"].tolist()[:3] == ["", "L0H0", "L1H0"]
    clean, floor = curve.clean["accuracy"], curve.ablated["accuracy"]
    for row in frame.itertuples():
        assert row.of_clean == pytest.approx(row.accuracy / clean)
        assert row.recovered == pytest.approx((row.accuracy - floor) / (clean - floor))
    assert frame["recovered"].iloc[0] == 0.0 and frame["recovered"].iloc[-1] == 1.0
    assert curve.chance == 0.25


def test_cost_is_evaluate_with_the_reference_run_once(toy_llamas, llama_task):
    """Four evaluations (n = 0, n = 1, every head, the circuit), three of them mean-ablated
    against the same reference: evaluated by hand they run the reference three times; the
    curve runs it once (`GnaModel.source_cache`), so two reference forwards fewer."""
    model = toy_llamas["tlens"]
    order = [gna.Head(0, 0), gna.Head(1, 0)]
    with gna.cost_meter(model) as cost:
        gna.faithfulness_curve(model, llama_task, order, sizes=[1], circuit=[gna.Head(1, 0)], progress=False)
    with gna.cost_meter(model) as by_hand_cost:
        for kept in ([], order[:1], list(model.heads), [gna.Head(1, 0)]):
            by_hand(model, llama_task, kept, "mean")
    with gna.cost_meter(model) as reference_run:
        model.capture_sites(llama_task, [])
    assert by_hand_cost.forwards == 4 + 3 * reference_run.forwards
    assert cost.forwards == by_hand_cost.forwards - 2 * reference_run.forwards
    assert cost.block_rows == by_hand_cost.block_rows - 2 * reference_run.block_rows


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_source_cache_gives_the_same_numbers_and_is_dropped(toy_llamas, llama_task, backend):
    """Inside `source_cache` a mean or resample ablation reads its reference's activations
    from the first capture: the logits equal the uncached run's exactly; the cache is gone
    after the block, also when the block raises."""
    model = toy_llamas[backend]
    ablations = [gna.Ablate([gna.Head(0, 1), gna.Head(1, 0)], how="mean", corrupt=llama_task)]
    ablations.append(gna.Ablate([gna.Head(0, 0)], how="resample", corrupt=llama_task.corrupted()))
    plain = [model.logits(llama_task.prompts, [item]) for item in ablations]
    with gna.cost_meter(model) as cost, model.source_cache():
        cached = [model.logits(llama_task.prompts, [item]) for item in ablations for _ in range(2)]
    assert cost.forwards == 4 + 2  # 4 ablated runs, each reference captured once
    for index, expected in enumerate(plain):
        assert torch.equal(cached[2 * index], expected) and torch.equal(cached[2 * index + 1], expected)
    assert model._sources is None
    with pytest.raises(RuntimeError, match="inside"), model.source_cache():
        model.logits(llama_task.prompts, ablations[:1])
        raise RuntimeError("inside")
    assert model._sources is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"sizes": [3, 9]}, ValueError, r"sizes\[1\]=9: expected heads kept in 0\.\.8"),
        ({"sizes": [2.5]}, TypeError, r"sizes\[0\]=2\.5: expected an int"),
        ({"how": "median"}, ValueError, r"how='median' is not an ablation kind"),
        ({"ranking": [gna.Head(0, 1), gna.Head(0, 1)]}, ValueError, r"ranking\[1\] is L0H1 again"),
        ({"ranking": [(0, 1)]}, TypeError, r"ranking\[0\] is \(0, 1\) \(tuple\): expected a gna_interp.Head"),
        ({"ranking": "L0H1"}, TypeError, r"ranking='L0H1': expected a SweepResult"),
        ({"ranking": [gna.Head(0, 7)]}, ValueError, r"L0H7|head 7"),
        ({"circuit": []}, ValueError, r"circuit is empty"),
        (
            {"ranking": gna.SweepResult(torch.zeros(2, 4, 3), ("layer", "head", "pos"), 0.0)},
            ValueError,
            r"ranking has axes \('layer', 'head', 'pos'\): expected a SweepResult of \[layer, head\]",
        ),
        ({"ranking": gna.SweepResult(torch.zeros(3, 4), ("layer", "head"), 0.0)}, ValueError, r"shape \(3, 4\): expected \(2, 4\)"),
    ],
)
def test_bad_arguments_are_named(toy_llamas, llama_task, kwargs, error, match):
    arguments = {"ranking": [gna.Head(0, 0)], **kwargs}
    with pytest.raises(error, match=match):
        gna.faithfulness_curve(toy_llamas["tlens"], llama_task, progress=False, **arguments)


def test_the_llama_toys_circuit_alone_carries_its_task(toy_llamas):
    """The issue's goal: keeping only the discovered G&A heads (every other head
    mean-ablated) recovers >= 90% of clean accuracy on the Llama toy."""
    model, task = toy_llamas["tlens"], gna.toy_task("llama", 100, seed=SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        circuit = gna.discover(model, task, progress=False)
    heads = [*circuit.gather, *circuit.aggregate]
    assert circuit.aggregate and circuit.gather
    sweep = gna.ablation_sweep(model, task, task, _margin(model, task), how="mean", progress=False)
    curve = gna.faithfulness_curve(model, task, sweep, circuit=heads, progress=False)
    assert curve.circuit_point is not None
    assert curve.of_clean(curve.circuit_point["accuracy"]) >= 0.9, curve.to_frame()
    check_point_of(curve, model, task, heads)
    assert curve.ablated["accuracy"] <= curve.chance + 0.1  # and without any head the task is gone


def check_point_of(curve: FaithfulnessCurve, model, task, heads) -> None:
    expected = by_hand(model, task, heads, "mean")
    assert curve.circuit_point == pytest.approx(
        {"accuracy": expected.accuracy, "margin": float(expected.margins.double().mean()), "logprob": curve.circuit_point["logprob"]}
    )


def _margin(model, task):
    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    return candidate_logit_diff(encoded.candidate_ids, encoded.correct)


def test_figure_draws_the_curve_and_marks_the_circuit(toy_llamas, llama_task, tmp_path):
    from gna_interp.viz.faithfulness import faithfulness_figure, faithfulness_svg

    order = [gna.Head(1, 0), gna.Head(0, 0), gna.Head(0, 1), gna.Head(0, 3), gna.Head(0, 2)]
    curve = gna.faithfulness_curve(toy_llamas["tlens"], llama_task, order, circuit=order[:5], progress=False)
    figure = faithfulness_figure(curve)
    axes = figure.axes[0]
    line = next(line for line in axes.lines if line.get_label().startswith("top-n"))
    assert list(line.get_xdata()) == curve.sizes.tolist()
    assert list(line.get_ydata()) == curve.accuracy.tolist()
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert f"clean {curve.clean['accuracy']:.3f}" in labels and "chance 0.250" in labels
    assert any(label.startswith("circuit alone (5 heads)") for label in labels), labels
    path = tmp_path / "faithfulness.png"
    figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "circuit alone (5 heads)" in faithfulness_svg(curve)
    with pytest.raises(TypeError, match="curve=list: expected a FaithfulnessCurve"):
        faithfulness_figure([])  # type: ignore[arg-type]
    # The toy's 5 live heads: the 3 pruned ones write zero, so their mean is zero too.
    assert curve.circuit_point["accuracy"] == curve.clean["accuracy"]
    assert curve.circuit_point["margin"] == pytest.approx(curve.clean["margin"], abs=1e-5)
