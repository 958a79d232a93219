"""A pure-PyTorch Llamba twin: Cartesia's Llamba (Llama distilled into Discrete Mamba-2
mixers) with the same module tree, parameter names and shapes, and a sequential scan
in place of mamba-ssm's Triton kernel, so it runs on a CPU.

Two namings, as Cartesia shipped them:

- `LlambaLMHeadModel` (the first release, ``cartesia_pytorch``): ``backbone.embedding``,
  ``backbone.layers[i]``, ``backbone.final_layernorm``, ``lm_head``; a block returns
  ``{"hidden_states": ...}``; ``forward(input_ids)`` takes no attention mask.
- `LlambaHFLMHeadModel` (the later HF-style version): the trunk is ``model`` instead of
  ``backbone``; a block returns ``(hidden_states,)``; ``forward`` accepts an
  ``attention_mask`` and multiplies each block's normed input by it (which does not
  keep padding out of the SSM state: the conv bias still writes there).

Each block: ``input_layernorm`` -> ``mixer`` (residual) -> ``post_attention_layernorm``
-> ``mlp`` (residual). The mixer (`DiscreteMamba2`), per token ``t`` and value head ``h``
(its qk head ``g = h // (n_v_heads / n_qk_heads)``)::

    [xBC | z | A_log] = in_proj(u)
    [x | B | C] = act(causal depthwise conv1d(xBC))
    a_t = softplus(A_log_t)
    h_t = exp(-a_t) h_{t-1} + x_t B_{t,g}^T                # [head_dim, d_state]
    y_t = h_t C_{t,g} + D_h x_t
    out = out_proj(y * silu(z + z_bias))

so ``y = M x + D x`` with ``M[t, s] = (C_t . B_s) exp(-sum_{k=s+1..t} a_k)`` for ``s <= t``.
The mixer is usable alone (hybrid students build on it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PretrainedConfig

from ..core.errors import GnaTypeError, GnaValueError

LLAMBA_SSM_DEFAULTS: dict[str, Any] = {
    "d_state": 64,
    "n_v_heads": 32,
    "n_qk_heads": 32,
    "expand": 1,
    "chunk_size": 128,
    "activation": "identity",
    "bias": False,
}
LLAMBA_MLP_DEFAULTS: dict[str, Any] = {"intermediate_size": 14336, "bias": False, "act_fn": "silu"}


class LlambaConfig(PretrainedConfig):
    """Cartesia's ``LlambaConfig`` fields (``model_type = "llamba"``); defaults are Llamba-8B's
    but for ``vocab_size`` and ``d_model``, which Cartesia requires too.

    Args:
        vocab_size: vocabulary size before padding (the model pads it up to a multiple of
            ``pad_vocab_size_multiple`` and writes the padded size back here).
        d_model: the residual width.
        tie_embeddings: the LM head reuses the embedding matrix.
        pad_vocab_size_multiple: see ``vocab_size``.
        lm_head_bias: the LM head has a bias.
        n_layer: number of blocks.
        resid_dropout: unused at inference (kept for Cartesia's field list).
        norm_epsilon: the final norm's epsilon (the first release's block norms use 1e-5).
        mlp_cfg: ``{"intermediate_size", "bias", "act_fn"}``.
        ssm_cfg: ``{"d_state", "n_v_heads", "n_qk_heads", "expand", "chunk_size",
            "activation", "bias"}`` (and optionally ``"d_conv"``, ``"conv_bias"``).
    """

    model_type = "llamba"

    def __init__(
        self,
        vocab_size: int = 128256,
        d_model: int = 4096,
        tie_embeddings: bool = False,
        pad_vocab_size_multiple: int = 8,
        lm_head_bias: bool = False,
        n_layer: int = 32,
        resid_dropout: float = 0.0,
        norm_epsilon: float = 1e-5,
        mlp_cfg: dict[str, Any] | None = None,
        ssm_cfg: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.tie_embeddings = tie_embeddings
        self.pad_vocab_size_multiple = pad_vocab_size_multiple
        self.lm_head_bias = lm_head_bias
        self.d_model = d_model
        self.n_layer = n_layer
        self.resid_dropout = resid_dropout
        self.norm_epsilon = norm_epsilon
        self.mlp_cfg = dict(mlp_cfg) if mlp_cfg else dict(LLAMBA_MLP_DEFAULTS)
        self.ssm_cfg = dict(ssm_cfg) if ssm_cfg else dict(LLAMBA_SSM_DEFAULTS)


def padded_vocab_size(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple`` (Cartesia's padding)."""
    return vocab_size + (-vocab_size) % multiple


