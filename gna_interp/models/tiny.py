"""Tiny random models and a local word-level tokenizer, for tests, smoke runs and
benchmarks. Nothing here downloads anything."""

from __future__ import annotations

import tempfile
from typing import Any

import torch

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
}


def tiny_config(family: str, vocab_size: int = 64, **overrides: Any) -> Any:
    from transformers import AutoConfig

    if family not in TINY_CONFIGS:
        raise ValueError(f"no tiny config for family {family!r}: expected one of {sorted(TINY_CONFIGS)}")
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
    return model.eval()


def _spread_weights(model: Any, seed: int) -> None:
    """HF initialises some weights to zero or one (norm scales, out-projection biases,
    Mamba's ``D``); randomise them so every head and channel matters in tests."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight", "layernorm.weight", ".D")):
                param.copy_(1 + 0.3 * torch.randn(param.shape, generator=generator))


def word_tokenizer(words: list[str] | None = None, vocab_size: int = 64) -> Any:
    """A whitespace word-level tokenizer: ids 0..3 are ``<pad> <bos> <eos> <unk>``,
    then ``words`` (default ``w4, w5, ...``). It prepends ``<bos>``. Saved to a folder
    and loaded back, as TransformerLens needs."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    words = words if words is not None else [f"w{i}" for i in range(len(specials), vocab_size)]
    vocab = {token: i for i, token in enumerate([*specials, *words])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>")
    folder = tempfile.mkdtemp(prefix="gna_word_tokenizer_")
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)
