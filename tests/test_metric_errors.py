"""Issue 32, items 5 and 6: metric and token-id errors name the argument, its value and
what was expected; a candidate tie never counts as correct (it scores as wrong)."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

import gna_interp as gna
from gna_interp.backends.nnsight_program import verdicts
from gna_interp.core.inputs import UnknownWordsWarning
from gna_interp.models.tiny import tiny_model
from gna_interp.patching.metrics import candidate_logit_diff, candidate_logprob
from gna_interp.tasks.toy import CONTENT_WORDS, VOCAB_SIZE

from .conftest import CLEAN, CORRUPT

CANDIDATE_METRICS = [gna.candidate_accuracy, candidate_logprob, candidate_logit_diff]
LOGITS = torch.randn(8, 5, 64, generator=torch.Generator().manual_seed(0))  # [batch, pos, vocab]


# ----- token ids of the inputs ---------------------------------------------------------
def test_token_id_error_names_the_offending_id(llama_tlens):
    """The bad id of ``[[1, -3, 5]]`` is -3 (not the largest, 5), at row 0, position 1."""
    with pytest.raises(
        ValueError, match=r"token id -3 out of range at row 0, position 1: .* vocabulary of 64, so ids must lie in 0\.\.63$"
    ):
        llama_tlens.logits(torch.tensor([[1, -3, 5]]))
    with pytest.raises(ValueError, match=r"token id 500 out of range at row 1, position 0 \(1 more out of range\): .*0\.\.63$"):
        llama_tlens.logits(torch.tensor([[1, 2, 3], [500, 4, -1]]))
    with pytest.raises(ValueError, match=r"token id 64 out of range at row 0, position 2: "):  # the first id past the end
        llama_tlens.logits([[1, 63, 64]])


# ----- logit_diff and target_logprob ---------------------------------------------------
@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (lambda: gna.logit_diff(5, 6, position=40), r"logit_diff: position=40 out of range for logits of 5 positions: expected -5\.\.4$"),
        (lambda: gna.logit_diff(5, 6, position=-6), r"logit_diff: position=-6 out of range for logits of 5 positions"),
        (
            lambda: gna.logit_diff(999, 10),
            r"logit_diff: correct holds token id 999, out of range for .* vocabulary of 64: expected ids 0\.\.63$",
        ),
        (lambda: gna.logit_diff(10, [11, 64]), r"logit_diff: incorrect holds token id 64 \(entry 1\), out of range .* 0\.\.63$"),
        (
            lambda: gna.logit_diff(torch.tensor([1, 2, 3]), 4),
            r"logit_diff: correct is a 1-D tensor of 3 ids: expected one id per row \(8\)",
        ),
        (lambda: gna.target_logprob(7, position=5), r"target_logprob: position=5 out of range for logits of 5 positions"),
        (lambda: gna.target_logprob(torch.arange(8) * 10), r"target_logprob: targets holds token id 70 \(row 7, entry 0\), out of range"),
    ],
)
def test_logit_metrics_check_the_logits_shape(build, pattern):
    with pytest.raises(ValueError, match=pattern):
        build()(LOGITS)


@pytest.mark.parametrize(
    ("build", "error", "pattern"),
    [
        (lambda: gna.logit_diff([1, -2], 10), ValueError, r"logit_diff: correct holds token id -2 \(entry 1\): token ids are 0 or more"),
        (lambda: gna.logit_diff(5, 6, position=1.0), TypeError, r"logit_diff: position=1\.0: expected an int position"),
        (lambda: gna.logit_diff(5, [], position=-1), ValueError, r"logit_diff: incorrect is empty: expected a token id"),
        (lambda: gna.target_logprob(5.5), TypeError, r"target_logprob: targets=5\.5 has dtype torch\.float32: expected .*\(integers\)"),
        (lambda: gna.logit_diff([[1, 2], [3]], 5), ValueError, r"logit_diff: correct=\[\[1, 2\], \[3\]\] is not understood"),
    ],
)
def test_metrics_refuse_bad_arguments_when_built(build, error, pattern):
    with pytest.raises(error, match=pattern):
        build()


def test_a_bad_metric_argument_is_named_inside_a_sweep(llama_tlens):
    before = llama_tlens.logits(CLEAN)
    with pytest.raises(ValueError, match=r"logit_diff: position=40 out of range for logits of 5 positions"):
        gna.ablation_sweep(llama_tlens, CLEAN, None, gna.logit_diff(5, 6, position=40), heads=[gna.Head(0, 0)], progress=False)
    with pytest.raises(ValueError, match=r"logit_diff: correct holds token id 999, .*vocabulary of 64"):
        gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, gna.logit_diff(999, 10), heads=[gna.Head(0, 0)], progress=False)
    assert torch.equal(llama_tlens.logits(CLEAN), before)  # nothing outlived the failed calls


# ----- candidate metrics ---------------------------------------------------------------
@pytest.mark.parametrize("build", CANDIDATE_METRICS, ids=lambda f: f.__name__)
def test_candidate_metrics_check_correct_and_candidates(build):
    name = build.__name__
    with pytest.raises(
        ValueError, match=rf"{name}: correct has 3 values for logits of 8 rows: expected one index per row \(8\) or a single index"
    ):
        build([10, 11, 12], [0, 1, 2])(LOGITS)
    for bad in (5, -1):
        with pytest.raises(ValueError, match=rf"{name}: correct={bad} out of range for 3 candidates: expected an index 0\.\.2$"):
            build([[10, 11, 12]], correct=bad)
    with pytest.raises(ValueError, match=rf"{name}: correct\[2\]=3 out of range for 3 candidates"):
        build([10, 11, 12], [0, 2, 3, 1])
    with pytest.raises(
        ValueError, match=rf"{name}: candidates holds token id 70 \(entry 2\), out of range for logits of a vocabulary of 64"
    ):
        build([10, 11, 70], 0)(LOGITS)
    with pytest.raises(ValueError, match=rf"{name}: candidates has token id 11 twice \(candidates 1 and 2\)"):
        build([10, 11, 11], 0)
    with pytest.raises(ValueError, match=rf"{name}: row 1 of candidates has token id 3 twice \(candidates 0 and 1\)"):
        build(torch.tensor([[1, 2], [3, 3]]), 0)
    with pytest.raises(ValueError, match=rf"{name}: position=9 out of range for logits of 5 positions"):
        build([10, 11], 0, position=9)(LOGITS)


def test_candidate_accuracy_scores_a_tie_as_wrong():
    """Hand-set logits: a tie at the top, a clear win, a clear loss, all equal."""
    logits = torch.zeros(5, 1, 8)
    logits[0, 0, [2, 3, 4]] = torch.tensor([1.0, 1.0, 0.0])  # correct 0 ties candidate 1: wrong
    logits[1, 0, [2, 3, 4]] = torch.tensor([2.0, 1.0, 0.0])  # correct 0 strictly highest: right
    logits[2, 0, [2, 3, 4]] = torch.tensor([1.0, 2.0, 0.0])  # candidate 1 highest: wrong
    # row 3: all candidates equal (0.0): wrong, whichever is correct
    logits[4, 0, [2, 3, 4]] = torch.tensor([0.0, 3.0, 3.0])  # correct 2 ties candidate 1: wrong
    correct = [0, 0, 0, 0, 2]
    scores = gna.candidate_accuracy([2, 3, 4], correct)(logits)
    assert scores.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    first_of_tied = logits[:, 0, [2, 3, 4]].argmax(-1) == torch.tensor(correct)  # the old argmax rule
    assert first_of_tied.tolist() == [True, True, False, True, False]  # it would have counted rows 0 and 3


def test_candidate_logprob_by_hand():
    """A single correct index applies to every row (it once scored row 0 alone)."""
    values = candidate_logprob([4, 9, 1], 1)(LOGITS)
    assert values.shape == (8,)
    for row in range(8):
        a, b, c = (float(LOGITS[row, -1, t]) for t in (4, 9, 1))
        assert float(values[row]) == pytest.approx(b - math.log(math.exp(a) + math.exp(b) + math.exp(c)), abs=1e-5)


def test_remote_verdicts_score_a_tie_as_wrong():
    """The server-side scoring of `discover`'s joint search follows the same rule."""
    logits = torch.zeros(3, 2, 6)
    logits[0, -1, [1, 2]] = 4.0  # candidates 0 and 1 tie at the top
    logits[1, -1, 1] = 4.0  # candidate 0 alone on top
    candidate_ids = torch.tensor([[1, 2, 3]] * 3)
    assert verdicts(logits, candidate_ids, torch.tensor([0, 0, 1])).tolist() == [False, True, False]
    assert verdicts(logits, candidate_ids, torch.tensor([1, 0, 2])).tolist() == [False, True, False]


