"""Benchmark: per-head corrections to integrated gradients on the hybrid toy (issue 29).

`benchmarks/ig_paths.py` shows that on the hybrid toy (``toy-falcon_h1``, 2 layers x (4
attention + 8 SSM) heads) no shared integration path ranks the heads as `patching_sweep`
does at <= 10 steps, and that one path per head does (0.97-0.98 at 4 points a head, 96 in
all). This measures cheaper ways to get each head's *own* curve ``m(alpha e_h) - m(0)``
(``e_h``: head ``h`` moved from its corrupt to its clean output, every other head at its
corrupt output, the denoise direction of the sweep). Every estimate is built from gate
gradients (``act + w (target - act)``, `gna_interp.core.plan.Edit` with a floating mask), one
gate per *row* and head, broadcast over positions, so different prompts of one forward can
follow different paths:

``first``
    ``g_h = dm/dw_h`` at ``w = 0``: first-order attribution (1 point).
``taylor2`` / ``taylor3`` (ceilings, not methods)
    ``g_h + H_hh / 2 (+ T_hhh / 6)``, the per-head second (third) derivative by central
    differences of the gradient along ``e_h`` for every head (``2 x heads`` points): what a
    perfect estimate of the Hessian's diagonal could give.
``hutch-s``
    the same second-order term estimated for all heads at once (Hutchinson): each row ``r``
    draws its own random signs ``z_r`` (one per head); ``(g(eps z) - g(-eps z)) / (2 eps) = H z``
    (one Hessian-vector product per row, from two gradient points), and ``z_rh (H_r z_r)_h``
    has expectation ``H_r,hh``; ``s`` draws, ``1 + 2 s`` points.
``strat-k``
    stratified per-head integrated gradients: at each of ``k`` points every row moves *one*
    head of each layer (the others at their corrupt output), a different one at each point
    (balanced over rows), to ``alpha`` drawn stratified in ``[0, 1)``; head ``h``'s score is
    ``mean_r g_r,h(0)`` plus the mean, over the rows that moved it, of
    ``g_r,h(alpha e_h) - g_r,h(0)`` (a control variate: the first-order term on every row).
    ``1 + k`` points. Unbiased for the per-head integrated gradient (the sweep's effect)
    when each row's other-layer head does not interact with it; rows x k / heads-per-layer
    samples a head.
``edges-upstream`` / ``edges-receiver`` (``--edges``)
    a non-last-layer head's first-order score with each of its paths through a last-layer
    head re-scored by `gna.edge_attribution` (``method="exact_upstream"`` or
    ``"exact_receiver"``): ``first_h - sum_r first_order(h -> r) + sum_r exact(h -> r)``; the
    direct path stays first order.
``sweep-up`` (a control, not gradient-based)
    the exact effects (the sweep) for the heads before the last layer, first order for the
    last layer's heads (downstream of them only the last MLP and the final norm).
``rows-m`` (a control, not gradient-based)
    the exact per-head effects on a random ``m`` of the prompts: what a sweep at the same
    cost in passes gives.

``--curves``: how step-like each head's own curve is (the share of its variation in its
steepest eighth, 0.125 for a straight line), per layer.

Printed: Spearman over the live heads against the sweep, and the cost in points (forward +
backward each) and passes (`gna.cost_meter`: forwards + backwards). The first block checks
the per-row machinery: the exact per-row effects averaged over rows equal `patching_sweep`.

Randomised estimates are drawn ``--draws`` times: mean (min-max) Spearman.

Run: ``python benchmarks/ig_heads.py [--toy falcon_h1] [--prompts 32] [--seed 0] [--draws 5] [--curves] [--edges] [--threads 1]``
"""

from __future__ import annotations

import torch
from _common import parser, set_threads, spearman, toy_case

import gna_interp as gna

# Private, on purpose: this benchmark builds its own gated forwards from the plan machinery
# (heads_by_site, Edit, Plan, charge, logits_read) to compare estimators the public API does
# not offer; tests/test_benchmarks.py checks its gates reproduce the public patching_sweep.
from gna_interp.core.compile import heads_by_site
from gna_interp.core.plan import Edit, Plan
from gna_interp.cost import charge
from gna_interp.patching.metrics import logits_read

EPS = 1e-2


