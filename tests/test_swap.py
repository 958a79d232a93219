"""`swap_layers` (issue 7): blocks of one model run inside another.

References share no code with the library:
- same family: a deep copy of the target whose block got the donor block's state dict
  through ``load_state_dict``;
- different families: the donor *model's own forward* (its rotary embedding, its mask)
  run on the residual stream entering the swapped layer, every other donor layer made an
  identity with a raw forward hook; its block output is written over the target block's
  output with another raw hook.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import gna_interp as gna
from gna_interp.models.hf_compat import cache_keyword, returned_cache
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS, no_hooks_anywhere

EXACT = 1e-6
# A left-padded batch: row 1 has three padding positions.
IDS = torch.tensor([[5, 9, 13, 22, 30, 41, 7], [0, 0, 0, 12, 17, 50, 33]])
MASK = torch.tensor([[1] * 7, [0, 0, 0, 1, 1, 1, 1]])


class Boom(RuntimeError):
    pass


def hybrid(family: str, seed: int = 3):
    """A Llama-width (48) hybrid: Mamba-2 layers 0 and 2, attention layer 1."""
    shared = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, vocab_size=64)
    mamba = dict(mamba_n_heads=6, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=8, mamba_expand=2, mamba_chunk_size=4)
    if family == "granitemoehybrid":
        extra = dict(shared_intermediate_size=96, layer_types=["mamba", "attention", "mamba"], num_local_experts=0)
    else:
        extra = dict(attn_layer_indices=[1])
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **shared, **mamba, **extra)).eval()


def llama_width_mamba2(seed: int = 2):
    return tiny_model("mamba2", seed=seed, hidden_size=48, num_heads=6)


def layers_of(model):
    return model.backbone.layers if hasattr(model, "backbone") else model.model.layers


def logits(model, ids=IDS, mask=MASK):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def load_state_dict_reference(target, donor, pairs):
    reference = copy.deepcopy(target)
    for t_layer, d_layer in pairs.items():
        layers_of(reference)[t_layer].load_state_dict(layers_of(donor)[d_layer].state_dict())
    return logits(reference)


def donor_forward_reference(target, donor, t_layer, d_layer, ids=IDS, mask=MASK, target_pre_hooks=()):
    """Logits of ``target`` with block ``t_layer``'s output replaced by what the donor
    model's own forward makes of the residual stream entering ``t_layer`` at its block
    ``d_layer``. ``target_pre_hooks``: ``(module, hook)`` pairs active on the target."""
    store = {}
    handles = [module.register_forward_pre_hook(hook) for module, hook in target_pre_hooks]
    handles.append(layers_of(target)[t_layer].register_forward_pre_hook(lambda m, args: store.setdefault("in", args[0])))
    try:
        logits(target, ids, mask)
    finally:
        handles.pop().remove()
    donor_handles = []
    for i, layer in enumerate(layers_of(donor)):
        if i == d_layer:
            donor_handles.append(layer.register_forward_hook(lambda m, args, out: store.setdefault("out", out)))
        else:
            donor_handles.append(layer.register_forward_hook(lambda m, args, out: args[0]))
    backbone = donor.backbone if hasattr(donor, "backbone") else donor.model
    try:
        with torch.no_grad():
            backbone(inputs_embeds=store["in"], attention_mask=mask)
    finally:
        for handle in donor_handles:
            handle.remove()
    out = store["out"][0] if isinstance(store["out"], tuple) else store["out"]

    def replace(module, args, output):
        return (out, *output[1:]) if isinstance(output, tuple) else out

    handles.append(layers_of(target)[t_layer].register_forward_hook(replace))
    try:
        return logits(target, ids, mask)
    finally:
        for handle in handles:
            handle.remove()


def snapshot(model):
    return {
        "modules": [id(m) for m in model.modules()],
        "params": {name: (id(p), p.detach().clone()) for name, p in model.named_parameters()},
        "logits": logits(model),
    }


def assert_restored(model, before):
    after = snapshot(model)
    assert after["modules"] == before["modules"]
    assert after["params"].keys() == before["params"].keys()
    for name, (identity, value) in before["params"].items():
        assert after["params"][name][0] == identity, name
        assert torch.equal(after["params"][name][1], value), name
    assert torch.equal(after["logits"], before["logits"])
    assert no_hooks_anywhere(model)


# ----- same family -------------------------------------------------------------------------


FAMILIES = ["llama", "mistral", "qwen2", "mamba", "falcon_mamba", "mamba2"]


@pytest.mark.parametrize("family", FAMILIES)
def test_swap_with_itself_or_a_copy_is_the_identity(family):
    model = tiny_model(family, seed=0)
    before = logits(model)
    every = list(range(len(layers_of(model))))
    with gna.swap_layers(model, model, every) as swapped:
        assert swapped is model
        assert torch.equal(logits(model), before)
    with gna.swap_layers(model, copy.deepcopy(model), every):
        assert torch.equal(logits(model), before)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layers", [[1], {0: 1}, {0: 1, 1: 0}])
def test_same_family_swap_equals_load_state_dict(family, layers):
    target, donor = tiny_model(family, seed=0), tiny_model(family, seed=1, vocab_size=80)  # vocabulary is irrelevant
    pairs = layers if isinstance(layers, dict) else {layer: layer for layer in layers}
    expected = load_state_dict_reference(target, donor, pairs)
    assert not torch.allclose(expected, logits(target))  # the swap changes something
    with gna.swap_layers(target, donor, layers):
        assert (logits(target) - expected).abs().max() <= EXACT


# ----- different families ------------------------------------------------------------------

CROSS = {
    "llama->mamba2": (llama_width_mamba2, lambda: tiny_model("llama", seed=1), 1, 2),
    "mistral(sliding 3)->mamba2": (llama_width_mamba2, lambda: tiny_model("mistral", seed=1, sliding_window=3), 0, 1),
    "qwen2->mamba2": (llama_width_mamba2, lambda: tiny_model("qwen2", seed=1), 1, 0),
    "mamba2->llama": (lambda: tiny_model("llama", seed=0), llama_width_mamba2, 2, 1),
    "mamba->llama": (lambda: tiny_model("llama", seed=0), lambda: tiny_model("mamba", seed=4, hidden_size=48), 0, 1),
    "llama->falcon_mamba": (lambda: tiny_model("falcon_mamba", seed=4, hidden_size=48), lambda: tiny_model("llama", seed=1), 1, 0),
    "mamba2->qwen2": (lambda: tiny_model("qwen2", seed=0), llama_width_mamba2, 0, 0),
    "llama->mistral": (lambda: tiny_model("mistral", seed=0), lambda: tiny_model("llama", seed=1), 1, 1),
    "llama->granitemoehybrid (mamba layer)": (lambda: hybrid("granitemoehybrid"), lambda: tiny_model("llama", seed=1), 0, 1),
    "llama->granitemoehybrid (attention layer)": (lambda: hybrid("granitemoehybrid"), lambda: tiny_model("llama", seed=1), 1, 1),
    "llama->bamba": (lambda: hybrid("bamba"), lambda: tiny_model("llama", seed=1), 2, 0),
}


@pytest.mark.parametrize("case", list(CROSS))
def test_cross_family_swap_equals_donor_model_forward(case):
    make_target, make_donor, t_layer, d_layer = CROSS[case]
    target, donor = make_target(), make_donor()
    expected = donor_forward_reference(target, donor, t_layer, d_layer)
    assert not torch.allclose(expected, logits(target))
    with gna.swap_layers(target, donor, {t_layer: d_layer}):
        assert (logits(target) - expected).abs().max() <= EXACT


def test_cross_family_padding_mask_reaches_the_donor_block():
    """A left-padded row's real-token logits equal those of the same row unpadded."""
    target, donor = llama_width_mamba2(), tiny_model("llama", seed=1)
    with gna.swap_layers(target, donor, [1]):
        padded = logits(target)[1, 3:]
        alone = logits(target, IDS[1:, 3:], MASK[1:, 3:])[0]
    assert (padded - alone).abs().max() < 1e-5