# ----- what a metric returns ----------------------------------------------------------
@pytest.mark.parametrize("returned", ["abc", None, [1.0, 2.0]])
def test_a_metric_returning_no_number_is_named(llama_tlens, returned):
    def my_metric(logits):
        return returned

    shown = re.escape(repr(returned))
    kind = type(returned).__name__
    expected = rf"metric .*my_metric returned {shown} \({kind}\): expected a float, or a tensor \(a scalar, or one value per row"
    heads = [gna.Head(0, 0)]
    with pytest.raises(TypeError, match=expected):
        gna.ablation_sweep(llama_tlens, CLEAN, None, my_metric, heads=heads, progress=False)
    with pytest.raises(TypeError, match=expected):
        gna.patching_sweep(llama_tlens, CLEAN, CORRUPT, my_metric, heads=heads, progress=False)
    with pytest.raises(TypeError, match=expected):
        gna.path_patching(llama_tlens, CLEAN, CORRUPT, my_metric, senders=heads, receivers=gna.patching.LOGITS)
    with pytest.raises(TypeError, match=expected):
        gna.attribution_patching(llama_tlens, CLEAN, CORRUPT, my_metric)
    with pytest.raises(TypeError, match=rf"metric .*my_metric returned {shown}: attribution patching needs a metric that returns a tensor"):
        gna.patching.ablation_attribution(llama_tlens, CLEAN, my_metric)


