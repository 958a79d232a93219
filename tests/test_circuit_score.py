"""`circuit_score` (issue 41, item 5): MIB's faithfulness f(C) = (m(C) - m(∅)) / (m(N) - m(∅)),
CPR and CMD, against independent references:

- each m(C), m(∅), m(N) redone with raw PyTorch pre-hooks on the HF out-projections (the
  head slices outside C replaced by their corrupt values, their corrupt mean, or zero),
  on tiny Llama (both backends), Mamba-2, Mamba-1 and FalconH1 models built from configs;
- CPR and CMD against a trapezoid written out by hand;
- the identities f(every head) = 1 and f(no head) = 0;
- an edge ranking: the empty circuit is path patching of every ranked edge (the raw-hook
  twin of tests/path_twin.py), the full one the clean run;
- bad input named; JSON and the frame.
"""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model
from gna_interp.scoring.circuit_scores import MIB_FRACTIONS, CircuitScore, realised_sizes

from . import path_twin
from .conftest import CLEAN, CORRUPT, TOL, no_hooks_anywhere

H = gna.Head
METRIC = gna.logit_diff(5, 6)
FRACTIONS = (0.25, 0.5, 0.75, 1.0)

# name -> (family, config overrides, backend)
MODELS = {
    "llama-tlens": ("llama", {}, "tlens"),
    "llama-nnsight": ("llama", {}, "nnsight"),
    "mamba2": ("mamba2", {}, None),
    "mamba": ("mamba", {}, None),
    "falcon_h1": ("falcon_h1", {"mamba_rms_norm": True}, None),
}


@pytest.fixture(scope="module")
def models(tokenizer):
    hfs = {name: tiny_model(family, seed=1, **config) for name, (family, config, _) in MODELS.items()}
    loaded = {
        name: gna.load(copy.deepcopy(hfs[name]), tokenizer=tokenizer, **({"backend": backend} if backend else {}))
        for name, (_, _, backend) in MODELS.items()
    }
    return hfs, loaded


def twin_metric(hf, clean, corrupt, kept: set[tuple[int, int]], how: str) -> float:
    """The metric of ``clean`` with every head not in ``kept`` ((layer, head) pairs, heads
    numbered per layer, attention first) replaced at the out-projection input by its value
    on ``corrupt`` (same positions), its mean over every corrupt token, or zero. Raw hooks."""
    store, _ = path_twin.head_outputs(hf, corrupt)
    hooks = []
    for layer in range(hf.config.num_hidden_layers):
        for i, m in enumerate(path_twin.mixers(hf, layer)):
            out = [h for h in range(m.n_heads) if (layer, m.offset + h) not in kept]
            columns = [c for h in out for c in range(h * m.head_dim, (h + 1) * m.head_dim)]
            if not columns:
                continue
            source = store[("out", layer, i)]
            if how == "mean":
                source = source.mean(dim=(0, 1), keepdim=True).expand_as(source)
            elif how == "zero":
                source = torch.zeros_like(source)

            def replace(module, args, columns=columns, source=source):
                x = args[0].clone()
                x[..., columns] = source[..., columns].to(x.dtype)
                return (x, *args[1:])

            hooks.append((m.out_proj, "pre", replace))
    return float(METRIC(path_twin._run(hf, clean, hooks)).mean())


def by_hand_area(x: list[float], y: list[float]) -> float:
    return sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1))


def shuffled_heads(model, seed: int = 0) -> list[gna.Head]:
    heads = list(model.heads)
    return [heads[i] for i in torch.randperm(len(heads), generator=torch.Generator().manual_seed(seed)).tolist()]


@pytest.mark.parametrize("name", list(MODELS))
def test_every_point_matches_raw_hooks_and_the_areas_a_hand_trapezoid(models, name):
    hfs, loaded = models
    model, hf = loaded[name], hfs[name]
    order = shuffled_heads(model)
    score = gna.circuit_score(model, CLEAN, CORRUPT, METRIC, order, fractions=FRACTIONS, progress=False)
    n = len(order)
    assert score.sizes.tolist() == sorted({0, n, *(int(p * n) for p in FRACTIONS)})
    assert score.ranking == order and score.unit == "head" and score.how == "corrupt"
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    label = {h: (h.layer, h.head) for h in model.heads}
    expected = [twin_metric(hf, clean_b, corrupt_b, {label[h] for h in order[:k]}, "corrupt") for k in score.sizes.tolist()]
    full, empty = expected[-1], expected[0]
    assert abs(full - empty) > 1e-3, "corrupting every head does not move the metric: the test could not fail"
    assert score.metric_full == pytest.approx(full, abs=TOL) and score.metric_empty == pytest.approx(empty, abs=TOL)
    assert score.metric.tolist() == pytest.approx(expected, abs=TOL)
    faith = [(value - empty) / (full - empty) for value in expected]
    assert score.faithfulness.tolist() == pytest.approx(faith, abs=1e-3)
    assert score.faithfulness[0].item() == 0.0 and score.faithfulness[-1].item() == 1.0  # f(∅) = 0, f(N) = 1 exactly
    x = [k / n for k in score.sizes.tolist()]
    assert score.fractions.tolist() == pytest.approx(x)
    f = score.faithfulness.tolist()
    assert score.cpr == pytest.approx(by_hand_area(x, f), abs=1e-12)
    assert score.cmd == pytest.approx(by_hand_area(x, [abs(1 - v) for v in f]), abs=1e-12)
    assert no_hooks_anywhere(hf)


