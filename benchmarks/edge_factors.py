"""Where first-order edge attribution goes wrong on the Llama toy: each factor of
``g_r . K_r . J_s . delta_s`` against its exact counterpart, edge by edge.

For every edge ``s -> (r, stream)`` into the Aggregate head (layer 1) of the bundled Llama
toy, with raw hooks on the HF model in float64 (no library code on the measuring side):

- ``exact``: path patching (clean run; r's output recomputed with its ``stream`` from the
  run where ``s`` is corrupt, every other head's output clean; metric change);
- ``first_order``: ``g_r . K_r J_s delta_s`` (what `gna.edge_attribution` computes, steps=1);
- ``up_exact``: ``g_r . K_r Delta_stream``, with the exact change of r's stream;
- ``up_exact_recv_exact``: ``g_r . (out_r(stream + Delta_stream) - out_r)``: only the
  part after r linear;
- ``atp_star``: ``g_r . (out_r(stream + J_s delta_s) - out_r)``: the receiver exact under
  the first-order change of its stream (AtP*'s idea), up- and downstream linear;
- ``down_exact``: the metric change with r's output set to ``out_r + K_r Delta_stream``
  (exact upstream and downstream, linear receiver);
- ``down_ig``: ``g_ig . K_r J_s delta_s``, with ``g_ig`` the gradient at r's output averaged
  over 8 midpoints from its clean value to its value with every sender corrupt (one path per
  receiver, shared by its edges: integrated gradients downstream only);
- ``up_exact_down_ig``: ``g_ig . K_r Delta_stream``;
- ``up_exact_down_ig_stream``: the same with one downstream path per receiver stream (to r's
  output with that stream alone from the every-sender-corrupt run);
- ``up_recv_exact_down_ig_stream``: that, with the receiver exact too.

Printed: each estimate per edge and its Spearman against ``exact`` over the edges.
Jacobian-vector products are central differences in float64 (step 1e-4 of a unit-free t).

    python benchmarks/edge_factors.py [--prompts 48] [--seed 4242] [--receiver 0]
"""

from __future__ import annotations

import torch
from _common import parser, set_threads, spearman

import gna_interp as gna

STREAMS = ("q", "k", "v")
EPS = 1e-4
STEPS = 8  # midpoints of the downstream integrated gradient


class Runner:
    """Forwards of the HF Llama with: layer-0 head outputs (o_proj input) replaced, one
    layer-1 stream's receiver slice replaced, the receiver's output slice replaced."""

    def __init__(self, hf, batch, metric, receiver: int):
        self.hf, self.batch, self.metric, self.r = hf, batch, metric, receiver
        self.d = hf.config.head_dim

    def run(self, o0=None, stream=None, out1=None, grad_out=False):
        """Returns (layer-1 q/k/v projections [b, pos, 64] each, r's output slice, metric, grad of metric wrt r's output)."""
        layers = self.hf.model.layers
        seen: dict = {}
        handles = []
        sl = slice(self.r * self.d, (self.r + 1) * self.d)

        def o0_hook(module, args):
            return (o0,) if o0 is not None else None

        def proj_hook(name):
            def hook(module, args, output):
                seen[name] = output.detach().clone()
                if stream is not None and stream[0] == name:
                    output = output.clone()
                    output[..., sl] = stream[1]
                    return output
                return None

            return hook

        def o1_hook(module, args):
            x = args[0]
            if out1 is not None:
                x = x.clone()
                x[..., sl] = out1
            if grad_out:
                x = x.detach().requires_grad_(True)
                seen["o1_leaf"] = x
            seen["out"] = x[..., sl].detach().clone()
            return (x,)

        attn0, attn1 = layers[0].self_attn, layers[1].self_attn
        try:  # registered inside: a failing registration leaves none behind
            handles.append(attn0.o_proj.register_forward_pre_hook(o0_hook))
            for name in STREAMS:
                handles.append(getattr(attn1, f"{name}_proj").register_forward_hook(proj_hook(name)))
            handles.append(attn1.o_proj.register_forward_pre_hook(o1_hook))
            with torch.set_grad_enabled(grad_out):
                logits = self.hf(input_ids=self.batch.input_ids, attention_mask=self.batch.attention_mask, use_cache=False).logits
                value = self.metric(logits).double().mean()
                grad = torch.autograd.grad(value, seen["o1_leaf"])[0][..., sl] if grad_out else None
        finally:
            for handle in handles:
                handle.remove()
        return seen, float(value.detach()), grad