def test_an_empty_metric_result_is_named(llama_tlens):
    def empty_metric(logits):
        return logits[:0, -1, 0]

    with pytest.raises(ValueError, match=r"metric .*empty_metric returned an empty tensor: expected a float, or a tensor"):
        gna.ablation_sweep(llama_tlens, CLEAN, None, empty_metric, heads=[gna.Head(0, 0)], progress=False)


def test_plain_numbers_are_still_accepted(llama_tlens):
    result = gna.ablation_sweep(llama_tlens, CLEAN, None, lambda logits: 2, heads=[gna.Head(0, 0)], progress=False)
    assert result.baseline == 2.0
    assert float(result.scores[0, 0]) == 2.0


# ----- evaluation ---------------------------------------------------------------------
def test_evaluation_scores_a_tie_as_wrong():
    """Hand-computed: rows 0 and 3 tie at the top (wrong), row 1 is right, row 2 wrong."""
    scores = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 2.0, 1.0], [-1.0, -1.0, -3.0, -4.0]])
    evaluation = gna.Evaluation(scores=scores, correct=torch.tensor([0, 0, 1, 1]))
    assert evaluation.is_correct.tolist() == [False, True, False, False]
    assert evaluation.accuracy == 0.25
    assert evaluation.margins.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert evaluation.predictions.tolist() == [0, 0, 1, 0]  # the first of the tied: row 0 and 3's "prediction" is the correct index
    assert evaluation.to_frame().is_correct.tolist() == [False, True, False, False]


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_a_model_that_cannot_tell_candidates_apart_scores_zero(backend):
    """Zero output weights: every logit is 0, every candidate ties, so accuracy is 0 (the
    argmax rule gave the share of prompts whose answer is the first candidate)."""
    hf = tiny_model("llama", seed=0, vocab_size=VOCAB_SIZE)
    with torch.no_grad():
        hf.lm_head.weight.zero_()
    model = gna.load(copy.deepcopy(hf), tokenizer=gna.tasks.toy_tokenizer(), backend=backend)
    task = gna.tasks.toy_mcq(24, seed=1)
    evaluation = gna.evaluate(model, task)
    first_share = float((task.correct == 0).double().mean())
    assert first_share > 0  # the old rule's score: the test can fail
    assert evaluation.accuracy == 0.0
    assert torch.equal(evaluation.margins, torch.zeros(len(task)))
    encoded = task.encode(model.tokenizer)
    metric = gna.candidate_accuracy(encoded.candidate_ids, encoded.correct)
    assert gna.ablation_sweep(model, task, None, metric, heads=[gna.Head(0, 0)], progress=False).baseline == 0.0


def test_labels_that_tokenize_alike_are_refused():
    """The issue's case: labels W, X, Y, Z the toy tokenizer lacks all become <unk>."""
    words = CONTENT_WORDS
    options = [f"{words[i]} {words[i + 1]}" for i in range(0, 8, 2)]
    examples = [gna.tasks.mcq_example("", options, correct, labels=["W", "X", "Y", "Z"]) for correct in (0, 2)]
    task = gna.tasks.Task("mine", examples, tokenizer=gna.tasks.toy_tokenizer())
    model = gna.load(tiny_model("llama", seed=0, vocab_size=VOCAB_SIZE), tokenizer=gna.tasks.toy_tokenizer())
    with (
        pytest.warns(UnknownWordsWarning),
        pytest.raises(ValueError, match=r"task 'mine', prompt 0: candidates ' W' and ' X' both tokenize to \[\d+\], so they always tie"),
    ):
        gna.evaluate(model, task)
