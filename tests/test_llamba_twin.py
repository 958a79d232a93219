"""The pure-PyTorch Llamba twin (`gna_interp.models.llamba`) against Cartesia's naming and
against the Discrete Mamba-2 equations written out here (a quadratic form, not a scan)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gna_interp.models.llamba import DiscreteMamba2, LlambaConfig, LlambaHFLMHeadModel, LlambaLMHeadModel, tiny_llamba


def cartesia_shapes(trunk: str, d: int, layers: int, vocab: int, inner: int, heads: int, qk: int, state: int, mlp: int) -> dict:
    """Cartesia's parameter names and shapes, written from its module tree (no bias anywhere,
    ``z_bias`` because ``bias=False``, conv width 4 with a bias)."""
    conv = inner + 2 * qk * state
    shapes = {f"{trunk}.embedding.weight": (vocab, d), f"{trunk}.final_layernorm.weight": (d,), "lm_head.weight": (vocab, d)}
    for i in range(layers):
        p = f"{trunk}.layers.{i}."
        shapes.update(
            {
                p + "mixer.in_proj.weight": (conv + inner + heads, d),
                p + "mixer.z_bias": (inner,),
                p + "mixer.conv1d.weight": (conv, 1, 4),
                p + "mixer.conv1d.bias": (conv,),
                p + "mixer.D": (heads,),
                p + "mixer.out_proj.weight": (d, inner),
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
                p + "mlp.gate_proj.weight": (mlp, d),
                p + "mlp.up_proj.weight": (mlp, d),
                p + "mlp.down_proj.weight": (d, mlp),
            }
        )
    return shapes


@pytest.mark.parametrize("cls,trunk", [(LlambaLMHeadModel, "backbone"), (LlambaHFLMHeadModel, "model")])
def test_state_dict_in_cartesia_naming_loads_strict(cls, trunk):
    config = LlambaConfig(
        vocab_size=61,  # padded to 64
        d_model=16,
        n_layer=2,
        mlp_cfg={"intermediate_size": 24, "bias": False, "act_fn": "silu"},
        ssm_cfg={"d_state": 4, "n_v_heads": 4, "n_qk_heads": 2, "expand": 2, "chunk_size": 8, "activation": "identity", "bias": False},
    )
    model = cls(config)
    assert model.config.vocab_size == 64
    shapes = cartesia_shapes(trunk, d=16, layers=2, vocab=64, inner=32, heads=4, qk=2, state=4, mlp=24)
    generator = torch.Generator().manual_seed(0)
    state = {name: torch.randn(shape, generator=generator) for name, shape in shapes.items()}
    model.load_state_dict(state, strict=True)
    assert torch.equal(model.get_submodule(f"{trunk}.layers.1.mixer").z_bias, state[f"{trunk}.layers.1.mixer.z_bias"])


def reference_mixer(mixer: DiscreteMamba2, u: torch.Tensor) -> torch.Tensor:
    """The mixer from its equations: ``y = M x + D x`` with the full ``M`` built at once."""
    n_pos = u.shape[1]
    inner, qk, n, heads = mixer.d_inner, mixer.n_qk_heads, mixer.d_state, mixer.n_v_heads
    proj = u @ mixer.in_proj.weight.T
    xbc, z, a_log = proj[..., : inner + 2 * qk * n], proj[..., inner + 2 * qk * n : -heads], proj[..., -heads:]
    padded = F.pad(xbc, (0, 0, 3, 0))  # causal: three zeros before the first position
    kernel = mixer.conv1d.weight[:, 0, :]  # [channel, 4]
    conv = sum(padded[:, k : k + n_pos] * kernel[:, k] for k in range(4)) + mixer.conv1d.bias
    x = conv[..., :inner].unflatten(-1, (heads, -1))
    b = conv[..., inner : inner + qk * n].unflatten(-1, (qk, n)).repeat_interleave(heads // qk, dim=2)
    c = conv[..., inner + qk * n :].unflatten(-1, (qk, n)).repeat_interleave(heads // qk, dim=2)
    a = F.softplus(a_log)  # [batch, pos, head]
    cum = torch.cumsum(a.double(), dim=1)
    seg = cum[:, :, None, :] - cum[:, None, :, :]  # [batch, t, s, head] = sum_{k=s+1..t} a_k
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool).tril()[None, :, :, None]
    decay = torch.where(causal, torch.exp(-seg.clamp(min=0)), torch.zeros(()).double()).float()
    scores = torch.einsum("bthn,bshn->btsh", c, b) * decay
    y = torch.einsum("btsh,bshp->bthp", scores, x) + mixer.D[:, None] * x
    return (y.flatten(2) * F.silu(z + mixer.z_bias)) @ mixer.out_proj.weight.T


def test_mixer_equals_its_equations():
    model = tiny_llamba(seed=3)
    mixer = model.backbone.layers[1].mixer
    u = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = mixer(u)["hidden_states"]
        expected = reference_mixer(mixer, u)
    assert (out - expected).abs().max().item() < 1e-5


def test_mixer_alone_with_silu_and_groups():
    """The mixer as a standalone module (what hybrid students build on)."""
    torch.manual_seed(0)
    mixer = DiscreteMamba2(d_model=24, d_state=4, n_qk_heads=1, n_v_heads=3, expand=2, activation="silu")
    assert (mixer.headdim, mixer.in_proj.out_features) == (16, 48 + 8 + 48 + 3)
    u = torch.randn(1, 5, 24)
    with torch.no_grad():
        parts = mixer.ssm_inputs(u)
        x_silu = parts["x"]
    assert float(x_silu.min()) > -0.3  # silu's floor is about -0.278: the activation ran
    with pytest.raises(ValueError, match=r"n_v_heads=5 must divide d_inner=48"):
        DiscreteMamba2(d_model=24, n_v_heads=5, n_qk_heads=1, expand=2)


def test_first_release_forward_takes_no_mask():
    model = tiny_llamba()
    ids = torch.tensor([[1, 5, 6]])
    with pytest.raises(TypeError, match=r"takes no \['attention_mask'\]"):
        model(ids, attention_mask=torch.ones_like(ids))
    hf = tiny_llamba(hf_style=True)
    hf.load_state_dict({key.replace("backbone.", "model.", 1): value for key, value in model.state_dict().items()}, strict=True)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, hf(ids).logits)
        assert torch.equal(hf(ids, attention_mask=torch.ones_like(ids)).logits, hf(ids).logits)