def test_the_copied_rotary_embedding_is_the_donors():
    """The donor's frequency buffers travel with the block, not just its config (a
    loaded or dynamically rescaled rotary embedding differs from a fresh one)."""
    target, donor = llama_width_mamba2(), tiny_model("llama", seed=1)
    donor.model.rotary_emb.inv_freq.mul_(0.5)
    expected = donor_forward_reference(target, donor, 1, 1)
    with gna.swap_layers(target, donor, [1]):
        assert (logits(target) - expected).abs().max() <= EXACT


def test_a_swapped_block_called_on_its_own_assumes_no_padding():
    """Outside the target's forward no padding mask is known (nor one left over from the
    last forward): the block runs the donor block with a plain causal mask."""
    target, donor = llama_width_mamba2(), tiny_model("llama", seed=1)
    hidden = torch.randn(1, 4, 48)
    store = {}
    handles = [
        donor.model.layers[0].register_forward_hook(lambda m, args, out: args[0]),
        donor.model.layers[1].register_forward_hook(lambda m, args, out: store.setdefault("out", out)),
    ]
    try:
        with torch.no_grad():
            donor.model(inputs_embeds=hidden)
    finally:
        for handle in handles:
            handle.remove()
    with gna.swap_layers(target, donor, [1]), torch.no_grad():
        logits(target, IDS.flip(0), MASK.flip(0).flip(1))  # right padding in row 0: its mask must not linger
        alone = layers_of(target)[1](hidden)
    assert (alone - store["out"]).abs().max() <= EXACT


