"""Issue 30, items 1 and 2: the retrieval-aware head ranking and keep-only curves,
against independent references:

- every head's drop equals `evaluate` with that head alone ablated (`Ablate`), on both
  backends and on SSM and hybrid heads;
- the default probe is the paper's dictionary prompts; a vocabulary or context that cannot
  hold it is an error naming what to pass instead;
- `KeepOnly` of every head is the clean run exactly; of none, `Ablate` of every head of
  the kind; of a few, `Ablate` of the rest; other kinds are untouched;
- `retention_curve`'s points equal `evaluate` with `KeepOnly` built by hand, its random
  orders are seeded permutations, and no hook outlives it, even when it raises.
"""

from __future__ import annotations

import random
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model, word_tokenizer
from gna_interp.tasks.toy import VOCAB_SIZE

from .conftest import no_hooks_left

N_PROMPTS = 24
SEED = 3030


@pytest.fixture(scope="module")
def llama_task():
    return gna.toy_task("llama", N_PROMPTS, seed=SEED)


def ablated_alone(model, task, head, how="zero"):
    reference = None if how == "zero" else task
    return gna.evaluate(model, task, [gna.Ablate([head], how=how, corrupt=reference)], progress=False).accuracy


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_ranking_equals_each_heads_ablation_drop(toy_llamas, llama_task, backend):
    model = toy_llamas[backend]
    ranking = gna.retrieval_ranking(model, llama_task, progress=False)
    clean = gna.evaluate(model, llama_task, progress=False).accuracy
    assert ranking.clean == clean
    expected = {head: clean - ablated_alone(model, llama_task, head) for head in model.heads}
    for head, drop in expected.items():
        assert ranking.drop[head.layer, head.head].item() == pytest.approx(drop, abs=1e-12), head
    assert max(expected.values()) > 0.3  # the toy's heads matter: a drop worth ranking
    # Best first; the frame has the same numbers.
    drops = [expected[head] for head in ranking.order]
    assert drops == sorted(drops, reverse=True) and set(ranking.order) == set(model.heads)
    frame = ranking.to_frame()
    assert frame["head"].tolist() == [str(h) for h in ranking.order]
    assert frame["drop"].tolist() == pytest.approx(drops, abs=1e-12)
    assert set(frame["kind"]) == {"attention"}
    # One stacked sweep: the cost meter's figures, fewer forwards than one per head.
    assert ranking.cost["forwards"] < len(model.heads) and ranking.cost["n_prompts"] == N_PROMPTS
    assert no_hooks_left(model)


def test_ranking_matches_an_ablation_sweep_of_candidate_accuracy(toy_llamas, llama_task):
    model = toy_llamas["nnsight"]
    ranking = gna.retrieval_ranking(model, llama_task, how="mean", progress=False)
    encoded = llama_task.encode(llama_task.tokenizer_for(model.tokenizer))
    metric = gna.candidate_accuracy(encoded.candidate_ids, encoded.correct)
    sweep = gna.ablation_sweep(model, llama_task, llama_task, metric, how="mean", progress=False)
    assert torch.allclose(ranking.accuracy.float(), sweep.scores, atol=1e-6)
    assert ranking.as_sweep().baseline == pytest.approx(sweep.baseline, abs=1e-6)
    head = ranking.order[0]
    assert ranking.accuracy[head.layer, head.head].item() == ablated_alone(model, llama_task, head, how="mean")


def test_ssm_heads_are_ranked_and_other_kinds_left_out():
    mamba = gna.load_toy("mamba2_counting")
    task = gna.toy_task("mamba2_counting", 16, seed=SEED)
    ranking = gna.retrieval_ranking(mamba, task, kind="ssm", progress=False)
    clean = gna.evaluate(mamba, task, progress=False).accuracy
    for head in mamba.heads:
        assert ranking.drop[head.layer, head.head].item() == pytest.approx(clean - ablated_alone(mamba, task, head), abs=1e-12)
    hybrid = gna.load_toy("falcon_h1_counting")
    task = gna.toy_task("falcon_h1_counting", 16, seed=SEED)
    ranking = gna.retrieval_ranking(hybrid, task, kind="attention", progress=False)
    kinds = {head: hybrid.layout.head_kind(head).value for head in hybrid.heads}
    assert set(ranking.order) == {head for head, kind in kinds.items() if kind == "attention"}
    ssm = [head for head, kind in kinds.items() if kind == "ssm"]
    assert ssm and all(torch.isnan(ranking.drop[h.layer, h.head]) for h in ssm)


