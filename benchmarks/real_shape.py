"""Benchmark: gna_interp at real widths, against a raw HF forward with one raw hook.

What is run
-----------
The published configs of Llama-3.1-8B, Falcon-Mamba-7B, Zamba2-7B and Llamba-8B (`CONFIGS`:
every width, head count, vocabulary and norm setting as released; Llamba as gna_interp's
PyTorch twin of Cartesia's class), cut to ``--layers`` layers (2 by default; Zamba2
alternates Mamba-2 and hybrid layers), random weights, bf16, on the CPU (``--device cuda`` on
a GPU). Each model is loaded once into its default backend (tlens for Llama, nnsight for the
SSMs) and runs, on ``--prompts`` random prompts of ``--seq-len``
tokens:

``raw``
    the HF model's own forward with one raw torch pre-hook zeroing head 0 of layer 0 at
    its out-projection's input: the floor every ratio is taken against (1.00x).
``forward``, ``ablation``
    `GnaModel.logits` plain, and with ``Ablate(Head(0, 0))`` (the same edit as ``raw``).
``ablation, last logits``
    the same with ``logits_to_keep=1``: the final position's logits alone.
``sweep`` / ``sweep, every position``
    `ablation_sweep` over heads 0 and 1 of layer 0 with `logit_diff` (it declares that it reads
    the final position: logits computed there alone) and with the same metric as an
    undeclared lambda (every position's logits): issue 27 item 6 side by side.
``sweep, budget``
    the same `ablation_sweep` with ``memory_budget_mb=--budget-mb`` (stacked copies): its peak
    must stay within that budget (else exit 1), or, where one copy of the batch alone needs
    more (one copy per forward, as `run_variants` documents), within the one-copy row's peak.
``patching sweep`` / ``patching sweep, budget``
    `patching_sweep` over the same heads, one copy per forward / within the budget.
``path patching``, ``final-row patterns``
    `path_patching` (head 0 of layer 0 -> head 0 of layer 1), `attention_pattern` of both
    heads at the final query row.
``raw backward``
    the floor of the backward operations (their ratios are taken against it): a no-grad
    corrupt forward capturing every layer's out-projection input with raw hooks, then a
    clean forward capturing them again (in the graph), the final position's logits alone,
    and the backward of the logit difference to them (every path, as the library's gates).
``attribution``, ``attribution, IG``, ``edge attribution``
    `attribution_patching` over every head (first order; integrated gradients with
    ``steps=2``) and `edge_attribution` into head 0 of layer 1, one copy per forward.

The sweeps, the attributions and edge attribution run one copy of the batch per forward
(``batch_size`` = the batch) unless their label says ``budget``.

Time is the best of ``--repeats`` calls (on CUDA after one untimed call); peak memory is the peak resident memory above
what the process held before the call (a sampling thread, every 2 ms, after returning
freed memory to the system), or ``torch.cuda.max_memory_allocated`` above the weights on a
GPU. Both are given as ratios to ``raw``'s.

Numbers: the ablated logits must equal ``raw``'s (bf16, same arithmetic) within
``--tolerance`` on the final position, and the sweep's per-head scores must equal a loop
of ``raw`` forwards with the hook moved to each head, the metric reduced in float32, within
``--tolerance`` (else exit 1).

Run: ``python benchmarks/real_shape.py [--layers 2] [--prompts 2] [--seq-len 32]
[--models llama-3.1-8b,falcon-mamba-7b,zamba2-7b,llamba-8b] [--device cpu|cuda] [--json PATH]``
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import parser, set_threads, write_json

import gna_interp as gna

# Private: gna_interp.models.tiny's word tokenizer for random models, and (below) the Llamba
# classes gna_interp.models.llamba registers, to build real-shaped models with random weights.
from gna_interp.models.tiny import word_tokenizer

CONFIGS: dict[str, tuple[str, dict[str, Any], str, int]] = {
    # name: (model_type, the released config's fields, layer 0's out-projection, its head width)
    "llama-3.1-8b": (
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            hidden_act="silu",
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
            bos_token_id=128000,
            eos_token_id=128001,
        ),
        "model.layers.0.self_attn.o_proj",
        128,
    ),
    "falcon-mamba-7b": (
        "falcon_mamba",
        dict(
            vocab_size=65024,
            hidden_size=4096,
            state_size=16,
            expand=2,
            conv_kernel=4,
            time_step_rank=256,
            use_bias=False,
            use_conv_bias=True,
            layer_norm_epsilon=1e-5,
            mixer_rms_eps=1e-6,
            residual_in_fp32=True,
            tie_word_embeddings=False,
            pad_token_id=0,
            bos_token_id=0,
            eos_token_id=11,
        ),
        "backbone.layers.0.mixer.out_proj",
        1,  # every channel is a head
    ),
    "zamba2-7b": (
        "zamba2",
        dict(
            vocab_size=32000,
            hidden_size=3584,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=32,
            mamba_d_state=64,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_headdim=64,
            mamba_ngroups=2,
            n_mamba_heads=112,
            num_mem_blocks=2,
            use_shared_attention_adapter=False,
            adapter_rank=128,
            use_mem_rope=True,
            rope_theta=10000,
            max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            add_bias_linear=False,
            use_conv_bias=True,
            chunk_size=256,
            tie_word_embeddings=True,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
        "model.layers.0.mamba.out_proj",
        64,
    ),
    # Llamba-8B in Cartesia's naming (`LlambaConfig`'s defaults are its released config):
    # 32 value heads of 128 over 32 qk heads, state 64, no attention. transformers has no
    # Llamba class: `build` makes gna_interp's CPU twin (`gna_interp.models.llamba`), whose
    # scan is sequential PyTorch (Cartesia's GPU class runs a Triton scan instead).
    "llamba-8b": (
        "llamba",
        dict(vocab_size=128256, d_model=4096, pad_vocab_size_multiple=8, tie_embeddings=False),
        "backbone.layers.0.mixer.out_proj",
        128,
    ),
}
SWEEP_HEADS = 2


def build(name: str, n_layers: int, device: str) -> Any:
    """The released config of ``name`` cut to ``n_layers`` layers, random bf16 weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, fields, _, _ = CONFIGS[name]
    if model_type == "llamba":
        # Private: the Llamba classes (see the note at the imports above).
        from gna_interp.models.llamba import LlambaConfig, LlambaLMHeadModel

        torch.manual_seed(0)
        twin = LlambaLMHeadModel(LlambaConfig(**fields, n_layer=n_layers))
        return twin.to(device=device, dtype=torch.bfloat16).eval()
    fields = dict(fields, num_hidden_layers=n_layers)
    if model_type == "zamba2":  # Mamba-2 layers with the shared attention block every other one
        fields["layers_block_type"] = ["mamba" if i % 2 == 0 else "hybrid" for i in range(n_layers)]
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.to(device).eval()