@pytest.mark.parametrize("how", ["mean", "zero"])
def test_mean_and_zero_ablation_match_raw_hooks(models, how):
    hfs, loaded = models
    model, hf = loaded["mamba2"], hfs["mamba2"]
    order = shuffled_heads(model, seed=3)
    score = gna.circuit_score(model, CLEAN, CORRUPT, METRIC, order, how=how, fractions=(0.5, 1.0), progress=False)
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    label = {h: (h.layer, h.head) for h in model.heads}
    expected = [twin_metric(hf, clean_b, corrupt_b, {label[h] for h in order[:k]}, how) for k in score.sizes.tolist()]
    assert score.sizes.tolist() == [0, 4, 8]
    assert score.metric.tolist() == pytest.approx(expected, abs=TOL)
    assert score.how == how


def test_the_mib_fractions_and_the_floor(models):
    """MIB's 0.1% .. 100%, each ``int(p * n)``: on 18 heads, 0 up to 5%, then 1, 3, 9, 18."""
    model = models[1]["llama-tlens"]
    assert len(model.heads) == 18
    score = gna.circuit_score(model, CLEAN, CORRUPT, METRIC, list(model.heads), progress=False)
    assert score.requested == MIB_FRACTIONS == (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
    assert score.sizes.tolist() == [0, 1, 3, 9, 18]
    assert realised_sizes((0.25, 0.5), 3) == [0, 1, 3]  # both ends always there
    assert realised_sizes((1 / 3, 2 / 3), 3) == [0, 1, 2, 3]  # k / n gives k despite rounding


def test_a_sweep_ranking_orders_heads_by_effect_size(models):
    model = models[1]["llama-nnsight"]
    sweep = gna.attribution_patching(model, CLEAN, CORRUPT, METRIC)
    score = gna.circuit_score(model, CLEAN, CORRUPT, METRIC, sweep, fractions=FRACTIONS, progress=False)
    effect = (sweep.scores - sweep.baseline).abs()
    assert [effect[h.layer, h.head].item() for h in score.ranking] == sorted(effect.flatten().tolist(), reverse=True)
    by_list = gna.circuit_score(model, CLEAN, CORRUPT, METRIC, score.ranking, fractions=FRACTIONS, progress=False)
    assert torch.equal(score.faithfulness, by_list.faithfulness)


def test_an_edge_ranking(tokenizer):
    """Edges from layer-0 heads into two layer-1 receivers' q / k / v: the empty circuit is
    path patching of every ranked edge (the raw-hook twin), the full one the clean run, and
    each size equals `edge_faithfulness_curve`'s metric there."""
    from .test_path_patching import sensitive_model

    hf = sensitive_model("llama")
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="nnsight")
    receivers, streams = [H(1, 3), H(1, 0)], ["q", "k", "v"]
    edges = [(s, r, st) for r in receivers for st in streams for s in model.heads if s.layer == 0]
    metric = gna.logit_diff(5, 6)
    score = gna.circuit_score(model, CLEAN, CORRUPT, metric, edges, fractions=(0.1, 0.5, 1.0), progress=False)
    n = len(edges)
    assert score.unit == "edge" and score.ranking == edges and score.sizes.tolist() == [0, n // 10, n // 2, n]
    clean_b, corrupt_b = model.to_batch(CLEAN), model.to_batch(CORRUPT)
    empty = path_twin.path_patch(hf, clean_b, corrupt_b, [H(0, h) for h in range(6)], receivers, streams, metric)
    full = float(metric(model.logits(CLEAN)).mean())
    assert abs(full - empty) > 1e-3
    assert score.metric_empty == pytest.approx(empty, abs=TOL) and score.metric_full == pytest.approx(full, abs=TOL)
    task = gna.tasks.Task("words", [gna.tasks.base.Example(text=t, segments=(), correct=0, candidates=(" w5", " w6")) for t in CLEAN])
    curve = gna.edge_faithfulness_curve(model, task, edges, sizes=score.sizes.tolist(), corrupt=CORRUPT, metric=metric, progress=False)
    assert score.metric.tolist() == pytest.approx(curve.metric.tolist(), abs=1e-6)
    with pytest.raises(gna.core.errors.GnaValueError, match=r"how='mean' with an edge ranking"):
        gna.circuit_score(model, CLEAN, CORRUPT, metric, edges, how="mean", progress=False)


def test_result_frame_json_and_repr(models):
    model = models[1]["mamba2"]
    score = gna.circuit_score(model, CLEAN, CORRUPT, METRIC, shuffled_heads(model), fractions=FRACTIONS, progress=False)
    assert isinstance(score, CircuitScore)
    frame = score.to_frame()
    assert list(frame.columns) == ["size", "fraction", "metric", "faithfulness"]
    assert frame["size"].tolist() == score.sizes.tolist()
    data = json.loads(json.dumps(score.to_dict(), allow_nan=False))
    assert data["cpr"] == score.cpr and data["cmd"] == score.cmd and data["ranking"] == [str(h) for h in score.ranking]
    assert data["unit"] == "head" and data["n_units"] == 8 and data["faithfulness"] == score.faithfulness.tolist()
    assert repr(score).startswith(f"CircuitScore(CPR {score.cpr:.3f}, CMD {score.cmd:.3f}; 5 sizes of 8 heads")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ranking": []}, ValueError, r"ranking is empty"),
        ({"ranking": [H(0, 9)]}, ValueError, r"L0H9|head 9"),
        ({"ranking": [H(0, 1), H(0, 1)]}, ValueError, r"ranking\[1\] is L0H1 again"),
        ({"fractions": [0.5, 0.0]}, ValueError, r"fractions\[1\]=0\.0: expected a fraction of the units in \(0, 1\]"),
        ({"fractions": [1.5]}, ValueError, r"fractions\[0\]=1\.5"),
        ({"fractions": []}, ValueError, r"fractions is empty"),
        ({"fractions": ["half"]}, TypeError, r"fractions\[0\]='half': expected a number"),
        ({"fractions": [0.01]}, ValueError, r"give one circuit size \(0 of 8 units\)"),
        ({"how": "median"}, ValueError, r"how='median': expected one of \['corrupt', 'mean', 'zero'\]"),
        ({"corrupt": None}, ValueError, r"how='corrupt' needs corrupt= inputs"),
        ({"corrupt": CLEAN}, ValueError, r"the score is undefined: m\(N\) = .* and m\(∅\) = .* are equal"),
    ],
)
def test_bad_input_is_named(models, kwargs, error, match):
    model = models[1]["mamba2"]
    arguments = {"corrupt": CORRUPT, "ranking": [H(0, 0)], **kwargs}
    with pytest.raises(error, match=match):
        gna.circuit_score(model, CLEAN, arguments.pop("corrupt"), METRIC, arguments.pop("ranking"), progress=False, **arguments)


