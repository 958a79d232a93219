"""Hybrid students (Bick, Xing, Gu 2026): a Llama teacher's layers with a few of its
attention heads kept and a Discrete Mamba-2 mixer (`gna_interp.models.llamba.DiscreteMamba2`)
beside them, in every layer.

`hybridize(teacher, keep)` builds one. Each student block::

    u = input_layernorm(h)                                  # the teacher's norm
    s = mixer(u)                                            # Discrete Mamba-2, [batch, pos, d_model]
    a = self_attn(u)                                        # the kept heads only (the teacher's q/k/v/o slices)
    a' = (a - mean(a)) / std(a) * std(s) + mean(s)          # per token, over d_model
    h = h + (s + attn_map(a')) / 2                          # attn_map: a d_model x d_model linear map, starts as identity
    h = h + mlp(post_attention_layernorm(h))                # the teacher's MLP and norm

A layer that keeps no head adds ``s`` alone. The mixer's input is multiplied by the
attention mask, and the mixer is given the mask (`DiscreteMamba2.forward`'s
``padding_mask``: Llamba's pad guard on its ``in_proj`` output), so a left-padded row's real
tokens get the numbers the row gives alone. Embeddings, MLPs, norms, the final norm and
the LM head are copies of the teacher's; the teacher is never modified.

**Initialisations of the mixer** (every layer has ``n_heads`` value heads of the teacher's
``head_dim``, ``n_heads`` qk heads of ``d_state = head_dim``: one SSM head per teacher head):

- ``"default"`` (the authors'): PyTorch's default init of ``DiscreteMamba2``, with the
  depthwise conv set to the identity (weight 1 on the current token, 0 elsewhere, bias 0).
- ``"attention"`` (attention/SSD duality): the same, then for every *replaced* head ``h``
  of layer ``l`` (its key/value head ``g = h // (n_heads / n_kv_heads)``, ``d = head_dim``),
  rows of ``in_proj`` and columns of ``out_proj``::

      x rows of head h   = W_v[g]                 # value  -> x
      B rows of qk head h = W_k[g]                # key    -> B
      C rows of qk head h = W_q[h] / sqrt(d)      # query  -> C (the softmax's scale)
      A_log row of head h = 0                     # a_t = softplus(0) = ln 2: decay 1/2 per token
      z rows of head h    = 0, z_bias = SILU_ONE  # gate silu(z + z_bias) = 1
      D[h]                = 0                     # no skip term
      out_proj[:, head h] = W_o[:, head h]        # the head's slice of o_proj

  and for a *kept* head the mixer's ``out_proj`` columns are 0 (its SSM slot starts
  silent). So before training, the mixer's output is the teacher's replaced heads with
  softmax(q.k/sqrt(d)) swapped for the linear, decaying ``(q.k/sqrt(d)) 2^-(t-s)`` and
  without RoPE: ``y_h[t] = sum_{s<=t} (C_t . B_s) 2^-(t-s) x_s``.

The student describes itself to the library through the package's architecture table
(`gna_interp.models.registry.HYBRID_STUDENT`, ``model_type`` ``"gna_hybrid_student"``):
heads per layer are its kept attention heads (``self_attn``, numbered 0..k-1 in the order
of the teacher's head index, `HybridStudentConfig.kept`), then its ``n_heads`` SSM heads
(``mixer``, Llamba's Discrete Mamba-2 mixer spec: input streams, pad guard and the
``"discrete_mamba2"`` implicit-attention recipe), so every analysis runs on it. A folder
written by ``save_pretrained`` (plus the tokenizer) loads with `gna_interp.load`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, LlamaConfig, PreTrainedModel

from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Head
from ..core.keywords import suggest_keywords
from .llamba import DiscreteMamba2
from .registry import HYBRID_STUDENT, HYBRID_STUDENT_MODEL_TYPE

INITS = ("default", "attention")
COMBINES = ("authors", "sum")
"""How a layer adds its two mixers: ``"authors"`` rescales the attention to the SSM's
per-token mean and std, maps it and averages; ``"sum"`` adds both unchanged (the teacher's
own sum of heads, so the kept heads pass exactly at initialisation)."""
MODEL_TYPE = HYBRID_STUDENT_MODEL_TYPE
SILU_ONE = 1.2784645427610738
"""The ``s`` with ``silu(s) = s * sigmoid(s) = 1``."""


class HybridStudentConfig(LlamaConfig):
    """The student's config: its Llama teacher's fields plus ``kept`` (per layer, the
    teacher head indices kept as attention) and ``d_state`` (the mixer's state per qk
    head; default ``head_dim``). ``model_type`` ``"gna_hybrid_student"``, a row of the
    package's architecture table (`gna_interp.models.registry.HYBRID_STUDENT`), registered
    with transformers' ``AutoConfig`` / ``AutoModelForCausalLM`` so that a saved student
    folder loads with `gna_interp.load`."""

    model_type = MODEL_TYPE

    def __init__(self, kept: list[list[int]] | None = None, d_state: int | None = None, combine: str = "authors", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.combine = combine
        self.kept = [list(layer) for layer in kept] if kept is not None else [[] for _ in range(int(self.num_hidden_layers))]
        self.d_state = int(d_state) if d_state is not None else _head_dim(self)


def _student_config(teacher_config: Any, kept: list[list[int]], d_state: int, combine: str = "authors") -> HybridStudentConfig:
    """The teacher's config fields (a ``LlamaConfig``'s) with ``kept`` and ``d_state``,
    and the teacher's attention kernel."""
    fields = teacher_config.to_dict()
    for name in ("model_type", "architectures", "kept", "d_state", "combine", "transformers_version"):
        fields.pop(name, None)
    config = HybridStudentConfig(kept=kept, d_state=d_state, combine=combine, **fields)
    config._attn_implementation = getattr(teacher_config, "_attn_implementation", None)
    config.architectures = ["HybridStudentForCausalLM"]
    return config