def test_default_probe_is_the_papers_dictionaries():
    tasks = gna.tasks.kv_probe(10, seed=1)
    assert [t.n_segments for t in tasks] == [20, 30, 40, 50] and [len(t) for t in tasks] == [3, 3, 2, 2]
    prompt = tasks[0].examples[0]
    assert prompt.text.startswith("Memorize the following dictionary:\n")
    assert prompt.text.split("\n")[-1].startswith("The value of the key '") and prompt.text.endswith("' is")
    values = [int(line.split(":")[1]) for line in prompt.text.split("\n")[1:-1]]
    assert len(values) == 20 and all(0 <= v <= 99 for v in values)
    # A random tiny model: the default probe, the drops of evaluate, and a warning that it cannot do the task.
    hf = tiny_model("llama", seed=1, vocab_size=VOCAB_SIZE, max_position_embeddings=256)
    model = gna.load(hf, tokenizer=gna.tasks.toy_tokenizer(), backend="nnsight")
    with pytest.warns(UserWarning, match=r"answers the probe \(kv_retrieval_20, .*chance 0\.0.*does not do this task"):
        ranking = gna.retrieval_ranking(model, n=4, seed=2, progress=False)
    probe = gna.tasks.kv_probe(4, seed=2)
    assert ranking.probe == [t.name for t in probe] and ranking.n_prompts == 4
    for head in [model.heads[0], model.heads[-1]]:
        expected = sum(gna.evaluate(model, t, progress=False).accuracy - ablated_alone(model, t, head) for t in probe) / 4
        assert ranking.drop[head.layer, head.head].item() == pytest.approx(expected, abs=1e-12)


def toy_like_without_numbers():
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from gna_interp.tasks.toy import NUMBERS, VOCAB

    vocab = {token: i for i, token in enumerate(t for t in VOCAB if t not in NUMBERS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"[\n.:']"), behavior="isolated"), pre_tokenizers.Split(Regex(r"[ \t]+"), behavior="removed")]
    )
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")


def test_default_probe_needs_the_vocabulary_and_the_context():
    words = gna.load(tiny_model("llama", seed=0, vocab_size=64), tokenizer=word_tokenizer(), backend="nnsight")
    with pytest.raises(ValueError, match=r"task=None: .*cannot encode the default KV probe \(kv_retrieval_20: .*\): pass task="):
        gna.retrieval_ranking(words, n=4, progress=False)
    # A tokenizer that splits as the toy one does but lacks the numbers: they become its unknown token.
    unknown = gna.load(tiny_model("llama", seed=0, vocab_size=VOCAB_SIZE), tokenizer=toy_like_without_numbers(), backend="nnsight")
    with pytest.raises(ValueError, match=r"task=None: the default KV probe \(kv_retrieval_20\) has words .* lacks .*: pass task="):
        gna.retrieval_ranking(unknown, n=4, progress=False)
    short_hf = tiny_model("llama", seed=0, vocab_size=VOCAB_SIZE, max_position_embeddings=90)
    short = gna.load(short_hf, tokenizer=gna.tasks.toy_tokenizer(), backend="nnsight")
    with pytest.raises(
        ValueError, match=r"kv_retrieval_20 prompts have up to 9\d tokens, more than .*context of 90: pass a probe that fits"
    ):
        gna.retrieval_ranking(short, n=4, progress=False)