class RMSNorm(nn.Module):
    """Llama's RMS norm (parameter ``weight`` ``[hidden]``), computed in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: Tensor) -> Tensor:
        """``[batch, pos, hidden]`` -> same shape."""
        dtype = hidden_states.dtype
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class GatedMLP(nn.Module):
    """Llama's MLP: ``down_proj(act(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, act_fn: str = "silu") -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = ACT2FN[act_fn]

    def forward(self, x: Tensor) -> Tensor:
        """``[batch, pos, hidden]`` -> same shape."""
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def discrete_mamba2_scan(x: Tensor, a: Tensor, B: Tensor, C: Tensor) -> Tensor:
    """The reference recurrence, one step per position, in float32.

    Args:
        x: ``[batch, pos, head, head_dim]`` SSM inputs (after the conv).
        a: ``[batch, pos, head]`` decays ``softplus(A_log)``.
        B, C: ``[batch, pos, head, d_state]`` (each value head's qk head).

    Returns:
        ``[batch, pos, head, head_dim]``: ``y_t = h_t C_t`` with
        ``h_t = exp(-a_t) h_{t-1} + x_t B_t^T`` (no skip term).
    """
    n_rows, n_pos, n_heads, head_dim = x.shape
    state = x.new_zeros(n_rows, n_heads, head_dim, B.shape[-1], dtype=torch.float32)
    decay = torch.exp(-a.float())
    outputs = []
    for t in range(n_pos):
        state = decay[:, t, :, None, None] * state + x[:, t, :, :, None].float() * B[:, t, :, None, :].float()
        outputs.append((state * C[:, t, :, None, :].float()).sum(-1))
    return torch.stack(outputs, dim=1) if outputs else x.float()