def _attention_config(config: Any, n_kept: int) -> Any:
    sub = copy.deepcopy(config)
    sub.head_dim = _head_dim(config)
    sub.num_attention_heads = n_kept
    sub.num_key_value_heads = n_kept
    return sub


def _head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


class HybridStudentLayer(nn.Module):
    """One student block (see the module docstring). Submodules: ``input_layernorm``,
    ``self_attn`` (a ``LlamaAttention`` over the kept heads; absent when none is kept),
    ``attn_map``, ``mixer`` (`DiscreteMamba2`), ``post_attention_layernorm``, ``mlp``."""

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRMSNorm

        self.layer_idx = layer_idx
        self.combine_how = str(getattr(config, "combine", "authors"))
        n_kept = len(config.kept[layer_idx])
        d_model, head_dim = int(config.hidden_size), _head_dim(config)
        n_heads = int(config.num_attention_heads)
        self.input_layernorm = LlamaRMSNorm(d_model, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(d_model, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.self_attn: nn.Module | None = None
        self.attn_map: nn.Linear | None = None
        if n_kept:
            attention = LlamaAttention(_attention_config(config, n_kept), layer_idx)
            attention.config = config  # shared: the backend's eager switch reaches it
            self.self_attn = attention
            self.attn_map = nn.Linear(d_model, d_model, bias=False)
            with torch.no_grad():
                self.attn_map.weight.copy_(torch.eye(d_model))
        expand = n_heads * head_dim // d_model
        if expand * d_model != n_heads * head_dim:
            raise GnaValueError(
                f"hybridize: the teacher's n_heads * head_dim = {n_heads} * {head_dim} must be a multiple of hidden_size={d_model} "
                "(the Discrete Mamba-2 mixer's inner width is expand * hidden_size)"
            )
        self.mixer = DiscreteMamba2(
            d_model,
            d_state=int(config.d_state),
            n_qk_heads=n_heads,
            n_v_heads=n_heads,
            expand=expand,
            activation="identity",
            layer_idx=layer_idx,
        )

    def combine(self, ssm: Tensor, attention: Tensor | None) -> Tensor:
        """``ssm``, ``attention`` ``[batch, pos, d_model]`` -> the mixers' sum
        ``(ssm + attn_map(rescaled attention)) / 2`` (``ssm`` alone without attention);
        with ``combine="sum"``, ``ssm + attn_map(attention)``."""
        if attention is None or self.attn_map is None:
            return ssm
        if self.combine_how == "sum":
            return ssm + self.attn_map(attention)
        a_mean, a_std = attention.mean(-1, keepdim=True), attention.std(-1, keepdim=True)
        s_mean, s_std = ssm.mean(-1, keepdim=True), ssm.std(-1, keepdim=True)
        rescaled = (attention - a_mean) / (a_std + 1e-6) * s_std + s_mean
        return (ssm + self.attn_map(rescaled)) / 2

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        padding_mask: Tensor | None = None,
        **kwargs: Any,
    ) -> Tensor:
        """``[batch, pos, d_model]`` -> the same. ``attention_mask``: the 4-D causal mask
        the attention kernel takes; ``padding_mask`` ``[batch, pos]`` (1 on real tokens)."""
        residual = hidden_states
        normed = self.input_layernorm(hidden_states)
        ssm_in = normed if padding_mask is None else normed * padding_mask[..., None].to(normed.dtype)
        ssm = self.mixer(ssm_in, padding_mask=padding_mask)["hidden_states"]  # the mixer's own pad guard
        attention = None
        if self.self_attn is not None:
            attention = self.self_attn(hidden_states=normed, attention_mask=attention_mask, position_embeddings=position_embeddings)[0]
        hidden_states = residual + self.combine(ssm, attention)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class HybridStudentTrunk(nn.Module):
    """``embed_tokens``, ``layers``, ``norm``, ``rotary_emb`` (Llama's names)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridStudentLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def block_inputs(self, hidden: Tensor, attention_mask: Tensor | None) -> dict[str, Any]:
        """What every block takes besides the hidden state, for ``hidden [batch, pos,
        d_model]`` and ``attention_mask [batch, pos]`` (positions ``0..pos-1``, as Llama)."""
        from transformers.masking_utils import create_causal_mask

        position_ids = torch.arange(hidden.shape[1], device=hidden.device)[None]
        # The cache is passed by position: transformers renamed it (past_key_values -> cache).
        mask = create_causal_mask(self.config, hidden, attention_mask, None, position_ids=position_ids)
        return {
            "attention_mask": mask,
            "position_embeddings": self.rotary_emb(hidden, position_ids=position_ids),
            "padding_mask": attention_mask,
        }

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """``[batch, pos]`` ids -> ``[batch, pos, d_model]`` after the final norm."""
        hidden = self.embed_tokens(input_ids)
        extra = self.block_inputs(hidden, attention_mask)
        for layer in self.layers:
            hidden = layer(hidden, **extra)
        return self.norm(hidden)


class HybridStudentOutput(dict):  # type: ignore[type-arg]
    """``logits [batch, pos, vocab]``, as an attribute and a key."""

    @property
    def logits(self) -> Tensor:
        return self["logits"]  # type: ignore[no-any-return]


class HybridStudentForCausalLM(PreTrainedModel, GenerationMixin):
    """The student: ``model`` (`HybridStudentTrunk`) and ``lm_head``;
    ``forward(input_ids, attention_mask=None)`` -> ``.logits [batch, pos, vocab]``.
    A ``transformers.PreTrainedModel`` (what nnsight's wrapper expects)."""

    config_class = HybridStudentConfig
    base_model_prefix = "model"
    _supports_sdpa = True
    _supports_attention_backend = True

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.model = HybridStudentTrunk(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()  # transformers' bookkeeping (from_pretrained needs it); weights: see _init_weights

    def _init_weights(self, module: nn.Module) -> None:
        """Only the rotary buffers are (re)computed: every parameter keeps PyTorch's default
        init (the authors' default-initialised SSM) or the teacher's copy, and a loaded
        student its saved values."""
        if "RotaryEmbedding" in type(module).__name__:
            super()._init_weights(module)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any) -> HybridStudentOutput:
        return HybridStudentOutput(logits=self.lm_head(self.model(input_ids, attention_mask)))


# ----- describing the student to the library -------------------------------------------


STUDENT_ARCH = HYBRID_STUDENT
"""The student's row of the package's architecture table
(`gna_interp.models.registry.HYBRID_STUDENT`): its SSM heads use Llamba's Discrete Mamba-2
`MixerSpec` (input streams ``x``, ``B``, ``C``, ``z``, ``decay``, the pad guard, the
``"discrete_mamba2"`` implicit-attention recipe)."""

AutoConfig.register(MODEL_TYPE, HybridStudentConfig, exist_ok=True)
AutoModelForCausalLM.register(HybridStudentConfig, HybridStudentForCausalLM, exist_ok=True)


def wrap_student(student: HybridStudentForCausalLM, tokenizer: Any, name: str = "hybrid student") -> Any:
    """A `GnaModel` over ``student`` (nnsight backend, `STUDENT_ARCH`)."""
    from nnsight.modeling.transformers import TransformersModel

    from ..backends.nnsight import NNsightBackend
    from .handle import GnaModel

    student.eval()
    # As gna.load wraps a transformers model (loading imports this module: no import back).
    envoy = TransformersModel(student, tokenizer=copy.deepcopy(tokenizer))  # nnsight sets padding in place: not on the caller's
    backend = NNsightBackend(envoy, STUDENT_ARCH, STUDENT_ARCH.layers_of(student.config), False)
    return GnaModel(student, tokenizer, STUDENT_ARCH, backend, name)


# ----- building one ---------------------------------------------------------------------


def _kept_per_layer(keep: Iterable[Head] | None, n_layers: int, n_heads: int) -> list[list[int]]:
    if keep is None:
        keep = []
    if isinstance(keep, Head):
        keep = [keep]
    kept: list[set[int]] = [set() for _ in range(n_layers)]
    for head in keep:
        if not isinstance(head, Head):
            raise GnaTypeError(f"hybridize: keep holds {head!r} ({type(head).__name__}): expected gna_interp.Head objects")
        if head.layer >= n_layers or head.head >= n_heads:
            raise GnaValueError(
                f"hybridize: keep holds {head}, not a head of the teacher (layers 0..{n_layers - 1}, heads 0..{n_heads - 1})"
            )
        kept[head.layer].add(head.head)
    return [sorted(layer) for layer in kept]


def _teacher_parts(teacher: Any) -> tuple[Any, Any]:
    """The teacher's HF model and tokenizer, from a `GnaModel` (Llama family) or a
    ``LlamaForCausalLM``."""
    hf_model = getattr(teacher, "hf_model", teacher)
    tokenizer = getattr(teacher, "tokenizer", None)
    model_type = getattr(getattr(hf_model, "config", None), "model_type", None)
    if model_type not in ("llama", "mistral", "qwen2") or not hasattr(hf_model, "model"):
        raise GnaValueError(
            f"hybridize: teacher of model_type {model_type!r}: expected a Llama-family attention model ('llama', 'mistral', 'qwen2')"
        )
    if getattr(hf_model.config, "attention_bias", False) or getattr(hf_model.config, "model_type", "") == "qwen2":
        raise GnaValueError(
            f"hybridize: teacher of model_type {model_type!r} has q/k/v biases, which the student's head slices do not carry"
        )
    return hf_model, tokenizer


@suggest_keywords
def hybridize(
    teacher: Any,
    keep: Iterable[Head] | None = None,
    init: str = "default",
    *,
    seed: int = 0,
    d_state: int | None = None,
    tokenizer: Any = None,
    combine: str = "authors",
) -> Any:
    """A hybrid student of ``teacher`` that keeps the heads ``keep`` as attention.

    Args:
        teacher: a `GnaModel` of a Llama-family model (or the ``LlamaForCausalLM``;
            then give ``tokenizer``). Read, never modified.
        keep: the teacher's heads kept as attention (`Head(layer, head)`); none: a pure
            SSM student.
        init: ``"default"`` or ``"attention"`` (see the module docstring for the formula).
        seed: seeds the default initialisation of the new parameters.
        d_state: the mixer's state size per qk head (default: the teacher's ``head_dim``;
            ``init="attention"`` needs exactly that).
        tokenizer: the tokenizer, when ``teacher`` is not a `GnaModel`.
        combine: ``"authors"`` (attention rescaled to the SSM output's per-token mean
            and std, mapped, then averaged with it) or ``"sum"`` (``ssm + attn_map(a)``:
            the kept heads reach the residual exactly as in the teacher at initialisation).

    Returns:
        A `GnaModel` (nnsight backend) over a `HybridStudentForCausalLM` (``.hf_model``).
        Its layer ``l`` has ``len(kept in l)`` attention heads (0..k-1, in the order of the
        teacher's head index: ``.hf_model.config.kept[l]``) then ``n_heads`` SSM heads.

    Raises:
        ValueError: an unknown ``init``, a head not in the teacher, a teacher that is not
            Llama-family, or ``d_state`` other than ``head_dim`` with ``init="attention"``.
    """
    if init not in INITS:
        raise GnaValueError(f"hybridize: init={init!r}: expected one of {INITS}")
    if combine not in COMBINES:
        raise GnaValueError(f"hybridize: combine={combine!r}: expected one of {COMBINES}")
    hf_teacher, teacher_tokenizer = _teacher_parts(teacher)
    tokenizer = tokenizer if tokenizer is not None else teacher_tokenizer
    if tokenizer is None:
        raise GnaValueError("hybridize: the teacher is a bare HF model: pass tokenizer=")
    config = hf_teacher.config
    n_layers, n_heads, head_dim = int(config.num_hidden_layers), int(config.num_attention_heads), _head_dim(config)
    if d_state is None:
        d_state = head_dim
    if init == "attention" and d_state != head_dim:
        raise GnaValueError(
            f"hybridize: d_state={d_state} with init='attention': keys and queries become B and C, so d_state must be head_dim={head_dim}"
        )
    kept = _kept_per_layer(keep, n_layers, n_heads)
    student_config = _student_config(config, kept, d_state, combine)
    student_config.name_or_path = f"hybrid student of {config.name_or_path or config.model_type}"
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(seed)
        student = HybridStudentForCausalLM(student_config)
    parameter = next(hf_teacher.parameters())
    student.to(device=parameter.device, dtype=parameter.dtype)  # type: ignore[call-arg]
    with torch.no_grad():
        _copy_shared(student, hf_teacher)
        for layer in range(n_layers):
            block = student.model.layers[layer]
            weights = {name: _param(hf_teacher, f"model.layers.{layer}.self_attn.{name}_proj.weight") for name in "qkvo"}
            _identity_conv(block.mixer)
            if block.self_attn is not None:
                _copy_kept_heads(block.self_attn, weights, kept[layer], n_heads, int(config.num_key_value_heads or n_heads), head_dim)
            if init == "attention":
                replaced = [h for h in range(n_heads) if h not in kept[layer]]
                attention_init(
                    block.mixer,
                    weights,
                    replaced,
                    kept[layer],
                    n_heads,
                    int(config.num_key_value_heads or n_heads),
                    head_dim,
                )
    return wrap_student(student, tokenizer, str(student_config.name_or_path))


def _copy_shared(student: HybridStudentForCausalLM, teacher: Any) -> None:
    """Embeddings, final norm, LM head, and every block's norms and MLP (copies)."""
    for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        _param(student, name).copy_(_param(teacher, name))
    for layer, block in enumerate(student.model.layers):
        for part in ("input_layernorm", "post_attention_layernorm", "mlp"):
            for name, value in getattr(block, part).named_parameters():
                value.copy_(_param(teacher, f"model.layers.{layer}.{part}.{name}"))


def _param(root: Any, path: str) -> Tensor:
    """The tensor at attribute ``path`` of ``root``, through TransformerLens's bridge
    wrappers (a bridged module keeps the HF one as ``_original_component``)."""
    value = root
    for name in path.split("."):
        value = getattr(getattr(value, "_original_component", value), name)
    if not isinstance(value, Tensor):
        raise GnaTypeError(f"hybridize: the teacher's {path} is a {type(value).__name__}, expected a tensor")
    return value


def _identity_conv(mixer: DiscreteMamba2) -> None:
    """The depthwise causal conv passes each channel's current token through unchanged."""
    mixer.conv1d.weight.zero_()
    mixer.conv1d.weight[:, 0, -1] = 1.0
    if mixer.conv1d.bias is not None:
        mixer.conv1d.bias.zero_()


def _rows(weight: Tensor, unit: int, width: int) -> Tensor:
    return weight[unit * width : (unit + 1) * width]


def _copy_kept_heads(attention: Any, teacher: dict[str, Tensor], kept: list[int], n_heads: int, n_kv: int, head_dim: int) -> None:
    """Kept head ``j`` (teacher head ``kept[j]``) gets the teacher's query rows, its key /
    value head's rows (one per kept head) and its ``o_proj`` columns."""
    group = n_heads // n_kv
    for j, head in enumerate(kept):
        _rows(attention.q_proj.weight, j, head_dim).copy_(_rows(teacher["q"], head, head_dim))
        _rows(attention.k_proj.weight, j, head_dim).copy_(_rows(teacher["k"], head // group, head_dim))
        _rows(attention.v_proj.weight, j, head_dim).copy_(_rows(teacher["v"], head // group, head_dim))
        attention.o_proj.weight[:, j * head_dim : (j + 1) * head_dim].copy_(teacher["o"][:, head * head_dim : (head + 1) * head_dim])


def attention_init(
    mixer: DiscreteMamba2, teacher: dict[str, Tensor], replaced: list[int], kept: list[int], n_heads: int, n_kv: int, head_dim: int
) -> None:
    """The ``"attention"`` initialisation of one layer's mixer from the teacher's
    attention weights ``teacher`` (``"q"``, ``"k"``, ``"v"``, ``"o"``: its projections'
    weights), in place:
    see the module docstring for the formula."""
    group = n_heads // n_kv
    d_inner, n_state = mixer.d_inner, mixer.n_qk_heads * mixer.d_state
    x0, b0, c0 = 0, d_inner, d_inner + n_state  # row offsets of x, B, C in in_proj (xBC first)
    z0, a0 = mixer.conv_dim, mixer.conv_dim + d_inner
    weight = mixer.in_proj.weight
    for head in replaced:
        g = head // group
        _rows(weight[x0:], head, head_dim).copy_(_rows(teacher["v"], g, head_dim))
        _rows(weight[b0:], head, head_dim).copy_(_rows(teacher["k"], g, head_dim))
        _rows(weight[c0:], head, head_dim).copy_(_rows(teacher["q"], head, head_dim) / math.sqrt(head_dim))
        _rows(weight[z0:], head, head_dim).zero_()
        weight[a0 + head].zero_()
        assert isinstance(mixer.z_bias, Tensor)
        mixer.z_bias[head * head_dim : (head + 1) * head_dim] = SILU_ONE
        mixer.D[head] = 0.0
        mixer.out_proj.weight[:, head * head_dim : (head + 1) * head_dim].copy_(teacher["o"][:, head * head_dim : (head + 1) * head_dim])
    for head in kept:
        mixer.out_proj.weight[:, head * head_dim : (head + 1) * head_dim].zero_()