SWAPS = {
    "same family": (lambda: tiny_model("llama", seed=0), lambda: tiny_model("llama", seed=1)),
    "llama->mamba2": (llama_width_mamba2, lambda: tiny_model("llama", seed=1)),
    "mamba2->llama": (lambda: tiny_model("llama", seed=0), llama_width_mamba2),
    "llama->granitemoehybrid": (lambda: hybrid("granitemoehybrid"), lambda: tiny_model("llama", seed=1)),
}


@pytest.mark.parametrize("case", list(SWAPS))
def test_leaving_restores_modules_parameters_and_logits(case):
    target, donor = (make() for make in SWAPS[case])
    before, donor_before = snapshot(target), snapshot(donor)
    with gna.swap_layers(target, donor, [0, 1]):
        assert not torch.equal(logits(target), before["logits"])
    assert_restored(target, before)
    with pytest.raises(Boom), gna.swap_layers(target, donor, {1: 0}):
        logits(target)
        raise Boom("body failed")
    assert_restored(target, before)
    assert_restored(donor, donor_before)


def test_cross_family_refuses_to_continue_a_cache():
    target, donor = llama_width_mamba2(), tiny_model("llama", seed=1)
    with gna.swap_layers(target, donor, [1]):
        with torch.no_grad():
            out = target(input_ids=IDS[:1], use_cache=True)
            with pytest.raises(NotImplementedError, match="use_cache=False"):
                cache = {cache_keyword(target.forward): returned_cache(out)}  # cache_params before transformers 5.24
                target(input_ids=IDS[:1, -1:], **cache, use_cache=True)
        with torch.no_grad():
            generated = target.generate(IDS[:1], max_new_tokens=3, do_sample=False, use_cache=False, pad_token_id=0)
        greedy = IDS[:1]
        for _ in range(3):
            greedy = torch.cat([greedy, logits(target, greedy, torch.ones_like(greedy))[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, greedy)


# ----- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("donor", "fields"),
    [
        (lambda: tiny_model("llama", seed=1, hidden_size=72), ["hidden_size 48 vs 72"]),
        (lambda: tiny_model("llama", seed=1, num_attention_heads=4), ["num_attention_heads", "head_dim"]),
        (lambda: tiny_model("llama", seed=1, num_key_value_heads=3), ["num_key_value_heads"]),
        (lambda: tiny_model("llama", seed=1, rope_parameters={"rope_type": "default", "rope_theta": 5e5}), ["rope_parameters", "500000.0"]),
        (lambda: tiny_model("llama", seed=1, rms_norm_eps=1e-5), ["rms_norm_eps"]),
    ],
)
def test_same_family_mismatch_names_the_fields(donor, fields):
    with pytest.raises(ValueError, match="do not fit") as error:  # noqa: SIM117
        with gna.swap_layers(tiny_model("llama", seed=0), donor(), [1]):
            pass
    for field in fields:
        assert field in str(error.value)


def test_cross_family_width_mismatch_names_hidden_size():
    with pytest.raises(ValueError, match=r"hidden_size differs: target mamba2 has 32, donor llama has 48"):  # noqa: SIM117
        with gna.swap_layers(tiny_model("mamba2", seed=0), tiny_model("llama", seed=1), [0]):
            pass


@pytest.mark.parametrize(
    ("layers", "error", "message"),
    [
        ([3], ValueError, r"target layer 3 out of range: the target has layers 0\.\.2"),
        ([-1], ValueError, r"target layer -1 out of range: the target has layers 0\.\.2"),
        ({0: 2}, ValueError, r"donor layer 2 out of range: the donor has layers 0\.\.1"),
        ([1, 1], ValueError, "given twice"),
        ([], ValueError, "no layers"),
        ([True], TypeError, "must be ints"),
        (["1"], TypeError, "must be ints"),
    ],
)
def test_bad_layer_indices(layers, error, message):
    target, donor = tiny_model("llama", seed=0), tiny_model("llama", seed=1, num_hidden_layers=2)
    with pytest.raises(error, match=message), gna.swap_layers(target, donor, layers):
        pass
    assert no_hooks_anywhere(target)


def test_unsupported_families_are_named():
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_embd=48, n_layer=2, n_head=4, vocab_size=64))
    with pytest.raises(ValueError, match=r"target's family 'gpt2' is not supported; supported are \["), gna.swap_layers(gpt2, gpt2, [0]):
        pass
    with pytest.raises(ValueError, match="granitemoehybrid blocks cannot be swapped into another family"):  # noqa: SIM117
        with gna.swap_layers(tiny_model("llama", seed=0), hybrid("granitemoehybrid"), [1]):
            pass
    with pytest.raises(TypeError, match="transformers causal LM or a GnaModel"), gna.swap_layers(object(), gpt2, [0]):
        pass