def logits(model, task, interventions=()):
    return model.logits(task, interventions=list(interventions))


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
@pytest.mark.parametrize("how", ["zero", "mean"])
def test_keep_only_every_head_is_clean_and_none_is_every_head_ablated(toy_llamas, llama_task, backend, how):
    model = toy_llamas[backend]
    reference = None if how == "zero" else llama_task
    heads = list(model.heads)
    clean = logits(model, llama_task)
    assert torch.equal(logits(model, llama_task, [gna.KeepOnly(heads, kind="all", how=how, corrupt=reference)]), clean)
    none = logits(model, llama_task, [gna.KeepOnly([], how=how, corrupt=reference)])
    assert torch.equal(none, logits(model, llama_task, [gna.Ablate(heads, how=how, corrupt=reference)]))
    assert not torch.allclose(none, clean, atol=1e-3)
    kept = [gna.Head(1, 0), gna.Head(0, 3)]
    others = [head for head in heads if head not in kept]
    some = logits(model, llama_task, [gna.KeepOnly(kept, how=how, corrupt=reference)])
    assert torch.equal(some, logits(model, llama_task, [gna.Ablate(others, how=how, corrupt=reference)]))
    assert no_hooks_left(model)


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_keep_only_defaults_take_the_mean_over_the_inputs_it_runs_on(toy_llamas, llama_task, backend):
    """``KeepOnly(heads)`` as it stands: how="mean" over the inputs of the forward it runs
    in, the same as `Ablate` of the other heads with those very inputs as ``corrupt``
    (and not the mean over other inputs)."""
    model = toy_llamas[backend]
    kept = [gna.Head(1, 0), gna.Head(0, 3)]
    others = [head for head in model.layout.heads if head not in kept]  # attention: every head of the toy Llama
    half = llama_task[: N_PROMPTS // 2]
    got = logits(model, half, [gna.KeepOnly(kept)])
    assert torch.equal(got, logits(model, half, [gna.Ablate(others, how="mean", corrupt=half)]))
    whole_mean = logits(model, half, [gna.Ablate(others, how="mean", corrupt=llama_task)])
    assert not torch.allclose(got, whole_mean, atol=1e-4), "the mean over other inputs: the comparison could not fail"
    assert not torch.allclose(got, logits(model, half), atol=1e-3)
    with pytest.raises(ValueError, match=r"KeepOnly how='resample' needs corrupt="):
        gna.KeepOnly(kept, how="resample")
    assert no_hooks_left(model)


def test_keep_only_leaves_other_kinds_alone():
    hybrid = gna.load_toy("falcon_h1_counting")
    task = gna.toy_task("falcon_h1_counting", 8, seed=SEED)
    kinds = {head: hybrid.layout.head_kind(head).value for head in hybrid.heads}
    attention = [h for h, k in kinds.items() if k == "attention"]
    ssm = [h for h, k in kinds.items() if k == "ssm"]
    assert torch.equal(
        logits(hybrid, task, [gna.KeepOnly([], kind="attention", how="zero")]), logits(hybrid, task, [gna.Ablate(attention)])
    )
    assert torch.equal(logits(hybrid, task, [gna.KeepOnly(ssm[:2], kind="ssm", how="zero")]), logits(hybrid, task, [gna.Ablate(ssm[2:])]))
    with pytest.raises(ValueError, match=rf"KeepOnly heads: {ssm[0]} is an ssm head of .*, not of kind='attention'"):
        logits(hybrid, task, [gna.KeepOnly([ssm[0]], kind="attention", how="zero")])
    assert no_hooks_left(hybrid)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(heads=[], kind="mlp"), ValueError, r"KeepOnly kind='mlp': expected one of \('attention', 'ssm', 'all'\)"),
        (dict(heads=[], how="resample"), ValueError, r"KeepOnly how='resample' needs corrupt="),
        (dict(heads=[], how="median", corrupt="x"), ValueError, r"how='median' is not an ablation kind"),
        (dict(heads=[gna.Head(0, 1), gna.Head(0, 1)], how="zero"), ValueError, r"KeepOnly heads repeat \['L0H1'\]"),
        (dict(heads=[(0, 1)], how="zero"), TypeError, r"KeepOnly heads must contain gna_interp.Head values, got \(0, 1\)"),
        (dict(heads="L0H1", how="zero"), TypeError, r"KeepOnly heads"),
    ],
)
def test_keep_only_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        gna.KeepOnly(**kwargs)


