"""Benchmark: what one forward through the TransformerLens bridge costs against HF's own.

What is compared
----------------
One tiny random Llama (``--layers`` layers of 8 heads of 8, 2 KV heads) is built once and
copied, so every variant has the same weights; 64 left-padded prompts of up to 24 tokens.
Each variant runs the same forward, with head 0 of layer 0 zero-ablated (the commonest
forward of a sweep), alternating variants round by round (best of ``--repeats``):

``hf``
    the plain HF model (its own kernel, sdpa) with a raw forward pre-hook on layer 0's
    ``o_proj``: the floor.
``tlens: <attention>, <norms>, <hooks>``
    the tlens backend with the bridge's own step-by-step attention or HF's (kernel inside
    the bridge), the bridge's own norms or HF's, and gna's hooks put on through the
    bridge's ``hooks()`` context (which rebuilds its alias maps on every call) or added to
    the hook points directly. The first is the backend as it was before
    `TLensBackend._native_forwards` and `TLensBackend._named_hooks`; the last its default.
``nnsight``
    the nnsight backend on the HF model.

Every variant's logits must equal ``hf``'s to ``--tolerance`` (else exit 1). The ratio to
``hf`` is printed beside each time; 1.00x is the physical limit (the same arithmetic).

Run: ``python benchmarks/bridge_overhead.py [--layers 32] [--repeats 15] [--threads 1] [--json PATH]``
"""

from __future__ import annotations

import copy
import random
import sys
from collections.abc import Callable
from typing import Any

import torch
from _common import best_of_each, parser, set_threads, write_json

import gna_interp as gna

# Private: gna_interp.models.tiny builds random untrained models of any shape (the library has no public builder).
from gna_interp.models.tiny import tiny_model, word_tokenizer

VOCAB_SIZE = 64
FIRST_WORD = 4  # ids 0..3 are <pad> <bos> <eos> <unk>
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 8
# (attention, norms, how hooks go on) of each tlens variant; the last is the backend's default.
TLENS_VARIANTS = [
    ("bridge", "bridge", "bridge.hooks()"),
    ("bridge", "bridge", "direct"),
    ("HF", "bridge", "direct"),
    ("bridge", "HF", "direct"),
    ("HF", "HF", "direct"),
]


def make_prompts(n: int, length: int, seed: int) -> list[str]:
    """``n`` prompts of random words, unequal lengths (so left padding is exercised)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(FIRST_WORD, VOCAB_SIZE)]
    return [" ".join(rng.choices(words, k=rng.randint(max(1, length - 4), max(1, length - 1)))) for _ in range(n)]


def main(argv: list[str] | None = None) -> int:
    arguments = parser(__doc__, threads=None, repeats=15)
    arguments.add_argument("--layers", type=int, default=32)
    arguments.add_argument("--prompts", type=int, default=64)
    arguments.add_argument("--prompt-len", type=int, default=24)
    arguments.add_argument("--seed", type=int, default=0)
    arguments.add_argument("--tolerance", type=float, default=1e-5)
    args = arguments.parse_args(argv)
    set_threads(args.threads)

    hidden = HEADS * HEAD_DIM
    hf = tiny_model(
        "llama",
        seed=args.seed,
        vocab_size=VOCAB_SIZE,
        num_hidden_layers=args.layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
    )
    tokenizer = word_tokenizer(vocab_size=VOCAB_SIZE)
    # Copies before anything boots a bridge: tlens wraps its model's modules in place. Each
    # variant switches off what it does not use: the cached lists of components that run
    # HF's forward emptied, or hooks put on through the bridge's own `hooks()` context.
    tlens_models = {}
    for attention, norms, hooks in TLENS_VARIANTS:
        model = gna.load(copy.deepcopy(hf), backend="tlens", tokenizer=tokenizer)
        backend = model.backend
        backend._attentions(), backend._norms()
        if attention == "bridge":
            backend._kernel_attentions = []
        if norms == "bridge":
            backend._native_norms = []
        if hooks == "bridge.hooks()":
            backend._named_hooks = lambda named, bridge=backend.bridge: bridge.hooks(fwd_hooks=named)
        tlens_models[f"tlens: {attention} attention, {norms} norms, {hooks}"] = model
    nnsight_model = gna.load(copy.deepcopy(hf), backend="nnsight", tokenizer=tokenizer)

    batch = nnsight_model.to_batch(make_prompts(args.prompts, args.prompt_len, args.seed))
    ablate = [gna.Ablate([gna.Head(0, 0)])]

    def zero_head(module: Any, inputs: tuple) -> tuple:
        x = inputs[0].clone()
        x[..., :HEAD_DIM] = 0
        return (x,)

    def hf_forward() -> torch.Tensor:
        handle = hf.model.layers[0].self_attn.o_proj.register_forward_pre_hook(zero_head)
        try:
            with torch.no_grad():
                return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        finally:
            handle.remove()

    variants: dict[str, Callable[[], torch.Tensor]] = {"hf": hf_forward}
    for name, model in tlens_models.items():
        variants[name] = lambda model=model: model.logits(batch, ablate)
    variants["nnsight"] = lambda: nnsight_model.logits(batch, ablate)
    reference = hf_forward()
    real = batch.attention_mask.bool()  # the bridge's own attention differs at padded positions
    differences = {name: float((fn()[real] - reference[real]).abs().max()) for name, fn in variants.items()}  # also the warm-up
    best, _ = best_of_each(variants, args.repeats, warmup=False)  # warmed up by the differences above

    model_line = f"tiny random llama: {args.layers} layers x {HEADS} heads ({KV_HEADS} kv) of {HEAD_DIM}"
    print(
        f"{model_line}; {args.prompts} prompts of {batch.n_pos} tokens; "
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); best of {args.repeats}, variants alternating"
    )
    width = max(map(len, variants))
    print(f"{'variant':<{width}} {'best s':>8} {'/ hf':>6} {'max |diff| (real tokens)':>25}")
    for name in variants:
        print(f"{name:<{width}} {best[name]:>8.4f} {best[name] / best['hf']:>5.2f}x {differences[name]:>25.2e}")
    print("limit: 1.00x (the same arithmetic as hf)")
    failed = [name for name, diff in differences.items() if diff > args.tolerance]
    if args.json:
        over_hf = {name: seconds / best["hf"] for name, seconds in best.items()}
        write_json(args.json, {"seconds": best, "over_hf": over_hf, "max_abs_diff": differences}, indent=2)
    if failed:
        print(f"FAIL: {failed} differ from hf by more than {args.tolerance}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