# ----- through the library -------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_same_family_swap_on_a_gna_model(backend, tokenizer):
    hf, donor = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    reference = copy.deepcopy(hf)
    layers_of(reference)[1].load_state_dict(layers_of(donor)[1].state_dict())
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer, backend=backend)
    batch = model.to_batch(PROMPTS)
    real = batch.attention_mask.bool()
    ablate = gna.Ablate([gna.Head(1, 2)])
    before, before_ablated = model.logits(PROMPTS), model.logits(PROMPTS, [ablate])

    def zero_head_2(module, args):
        x = args[0].clone()
        x[..., 2 * model.head_dim : 3 * model.head_dim] = 0
        return (x,)

    handle = layers_of(reference)[1].self_attn.o_proj.register_forward_pre_hook(zero_head_2)
    try:
        expected_ablated = logits(reference, batch.input_ids, batch.attention_mask)
    finally:
        handle.remove()
    expected = logits(reference, batch.input_ids, batch.attention_mask)
    with gna.swap_layers(model, donor, [1]) as swapped:
        assert swapped is model
        assert (model.logits(PROMPTS) - expected)[real].abs().max() < 1e-4
        assert (model.logits(PROMPTS, [ablate]) - expected_ablated)[real].abs().max() < 1e-4
    assert torch.equal(model.logits(PROMPTS), before)
    assert torch.equal(model.logits(PROMPTS, [ablate]), before_ablated)