def by_hand(model, task, kept, kind="attention"):
    every = [h for h in model.heads if kind == "all" or model.layout.head_kind(h).value == kind]
    others = [h for h in every if h not in set(kept)]
    interventions = [gna.Ablate(others, how="mean", corrupt=task)] if others else []
    return gna.evaluate(model, task, interventions, progress=False).accuracy


def test_retention_curve_points_are_keep_only_by_hand(toy_llamas, llama_task):
    model = toy_llamas["tlens"]
    ranking = gna.retrieval_ranking(model, llama_task, progress=False)
    curve = gna.retention_curve(model, llama_task, ranking, sizes=[1, 3], seeds=[7, 8], progress=False)
    assert curve.sizes.tolist() == [0, 1, 3, 8] and curve.order == ranking.order
    for index, n in enumerate(curve.sizes.tolist()):
        assert curve.accuracy[index].item() == by_hand(model, llama_task, ranking.order[:n])
    for row, seed in enumerate([7, 8]):
        permutation = list(model.heads)
        random.Random(seed).shuffle(permutation)
        assert curve.random_orders[row] == permutation
        for index, n in enumerate(curve.sizes.tolist()):
            assert curve.random[row, index].item() == by_hand(model, llama_task, permutation[:n])
    assert curve.clean == gna.evaluate(model, llama_task, progress=False).accuracy
    assert curve.ablated == by_hand(model, llama_task, [])
    frame = curve.to_frame()
    assert frame["random_mean"].tolist() == pytest.approx(curve.random.mean(0).tolist())
    assert frame["random_std"].tolist() == pytest.approx(curve.random.std(0, unbiased=True).tolist())
    assert frame["added"].tolist()[1] == str(ranking.order[0])
    assert curve.cost["forwards"] > 0 and no_hooks_left(model)


def test_retention_curve_on_a_hybrid_keeps_only_attention_heads():
    hybrid = gna.load_toy("falcon_h1_counting")
    task = gna.toy_task("falcon_h1_counting", 12, seed=SEED)
    attention = [h for h in hybrid.heads if hybrid.layout.head_kind(h).value == "attention"]
    order = list(reversed(attention))
    curve = gna.retention_curve(hybrid, task, order, sizes=[2], seeds=1, progress=False)
    assert curve.n_heads == len(attention) and curve.sizes.tolist() == [0, 2, len(attention)]
    assert curve.accuracy[1].item() == by_hand(hybrid, task, order[:2])
    ssm = next(h for h in hybrid.heads if h not in set(attention))
    with pytest.raises(ValueError, match=rf"ranking\[0\] is {ssm}, an ssm head: expected heads of kind='attention'"):
        gna.retention_curve(hybrid, task, [ssm], progress=False)


class Boom(RuntimeError):
    pass