class DiscreteMamba2(nn.Module):
    """Llamba's token mixer (Discrete Mamba-2), with Cartesia's submodules and parameters:
    ``in_proj``, ``z_bias``, ``conv1d``, ``act``, ``D``, ``out_proj``.

    Args:
        d_model: input and output width.
        d_state: state size per qk head.
        n_qk_heads: heads of ``B`` / ``C``; each serves ``n_v_heads // n_qk_heads`` value heads.
        n_v_heads: value heads (the heads of head ablation); ``head_dim = expand * d_model // n_v_heads``.
        d_conv: the causal conv's width.
        expand: ``d_inner = expand * d_model``.
        activation: after the conv: ``"identity"`` (Llamba) or ``"silu"``.
        bias: ``in_proj`` / ``out_proj`` biases (then there is no ``z_bias`` parameter).
        conv_bias: the conv has a bias.
        chunk_size: the GPU kernel's chunk (kept as an attribute; the scan here is sequential).
        layer_idx: the block index (kept as an attribute).
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        n_qk_heads: int = 32,
        n_v_heads: int = 32,
        d_conv: int = 4,
        expand: int = 1,
        activation: str = "identity",
        bias: bool = False,
        conv_bias: bool = True,
        chunk_size: int = 128,
        layer_idx: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = expand * d_model
        self.n_qk_heads, self.n_v_heads = n_qk_heads, n_v_heads
        if self.d_inner % n_v_heads or n_v_heads % n_qk_heads:
            raise GnaValueError(
                f"DiscreteMamba2: n_v_heads={n_v_heads} must divide d_inner={self.d_inner} (expand * d_model) "
                f"and be a multiple of n_qk_heads={n_qk_heads}"
            )
        if activation not in ("identity", "silu", "swish"):
            raise GnaValueError(f"DiscreteMamba2: activation={activation!r}, expected 'identity', 'silu' or 'swish'")
        self.headdim = self.d_inner // n_v_heads
        self.activation, self.chunk_size, self.layer_idx, self.bias = activation, chunk_size, layer_idx, bias
        self.conv_dim = self.d_inner + 2 * n_qk_heads * d_state
        self.in_proj = nn.Linear(d_model, self.conv_dim + self.d_inner + n_v_heads, bias=bias)
        self.z_bias: Tensor | float = nn.Parameter(torch.zeros(self.d_inner)) if not bias else 0.0
        self.conv_bias = conv_bias
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, padding=d_conv - 1, bias=conv_bias)
        self.act: nn.Module = nn.Identity() if activation == "identity" else nn.SiLU()
        self.D = nn.Parameter(torch.ones(n_v_heads))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)

    def split_projection(self, projected: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``in_proj`` output ``[batch, pos, conv_dim + d_inner + n_v_heads]`` ->
        ``xBC [.., conv_dim]``, ``z [.., d_inner]``, ``A_log [.., n_v_heads]``."""
        xBC, z, A_log = projected.split([self.conv_dim, self.d_inner, self.n_v_heads], dim=-1)
        return xBC, z, A_log

    def pad_guard(self, projected: Tensor, padding_mask: Tensor) -> Tensor:
        """Llamba's pad guard (`gna_interp.models.mixers.discrete_mamba2_pad_guard`) on
        this mixer's ``in_proj`` output ``[batch, pos, cols]`` for ``padding_mask [batch,
        pos]`` (1 on real tokens, left padding): zeroed ``x``, ``B``, ``C`` on padding and
        the state cleared at each row's first real token. Idempotent."""
        from ..core.dims import Mamba2Dims
        from .mixers import discrete_mamba2_pad_guard

        dims = Mamba2Dims(heads=self.n_v_heads, head_dim=self.headdim, groups=self.n_qk_heads, state=self.d_state)
        return discrete_mamba2_pad_guard(projected, dims, padding_mask)  # type: ignore[no-any-return]

    def ssm_inputs(self, u: Tensor, padding_mask: Tensor | None = None) -> dict[str, Tensor]:
        """The scan's inputs for ``u [batch, pos, d_model]``: ``x [batch, pos, head,
        head_dim]``, ``B`` / ``C`` ``[batch, pos, qk head, d_state]``, ``a [batch, pos,
        head]`` (``softplus(A_log)``) and ``z [batch, pos, d_inner]``; with
        ``padding_mask [batch, pos]`` (1 on real tokens) of a padded batch, after
        `pad_guard`."""
        n_rows, n_pos, _ = u.shape
        projected = self.in_proj(u)
        if padding_mask is not None and not bool(padding_mask.bool().all()):
            projected = self.pad_guard(projected, padding_mask)
        xBC, z, A_log = self.split_projection(projected)
        xBC = self.act(self.conv1d(xBC.transpose(1, 2))[..., :n_pos].transpose(1, 2))
        x, B, C = xBC.split([self.d_inner, self.n_qk_heads * self.d_state, self.n_qk_heads * self.d_state], dim=-1)
        return {
            "x": x.reshape(n_rows, n_pos, self.n_v_heads, self.headdim),
            "B": B.reshape(n_rows, n_pos, self.n_qk_heads, self.d_state),
            "C": C.reshape(n_rows, n_pos, self.n_qk_heads, self.d_state),
            "a": F.softplus(A_log.float()),
            "z": z,
        }

    def forward(self, u: Tensor, inference_params: Any = None, padding_mask: Tensor | None = None, **kwargs: Any) -> dict[str, Tensor]:
        """``u [batch, pos, d_model]`` -> ``{"hidden_states": [batch, pos, d_model]}``.
        ``padding_mask [batch, pos]`` (1 on real tokens; optional): a left-padded row's
        real tokens get the numbers the row gives alone (`pad_guard`)."""
        if inference_params is not None:
            raise NotImplementedError("the CPU twin runs whole sequences only (inference_params must be None)")
        n_rows, n_pos, _ = u.shape
        parts = self.ssm_inputs(u, padding_mask)
        x = parts["x"]
        group = self.n_v_heads // self.n_qk_heads
        B, C = (parts[name].repeat_interleave(group, dim=2) for name in ("B", "C"))
        y = discrete_mamba2_scan(x, parts["a"], B, C) + self.D.float()[:, None] * x.float()
        y = y.to(u.dtype).reshape(n_rows, n_pos, self.d_inner)
        return {"hidden_states": self.out_proj(y * F.silu(parts["z"] + self.z_bias))}


