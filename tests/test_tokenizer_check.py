"""Tokenizers checked before they mislead (issue 43, item 2): at load, a tokenizer that does
not give back text of its own vocabulary, or whose ids the model cannot embed, is refused
with an error naming its class and ``tokenizer=``; the advice of the folder-without-a-
tokenizer error, followed literally, gives a folder that loads and tokenizes right."""

from __future__ import annotations

import re

import pytest
import torch

import gna_interp as gna
from gna_interp.core.tokenizer_check import probe_text, round_trip_problem, tokenizer_problem
from gna_interp.models.preflight import ModelFilesError
from gna_interp.models.tiny import tiny_model, word_tokenizer


def model_folder(path, family="qwen2"):
    tiny_model(family, seed=0).save_pretrained(path)
    return path


def test_probe_is_vocabulary_words_and_round_trips(tokenizer):
    text = probe_text(tokenizer)
    assert text == "w4 w5 w6 w7 w8 w9 w10 w11"  # ids 4.. of the word-level vocabulary, specials skipped
    assert round_trip_problem(tokenizer, text) is None
    assert tokenizer_problem(tokenizer, 64) is None


@pytest.mark.parametrize("family", ["qwen2", "jamba", "llama", "mamba2"])
def test_following_the_missing_tokenizer_advice_gives_a_working_folder(tmp_path, tokenizer, family):
    """The advice, taken literally: ``tokenizer.save_pretrained(folder)``. transformers reads
    a Qwen2 folder's tokenizer as Qwen2Tokenizer (a byte-level BPE) whatever the folder's
    tokenizer_config.json names (transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: qwen2,
    jamba, ...), which made "w5 w6 w7" one token; the load reads it as
    the class the folder names once the first class fails the probe."""
    folder = model_folder(tmp_path, family)
    with pytest.raises(ModelFilesError, match="no usable tokenizer") as caught:
        gna.load(folder)
    advice = re.search(r"save one there \((tokenizer\.save_pretrained\(folder\))\)", str(caught.value))
    assert advice is not None, str(caught.value)
    eval(advice.group(1), {"tokenizer": tokenizer, "folder": str(folder)})  # the advice, as written
    model = gna.load(folder)
    assert model.tokenizer("w5 w6 w7")["input_ids"] == [1, 5, 6, 7]
    assert model.to_batch(["w5 w6 w7"]).input_ids.tolist() == [[1, 5, 6, 7]]
    with torch.no_grad():
        raw = model.hf_model(torch.tensor([[1, 5, 6, 7]])).logits
    torch.testing.assert_close(model.logits(["w5 w6 w7"]), raw, atol=1e-4, rtol=1e-4)


def test_collapsing_tokenizer_object_is_refused_naming_its_class(tmp_path, tokenizer):
    """The same folder read by ``AutoTokenizer`` by hand gives the collapsing class; passed
    as ``tokenizer=`` it is refused, naming the class, the probe and ``tokenizer=``."""
    from transformers import AutoTokenizer

    folder = model_folder(tmp_path)
    tokenizer.save_pretrained(folder)
    collapsing = AutoTokenizer.from_pretrained(folder)
    assert type(collapsing).__name__ == "Qwen2Tokenizer"
    assert len(collapsing("w5 w6 w7")["input_ids"]) == 1  # the failure the check exists for: 3 words, 1 token
    pattern = (
        r"tokenizer refused: the Qwen2Tokenizer passed as tokenizer= cannot be this model's: it does not give back text "
        r"made of its own vocabulary: 'w4 w5 w6 w7 w8 w9 w10 w11' -> 0 token\(s\) \[\] -> ''; pass the tokenizer the model was "
        r"trained with: gna.load\(model, tokenizer=<a tokenizer object, or its folder or hub id>\)"
    )
    with pytest.raises(ValueError, match=pattern):
        gna.load(tiny_model("qwen2"), tokenizer=collapsing)


def test_vocabulary_larger_than_the_embedding_is_refused():
    big = word_tokenizer(vocab_size=100)
    with pytest.raises(
        ValueError,
        match=r"the TokenizersBackend passed as tokenizer= .* its ids reach 99 \(vocabulary of 100, .*the model embeds 64 ids \(0..63\)",
    ):
        gna.load(tiny_model("qwen2"), tokenizer=big, backend="nnsight")
    small = word_tokenizer(vocab_size=40)  # a vocabulary smaller than the embedding (padded rows) is fine
    assert gna.load(tiny_model("qwen2"), tokenizer=small, backend="nnsight").tokenizer is small


def test_task_text_the_tokenizer_cannot_give_back_names_the_tokenizer(tmp_path, tokenizer):
    """A task's words: when a segment falls in no token, the error says the tokenizer does
    not give the task's text back, and how to pass the right one."""
    from transformers import AutoTokenizer

    folder = model_folder(tmp_path)
    tokenizer.save_pretrained(folder)
    collapsing = AutoTokenizer.from_pretrained(folder)
    task = gna.tasks.Task("mine", [gna.tasks.mcq_example("w5 w6\n", ["w7 w8", "w9 w10", "w11 w12"], 0)])
    with pytest.raises(
        ValueError, match=r"falls in no token; the Qwen2Tokenizer does not give the text back \(.* -> .*\): pass the tokenizer"
    ):
        task.encode(collapsing)


CORPUS = [
    "Gather heads read the options and aggregate heads write the answer into the residual stream.",
    "The model attends to the segment end, then copies the label of the correct option.",
    "State space models and transformers both retrieve facts from their context windows.",
] * 20


def trained(kind: str):
    """Small trained tokenizers of the kinds real checkpoints ship (GPT-2's byte-level BPE,
    Llama's Metaspace BPE with byte fallback, a Unigram with NFKC): none is refused."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "byte_level":
        core = Tokenizer(models.BPE())
        core.pre_tokenizer, core.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        )
        core.train_from_iterator(CORPUS, trainer)
        return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")
    if kind == "metaspace":
        core = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        core.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
        return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    core = Tokenizer(models.Unigram())
    core.normalizer, core.pre_tokenizer, core.decoder = normalizers.NFKC(), pre_tokenizers.Metaspace(), decoders.Metaspace()
    core.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=200, special_tokens=["<unk>"], unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")


@pytest.mark.parametrize("kind", ["byte_level", "metaspace", "unigram"])
def test_tokenizers_of_real_kinds_pass_the_probe(kind):
    tokenizer = trained(kind)
    text = probe_text(tokenizer)
    assert text is not None and len(text.split()) == 8
    assert tokenizer_problem(tokenizer, len(tokenizer)) is None
    assert "its ids reach" in str(tokenizer_problem(tokenizer, len(tokenizer) - 1))  # one row short: refused