def test_cross_family_swap_on_a_gna_model(tokenizer):
    hf, donor = llama_width_mamba2(), tiny_model("llama", seed=1)
    pristine = copy.deepcopy(hf)
    model = gna.load(hf, tokenizer=tokenizer, backend="nnsight")
    batch = model.to_batch(PROMPTS)
    ids, mask = batch.input_ids, batch.attention_mask
    ablate = gna.Ablate([gna.Head(0, 3)])
    before, before_ablated = model.logits(PROMPTS), model.logits(PROMPTS, [ablate])

    def zero_head_3(module, args):
        x = args[0].clone()
        x[..., 3 * model.head_dim : 4 * model.head_dim] = 0
        return (x,)

    head_hook = [(layers_of(pristine)[0].mixer.out_proj, zero_head_3)]
    expected = donor_forward_reference(pristine, donor, 1, 1, ids, mask)
    expected_ablated = donor_forward_reference(pristine, donor, 1, 1, ids, mask, target_pre_hooks=head_hook)
    skip = layers_of(pristine)[1].register_forward_hook(lambda m, args, out: args[0])
    try:
        expected_skipped = logits(pristine, ids, mask)
    finally:
        skip.remove()
    with gna.swap_layers(model, donor, [1]):
        assert (model.logits(PROMPTS) - expected).abs().max() < 1e-5
        assert (model.logits(PROMPTS, [ablate]) - expected_ablated).abs().max() < 1e-5
        # Skipping the swapped layer is skipping the layer.
        assert (model.logits(PROMPTS, [gna.SkipLayers(1)]) - expected_skipped).abs().max() < 1e-5
        resid = model.cache(PROMPTS, [gna.Resid(2)])[gna.Resid(2)]
        assert resid.shape == (*ids.shape, 48)
        # The swapped layer's heads are not the table's: a clear error, not nnsight's.
        with pytest.raises(ValueError, match="holds a swapped-in llama block"):
            model.logits(PROMPTS, [gna.Ablate([gna.Head(1, 0)])])
    assert model.foreign_layers == {}
    assert torch.equal(model.logits(PROMPTS, [gna.Ablate([gna.Head(1, 0)])]), model.logits(PROMPTS, [gna.Ablate([gna.Head(1, 0)])]))
    assert torch.equal(model.logits(PROMPTS), before)
    assert torch.equal(model.logits(PROMPTS, [ablate]), before_ablated)
    assert no_hooks_anywhere(model.hf_model)


def test_load_inside_the_context(tokenizer):
    """The docstring's recipe: swap the HF model, then wrap it."""
    target, donor = llama_width_mamba2(), tiny_model("llama", seed=1)
    with gna.swap_layers(target, donor, {1: 2}) as swapped:
        model = gna.load(swapped, tokenizer=tokenizer, backend="nnsight")
        batch = model.to_batch(PROMPTS)
        got = model.logits(PROMPTS)
    expected = donor_forward_reference(target, donor, 1, 2, batch.input_ids, batch.attention_mask)
    assert (got - expected).abs().max() < 1e-5


def test_cross_family_swap_refuses_transformer_lens(tokenizer):
    model = gna.load(tiny_model("llama", seed=0), tokenizer=tokenizer, backend="tlens")
    with pytest.raises(ValueError, match="backend='nnsight'"), gna.swap_layers(model, llama_width_mamba2(), [1]):
        pass


@pytest.mark.parametrize("backend", ["tlens", "nnsight"])
def test_donor_may_be_a_gna_model(backend, tokenizer):
    """The donor's blocks are read through the backend's wrapping (TransformerLens nests
    them) and left as they were. TransformerLens switches the donor to eager attention,
    which the copied block keeps: padding positions differ from the sdpa reference, real
    tokens agree to float error."""
    pristine = tiny_model("llama", seed=1)
    donor = gna.load(copy.deepcopy(pristine), tokenizer=tokenizer, backend=backend)
    donor_before = donor.logits(PROMPTS)
    same, cross = tiny_model("llama", seed=0), llama_width_mamba2()
    expected_same = load_state_dict_reference(same, pristine, {1: 2})
    expected_cross = donor_forward_reference(cross, pristine, 0, 2)
    with gna.swap_layers(same, donor, {1: 2}):
        assert (logits(same) - expected_same).abs().max() <= EXACT
    with gna.swap_layers(cross, donor, {0: 2}):
        assert (logits(cross) - expected_cross)[MASK.bool()].abs().max() < 1e-5
    assert torch.equal(donor.logits(PROMPTS), donor_before)


