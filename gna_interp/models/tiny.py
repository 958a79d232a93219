"""Tiny random models and a local word-level tokenizer, for tests, smoke runs and
benchmarks. Nothing here downloads anything."""

from __future__ import annotations

import tempfile
from typing import Any

import torch

from ..core.errors import GnaValueError

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    # Grouped-query attention: 6 query heads share 2 key/value heads.
    "llama": dict(
        hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256
    ),
    "mistral": dict(
        hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256
    ),
    "qwen2": dict(
        hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256
    ),
    "mamba": dict(hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4),
    "falcon_mamba": dict(hidden_size=32, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4),
    "mamba2": dict(hidden_size=32, state_size=8, num_hidden_layers=2, num_heads=4, head_dim=16, expand=2, n_groups=2, chunk_size=4),
    # Hybrids: a few layers of both kinds, 4 attention heads (2 key/value heads where the
    # family allows grouped-query attention) and 4 Mamba-2 heads of 16 in 2 groups (Jamba:
    # 64 Mamba-1 channels). Multipliers differ from 1 so tests see them.
    "jamba": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        num_experts_per_tok=1,
        mamba_d_state=4,
        mamba_expand=2,
        max_position_embeddings=256,
    ),
    "bamba": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_chunk_size=4,
        max_position_embeddings=256,
    ),
    "granitemoehybrid": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        position_embedding_type="rope",
        mamba_n_heads=4,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_chunk_size=4,
        num_local_experts=2,
        num_experts_per_tok=1,
        shared_intermediate_size=64,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.3,
        logits_scaling=2.0,
        max_position_embeddings=256,
        pad_token_id=0,
    ),
    # NemotronH: Mamba-2, MoE (0 heads), attention, MLP (0 heads).
    "nemotron_h": dict(
        hidden_size=32,
        intermediate_size=64,
        layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=8,
        chunk_size=4,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        max_position_embeddings=256,
    ),
    # Zamba2: the shared attention block runs at layers 1 and 3 (two applications).
    "zamba2": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
        num_attention_heads=4,
        num_key_value_heads=4,
        n_mamba_heads=4,
        mamba_ngroups=2,
        mamba_d_state=8,
        chunk_size=4,
        use_mem_rope=True,
        max_position_embeddings=256,
    ),
    # FalconH1: every layer runs 4 attention heads and 4 Mamba-2 heads side by side.
    "falcon_h1": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_chunk_size=4,
        max_position_embeddings=256,
        ssm_multipliers=[0.7, 1.3, 0.8, 1.2, 0.9],
        ssm_in_multiplier=1.1,
        ssm_out_multiplier=2.0,
        attention_in_multiplier=1.2,
        attention_out_multiplier=0.8,
        key_multiplier=0.7,
        embedding_multiplier=1.5,
        lm_head_multiplier=0.5,
        mlp_multipliers=[1.1, 0.9],
    ),
    # Qwen3-Next: gated DeltaNet (4 value heads of 8 over 2 key heads) and gated attention.
    "qwen3_next": dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        max_position_embeddings=256,
        pad_token_id=0,
    ),
}

HYBRIDS = ("jamba", "bamba", "granitemoehybrid", "nemotron_h", "zamba2", "falcon_h1", "qwen3_next")


def tiny_config(family: str, vocab_size: int = 64, **overrides: Any) -> Any:
    from transformers import AutoConfig

    if family not in TINY_CONFIGS:
        raise GnaValueError(f"no tiny config for family {family!r}: expected one of {sorted(TINY_CONFIGS)}")
    fields = {**TINY_CONFIGS[family], "vocab_size": vocab_size, **overrides}
    if family.startswith(("mamba", "falcon_mamba")):
        fields.setdefault("pad_token_id", 0)
        fields.setdefault("bos_token_id", 1)
        fields.setdefault("eos_token_id", 2)
    return AutoConfig.for_model(family, **fields)


def tiny_model(family: str, seed: int = 0, vocab_size: int = 64, **overrides: Any) -> Any:
    """A randomly initialised ``*ForCausalLM`` of ``family`` (eval mode, float32)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, vocab_size, **overrides))
    _spread_weights(model, seed)
    if family in HYBRIDS:
        _spread_hybrid(model, seed)
    return model.eval()


def _spread_weights(model: Any, seed: int) -> None:
    """HF initialises some weights to zero or one (norm scales, out-projection biases,
    Mamba's ``D``); randomise them so every head and channel matters in tests."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight", "layernorm.weight", ".D")):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))


def _spread_hybrid(model: Any, seed: int) -> None:
    """Hybrids also start with equal step-size biases in every SSM head, convolutions
    that all but erase the SSM inputs (std 0.02, where pure Mamba-2 has PyTorch's 0.3) and
    projections too small for a few layers to move the logits visibly: spread the biases,
    draw the conv weights like PyTorch does, and scale every linear map up (tied weights
    keep their tie)."""
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("dt_bias"):
                param.copy_(torch.randn(param.shape, generator=generator))
            elif name.endswith("conv1d.weight"):
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
            elif param.dim() == 2 and "embed" not in name:
                param.mul_(4.0)


def word_tokenizer(words: list[str] | None = None, vocab_size: int = 64) -> Any:
    """A whitespace word-level tokenizer: ids 0..3 are ``<pad> <bos> <eos> <unk>``,
    then ``words`` (default ``w4, w5, ...``). It prepends ``<bos>``. Saved to a temporary
    folder and loaded back (a tokenizer as users load one), the folder then removed."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    words = words if words is not None else [f"w{i}" for i in range(len(specials), vocab_size)]
    vocab = {token: i for i, token in enumerate([*specials, *words])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    with tempfile.TemporaryDirectory(prefix="gna_word_tokenizer_") as folder:  # a loaded tokenizer, as from a folder
        fast.save_pretrained(folder)
        return AutoTokenizer.from_pretrained(folder)