class LlambaBlock(nn.Module):
    """``input_layernorm`` -> ``mixer`` (+ residual) -> ``post_attention_layernorm`` -> ``mlp``
    (+ residual). ``hf_style``: returns ``(hidden_states,)`` and multiplies the normed
    input by an ``attention_mask`` when given; else returns ``{"hidden_states": ...}``."""

    def __init__(self, config: LlambaConfig, layer_idx: int, hf_style: bool = False) -> None:
        super().__init__()
        self.layer_idx, self.hf_style = layer_idx, hf_style
        self.mixer = DiscreteMamba2(d_model=config.d_model, layer_idx=layer_idx, **config.ssm_cfg)
        eps = config.norm_epsilon if hf_style else 1e-5
        self.input_layernorm = RMSNorm(config.d_model, eps=eps)
        self.post_attention_layernorm = RMSNorm(config.d_model, eps=eps)
        self.mlp = GatedMLP(config.d_model, **config.mlp_cfg)

    def forward(self, hidden_states: Tensor, inference_params: Any = None, attention_mask: Tensor | None = None, **kwargs: Any) -> Any:
        """``[batch, pos, d_model]`` -> the same shape, as a dict or a 1-tuple."""
        residual = hidden_states
        normed = self.input_layernorm(hidden_states)
        if self.hf_style and attention_mask is not None:
            normed = normed * attention_mask[..., None].to(normed.dtype)
        hidden_states = self.mixer(normed, inference_params=inference_params)["hidden_states"].to(residual.dtype) + residual
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return (hidden_states,) if self.hf_style else {"hidden_states": hidden_states}


class LlambaTrunk(nn.Module):
    """``embedding``, ``layers``, ``final_layernorm`` (Cartesia's ``MixerModel`` / ``LlambaModel``)."""

    def __init__(self, config: LlambaConfig, hf_style: bool = False) -> None:
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(LlambaBlock(config, i, hf_style) for i in range(config.n_layer))
        self.final_layernorm = RMSNorm(config.d_model, eps=config.norm_epsilon)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``[batch, pos]`` ids -> ``[batch, pos, d_model]`` after the final norm."""
        hidden = self.embedding(input_ids)
        for layer in self.layers:
            out = layer(hidden, attention_mask=attention_mask)
            hidden = out[0] if isinstance(out, tuple) else out["hidden_states"]
        return self.final_layernorm(hidden)


@dataclass
class LlambaOutput:
    """What the model returns: ``logits [batch, pos, vocab]`` (float32)."""

    logits: Tensor


class _LlambaBase(nn.Module):
    trunk_name = "backbone"
    hf_style = False

    def __init__(self, config: LlambaConfig | dict[str, Any]) -> None:
        super().__init__()
        if not isinstance(config, LlambaConfig):
            config = LlambaConfig(**config)
        config.vocab_size = padded_vocab_size(int(config.vocab_size), int(config.pad_vocab_size_multiple))
        self.config = config
        setattr(self, self.trunk_name, LlambaTrunk(config, self.hf_style))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.trunk.embedding.weight

    @property
    def trunk(self) -> LlambaTrunk:
        trunk: LlambaTrunk = getattr(self, self.trunk_name)
        return trunk

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, **kwargs: Any) -> LlambaOutput:
        """``input_ids [batch, pos]`` -> `LlambaOutput` with ``logits [batch, pos, vocab]``."""
        hidden = self.trunk(input_ids, attention_mask=kwargs.get("attention_mask") if self.hf_style else None)
        return LlambaOutput(logits=self.lm_head(hidden).float())


class LlambaLMHeadModel(_LlambaBase):
    """Cartesia's first release: ``backbone.*`` and ``lm_head``; ``forward(input_ids)``
    takes no attention mask (passing one raises, as Cartesia's does)."""

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, **kwargs: Any) -> LlambaOutput:  # type: ignore[override]
        """``input_ids [batch, pos]`` -> `LlambaOutput` with ``logits [batch, pos, vocab]``."""
        if kwargs:
            raise GnaTypeError(f"LlambaLMHeadModel.forward() takes no {sorted(kwargs)} (Cartesia's forward has no attention mask)")
        return super().forward(input_ids, position_ids)