class PeakMemory:
    """Peak memory above the start, in bytes: resident memory sampled by a thread (CPU), or
    the CUDA allocator's peak."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
            return self
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system first
        import psutil

        self.process = psutil.Process()
        self.start = self.process.memory_info().rss
        self.peak = self.start
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.used = torch.cuda.max_memory_allocated() - self.start
            return
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)
        self.used = self.peak - self.start


def measure(fn: Callable[[], Any], repeats: int, device: str) -> tuple[float, float, Any]:
    """(best seconds of ``repeats`` calls, peak bytes of the first, the last result).

    On CUDA one untimed call comes first: the first call of a process loads kernels and
    sets up cuBLAS and autograd (an H100 run at best of 1 without it timed Llama's raw
    backward at 1.39 s, 45x the attribution that followed it)."""
    if device.startswith("cuda"):
        fn()
        torch.cuda.synchronize()
    with PeakMemory(device) as memory:
        start = time.perf_counter()
        result = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    best = time.perf_counter() - start
    for _ in range(repeats - 1):
        start = time.perf_counter()
        result = fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, float(memory.used), result


def raw_hooked(hf: Any, path: str, head_dim: int, head: int, ids: torch.Tensor) -> torch.Tensor:
    """Logits ``[batch, pos, vocab]`` of the HF forward with a raw pre-hook zeroing ``head``
    at the out-projection ``path``'s input; the hook is removed before returning."""

    def zero(module: Any, inputs: tuple) -> tuple:
        x = inputs[0].clone()
        x[..., head * head_dim : (head + 1) * head_dim] = 0
        return (x, *inputs[1:])

    handle = hf.get_submodule(path).register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            return hf(input_ids=ids).logits
    finally:
        handle.remove()


