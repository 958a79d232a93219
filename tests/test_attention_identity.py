"""Issue 3, test 1: the identity that defines implicit attention.

With the SSM inputs ``x`` and output ``y`` captured from a REAL forward of a pristine copy
of the HF model (never loaded into gna), ``sum_s M[t, s] x_s + D x_t`` must reproduce ``y``:

- Mamba-2: ``x`` is the ``hidden_states`` argument of HF's own ``mamba2_chunk_scan`` call
  (recorded by a wrapper around that function, removed afterwards); ``y`` is the input of
  the gated norm (a raw forward pre-hook).
- Mamba-1 / FalconMamba: ``x`` is the input of ``x_proj`` (pre-hook); ``z`` is the gate half
  of ``in_proj``'s output (hook); ``y`` is ``out_proj``'s input (pre-hook) divided by
  ``silu(z)`` (and, without dividing, ``out_proj``'s input = ``(M x + D x) * silu(z)``).

``M`` comes from `gna.attention_pattern` through the nnsight backend. The ``dt``, ``B`` and
``C`` that gna reads are also checked against the arguments of HF's scan call.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import transformers.models.falcon_mamba.modeling_falcon_mamba as hf_falcon_mamba
import transformers.models.mamba.modeling_mamba as hf_mamba
import transformers.models.mamba2.modeling_mamba2 as hf_mamba2

import gna_interp as gna
from gna_interp.models.tiny import tiny_model

from .conftest import PROMPTS
from .recording import hooked, recorded_calls, relative_error

REL = 1e-4
SCAN = {"mamba2": (hf_mamba2, "mamba2_chunk_scan"), "mamba": (hf_mamba, "mamba_selective_scan")}
SCAN["falcon_mamba"] = (hf_falcon_mamba, "mamba_selective_scan")


def recorded_scans(family: str):
    """HF's own scan function wrapped: each call's arguments and result are kept."""
    return recorded_calls(*SCAN[family])


def keep(store: dict, key: tuple, output: bool = False):
    """A raw hook that stores a copy of its module's first input (or its output) under
    ``key`` and returns None, so the forward is left unchanged."""

    def hook(module, args, out=None) -> None:
        store[key] = (out if output else args[0]).detach().clone()

    return hook


def raw_mamba2(hf, batch) -> list[dict[str, torch.Tensor]]:
    """Per layer: ``x``, ``y`` and HF's ``dt``, ``B``, ``C`` (per head), ``D`` from one real forward."""
    layers = hf.backbone.layers
    store: dict = {}
    hooks = [(block.mixer.norm, "pre", keep(store, (i, "y"))) for i, block in enumerate(layers)]
    with recorded_scans("mamba2") as calls, hooked(hooks), torch.no_grad():
        hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    found = []
    for layer, (args, kwargs, out) in enumerate(calls):
        out = out[0] if isinstance(out, tuple) else out  # (output, final state) when HF keeps a cache
        y = store[(layer, "y")]
        assert torch.allclose(out.reshape(y.shape), y), "the recorded scan is not the norm's input"
        x, dt, _, B, C = args[:5]
        group = torch.arange(x.shape[2]) // (x.shape[2] // B.shape[2])
        dt = F.softplus(dt + kwargs["dt_bias"]).clamp(*kwargs["dt_limit"])
        found.append({"x": x, "y": y.view(x.shape), "dt": dt, "B": B[:, :, group], "C": C[:, :, group], "D": kwargs["D"].detach()})
    return found


def raw_mamba1(hf, batch) -> list[dict[str, torch.Tensor]]:
    """Per layer: ``x`` (x_proj input), ``z`` (gate), ``gated`` (out_proj input), HF's ``dt``, ``B``, ``C``, ``D``."""
    store: dict = {}
    hooks = []
    for i, block in enumerate(hf.backbone.layers):
        hooks += [(block.mixer.x_proj, "pre", keep(store, (i, "x"))), (block.mixer.out_proj, "pre", keep(store, (i, "gated")))]
        hooks.append((block.mixer.in_proj, "post", keep(store, (i, "in_proj"), output=True)))
    with recorded_scans(hf.config.model_type) as calls, hooked(hooks), torch.no_grad():
        hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    found = []
    for layer, (args, kwargs, _) in enumerate(calls):
        dt = F.softplus(args[1] + kwargs["delta_bias"][:, None]).transpose(1, 2)
        found.append(
            {
                "x": store[(layer, "x")],
                "gated": store[(layer, "gated")],
                "z": store[(layer, "in_proj")].chunk(2, dim=-1)[1],
                "dt": dt,
                "B": args[3].transpose(1, 2),
                "C": args[4].transpose(1, 2),
                "D": kwargs["D"].detach(),
            }
        )
    return found