class LlambaHFLMHeadModel(_LlambaBase):
    """The HF-style naming: ``model.*`` and ``lm_head``; ``forward(input_ids,
    attention_mask=None)``."""

    trunk_name = "model"
    hf_style = True


def tiny_llamba(seed: int = 0, vocab_size: int = 64, hf_style: bool = False, **overrides: Any) -> _LlambaBase:
    """A random Llamba-shaped twin (eval mode, float32): 3 blocks of 4 value heads of 8
    over 2 qk heads, state 8; weights spread so that every head, ``D`` and ``z_bias`` matter."""
    ssm = {"d_state": 8, "n_v_heads": 4, "n_qk_heads": 2, "expand": 1, "chunk_size": 8, "activation": "identity", "bias": False}
    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        d_model=32,
        n_layer=3,
        pad_vocab_size_multiple=8,
        mlp_cfg={"intermediate_size": 64, "bias": False, "act_fn": "silu"},
        ssm_cfg=ssm,
    )
    fields.update(overrides)
    torch.manual_seed(seed)
    model = (LlambaHFLMHeadModel if hf_style else LlambaLMHeadModel)(LlambaConfig(**fields))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("layernorm.weight", ".D")):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))
            elif name.endswith("z_bias") or name.endswith("conv1d.weight"):
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return model.eval()


def save_llamba(model: nn.Module, folder: str | Path) -> Path:
    """``config.json`` and ``model.safetensors`` (the state dict in Cartesia's naming) in ``folder``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config: Any = model.config
    (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
    save_file({key: value.contiguous() for key, value in model.state_dict().items()}, str(folder / "model.safetensors"))
    return folder


def load_llamba_folder(folder: str | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """A Llamba checkpoint folder (``config.json`` with ``model_type "llamba"``, and
    ``model.safetensors`` or ``pytorch_model.bin``): Cartesia's ``LlambaLMHeadModel`` when
    ``cartesia_pytorch`` is installed, else the CPU twin (the trunk's name, ``backbone`` or
    ``model``, read from the weights). Weights load strictly: a missing or unexpected
    tensor raises, naming it."""
    folder = Path(folder)
    fields = json.loads((folder / "config.json").read_text())
    fields.pop("model_type", None)  # the class's own
    state = _read_weights(folder)
    hf_style = any(key.startswith("model.") for key in state)
    try:
        from cartesia_pytorch.Llamba.llamba import LlambaLMHeadModel as Cartesia  # type: ignore[import-not-found]
    except ImportError:
        Cartesia = None
    if Cartesia is not None and not hf_style:
        model = Cartesia(fields)
    else:
        model = (LlambaHFLMHeadModel if hf_style else LlambaLMHeadModel)(LlambaConfig(**fields))
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise GnaValueError(
            f"{folder}: the weights do not fit the Llamba its config.json builds: "
            f"missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}"
        )
    return model.to(dtype=dtype).eval() if dtype is not None else model.eval()


def _read_weights(folder: Path) -> dict[str, Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        loaded: dict[str, Tensor] = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return loaded
    raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin (a Llamba checkpoint folder holds one)")
