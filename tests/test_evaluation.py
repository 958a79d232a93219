"""`evaluate` against a manual computation: each prompt run alone (no padding) through
the raw HF model, candidates scored by hand from its logits."""

from __future__ import annotations

import copy

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model
from gna_interp.tasks.toy import VOCAB_SIZE

from .conftest import zero_columns


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    """Byte-level, no merges: every candidate (" A", " 42") is several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    alphabet = ["<pad>", "<bos>", *sorted(pre_tokenizers.ByteLevel.alphabet())]
    core = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    folder = tmp_path_factory.mktemp("chars")
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>").save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def manual_scores(hf_model, task, tokenizer) -> torch.Tensor:
    """``[batch, candidate]`` summed log-prob of each candidate, one unpadded forward per
    (prompt, candidate)."""
    rows = []
    for example in task:
        prompt = tokenizer(example.text)["input_ids"]
        scores = []
        for candidate in example.candidates:
            tokens = tokenizer(example.text + candidate)["input_ids"][len(prompt) :]
            ids = torch.tensor([prompt + tokens])
            with torch.no_grad():
                logprobs = hf_model(input_ids=ids).logits[0].log_softmax(-1)
            scores.append(sum(float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)))
        rows.append(scores)
    return torch.tensor(rows)


def check_against(evaluation, expected, correct):
    assert torch.allclose(evaluation.scores, expected, atol=1e-4), (evaluation.scores - expected).abs().max()
    assert torch.equal(evaluation.correct, correct)
    right = 0
    for row in range(len(correct)):
        others = [float(expected[row, c]) for c in range(expected.shape[1]) if c != int(correct[row])]
        assert float(evaluation.margins[row]) == pytest.approx(float(expected[row, correct[row]]) - max(others), abs=1e-4)
        right += float(expected[row, correct[row]]) > max(others)  # strictly above every other: a tie is wrong
    assert evaluation.accuracy == pytest.approx(right / len(correct))


@pytest.mark.parametrize("family,backend", [("llama", "tlens"), ("llama", "nnsight"), ("mamba2", "nnsight"), ("mamba", "nnsight")])
def test_single_token_candidates(family, backend):
    hf = tiny_model(family, seed=1, vocab_size=VOCAB_SIZE)
    tokenizer = gna.tasks.toy_tokenizer()
    task = gna.tasks.toy_mcq(10, seed=3)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend=backend)
    evaluation = gna.evaluate(model, task, batch_size=4)
    check_against(evaluation, manual_scores(hf, task, tokenizer), task.correct)
    frame = evaluation.to_frame()
    assert list(frame.columns) == ["correct", "prediction", "is_correct", "margin", "correct_logprob"]
    assert frame.is_correct.mean() == pytest.approx(evaluation.accuracy)


@pytest.mark.parametrize("family", ["llama", "mamba2"])
def test_multi_token_candidates(family, char_tokenizer):
    """Labels and values that are not single tokens are scored by summed log-prob."""
    hf = tiny_model(family, seed=2, vocab_size=len(char_tokenizer))
    model = gna.load(copy.deepcopy(hf), tokenizer=char_tokenizer, backend="nnsight")
    toy_prompts_untied = gna.tasks.Task("toy", gna.tasks.toy_mcq(3, seed=1).examples)  # scored with the model's tokenizer
    for task in (gna.tasks.kv_retrieval(3, n=3, seed=1), toy_prompts_untied):
        encoded = task.encode(char_tokenizer)
        assert not encoded.single_token
        check_against(gna.evaluate(model, task, batch_size=5), manual_scores(hf, task, char_tokenizer), task.correct)


def test_evaluate_with_ablation_equals_weight_zeroing():
    hf = tiny_model("llama", seed=4, vocab_size=VOCAB_SIZE)
    tokenizer = gna.tasks.toy_tokenizer()
    task = gna.tasks.toy_mcq(8, seed=4)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend="tlens")
    head = gna.Head(1, 3)
    expected = manual_scores(zero_columns(hf, head, model.head_dim), task, tokenizer)
    check_against(gna.evaluate(model, task, [gna.Ablate([head])]), expected, task.correct)
    with model.ablated([head]):
        check_against(gna.evaluate(model, task), expected, task.correct)
    assert not torch.allclose(gna.evaluate(model, task).scores, expected, atol=1e-3)  # the head matters


def test_batch_size_does_not_change_scores():
    model = gna.load(tiny_model("mamba2", seed=5, vocab_size=VOCAB_SIZE), tokenizer=gna.tasks.toy_tokenizer())
    task = gna.tasks.kv_retrieval(4, n=7, seed=2)
    task.tokenizer = gna.tasks.toy_tokenizer()
    whole = gna.evaluate(model, task, batch_size=64).scores
    assert torch.allclose(gna.evaluate(model, task, batch_size=3).scores, whole, atol=1e-5)


def test_prompt_longer_than_context():
    model = gna.load(tiny_model("llama", seed=0, vocab_size=VOCAB_SIZE, max_position_embeddings=20), tokenizer=gna.tasks.toy_tokenizer())
    with pytest.raises(ValueError, match=r"prompt 0 has 27 tokens, more than .* context of 20"):
        gna.evaluate(model, gna.tasks.toy_mcq(2, seed=0))


def test_bad_arguments():
    model = gna.load(tiny_model("mamba2", seed=0, vocab_size=VOCAB_SIZE), tokenizer=gna.tasks.toy_tokenizer())
    with pytest.raises(TypeError, match="expected a gna_interp Task"):
        gna.evaluate(model, ["Query: apple"])
    with pytest.raises(ValueError, match="batch_size=0"):
        gna.evaluate(model, gna.tasks.toy_mcq(2), batch_size=0)