@pytest.mark.parametrize("family", ["granitemoehybrid", "bamba"])
def test_cross_family_swap_on_a_hybrid_gna_model(family, tokenizer):
    """Llama's block at a hybrid's Mamba layer 0; a head of its attention layer 1 ablated."""
    from gna_interp.models.registry import known_model_types

    if family not in known_model_types():
        pytest.skip(f"{family} has no row in the architecture table")
    hf, donor = hybrid(family), tiny_model("llama", seed=1)
    pristine = copy.deepcopy(hf)
    model = gna.load(hf, tokenizer=tokenizer, backend="nnsight")
    batch = model.to_batch(PROMPTS)
    ablate = gna.Ablate([gna.Head(1, 4)])

    def zero_head_4(module, args):
        x = args[0].clone()
        x[..., 4 * 8 : 5 * 8] = 0  # head_dim 48 / 6
        return (x,)

    head_hook = [(layers_of(pristine)[1].self_attn.o_proj, zero_head_4)]
    expected = donor_forward_reference(pristine, donor, 0, 1, batch.input_ids, batch.attention_mask)
    expected_ablated = donor_forward_reference(pristine, donor, 0, 1, batch.input_ids, batch.attention_mask, target_pre_hooks=head_hook)
    real = batch.attention_mask.bool()
    with gna.swap_layers(model, donor, {0: 1}):
        assert (model.logits(PROMPTS) - expected)[real].abs().max() < 1e-5
        assert (model.logits(PROMPTS, [ablate]) - expected_ablated)[real].abs().max() < 1e-5


# ----- foreign layers: what a GnaModel reports at a layer holding another family's block ----


def zero_mamba2_head(head: int, head_dim: int = 16):
    def hook(module, args):
        x = args[0].clone()
        x[..., head * head_dim : (head + 1) * head_dim] = 0
        return (x,)

    return hook


def test_a_model_loaded_inside_the_context_knows_its_foreign_layer(tokenizer):
    """The docstring's recipe: the loaded model finds the swapped-in block, reports no heads
    there, refuses a head there clearly, and runs heads elsewhere, Resid and SkipLayers."""
    target, donor = llama_width_mamba2(), tiny_model("llama", seed=1)
    ablate = gna.Ablate([gna.Head(0, 3)])
    with gna.swap_layers(target, donor, {1: 2}) as swapped:
        model = gna.load(swapped, tokenizer=tokenizer)  # the default backend for Mamba-2 is nnsight
        assert model.foreign_layers == {1: "llama"}
        assert model.layer_kinds == (gna.LayerKind.SSM, gna.LayerKind.MLP)
        assert model.heads_per_layer == (6, 0)
        assert model.heads == [gna.Head(0, h) for h in range(6)]
        assert model.n_heads == 6 and model.head_sites(1) == []
        with pytest.raises(ValueError, match="holds a swapped-in llama block") as error:
            model.logits(PROMPTS, [gna.Ablate([gna.Head(1, 0)])])
        assert "Resid(1)" in str(error.value) and "SkipLayers(1)" in str(error.value)
        with pytest.raises(ValueError, match="holds a swapped-in llama block"), model.ablated([gna.Head(1, 0)]):
            pass
        batch = model.to_batch(PROMPTS)
        got, got_ablated = model.logits(PROMPTS), model.logits(PROMPTS, [ablate])
        got_skipped = model.logits(PROMPTS, [gna.SkipLayers(1)])
        resid = model.cache(PROMPTS, [gna.Resid(1), gna.Resid(2)])
    ids, mask = batch.input_ids, batch.attention_mask
    head_hook = [(layers_of(target)[0].mixer.out_proj, zero_mamba2_head(3))]
    assert (got - donor_forward_reference(target, donor, 1, 2, ids, mask)).abs().max() < 1e-5
    assert (got_ablated - donor_forward_reference(target, donor, 1, 2, ids, mask, target_pre_hooks=head_hook)).abs().max() < 1e-5
    assert not torch.allclose(got, got_ablated)
    skip = layers_of(target)[1].register_forward_hook(lambda m, args, out: args[0])
    try:
        assert (got_skipped - logits(target, ids, mask)).abs().max() < 1e-5
    finally:
        skip.remove()
    assert resid[gna.Resid(1)].shape == resid[gna.Resid(2)].shape == (*ids.shape, 48)


def test_transformer_lens_refuses_a_model_holding_another_familys_block(tokenizer):
    target, donor = tiny_model("llama", seed=0), llama_width_mamba2()
    with gna.swap_layers(target, donor, [1]) as swapped:
        with pytest.raises(ValueError, match=r"backend='tlens' cannot wrap .*layer 1: mamba2.*backend='nnsight'"):
            gna.load(swapped, tokenizer=tokenizer, backend="tlens")
        model = gna.load(swapped, tokenizer=tokenizer)  # default: nnsight, where Llama's default is tlens
        assert model.backend_name == "nnsight" and model.foreign_layers == {1: "mamba2"}
        assert model.heads_per_layer == (6, 0, 6)
    again = gna.load(target, tokenizer=tokenizer)
    assert again.backend_name == "tlens" and again.foreign_layers == {} and again.heads_per_layer == (6, 6, 6)


