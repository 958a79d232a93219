"""Errors the front door missed (issue 53, item 5): a ``(task, model)`` swap named as such by
every entry point that takes both; `GnaModel.logits` / `run` / `cache` refusing a prompt
longer than the model's context by `evaluate`'s own rule; "did you mean" for a mistyped
keyword of each public function; ``gna.load(folder, arch=spec)`` for a family the table lacks."""

from __future__ import annotations

import inspect

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaTypeError, GnaValueError
from gna_interp.models.handle import check_model_and_task
from gna_interp.models.registry import attention, known_model_types
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, CORRUPT

H = gna.Head


@pytest.fixture(scope="module")
def task():
    return gna.tasks.toy_mcq(4, seed=0)


def swapped_calls(model, task):
    """Each public entry point taking ``(model, ...)``, called with a task where the model goes."""
    metric, r = gna.logit_diff(5, 6), [H(1, 0)]
    return {
        "evaluate": lambda: gna.evaluate(task, model),
        "ablation_sweep": lambda: gna.ablation_sweep(task, CLEAN, None, metric),
        "patching_sweep": lambda: gna.patching_sweep(task, CLEAN, CORRUPT, metric),
        "attribution_patching": lambda: gna.attribution_patching(task, CLEAN, CORRUPT, metric),
        "path_patching": lambda: gna.path_patching(task, CLEAN, CORRUPT, metric, senders=[H(0, 0)], receivers=r),
        "path_patching_sweep": lambda: gna.path_patching_sweep(task, CLEAN, CORRUPT, metric, receivers=r),
        "edge_attribution": lambda: gna.edge_attribution(task, CLEAN, CORRUPT, metric, receivers=r),
        "circuit_score": lambda: gna.circuit_score(task, CLEAN, CORRUPT, metric, [H(0, 0)]),
        "faithfulness_curve": lambda: gna.faithfulness_curve(task, model, [H(0, 0)]),
        "edge_faithfulness_curve": lambda: gna.edge_faithfulness_curve(task, model, []),
        "retention_curve": lambda: gna.retention_curve(task, model, [H(0, 0)]),
        "retrieval_ranking": lambda: gna.retrieval_ranking(task, model),
        "attention_pattern": lambda: gna.attention_pattern(task, CLEAN, [H(0, 0)]),
        "lm_eval": lambda: gna.lm_eval(task, ["mmlu"]),
        "lm_eval_table": lambda: gna.lm_eval_table(task, ["mmlu"], {}),
    }


SWAPPABLE = list(swapped_calls(None, None))


@pytest.mark.parametrize("name", SWAPPABLE)
def test_a_task_where_the_model_goes_is_named_as_swapped(name, llama_tlens, task):
    with pytest.raises(GnaTypeError, match=rf"^{name}: model=Task\('toy_mcq', 4 prompts.*the task came first: {name}\(model, "):
        swapped_calls(llama_tlens, task)[name]()


@pytest.mark.parametrize("name", ["evaluate", "faithfulness_curve", "edge_faithfulness_curve", "retention_curve"])
def test_a_model_where_the_task_goes_is_named_as_swapped(name, llama_tlens):
    call = getattr(gna, name)
    args = (llama_tlens, llama_tlens) if name == "evaluate" else (llama_tlens, llama_tlens, [H(0, 0)])
    with pytest.raises(GnaTypeError, match=rf"^{name}: task=GnaModel\(.*the model came where the task goes: {name}\(model, task"):
        call(*args)


def test_discover_check_names_the_swap(llama_tlens, task):
    """The check `discover` runs first (`check_model_and_task`): both orders of a swap, and
    nothing said for the right order."""
    with pytest.raises(GnaTypeError, match=r"^discover: model=Task\('toy_mcq'.*the task came first: discover\(model, task"):
        check_model_and_task(task, llama_tlens, "discover")
    with pytest.raises(GnaTypeError, match=r"^discover: task=\['w5 w6 w7 w8'.*prompts alone have no answers"):
        check_model_and_task(llama_tlens, CLEAN, "discover")
    check_model_and_task(llama_tlens, task, "discover")


def test_discover_and_stability_name_the_swap(llama_tlens, task):
    """`discover` and `discovery.stability` themselves, called with the task first: the swap
    named before any forward (the model is left as it was: no hook, no cache)."""
    with pytest.raises(GnaTypeError, match=r"^discover: model=Task\('toy_mcq'.*the task came first: discover\(model, task"):
        gna.discover(task, llama_tlens, progress=False)
    with pytest.raises(GnaTypeError, match=r"^stability: model=Task\('toy_mcq'"):
        gna.discovery.stability(task, llama_tlens, k=2, progress=False)
    assert llama_tlens.active_interventions == () and llama_tlens.prefix_sites(llama_tlens.to_batch(CLEAN)) == set()


def words(n: int) -> str:
    return " ".join(f"w{5 + i % 50}" for i in range(n))


