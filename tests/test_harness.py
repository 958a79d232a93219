"""`LMEvalModel` request by request, against references that share no code with it: the
raw HF model (plain forwards, weight edits, raw torch hooks) and lm-eval's own HF model."""

from __future__ import annotations

import copy
import sys
import tempfile

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import out_proj, zero_columns

lm_eval = pytest.importorskip("lm_eval")
from lm_eval.api.instance import Instance  # noqa: E402

from gna_interp.harness import LMEvalModel  # noqa: E402

HEAD_DIM = 8  # tiny Llama: 48 wide, 6 heads
CONTEXTS = ["w5 w6 w7", "w10 w11 w12 w13 w14 w15", "w20", "w20"]
CONTINUATIONS = [" w8 w9 w10", " w16 w17", " w21 w22 w23 w24", " w30"]


def requests(contexts=CONTEXTS, continuations=CONTINUATIONS):
    return [Instance("loglikelihood", {}, (c, x), i) for i, (c, x) in enumerate(zip(contexts, continuations, strict=True))]


def raw_loglikelihood(hf, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """Plain ``hf(input_ids)`` on one unpadded row: the continuation is what ``context +
    continuation`` adds to the context's tokens."""
    whole = tokenizer(context + continuation)["input_ids"]
    target = torch.tensor(whole[len(tokenizer(context)["input_ids"]) :])
    with torch.no_grad():
        logprobs = hf(input_ids=torch.tensor([whole[:-1]])).logits[0, -len(target) :].log_softmax(-1)
    return float(logprobs[torch.arange(len(target)), target].sum()), bool((logprobs.argmax(-1) == target).all())


def raw_greedy(hf, tokenizer, context: str, n: int, stop: str) -> str:
    """Greedy decoding, one full forward per token, ended by EOS, cut at ``stop``."""
    ids = tokenizer(context)["input_ids"]
    new: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            token = int(hf(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == tokenizer.eos_token_id:
                break
            new.append(token)
    return tokenizer.decode(new, skip_special_tokens=True).split(stop)[0]


def skip_hooks(hf, layers):
    """Raw forward hooks making these decoder layers return their input."""
    return [
        hf.model.layers[i].register_forward_hook(
            lambda m, args, kwargs, out: kwargs.get("hidden_states", args[0] if args else None), with_kwargs=True
        )
        for i in layers
    ]


def zero_last_row_hooks(hf):
    """Raw pre-hooks zeroing every attention head's output at the last position."""

    def pre(module, args):
        x = args[0].clone()
        x[:, -1] = 0
        return (x, *args[1:])

    return [out_proj(hf, layer).register_forward_pre_hook(pre) for layer in range(hf.config.num_hidden_layers)]


def with_greedy_request(hf, tokenizer):
    """The fixed requests plus one whose continuation is the raw model's own greedy choice
    (the first context, of a few, whose two greedy tokens are words, not special tokens)."""
    for start in range(30, 60):
        context = f"w{start} w{start + 1}"
        ids = tokenizer(context)["input_ids"]
        with torch.no_grad():
            first = int(hf(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            second = int(hf(input_ids=torch.tensor([[*ids, first]])).logits[0, -1].argmax())
        if min(first, second) >= len(tokenizer.all_special_ids):
            return requests([*CONTEXTS, context], [*CONTINUATIONS, " " + tokenizer.decode([first, second])])
    raise AssertionError("no context with a greedy continuation of words")


CASES = ["clean", "ablate", "mask_rows", "skip", "truncate", "ablated_context", "swap"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_loglikelihood_matches_raw_hf(case, backend, llama_models, llama_hf, tokenizer):
    """Multi-token continuations, batches of different lengths, two requests sharing one
    input, and a greedy one: scores and is_greedy equal a raw HF computation with the
    intervention done by weight edits or raw hooks."""
    model = llama_models[backend]
    reference, hooks, interventions = copy.deepcopy(llama_hf), [], []
    donor = tiny_model("llama", seed=1) if case == "swap" else None
    if case == "ablate":
        interventions = [gna.Ablate([gna.Head(1, 2), gna.Head(2, 5)])]
        reference = zero_columns(zero_columns(llama_hf, gna.Head(1, 2), HEAD_DIM), gna.Head(2, 5), HEAD_DIM)
    elif case == "ablated_context":
        reference = zero_columns(llama_hf, gna.Head(0, 1), HEAD_DIM)
    elif case == "mask_rows":
        interventions, hooks = [gna.MaskAttentionRows(-1)], zero_last_row_hooks(reference)
    elif case == "skip":
        interventions, hooks = [gna.SkipLayers(1)], skip_hooks(reference, [1])
    elif case == "truncate":
        interventions, hooks = [gna.Truncate(1)], skip_hooks(reference, [1, 2])
    elif case == "swap":
        reference.model.layers[1].load_state_dict(donor.model.layers[1].state_dict())
    batch = with_greedy_request(reference, tokenizer)
    try:
        expected = [raw_loglikelihood(reference, tokenizer, *r.args) for r in batch]
    finally:
        for hook in hooks:
            hook.remove()
    lm = LMEvalModel(model, interventions, batch_size=2)
    if case == "ablated_context":
        with model.ablated([gna.Head(0, 1)]):
            got = lm.loglikelihood(batch, disable_tqdm=True)
    elif case == "swap":
        with gna.swap_layers(model, donor, [1]):
            got = lm.loglikelihood(batch, disable_tqdm=True)
    else:
        got = lm.loglikelihood(batch, disable_tqdm=True)
    assert [g for _, g in got] == [g for _, g in expected]
    # With the last row masked, the greedy search (prompt alone) and the scoring forward
    # (prompt + first token) mask different rows: only there the last request may not be greedy.
    assert (expected[-1][1] or case == "mask_rows") and not all(g for _, g in expected)
    assert torch.allclose(torch.tensor([s for s, _ in got]), torch.tensor([s for s, _ in expected]), atol=1e-4)


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_generate_until_matches_raw_greedy(backend, llama_models, llama_hf, tokenizer):
    """Greedy generations, stopped at ``until`` or after max_gen_toks, clean and with a
    head ablated (reference: the weight-edited HF model)."""
    model = llama_models[backend]
    contexts = ["w5 w6 w7", "w10 w11", "w12 w13 w14 w15 w16"]
    kwargs = {"until": ["w9"], "max_gen_toks": 5, "do_sample": False}
    batch = [Instance("generate_until", {}, (c, dict(kwargs)), i) for i, c in enumerate(contexts)]
    for interventions, reference in ([], llama_hf), ([gna.Ablate([gna.Head(1, 0)])], zero_columns(llama_hf, gna.Head(1, 0), HEAD_DIM)):
        expected = [raw_greedy(reference, tokenizer, c, 5, stop="w9") for c in contexts]
        assert LMEvalModel(model, interventions, batch_size=2).generate_until(batch, disable_tqdm=True) == expected
    assert len({*expected}) > 1


def test_same_numbers_as_lm_evals_hf_model(llama_models, llama_hf, tokenizer):
    """lm-eval's own HF model on the same weights: loglikelihood, rolling windows (a text
    three times max_length) and generate_until agree."""
    from lm_eval.models.huggingface import HFLM

    theirs = HFLM(pretrained=copy.deepcopy(llama_hf), tokenizer=tokenizer, batch_size=2, max_length=8)
    ours = LMEvalModel(llama_models["nnsight"], batch_size=2, max_length=8)
    text = " ".join(f"w{i}" for i in range(5, 29))
    rolling = [Instance("loglikelihood_rolling", {}, (text,), 0), Instance("loglikelihood_rolling", {}, ("w7 w8",), 1)]
    gen = [Instance("generate_until", {}, ("w5 w6 w7", {"until": ["w9"], "max_gen_toks": 4, "do_sample": False}), 0)]
    batch = requests()
    assert torch.allclose(
        torch.tensor([s for s, _ in ours.loglikelihood(batch, disable_tqdm=True)]),
        torch.tensor([s for s, _ in theirs.loglikelihood(batch, disable_tqdm=True)]),
        atol=1e-4,
    )
    assert torch.allclose(torch.tensor(ours.loglikelihood_rolling(rolling)), torch.tensor(theirs.loglikelihood_rolling(rolling)), atol=1e-3)
    assert ours.generate_until(gen) == theirs.generate_until(gen)


@pytest.fixture(scope="module")
def bare_tokenizer():
    """A word-level tokenizer with no BOS and no EOS token (and adding none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    words = ["<pad>", "<unk>", *(f"w{i}" for i in range(2, 64))]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder = tempfile.mkdtemp(prefix="gna_bare_tokenizer_")
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>").save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.bos_token_id is None and tokenizer.eos_token_id is None and tokenizer("w5")["input_ids"] == [5]
    return tokenizer


def test_tokenizer_without_bos_or_eos(bare_tokenizer, llama_hf):
    """Scores and generations work (lm-eval's HF model fails on this tokenizer); an empty
    context and rolling windows need a prefix token, asked for by name."""
    from lm_eval.models.huggingface import HFLM

    hf = copy.deepcopy(llama_hf)
    model = gna.load(copy.deepcopy(hf), tokenizer=bare_tokenizer, backend="nnsight")
    batch = requests()
    expected = [raw_loglikelihood(hf, bare_tokenizer, *r.args) for r in batch]
    got = LMEvalModel(model, batch_size=4).loglikelihood(batch, disable_tqdm=True)
    assert torch.allclose(torch.tensor([s for s, _ in got]), torch.tensor([s for s, _ in expected]), atol=1e-4)
    gen = [Instance("generate_until", {}, ("w5 w6 w7", {"until": ["w9"], "max_gen_toks": 3}), 0)]
    assert LMEvalModel(model).generate_until(gen) == [raw_greedy(hf, bare_tokenizer, "w5 w6 w7", 3, stop="w9")]
    rolling = [Instance("loglikelihood_rolling", {}, ("w7 w8 w9",), 0)]
    with pytest.raises(ValueError, match=r"no BOS or EOS token.*prefix_token_id"):
        LMEvalModel(model).loglikelihood_rolling(rolling)
    expected_rolling = raw_loglikelihood(hf, bare_tokenizer, "w3", " w7 w8 w9")[0]  # w3 as the prefix token
    assert LMEvalModel(model, prefix_token_id=3).loglikelihood_rolling(rolling)[0] == pytest.approx(expected_rolling, abs=1e-4)
    with pytest.raises(TypeError):  # lm-eval 0.4.13's HF model: tokenizer.decode(None) while encoding
        HFLM(pretrained=hf, tokenizer=bare_tokenizer, batch_size=1).loglikelihood(batch, disable_tqdm=True)


def test_remote_local_simulation(llama_hf, llama_models, tokenizer):
    """nnsight's local simulation of NDIF gives the local numbers, intervention included."""
    remote = gna.load(copy.deepcopy(llama_hf), tokenizer=tokenizer, remote="local")
    interventions = [gna.Ablate([gna.Head(1, 2)]), gna.MaskAttentionRows(-1, layers=[2])]
    batch = requests()
    gen = [Instance("generate_until", {}, ("w5 w6 w7", {"until": ["w9"], "max_gen_toks": 1}), 0)]
    far, near = LMEvalModel(remote, interventions, batch_size=4), LMEvalModel(llama_models["nnsight"], interventions, batch_size=4)
    (far_scores, far_greedy), (near_scores, near_greedy) = (zip(*lm.loglikelihood(batch), strict=True) for lm in (far, near))
    assert far_greedy == near_greedy and torch.allclose(torch.tensor(far_scores), torch.tensor(near_scores), atol=1e-5)
    assert far.generate_until(gen) == near.generate_until(gen)


@pytest.mark.parametrize(
    "interventions,message",
    [
        ([gna.Patch([gna.Head(0, 0)], source="w5 w6")], "pairs each prompt"),
        ([gna.Ablate([gna.Head(0, 0)], how="resample", corrupt="w5 w6")], "pairs each prompt"),
        ([gna.MaskAttentionRows(2)], "positions must count from the end"),
        ([gna.Ablate([gna.Head(0, 0)], positions=torch.tensor([1]))], "positions must count from the end"),
    ],
)
def test_interventions_lm_eval_cannot_follow(interventions, message, llama_models):
    with pytest.raises(ValueError, match=message):
        LMEvalModel(llama_models["nnsight"], interventions)
    model = llama_models["tlens"]
    with model.intervening(*interventions), pytest.raises(ValueError, match=message):
        LMEvalModel(model).loglikelihood(requests())
    assert not model.active_interventions


def test_bad_requests_and_settings(llama_models):
    model = llama_models["nnsight"]
    with pytest.raises(ValueError, match="batch_size=0"):
        LMEvalModel(model, batch_size=0)
    with pytest.raises(TypeError, match=r"needs a gna_interp\.GnaModel"):
        LMEvalModel("llama")
    sampled = [Instance("generate_until", {}, ("w5", {"until": ["w9"], "do_sample": True, "temperature": 0.7}), 0)]
    with pytest.raises(ValueError, match="sampling"):
        LMEvalModel(model).generate_until(sampled)
    with pytest.raises(ValueError, match="more than max_length=2"):
        LMEvalModel(model, max_length=2).loglikelihood(requests(["w5"], [" w6 w7 w8"]))


def test_model_args():
    parsed = gna.harness.parse_model_args(
        {"pretrained": "toy:llama", "ablate": "L1H0+L0H2", "skip_layers": 1, "mask_attention_rows": "-1+-2", "batch_size": "auto"}
    )
    assert parsed.interventions == [
        gna.Ablate([gna.Head(1, 0), gna.Head(0, 2)]),
        gna.SkipLayers([1]),
        gna.MaskAttentionRows([-1, -2]),
    ]
    assert parsed.adapter == {}
    assert gna.harness.describe(parsed.interventions) == "-L1H0,L0H2 + skip L1 + mask rows [-1, -2]"
    for bad, message in [
        ({"pretrained": "x", "ablate": 16.22}, "write heads as L<layer>H<head>"),
        ({"pretrained": "x", "colour": "red"}, r"unknown gna model_args \['colour'\]"),
        ({"ablate": "L1H0"}, "needs pretrained="),
        ({"pretrained": "x", "truncate": "two"}, "truncate='two': expected an int"),
        ({"pretrained": "x", "batch_size": 0}, "batch_size=0"),
    ]:
        with pytest.raises(ValueError, match=message):
            gna.harness.parse_model_args(bad)


def test_from_model_args_string():
    """What lm-eval's CLI calls: a bundled toy by name, interventions from the string."""
    lm = LMEvalModel.create_from_arg_string("pretrained=toy:llama,ablate=L1H0,backend=nnsight", {"batch_size": "4", "device": None})
    assert lm.gna_model.name == "toy-llama" and lm.gna_model.backend_name == "nnsight"
    assert lm.interventions == (gna.Ablate([gna.Head(1, 0)]),) and lm.batch_size == 4
    with pytest.raises(ValueError, match="no bundled toy 'lama'"):
        LMEvalModel.create_from_arg_string("pretrained=toy:lama")


def test_registered_with_lm_eval():
    from lm_eval.api.registry import get_model

    assert get_model("gna") is LMEvalModel
    assert get_model("hf").__name__ == "HFLM"  # lm-eval's own models are still found


def test_clear_error_without_lm_eval(monkeypatch):
    """With lm-eval missing, the harness says which extra to install."""
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.") or m == "gna_interp.harness.adapter"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delattr(gna.harness, "adapter", raising=False)  # else `from . import adapter` finds it
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ImportError, match=r'pip install "gna-interp\[eval\]"'):
        gna.lm_eval(None, "any_task")