def measure(prompts: int, seed: int, receiver: int) -> dict:
    model = gna.load_toy("llama", backend="nnsight")
    hf = model.hf_model.double()
    task = gna.toy_task("llama", prompts, seed=seed)
    corrupt = task.corrupted(seed=seed)
    encoded = task.encode()
    base = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)
    batch, corrupt_batch = model.to_batch(task), model.to_batch(corrupt)
    d = hf.config.head_dim
    run_clean = Runner(hf, batch, base, receiver)
    o0 = {}

    def grab(module, args):
        o0["x"] = args[0].detach().clone()

    handle = hf.model.layers[0].self_attn.o_proj.register_forward_pre_hook(grab)
    try:
        with torch.no_grad():
            hf(input_ids=corrupt_batch.input_ids, attention_mask=corrupt_batch.attention_mask, use_cache=False)
            corrupt_o0 = o0["x"]
            hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
            clean_o0 = o0["x"]
    finally:
        handle.remove()
    clean, m0, g = run_clean.run(grad_out=True)
    out0 = clean["out"]
    sl = slice(receiver * d, (receiver + 1) * d)
    # r's output with every stream from the run where every sender is corrupt: the end of
    # the downstream path the integrated gradient g_ig averages over.
    every, _, _ = run_clean.run(o0=corrupt_o0)
    out_every = _recompute_all(run_clean, clean, every, sl)
    g_ig = sum(run_clean.run(out1=out0 + (i + 0.5) / STEPS * (out_every - out0), grad_out=True)[2] for i in range(STEPS)) / STEPS
    g_stream = {}  # the same, one path per stream: r's output with that stream alone from `every`
    for name in STREAMS:
        end, _, _ = run_clean.run(stream=(name, every[name][..., sl]))
        points = [run_clean.run(out1=out0 + (i + 0.5) / STEPS * (end["out"] - out0), grad_out=True)[2] for i in range(STEPS)]
        g_stream[name] = sum(points) / STEPS
    rows = {}
    for s in range(hf.config.num_attention_heads):
        delta = torch.zeros_like(clean_o0)
        delta[..., s * d : (s + 1) * d] = (corrupt_o0 - clean_o0)[..., s * d : (s + 1) * d]
        corrupted, _, _ = run_clean.run(o0=clean_o0 + delta)
        plus, _, _ = run_clean.run(o0=clean_o0 + EPS * delta)
        minus, _, _ = run_clean.run(o0=clean_o0 - EPS * delta)
        for name in STREAMS:
            base_stream = clean[name][..., sl]
            exact_change = corrupted[name][..., sl] - base_stream
            linear_change = (plus[name][..., sl] - minus[name][..., sl]) / (2 * EPS)

            def out_with(change, name=name, base_stream=base_stream):
                seen, value, _ = run_clean.run(stream=(name, base_stream + change))
                return seen["out"], value

            def k_times(change):  # K_r change, by central differences
                return (out_with(EPS * change)[0] - out_with(-EPS * change)[0]) / (2 * EPS)

            out_exact, m_exact = out_with(exact_change)
            out_atp, _ = out_with(linear_change)
            k_exact = k_times(exact_change)
            k_linear = k_times(linear_change)
            _, m_down, _ = run_clean.run(out1=out0 + k_exact)
            rows[(s, name)] = {
                "exact": m_exact - m0,
                "first_order": float((g * k_linear).sum()),
                "up_exact": float((g * k_exact).sum()),
                "up_exact_recv_exact": float((g * (out_exact - out0)).sum()),
                "atp_star": float((g * (out_atp - out0)).sum()),
                "down_exact": m_down - m0,
                "down_ig": float((g_ig * k_linear).sum()),
                "up_exact_down_ig": float((g_ig * k_exact).sum()),
                "up_exact_down_ig_stream": float((g_stream[name] * k_exact).sum()),
                "up_recv_exact_down_ig_stream": float((g_stream[name] * (out_exact - out0)).sum()),
            }
    return rows


def _recompute_all(runner: Runner, clean: dict, every: dict, sl: slice) -> torch.Tensor:
    """r's output with q, k and v all taken from ``every`` (the others' clean)."""
    layers = runner.hf.model.layers
    handles = []

    def hook(name):
        def fn(module, args, output):
            output = output.clone()
            output[..., sl] = every[name][..., sl]
            return output

        return fn

    try:  # registered inside: a failing registration leaves none behind
        for name in STREAMS:
            handles.append(getattr(layers[1].self_attn, f"{name}_proj").register_forward_hook(hook(name)))
        seen, _, _ = runner.run()
    finally:
        for handle in handles:
            handle.remove()
    return seen["out"]


def main(argv: list[str] | None = None) -> int:
    arguments = parser(__doc__, threads=1, json_file=False)
    arguments.add_argument("--prompts", type=int, default=48)
    arguments.add_argument("--seed", type=int, default=4242)
    arguments.add_argument("--receiver", type=int, default=0, help="layer-1 head")
    args = arguments.parse_args(argv)
    set_threads(args.threads)
    rows = measure(args.prompts, args.seed, args.receiver)
    names = list(next(iter(rows.values())))
    print(f"Llama toy, receiver L1H{args.receiver}, {args.prompts} prompts (seed {args.seed}), candidate logit difference")
    exact = torch.tensor([row["exact"] for row in rows.values()])
    print(f"{'estimate':30}" + "".join(f"{f'L0H{s}->{stream}':>9}" for s, stream in rows) + f"{'spearman':>9}")
    for n in names:
        values = torch.tensor([row[n] for row in rows.values()])
        print(f"{n:30}" + "".join(f"{float(v):9.3f}" for v in values) + f"{spearman(values, exact):9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