def raw_backward(
    hf: Any, out_proj: str, n_layers: int, ids: torch.Tensor, corrupt: torch.Tensor, good: int, bad: int
) -> list[torch.Tensor]:
    """Raw-hook attribution patching, the floor of the backward operations: a no-grad
    corrupt forward capturing every layer's out-projection input, then a clean forward
    capturing the same inputs (in the graph, as every head's gate is), and the backward of
    the final position's logit difference to them: every path, through later mixers too.
    Returns each layer's ``(corrupt - clean) * grad`` ``[batch, pos, width]``."""
    modules = []
    for layer in range(n_layers):
        with contextlib.suppress(AttributeError):
            modules.append(hf.get_submodule(out_proj.replace(".0.", f".{layer}.", 1)))
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else hf.lm_head  # Llamba's twin: lm_head

    def forward(inputs: torch.Tensor, grad: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        stored: list[torch.Tensor] = []
        hooks = [m.register_forward_pre_hook(lambda module, args: stored.append(args[0])) for m in modules]
        # the final position's logits alone (Llamba's twin takes no logits_to_keep)
        hooks.append(head.register_forward_pre_hook(lambda module, args: (args[0][:, -1:], *args[1:])))
        try:
            with torch.set_grad_enabled(grad):
                return hf(input_ids=inputs).logits, stored
        finally:
            for hook in hooks:
                hook.remove()

    _, source = forward(corrupt, False)
    logits, acts = forward(ids, True)
    value = (logits[:, -1, good].float() - logits[:, -1, bad].float()).mean()
    grads = torch.autograd.grad(value, acts)
    return [(c - x.detach()) * g for c, x, g in zip(source, acts, grads, strict=True)]


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    _, _, out_proj, head_dim = CONFIGS[name]
    start = time.perf_counter()
    hf = build(name, args.layers, args.device)
    if args.verbose:
        print(f"  {name}: built in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    model = gna.load(hf, device=args.device, tokenizer=word_tokenizer())  # inputs are token ids: it is not used
    vocab = hf.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(100, vocab, (args.prompts, args.seq_len), generator=generator).to(args.device)
    corrupt = ids.clone()
    corrupt[:, args.seq_len // 2] = torch.randint(100, vocab, (args.prompts,), generator=generator).to(args.device)
    good, bad = 1000, 2000
    metric = gna.logit_diff(good, bad)  # declares the final position

    def undeclared(logits: torch.Tensor) -> torch.Tensor:  # the same metric, declaring nothing: every position
        return logits[:, -1, good].float() - logits[:, -1, bad].float()

    heads = [gna.Head(0, h) for h in range(SWEEP_HEADS)]
    ablate = [gna.Ablate([gna.Head(0, 0)])]
    one = dict(batch_size=args.prompts, progress=False)  # one copy of the batch per forward
    budget = dict(memory_budget_mb=args.budget_mb, progress=False)  # stacked copies within the budget
    edge_receivers = [gna.Head(1, 0)]
    operations: dict[str, Callable[[], Any]] = {
        "raw": lambda: raw_hooked(hf, out_proj, head_dim, 0, ids),
        "raw backward": lambda: raw_backward(hf, out_proj, args.layers, ids, corrupt, good, bad),
        "forward": lambda: model.logits(ids),
        "ablation": lambda: model.logits(ids, ablate),
        "ablation, last logits": lambda: model.logits(ids, ablate, logits_to_keep=1),
        "sweep": lambda: gna.ablation_sweep(model, ids, None, metric, heads=heads, **one),
        "sweep, every position": lambda: gna.ablation_sweep(model, ids, None, undeclared, heads=heads, **one),
        "sweep, budget": lambda: gna.ablation_sweep(model, ids, None, metric, heads=heads, **budget),
        "patching sweep": lambda: gna.patching_sweep(model, ids, corrupt, metric, heads=heads, **one),
        "patching sweep, budget": lambda: gna.patching_sweep(model, ids, corrupt, metric, heads=heads, **budget),
        "path patching": lambda: gna.path_patching(model, ids, corrupt, metric, senders=[gna.Head(0, 0)], receivers=[gna.Head(1, 0)]),
        "final-row patterns": lambda: gna.attention_pattern(model, ids, [gna.Head(0, 0), gna.Head(1, 0)], query_positions=[-1]),
        "attribution": lambda: gna.attribution_patching(model, ids, corrupt, metric, **one),
        "attribution, IG": lambda: gna.attribution_patching(model, ids, corrupt, metric, steps=2, **one),
        "edge attribution": lambda: gna.edge_attribution(model, ids, corrupt, metric, receivers=edge_receivers, **one),
    }
    backward = {"attribution", "attribution, IG", "edge attribution", "raw backward"}
    rows: dict[str, dict[str, float]] = {}
    results: dict[str, Any] = {}
    operations["raw"](), operations["ablation"]()  # warm-up: first-call costs (hook tables, allocator) are not timed
    for label, fn in operations.items():
        seconds, peak, results[label] = measure(fn, args.repeats, args.device)
        rows[label] = {"seconds": seconds, "peak_mb": peak / 2**20}
        if args.verbose:
            print(f"  {name}: {label} {seconds:.3f} s", file=sys.stderr, flush=True)
    for label, row in rows.items():
        reference = rows["raw backward" if label in backward else "raw"]
        row["reference"] = "raw backward" if label in backward else "raw"
        row["time_ratio"] = row["seconds"] / reference["seconds"]
        row["memory_ratio"] = row["peak_mb"] / max(reference["peak_mb"], 1e-9)
        if label.endswith(", budget"):
            row["budget_mb"] = args.budget_mb
    # Numbers: the ablated logits against the raw twin's; the sweep against a raw-hook loop.
    raw = results["raw"]
    ablation_diff = float((results["ablation"][:, -1].float() - raw[:, -1].float()).abs().max())
    last_diff = float((results["ablation, last logits"][:, -1].float() - raw[:, -1].float()).abs().max())
    twin = torch.tensor(
        [
            float((lambda lg: (lg[:, -1, good].float() - lg[:, -1, bad].float()).mean())(raw_hooked(hf, out_proj, head_dim, h.head, ids)))
            for h in heads
        ]
    )
    sweep = results["sweep"].scores[0, :SWEEP_HEADS].float()
    every = results["sweep, every position"].scores[0, :SWEEP_HEADS].float()
    checks = {
        "ablation_vs_raw": ablation_diff,
        "last_logits_vs_raw": last_diff,
        "sweep_vs_raw_loop": float((sweep - twin).abs().max()),
        "sweep_declared_vs_every_position": float((sweep - every).abs().max()),
        "logit_scale": float(raw[:, -1].float().abs().max()),
    }
    info = {"backend": model.backend_name, "layers": args.layers, "params_m": sum(p.numel() for p in hf.parameters()) / 1e6}
    return {"model": name, **info, "rows": rows, "checks": checks}


def main(argv: list[str] | None = None) -> int:
    arguments = parser(__doc__, threads=1, repeats=1)
    arguments.add_argument("--models", default=",".join(CONFIGS))
    arguments.add_argument("--layers", type=int, default=2)
    arguments.add_argument("--prompts", type=int, default=2)
    arguments.add_argument("--seq-len", type=int, default=8)
    arguments.add_argument("--device", default="cpu")
    arguments.add_argument("--budget-mb", type=float, default=600.0, help="memory_budget_mb of the ', budget' rows")
    arguments.add_argument("--tolerance", type=float, default=0.05, help="max |diff| of bf16 logits / metrics vs the raw-hook twin")
    arguments.add_argument("--verbose", action="store_true", help="each operation's time on stderr as it finishes")
    args = arguments.parse_args(argv)
    set_threads(args.threads)
    if args.layers < 2:
        arguments.error(f"--layers={args.layers}: path patching needs 2 layers or more")
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        arguments.error(f"--models: unknown {unknown}; expected names from {list(CONFIGS)}")
    print(
        f"real shapes, {args.layers} layers, random bf16 weights, {args.prompts} prompts x {args.seq_len} tokens, "
        f"device {args.device}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), best of {args.repeats}"
    )
    reports = []
    failed = []
    for name in names:
        report = run_model(name, args)
        reports.append(report)
        print(f"\n{name} ({report['params_m']:.0f}M parameters at {args.layers} layers, backend {report['backend']})")
        print(f"{'operation':<24} {'seconds':>8} {'/ raw':>7} {'peak MB':>9} {'/ raw':>7}")
        for label, row in report["rows"].items():
            print(f"{label:<24} {row['seconds']:>8.3f} {row['time_ratio']:>6.2f}x {row['peak_mb']:>9.0f} {row['memory_ratio']:>6.2f}x")
        checks = report["checks"]
        print(
            "max |diff| vs the raw-hook twin (bf16; metric in float32): "
            + ", ".join(f"{key} {value:.3g}" for key, value in checks.items())
            + f"; tolerance {args.tolerance}"
        )
        failed += [f"{name}: {key}" for key, value in checks.items() if key != "logit_scale" and not value <= args.tolerance]
        failed += [
            f"{name}: {label} peak over its budget"
            for label, row in report["rows"].items()
            if row["peak_mb"] > allowed_peak(report["rows"], label)
        ]
    if args.json:
        write_json(args.json, {"args": vars(args) | {"json": str(args.json)}, "models": reports}, indent=2)
    if failed:
        print(f"FAIL: {failed} beyond {args.tolerance}")
        return 1
    return 0


def allowed_peak(rows: dict[str, dict[str, Any]], label: str) -> float:
    """A budgeted row's limit: its budget, or, where one copy of the batch alone needs more
    (the library then runs one copy per forward, as documented), the one-copy row's peak."""
    row = rows[label]
    if "budget_mb" not in row:
        return float("inf")
    one_copy = rows.get(label.removesuffix(", budget"), {}).get("peak_mb", 0.0)
    return max(float(row["budget_mb"]), float(one_copy))


if __name__ == "__main__":
    sys.exit(main())