@pytest.mark.parametrize("fits", [True, False])
def test_logits_refuse_a_prompt_past_the_context_as_evaluate_does(fits, tokenizer):
    """A 4-token context: 3 words (4 tokens with ``<bos>``) run and equal the raw model's
    logits; 4 words are refused by `run`, `logits` and `cache` with `evaluate`'s message."""
    hf = tiny_model("llama", seed=0, max_position_embeddings=4)
    model = gna.load(hf, tokenizer=tokenizer, backend="nnsight")
    prompt = words(3 if fits else 4)
    example = gna.tasks.Example(prompt, (gna.tasks.Segment(0, 1, 0),), 0, (" w9", " w10"))
    task = gna.tasks.Task("long", [example])
    if fits:
        raw = hf(torch.tensor([tokenizer(prompt)["input_ids"]])).logits
        torch.testing.assert_close(model.logits(prompt), raw)
        assert gna.evaluate(model, task).accuracy in (0.0, 1.0)
        return
    with pytest.raises(GnaValueError) as refused:
        gna.evaluate(model, task)
    message = str(refused.value)
    assert message == f"prompt 0 has 5 tokens, more than {model.name}'s context of 4"
    for call in (lambda: model.logits(prompt), lambda: model.run(prompt), lambda: model.cache(prompt, [H(0, 0)])):
        with pytest.raises(GnaValueError) as also:
            call()
        assert str(also.value) == message
    with pytest.raises(GnaValueError, match=r"^prompt 1 has 5 tokens"):  # the longest row is named
        model.logits([words(1), prompt])


KEYWORDS = [
    "ablation_sweep",
    "patching_sweep",
    "path_patching",
    "path_patching_sweep",
    "attribution_patching",
    "edge_attribution",
    "evaluate",
    "attention_pattern",
    "circuit_score",
    "faithfulness_curve",
    "edge_faithfulness_curve",
    "retention_curve",
    "retrieval_ranking",
    "lm_eval",
    "lm_eval_table",
    "load_toy",
    "toy_task",
    "toy_card",
    "hybridize",
    "distill",
    "swap_layers",
    "write_report",
    "register_architecture",
    "logit_diff",
    "target_logprob",
    "candidate_accuracy",
    "candidate_logit_diff",
    "candidate_logprob",
    "reads_position",
    "attention.entropy",
    "attention.mass_on",
    "attention.top1_mass",
]
"""Public functions that answer a mistyped keyword with its close matches."""


def by_name(function) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(function).parameters.values() if p.kind in kinds]


@pytest.mark.parametrize("name", KEYWORDS)
def test_a_mistyped_keyword_gets_its_close_matches(name):
    function = gna
    for part in name.split("."):  # a generic helper lives under its namespace
        function = getattr(function, part)
    name = name.rsplit(".", 1)[-1]
    inner = function.__wrapped__  # decorated, with the signature and name of the function itself
    assert inspect.signature(function) == inspect.signature(inner) and function.__name__ == name == inner.__name__
    names = by_name(inner)
    intended = max(names, key=len)  # the longest keyword, with its last letter dropped
    typo = intended[:-1]
    mistyped = rf"^{name}\(\) got an unexpected keyword argument '{typo}': did you mean (\w+= or )*{intended}="
    with pytest.raises(GnaTypeError, match=mistyped):
        function(**{typo: None})
    with pytest.raises(TypeError, match=rf"unexpected keyword argument '{typo}'"):  # Python itself refuses it too
        inspect.signature(inner).bind_partial(**{typo: None})
    far = "zzzz_unlike_anything"
    with pytest.raises(GnaTypeError, match=rf"^{name}\(\) got an unexpected keyword argument '{far}' \({name} takes {', '.join(names)}\)$"):
        function(**{far: None})


def test_known_keywords_reach_the_function():
    """The check refuses nothing Python would take: a real call with keywords runs."""
    metric = gna.logit_diff(correct=5, incorrect=6, position=-1)
    logits = torch.zeros(1, 2, 8)
    logits[0, -1, 5] = 2.0
    assert float(metric(logits)) == 2.0


QWEN3 = gna.ArchSpec("qwen3", ("qwen3",), gna.LayerKind.ATTENTION, "model.layers", "model.norm", gna.core.uniform(attention()), tlens=False)


def test_load_a_folder_with_arch(tmp_path, tokenizer):
    """A Qwen3 folder (a family the table lacks): refused without ``arch=``, loaded with it
    for that load only; its logits and zero-ablation equal the raw model's (the head's
    out-projection columns zeroed in a copy)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8
    )
    torch.manual_seed(0)
    raw = AutoModelForCausalLM.from_config(config.__class__(**{**config.to_dict(), "vocab_size": len(tokenizer)})).eval()
    raw.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(GnaValueError, match=r"unknown architecture model_type='qwen3'.*--arch module:NAME"):
        gna.load(str(tmp_path))
    model = gna.load(str(tmp_path), arch=QWEN3)
    assert model.arch is QWEN3 and "qwen3" not in known_model_types()  # used, not registered
    ids = torch.tensor([tokenizer(CLEAN[0])["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model.logits(CLEAN[0]), raw(ids).logits)
        ablated = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
        ablated.model.layers[1].self_attn.o_proj.weight[:, 8:16] = 0  # head 1 of layer 1: columns 8..15
        torch.testing.assert_close(model.logits(CLEAN[0], gna.Ablate([H(1, 1)])), ablated(ids).logits)
