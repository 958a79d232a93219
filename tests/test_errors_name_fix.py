"""Errors that name their fix (issue 43, items 3 and 5): swapped arguments named as swapped,
one wording for how to build a Task, text where token ids are expected pointed to the
tokenizer, ``Head("1.2")`` pointed to `Head.parse`, a long metric value cut, and the
unsupported-family error pointing to the page on describing an architecture."""

from __future__ import annotations

import copy
import re

import pytest
import torch

import gna_interp as gna
from gna_interp.tasks.base import TASK_HOW

from .conftest import CLEAN, CORRUPT, no_hooks_left


@pytest.fixture(scope="module")
def task():
    return gna.tasks.toy_mcq(4, seed=0)


def test_swapped_inputs_and_metric_are_named_as_swapped(llama_tlens, task):
    metric = gna.logit_diff(5, 6)
    swapped = (
        r"ablation_sweep: the arguments clean and metric are swapped: clean=<function logit_diff.*> is the function and "
        r"metric=Task\('toy_mcq', 4 prompts, 4 segments\) \(Task\) is not; call ablation_sweep\(model, clean, metric, \.\.\.\)"
    )
    with pytest.raises(TypeError, match=swapped):
        gna.ablation_sweep(llama_tlens, metric, None, task)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError,
        match=r"patching_sweep: the arguments corrupt and metric are swapped: .*call patching_sweep\(model, clean, corrupt, metric, ",
    ):
        gna.patching_sweep(llama_tlens, CLEAN, metric, CORRUPT)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"attribution_patching: the arguments clean and metric are swapped"):
        gna.attribution_patching(llama_tlens, metric, CORRUPT, CLEAN)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"edge_attribution: the arguments corrupt and metric are swapped"):
        gna.edge_attribution(llama_tlens, CLEAN, metric, CORRUPT, receivers=[gna.Head(1, 0)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ablation_sweep: metric='accuracy' is not callable: .*is a name, not a metric"):
        gna.ablation_sweep(llama_tlens, CLEAN, None, "accuracy")  # type: ignore[arg-type]
    assert no_hooks_left(llama_tlens)


def test_every_entry_point_that_needs_a_task_says_how_to_build_one(llama_tlens):
    """One wording (`TASK_HOW`) from evaluate, the curves, shuffle_labels, the lm-eval
    export and retention's probe, including how to build one's own Task."""
    assert "gna.tasks.Task(name, [gna.tasks.mcq_example(...), ...])" in TASK_HOW
    how = re.escape(TASK_HOW)
    prompts = ["w5 w6 w7", "w8 w9 w10"]
    heads = [gna.Head(1, 0)]
    calls = {
        "evaluate": lambda: gna.evaluate(llama_tlens, prompts),
        "faithfulness_curve": lambda: gna.faithfulness_curve(llama_tlens, prompts, heads),
        "retention_curve": lambda: gna.retention_curve(llama_tlens, prompts, heads),
        "edge_faithfulness_curve": lambda: gna.edge_faithfulness_curve(llama_tlens, prompts, [(gna.Head(0, 0), gna.Head(1, 0))]),
        "shuffle_labels": lambda: gna.tasks.shuffle_labels(prompts),
        "write_task": lambda: gna.harness.write_task(prompts, "unused"),
        "discover": lambda: gna.discover(llama_tlens, prompts, progress=False),
    }
    for call, run in calls.items():
        with pytest.raises(TypeError, match=rf"^{call}: task=\['w5 w6 w7', 'w8 w9 w10'\] \(list\): {how}; prompts alone have no answers"):
            run()
    with pytest.raises(TypeError, match=rf"^retrieval_ranking: task\[0\]='w5' \(str\): {how}"):
        gna.retrieval_ranking(llama_tlens, ["w5"])
    with pytest.raises(TypeError, match=rf"^discover: task='llama' \(str\): {how}; a bundled toy's task is gna.toy_task\(name\)"):
        gna.discover(llama_tlens, "llama", progress=False)
    assert no_hooks_left(llama_tlens)


def test_text_where_token_ids_are_expected_points_to_the_tokenizer(llama_tlens):
    fix = r"get a token's id from the tokenizer, e.g. model.tokenizer.encode\(' Y', add_special_tokens=False\)\[0\]"
    with pytest.raises(TypeError, match=rf"logit_diff: correct=' Y' is text: expected a token id, .*; {fix}"):
        gna.logit_diff(" Y", " Z")
    with pytest.raises(TypeError, match=rf"candidate_accuracy: candidates=\[\[' Y', ' Z'\]\] is text: .*; {fix}"):
        gna.candidate_accuracy([[" Y", " Z"]], [0])
    with pytest.raises(TypeError, match=r"target_logprob: targets=\['w5'\] is text: .*encode\('w5', add_special_tokens=False\)"):
        gna.target_logprob(["w5"])
    # the advice works: the ids it gives build the metric, which scores the model's logits
    y, z = (llama_tlens.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("w7", "w8"))
    logits = llama_tlens.logits(CLEAN)
    expected = (logits[:, -1, y] - logits[:, -1, z]).mean()
    torch.testing.assert_close(torch.as_tensor(gna.logit_diff(y, z)(logits)).float().mean(), expected)


def test_head_from_text_points_to_head_parse():
    with pytest.raises(
        TypeError, match=r"^Head\('1.2'\): Head\(layer, head\) takes two ints; a head written as text: gna.Head.parse\('1.2'\) builds it$"
    ):
        gna.Head("1.2")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Head\('L3H1'\): .*gna.Head.parse\('L3H1'\) builds it$"):
        gna.Head("L3H1")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Head\('abc'\): Head\(layer, head\) takes two ints; gna.Head.parse reads text such as 'L16H22'"):
        gna.Head("abc")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Head\(\(1, 2\)\): .*not a pair: gna.Head\(1, 2\) builds it$"):
        gna.Head((1, 2))  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^Head\(3\): the head index is missing: Head\(layer, head\), e.g. gna.Head\(3, 0\)$"):
        gna.Head(3)  # type: ignore[call-arg]
    # the pointer is right, and the dataclass still behaves as one
    head = gna.Head.parse("1.2")
    assert head == gna.Head(1, 2) == gna.Head(layer=1, head=2) and str(head) == "L1H2" and repr(head) == "Head(layer=1, head=2)"
    assert copy.deepcopy(head) == head and sorted([gna.Head(2, 0), head]) == [head, gna.Head(2, 0)]
    with pytest.raises(TypeError, match=r"Head.layer must be an int, got '1' \(str\)"):
        gna.Head("1", 2)  # type: ignore[arg-type]


def test_a_metric_returning_a_long_list_is_cut(llama_tlens):
    def per_logit(logits):
        return logits[0, -1].tolist()  # 64 floats: a list, not a tensor

    with pytest.raises(
        TypeError,
        match=r"metric .*per_logit returned \[.*\.\.\. \(list\): expected a float, or a tensor .*make its 64 values a tensor: torch",
    ) as raised:
        gna.ablation_sweep(llama_tlens, CLEAN, None, per_logit, heads=[gna.Head(0, 0)], progress=False)
    assert len(str(raised.value)) < 300  # the list is cut to a few values, not printed whole
    assert no_hooks_left(llama_tlens)


def test_unsupported_family_error_points_to_describing_an_architecture(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*describe it as data: .*\(docs/describe.md\)") as raised:
        gna.load(gpt2, tokenizer=tokenizer)
    assert "architecture.md" not in str(raised.value)