@pytest.mark.parametrize("how", ["swap a GnaModel", "load inside"])
def test_ablation_sweep_skips_the_foreign_layer(how, tokenizer):
    """Every head by default: NaN at the swapped layer, elsewhere each head ablated alone."""
    hf, donor = tiny_model("mamba2", seed=2, hidden_size=48, num_heads=6, num_hidden_layers=3), tiny_model("llama", seed=1)

    def metric(out):
        return out[:, -1, 5] - out[:, -1, 7]

    with gna.swap_layers(gna.load(hf, tokenizer=tokenizer) if how == "swap a GnaModel" else hf, donor, [1]) as swapped:
        model = swapped if how == "swap a GnaModel" else gna.load(swapped, tokenizer=tokenizer)
        sweep = gna.ablation_sweep(model, PROMPTS, None, metric, progress=False)
        alone = {head: float(metric(model.logits(PROMPTS, [gna.Ablate([head])])).mean()) for head in model.heads}
        baseline = float(metric(model.logits(PROMPTS)).mean())
    assert sorted({head.layer for head in alone}) == [0, 2] and len(alone) == 12
    assert sweep.scores.shape == (3, 6)
    assert sweep.scores[1].isnan().all() and not sweep.scores[[0, 2]].isnan().any()
    assert abs(sweep.baseline - baseline) < 1e-5
    for head, value in alone.items():
        assert abs(float(sweep.scores[head.layer, head.head]) - value) < 1e-5, head
    assert len({round(v, 4) for v in alone.values()}) > 1  # ablations do differ


def hybrid_with_two_attention_layers(family: str):
    """Mamba-2 layers 0 and 2, attention layers 1 and 3, Llama's hidden size."""
    if family == "bamba":
        return tiny_model("bamba", seed=3, hidden_size=48, num_hidden_layers=4, attn_layer_indices=[1, 3])
    kinds = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
    return tiny_model("granitemoehybrid", seed=3, hidden_size=48, num_hidden_layers=4, layer_types=kinds)


@pytest.mark.parametrize("family", ["bamba", "granitemoehybrid"])
@pytest.mark.parametrize("swapped_layer", [0, 1], ids=["into a mamba layer", "into an attention layer"])
def test_mask_attention_rows_covers_the_remaining_attention_layers(family, swapped_layer, tokenizer):
    model = gna.load(hybrid_with_two_attention_layers(family), tokenizer=tokenizer)
    kinds, counts = model.layer_kinds, model.heads_per_layer
    specs, heads = model.layer_specs, model.heads
    assert [kind.value for kind in kinds] == ["ssm", "attention", "ssm", "attention"]
    remaining = [layer for layer in (1, 3) if layer != swapped_layer]
    with gna.swap_layers(model, tiny_model("llama", seed=1), [swapped_layer]):
        assert model.foreign_layers == {swapped_layer: "llama"}
        assert model.layer_kinds[swapped_layer] is gna.LayerKind.MLP and model.heads_per_layer[swapped_layer] == 0
        assert all(head.layer != swapped_layer for head in model.heads)
        clean = model.logits(PROMPTS)
        masked = model.logits(PROMPTS, [gna.MaskAttentionRows(-1)])
        explicit = model.logits(PROMPTS, [gna.MaskAttentionRows(-1, layers=remaining)])
        assert torch.equal(masked, explicit)
        assert (masked[:, -1] - clean[:, -1]).abs().max() > 1e-4
        if swapped_layer in (1, 3):
            with pytest.raises(ValueError, match="holds a swapped-in llama block"):
                model.logits(PROMPTS, [gna.MaskAttentionRows(-1, layers=[swapped_layer])])
    # Leaving the context: the model describes its own layers again.
    assert model.foreign_layers == {}
    assert model.layer_kinds == kinds and model.heads_per_layer == counts
    assert model.layer_specs is specs and model.heads == heads
    assert model.logits(PROMPTS, [gna.Ablate([gna.Head(swapped_layer, 0)])]).shape == clean.shape