def test_discover_scores_its_circuit_and_reports_it(tmp_path):
    """`discover` on the Llama toy: ``circuit.score`` is `circuit_score` of discovery's ranking
    (the circuit's heads first) on the task against its corrupted prompts, in the summary, the
    JSON (read back exactly) and the report; its forwards are counted in the circuit's cost."""
    from gna_interp.discovery.confirm import answer_metric

    model, task = gna.load_toy("llama"), gna.toy_task("llama", 32, seed=4242)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        circuit = gna.discover(model, task, progress=False)
    score = circuit.score
    assert score is not None and score["unit"] == "head" and score["how"] == "corrupt"
    heads = {*circuit.gather, *circuit.aggregate}
    ranking = [gna.Head.parse(h) for h in score["ranking"]]
    assert set(ranking[: len(heads)]) == heads and score["circuit_size"] == len(heads)
    corrupt = task.corrupted()
    again = gna.circuit_score(model, task, corrupt, answer_metric(model, task, corrupt), ranking, progress=False)
    assert again.cpr == pytest.approx(score["cpr"], abs=1e-6) and again.cmd == pytest.approx(score["cmd"], abs=1e-6)
    assert score["sizes"] == [0, 1, 4, 8] and 0 < score["cpr"] < 1
    assert f"MIB CPR {score['cpr']:.3f}" in circuit.summary()
    assert gna.GnaCircuit.from_json(circuit.to_json()).score == circuit.score
    assert circuit.cost["estimate"] is not None
    with gna.cost_meter(model) as cost:
        gna.circuit_score(model, task, corrupt, answer_metric(model, task, corrupt), ranking, progress=False)
    # clean, corrupt, two of the three smaller circuits stacked in one forward; the third corrupts
    # layer 0 as one of them does, and starts at block 1 from that one's stream (`shared_prefix`)
    assert (cost.forwards, cost.block_rows) == (4, 32 * (2 + 2 + 2 * 2 + 1))
    gna.write_report([(circuit, None, None)], tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert 'data-role="score"' in page and f"CPR {score['cpr']:.3f}" in page