class Gates:
    """Forwards of the corrupt run with every head gated towards its clean output, one gate
    per row and head (``w``: ``[rows, heads]``, heads in `model.heads` order)."""

    def __init__(self, model, clean, corrupt, metric):
        self.model, self.metric = model, metric
        self.run_batch, source = model.to_batch(corrupt), model.to_batch(clean)
        self.heads = list(model.heads)
        self.sites = sorted(heads_by_site(model.layout, self.heads))
        self.keep = logits_read(metric)
        self.clean = model.backend.run(source, model.compile_plan(source, []), capture=set(self.sites), logits_to_keep=self.keep).acts
        self.base = model.compile_plan(self.run_batch, [])
        self.rows = self.run_batch.n_rows
        self.index = {}  # site -> list of (column in w, head index in the site)
        for column, head in enumerate(self.heads):
            site, i = model.head_site(head)
            self.index.setdefault(site, []).append((column, i))
        self.layer = torch.tensor([h.layer for h in self.heads])

    def __call__(self, w: torch.Tensor, grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-row metric ``[rows]`` and, with ``grad``, ``d m_r / d w_r,h`` ``[rows, heads]``."""
        model = self.model
        plan = Plan(start=self.base.start)
        plan.extend(self.base)
        leaves = {}
        for site in self.sites:
            n = model.layout.site_shape(site)[0]
            gate = torch.zeros(self.rows, 1, n, 1)
            for column, i in self.index[site]:
                gate[:, 0, i, 0] = w[:, column]
            gate.requires_grad_(grad)
            leaves[site] = gate
            plan.add(site, Edit(gate, self.clean[site]))
        with torch.set_grad_enabled(grad):
            out = model.backend.run(self.run_batch, plan, grad=grad, logits_to_keep=self.keep)
            values = self.metric(out.logits).float()
        if not grad:
            return values.detach(), None
        grads = torch.autograd.grad(values.sum(), list(leaves.values()))
        charge(model.backend, backwards=1, backward_block_rows=self.rows * model.n_layers)
        g = torch.zeros(self.rows, len(self.heads))
        for site, gr in zip(leaves, grads, strict=True):
            for column, i in self.index[site]:
                g[:, column] = gr[:, 0, i, 0].detach()
        return values.detach(), g


def table(model, heads, values: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(model.n_layers, model.n_heads)
    for column, head in enumerate(heads):
        out[head.layer, head.head] = values[column]
    return out


def curves(gates: Gates, g0: torch.Tensor, per_row: torch.Tensor, points: int = 8) -> None:
    """How far each head's own curve ``m_r(alpha e_h)`` is from linear, per layer: each row's
    curve at ``points + 1`` equally spaced ``alpha`` (one forward per point and head), then
    the share of its total variation that falls in its steepest interval (``1 / points`` for
    a straight line, 1 for a step), weighted by the variation, and where along ``alpha`` the
    steepest intervals lie; and the share of rows whose
    first-order estimate has the sign of the exact effect (rows with ``|effect| > 0.1``)."""
    rows, n = g0.shape
    print(
        f"per-head curves ({points} intervals): steepest-interval share of the variation "
        f"(1/{points} = {1 / points:.3f} if linear), first-order sign agreement"
    )
    for layer in sorted(set(gates.layer.tolist())):
        share_num, share_den, agree, total = 0.0, 0.0, 0, 0
        where_max: list[torch.Tensor] = []  # per interval: the steepest steps that fall in it
        for h in torch.nonzero(gates.layer == layer).flatten().tolist():
            values = []
            for j in range(points + 1):
                w = torch.zeros(rows, n)
                w[:, h] = j / points
                values.append(gates(w, grad=False)[0])
            steps = torch.stack(values, 1).diff(dim=1).abs()  # [rows, points]
            variation = steps.sum(1)
            share_num += float(steps.max(1).values.sum())
            where_max.append(torch.bincount(steps.argmax(1), weights=steps.max(1).values, minlength=points))
            share_den += float(variation.sum())
            big = per_row[:, h].abs() > 0.1
            agree += int((torch.sign(g0[big, h]) == torch.sign(per_row[big, h])).sum())
            total += int(big.sum())
        print(
            f"  layer {layer}: steepest-interval share {share_num / share_den:.3f}; "
            f"first-order sign right on {agree}/{total} (row, head) pairs"
        )
        where = torch.stack(where_max).sum(0)
        print(f"    where the steepest interval lies (weighted by its step, alpha = 0 -> 1): {(where / where.sum()).numpy().round(2)}")


def edge_nodes(model, clean, corrupt, metric, heads, first, score, rows) -> None:
    """Node scores of the non-last-layer heads from edge attribution into the last layer's heads:
    ``first_h - sum_r first_order(h -> r) + sum_r method(h -> r)`` (the direct path stays first
    order, each path through a last-layer head is re-estimated by ``method``); the edges are
    taken on the corrupt run with clean senders (the denoise direction). Cost: first-order node
    attribution, first-order edges and the method's edges (forward plus backward passes)."""
    last = max(h.layer for h in heads)
    senders = [h for h in heads if h.layer < last]
    receivers = [h for h in heads if h.layer == last]
    with gna.cost_meter(model) as base_cost:
        first_order = gna.edge_attribution(model, corrupt, clean, metric, receivers=receivers, senders=senders).scores
    base = base_cost.passes(rows) + base_cost.backward_block_rows / (rows * model.n_layers) + 3  # + first-order node attribution
    for method in ("exact_upstream", "exact_receiver"):
        with gna.cost_meter(model) as cost:
            edges = gna.edge_attribution(model, corrupt, clean, metric, receivers=receivers, senders=senders, method=method).scores
        est = first.clone()
        for i, sender in enumerate(senders):
            column = heads.index(sender)
            est[column] = first[column] - first_order[i].sum() + edges[i].sum()
        passes = cost.passes(rows) + cost.backward_block_rows / (rows * model.n_layers)
        print(f"{'edges-' + method.split('_')[1]:<12} {'':>6} {passes + base:>6.0f} {score(est):>10.3f}", flush=True)


def main() -> None:
    arguments = parser(__doc__, threads=1, json_file=False)
    arguments.add_argument("--toy", default="falcon_h1_counting")
    arguments.add_argument("--prompts", type=int, default=32)
    arguments.add_argument("--seed", type=int, default=0)
    arguments.add_argument("--draws", type=int, default=5, help="random draws of each randomised estimate")
    arguments.add_argument("--curves", action="store_true", help="also the shape of each head's own curve")
    arguments.add_argument("--edges", action="store_true", help="also the node scores from edge attribution (slow)")
    args = arguments.parse_args()
    set_threads(args.threads)
    _, model, clean, corrupt, metric = toy_case(args.toy, args.prompts, args.seed)
    with gna.cost_meter(model) as sweep_cost:
        exact = gna.patching_sweep(model, clean, corrupt, metric, progress=False).effects()
    gates = Gates(model, clean, corrupt, metric)
    heads, rows, n = gates.heads, gates.rows, len(gates.heads)
    exact_flat = torch.stack([exact[h.layer, h.head] for h in heads])
    live = exact_flat != 0

    def score(est: torch.Tensor) -> float:
        return spearman(est[live], exact_flat[live])

    # per-row exact effects, one forward per head (the machinery check)
    zero = torch.zeros(rows, n)
    m0, g0 = gates(zero)
    per_row = torch.stack([gates(torch.eye(n)[h].expand(rows, n).clone(), grad=False)[0] - m0 for h in range(n)], 1)  # [rows, heads]
    print(f"toy-{args.toy}, {rows} prompts, {n} heads ({int(live.sum())} live); sweep: {sweep_cost.passes(rows):.0f} passes")
    print(f"check: max |mean_r per-row effect - patching_sweep| = {(per_row.mean(0) - exact_flat).abs().max():.2e}")
    with gna.cost_meter(model) as one_point:
        gates(zero)
    print(
        f"one point (gradient at one gate setting): {one_point.passes(rows):.0f} forward pass + {one_point.backwards} backward(s) "
        f"over {one_point.backward_block_rows / (rows * model.n_layers):.0f} pass; passes below = 2 x points + 1 (the clean forward)"
    )
    print(f"{'estimate':<12} {'points':>6} {'passes':>6} {'spearman':>10}")

    def row(name: str, points: int, values: list[float]) -> None:
        text = (
            f"{sum(values) / len(values):.3f}"
            if len(values) == 1
            else f"{sum(values) / len(values):.3f} ({min(values):.2f}-{max(values):.2f})"
        )
        print(f"{name:<12} {points:>6} {2 * points + 1:>6} {text:>10}", flush=True)

    first = g0.mean(0)
    row("first", 1, [score(first)])
    last_layer = gates.layer == gates.layer.max()
    up = (~last_layer).sum().item()
    sweep_up = torch.where(last_layer, first, per_row.mean(0))
    print(f"{'sweep-up':<12} {'':>6} {up + 3:>6} {score(sweep_up):>10.3f}", flush=True)

    # ceilings: the per-head diagonal second and third derivatives
    d2, d3 = torch.zeros(n), torch.zeros(n)
    for h in range(n):
        e = torch.zeros(rows, n)
        e[:, h] = EPS
        gp, gm = gates(e)[1][:, h].mean(), gates(-e)[1][:, h].mean()
        d2[h] = (gp - gm) / (2 * EPS)
        d3[h] = (gp - 2 * first[h] + gm) / EPS**2
    row("taylor2", 1 + 2 * n, [score(first + d2 / 2)])
    row("taylor3", 1 + 2 * n, [score(first + d2 / 2 + d3 / 6)])

    gen = torch.Generator().manual_seed(1000 + args.seed)
    for s in (1, 2, 4, 8) if args.draws else ():
        got = []
        for _ in range(args.draws):
            diag = torch.zeros(n)
            for _ in range(s):
                z = torch.randint(0, 2, (rows, n), generator=gen).float() * 2 - 1
                hz = (gates(EPS * z)[1] - gates(-EPS * z)[1]) / (2 * EPS)
                diag += (z * hz).mean(0) / s
            got.append(score(first + diag / 2))
        row(f"hutch-{s}", 1 + 2 * s, got)

    layers = sorted(set(gates.layer.tolist()))
    for variant in ("strat", "strat-up") if args.draws else ():
        moving = layers if variant == "strat" else layers[:-1]  # strat-up: the last layer stays first order
        by_layer = [torch.nonzero(gates.layer == layer).flatten() for layer in moving]
        for k in (2, 4, 6, 8, 9, 10, 12) if variant == "strat-up" else (2, 4, 6, 8, 9, 10, 12, 16, 24):
            got = []
            for _ in range(args.draws):
                # assign[j][c]: [rows] the head of layer c that each row moves at point j (balanced, per-row offset)
                assign = []
                offsets = [torch.randperm(rows, generator=gen) for _ in by_layer]  # independent per layer: no fixed pairs
                for j in range(k):
                    assign.append([c[(offset + j) % len(c)] for c, offset in zip(by_layer, offsets, strict=True)])
                # alpha: per head, stratified over the samples that move it
                alpha = torch.zeros(k, len(by_layer), rows)
                for c in range(len(by_layer)):
                    picks = torch.stack([assign[j][c] for j in range(k)])  # [k, rows]
                    for h in picks.unique():
                        where = (picks == h).nonzero()
                        count = len(where)
                        vals = (torch.randperm(count, generator=gen).float() + torch.rand(count, generator=gen)) / count
                        alpha[where[:, 0], c, where[:, 1]] = vals
                total, count_h = torch.zeros(n), torch.zeros(n)
                for j in range(k):
                    w = torch.zeros(rows, n)
                    for c, pick in enumerate(assign[j]):
                        w[torch.arange(rows), pick] = alpha[j, c]
                    _, g = gates(w)
                    for pick in assign[j]:
                        total.index_add_(0, pick, g[torch.arange(rows), pick] - g0[torch.arange(rows), pick])
                        count_h.index_add_(0, pick, torch.ones(rows))
                est = first + torch.where(count_h > 0, total / count_h.clamp(min=1), 0.0)
                got.append(score(est))
            row(f"{variant}-{k}", 1 + k, got)

    if args.curves:
        curves(gates, g0, per_row)

    if args.edges:
        edge_nodes(model, clean, corrupt, metric, heads, first, score, rows)

    for m in (8, 12, 16, 24) if args.draws else ():
        got = []
        for _ in range(args.draws):
            pick = torch.randperm(rows, generator=gen)[:m]
            got.append(score(per_row[pick].mean(0)))
        print(
            f"{'rows-' + str(m):<12} {'':>6} {(n + 2) * m / rows:>6.1f} {sum(got) / len(got):.3f} ({min(got):.2f}-{max(got):.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