def test_no_hook_or_cache_outlives_a_failed_curve(toy_llamas, llama_task, monkeypatch):
    import gna_interp.scoring.faithfulness as faithfulness

    model = toy_llamas["nnsight"]
    before = logits(model, llama_task)
    real, calls = faithfulness.evaluate, {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise Boom("failed mid-curve")
        return real(*args, **kwargs)

    monkeypatch.setattr(faithfulness, "evaluate", failing)
    with pytest.raises(Boom):
        gna.retention_curve(model, llama_task, list(model.heads), sizes=[2, 4], seeds=2, progress=False)
    monkeypatch.undo()
    assert no_hooks_left(model) and not model.active_interventions
    assert model._sources is None and not getattr(model.backend, "_cost_meters", [])
    assert torch.equal(logits(model, llama_task), before)


def test_no_hook_outlives_a_failed_ranking(toy_llamas, monkeypatch):
    import gna_interp.scoring.retention as retention

    task = gna.toy_task("llama", 6, seed=SEED)
    toy = toy_llamas["tlens"]

    def exploding(*args, **kwargs):
        def metric(rows):
            raise Boom("metric failed mid-sweep")

        return metric

    monkeypatch.setattr(retention, "candidate_accuracy", exploding)
    with pytest.raises(Boom):
        gna.retrieval_ranking(toy, task, progress=False)
    assert no_hooks_left(toy) and not getattr(toy.backend, "_cost_meters", [])


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda m, t: gna.retrieval_ranking(m, t, kind="mlp"), ValueError, r"kind='mlp': expected one of"),
        (lambda m, t: gna.retrieval_ranking(m, t, kind="ssm"), ValueError, r"kind='ssm': toy-llama has no ssm heads"),
        (lambda m, t: gna.retrieval_ranking(m, "prompts"), TypeError, r"retrieval_ranking: task='prompts' \(str\): a Task, a"),
        (lambda m, t: gna.retrieval_ranking(m, [t, 3]), TypeError, r"retrieval_ranking: task\[1\]=3 \(int\): expected a gna_interp Task"),
        (lambda m, t: gna.retention_curve(m, t, [], seeds=0), ValueError, r"seeds=0: expected at least one random order"),
        (lambda m, t: gna.retention_curve(m, t, [], seeds=[1, "a"]), TypeError, r"seeds\[1\]='a': expected an int seed"),
        (lambda m, t: gna.retention_curve(m, t, [], sizes=[9]), ValueError, r"sizes\[0\]=9: expected heads kept in 0..8"),
        (lambda m, t: gna.retention_curve(m, t, [], how="max"), ValueError, r"how='max' is not an ablation kind"),
    ],
)
def test_bad_arguments_are_named(toy_llamas, llama_task, call, error, match):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(error, match=match):
            call(toy_llamas["nnsight"], llama_task)


def test_the_teacher_toys_top_eight_heads_carry_its_task():
    """The `llama_4x8` card's claim on fresh prompts: its ranking puts layer 0's four heads and
    layer 2's old four first, and those 8 of 32 heads kept alone carry the task where 8
    random heads stay near chance."""
    model = gna.load_toy("llama_4x8", backend="nnsight")
    task = gna.toy_task("llama_4x8", 60, seed=SEED)
    ranking = gna.retrieval_ranking(model, task, progress=False)
    assert {str(h) for h in ranking.top(8)} == {f"L{layer}H{head}" for layer in (0, 2) for head in range(4)}
    curve = gna.retention_curve(model, task, ranking, sizes=[8], seeds=3, progress=False)
    assert curve.accuracy[1].item() >= 0.95 * curve.clean
    assert curve.random[:, 1].max().item() <= 0.4


def test_resample_keep_only_pairs_rows_and_lm_eval_refuses_it(toy_llamas, llama_task):
    """A resample `KeepOnly` pairs each prompt with its corrupted twin (all rows in one
    forward, as `Ablate(how="resample")`); lm-eval's requests have no such rows."""
    from gna_interp.harness.adapter import check_interventions

    model = toy_llamas["nnsight"]
    corrupted = llama_task.corrupted()
    kept = [gna.Head(0, 3), gna.Head(1, 0), gna.Head(0, 0)]
    others = [h for h in model.heads if h not in kept]
    keep = gna.KeepOnly(kept, how="resample", corrupt=corrupted)
    expected = gna.evaluate(model, llama_task, [gna.Ablate(others, how="resample", corrupt=corrupted)], batch_size=5, progress=False)
    assert torch.equal(gna.evaluate(model, llama_task, [keep], batch_size=5, progress=False).scores, expected.scores)
    curve = gna.retention_curve(model, llama_task, kept, sizes=[3], seeds=1, how="resample", progress=False)
    assert curve.accuracy[1].item() == expected.accuracy
    with pytest.raises(ValueError, match=r"lm_eval: KeepOnly pairs each prompt with its own source row"):
        check_interventions([keep], "lm_eval")