# Random tiny Mamba-1 models take tiny steps (dt ~ 0.001..0.1), so y is mostly D x and the
# M part sits near float32's resolution of y; larger steps make the M part count.
LARGER_STEPS = {"time_step_min": 0.05, "time_step_max": 0.5}

MAMBA2_CASES = [  # (seed, chunk_size, n_groups): T = 8 is not a multiple of 3 or 5
    (0, 4, 2),
    (1, 3, 1),
    (2, 5, 4),
    (4, 1, 1),
]


# Longer prompts (token ids, T = 90 > 64): several Mamba-2 chunks, and Mamba-1's blocked full-matrix path.
LONG = [[5 + (7 * i + j) % 50 for i in range(90 - 13 * j)] for j in range(3)]


@pytest.mark.parametrize(("seed", "chunk_size", "n_groups"), MAMBA2_CASES)
def test_mamba2_identity_on_real_forward(seed, chunk_size, n_groups, tokenizer):
    hf = tiny_model("mamba2", seed=seed, chunk_size=chunk_size, n_groups=n_groups)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)
    check_mamba2_identity(hf, model, PROMPTS)


def test_mamba2_identity_long_prompts(tokenizer):
    hf = tiny_model("mamba2", seed=11, chunk_size=16)
    check_mamba2_identity(hf, gna.load(copy.deepcopy(hf), tokenizer=tokenizer), LONG)


def check_mamba2_identity(hf, model, inputs) -> None:
    batch = model.to_batch(inputs)
    assert not batch.attention_mask.all(), "the batch must be left-padded"
    heads = [gna.Head(layer, h) for layer in range(model.n_layers) for h in range(model.n_heads)]
    patterns = gna.attention_pattern(model, inputs, heads).unflatten(1, (model.n_layers, model.n_heads))
    with_skip = gna.attention_pattern(model, inputs, heads, include_skip=True).unflatten(1, (model.n_layers, model.n_heads))
    for layer, raw in enumerate(raw_mamba2(hf, batch)):
        M, x, y = patterns[:, layer], raw["x"], raw["y"]
        mixed = torch.einsum("bhts,bshp->bthp", M, x)
        assert relative_error(mixed + raw["D"][:, None] * x, y) < REL
        assert relative_error(mixed, y - raw["D"][:, None] * x) < REL, "the M part alone (D x is large in tiny models)"
        assert relative_error(torch.einsum("bhts,bshp->bthp", with_skip[:, layer], x), y) < REL
        assert (M - with_skip[:, layer]).abs().max() > 1e-2, "D must matter: the skip test could not fail"

        ssm = gna.attention.ssm_inputs(model, inputs, layer)  # what gna read equals HF's scan arguments
        for field in ("dt", "B", "C", "D"):
            assert torch.allclose(getattr(ssm, field), raw[field], atol=1e-6), field
        assert relative_error(gna.attention.ssm_output_loop(ssm, x), y) < REL


@pytest.mark.parametrize(
    ("family", "seed", "long"), [("mamba", 0, False), ("mamba", 1, True), ("falcon_mamba", 2, False), ("falcon_mamba", 3, True)]
)
def test_mamba1_identity_on_real_forward(family, seed, long, tokenizer):
    hf = tiny_model(family, seed=seed, **LARGER_STEPS)
    model = gna.load(copy.deepcopy(hf), tokenizer=tokenizer)
    inputs = LONG if long else PROMPTS
    batch = model.to_batch(inputs)
    assert not batch.attention_mask.all(), "the batch must be left-padded"
    heads = [gna.Head(layer, c) for layer in range(model.n_layers) for c in range(model.n_heads)]
    patterns = gna.attention_pattern(model, inputs, heads).unflatten(1, (model.n_layers, model.n_heads))
    for layer, raw in enumerate(raw_mamba1(hf, batch)):
        x = raw["x"]
        mixed = torch.einsum("bcts,bsc->btc", patterns[:, layer], x)
        predicted = mixed + raw["D"] * x
        gate = F.silu(raw["z"])
        assert relative_error(predicted * gate, raw["gated"]) < REL
        assert relative_error(mixed * gate, raw["gated"] - raw["D"] * x * gate) < REL, "the M part alone"
        well_conditioned = gate.abs() > 0.1
        assert well_conditioned.float().mean() > 0.3, "too few entries to check the division form"
        divided = raw["gated"][well_conditioned] / gate[well_conditioned]
        assert relative_error(predicted[well_conditioned], divided) < REL

        ssm = gna.attention.ssm_inputs(model, inputs, layer)
        for field in ("dt", "B", "C", "D"):
            assert torch.allclose(getattr(ssm, field), raw[field], atol=1e-6), field


def test_scan_wrapper_is_removed():
    assert hf_mamba2.mamba2_chunk_scan.__name__ != "recording"
    with pytest.raises(RuntimeError), recorded_scans("mamba2"):
        raise RuntimeError("boom")
    assert hf_mamba2.mamba2_chunk_scan.__name__ != "recording"
