"""Implicit attention of SSM heads, vectorised over batch, heads, query rows and keys.

A selective SSM ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t . h_t + D x_t``
is a causal linear map of its inputs: ``y_t = sum_s M[t, s] x_s + D x_t`` with

- Mamba-2 (scalar ``A_h`` per head):
  ``M_h[t, s] = (C_t . B_s) * exp(A_h * sum_{k=s+1..t} dt_{k,h}) * dt_{s,h}``
  (Discrete Mamba-2, Llamba: ``A_h = -1``, ``dt = softplus(A_log)``, no ``dt_{s,h}`` factor);
- Mamba-1 (a head is a channel ``c``; ``A`` diagonal over the state ``n``):
  ``M_c[t, s] = sum_n C_{t,n} exp(A_{c,n} * sum_{k=s+1..t} dt_{k,c}) B_{s,n} dt_{s,c}``;
- gated DeltaNet (Qwen3-Next; a head is a value head, ``A_r = alpha_r (I - beta_r k_r k_r^T)``):
  ``M[t, s] = beta_s k_s^T A_{s+1} ... A_t q_t`` and ``o_t = sum_s M[t, s] v_s``;

and ``M[t, s] = 0`` for ``s > t``. Only the requested query rows are built: memory is
``O(head x query x key)``, so one row per prompt costs ``O(T)``, never ``T x T``.

Mamba-1's decay depends on the state index, so a row costs ``state`` exponentials per
entry. The full matrix (every row) takes a blocked path instead (`_mamba1_full`): the
decay between blocks factors through the block boundary, which turns most of the work
into one matmul over the state.

The sums ``sum_{k=s+1..t} dt_k`` are differences of prefix sums. Prefix sums grow with
``T``, and subtracting two large, close float32 numbers loses most digits, so prefix sums
are taken in float64 and each is split into a float32 value plus its float32 remainder:
the difference of two close float32 values is exact (Sterbenz), and the remainders
carry the rest; the result is as accurate as a float64 difference at float32 memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .capture import DeltaInputs, SSMInputs


def gather_rows(x: Tensor, rows: Tensor) -> Tensor:
    """``x[b, rows[b, q], ...]``: ``[batch, pos, ...]``, ``[batch, query]`` -> ``[batch, query, ...]``."""
    index = rows.view(*rows.shape, *([1] * (x.dim() - 2))).expand(*rows.shape, *x.shape[2:])
    return x.gather(1, index)


def allowed_keys(rows: Tensor, mask: Tensor) -> Tensor:
    """``[batch, 1, query, key]`` bool: the key is at or before the query, and both are real tokens."""
    keys = torch.arange(mask.shape[1], device=mask.device)
    allowed = (keys <= rows[..., None]) & mask[:, None, :] & gather_rows(mask, rows)[..., None]
    return allowed[:, None]


def _segment_sums(prefix: Tensor, rows: Tensor) -> Tensor:
    """``[batch, head, query, key]`` = ``prefix[q] - prefix[s]`` from float64 ``prefix [batch, pos, head]``."""
    high = prefix.float()
    low = (prefix - high.double()).float()
    seg = torch.sub(gather_rows(high, rows).transpose(1, 2)[..., None], high.transpose(1, 2)[:, :, None, :])
    return seg.add_(gather_rows(low, rows).transpose(1, 2)[..., None]).sub_(low.transpose(1, 2)[:, :, None, :])


def _mamba2_rows(ssm: SSMInputs, rows: Tensor, allowed: Tensor) -> Tensor:
    log_decay = torch.cumsum(ssm.dt.double() * ssm.A.double(), dim=1)  # [batch, pos, head]: sum_{k<=t} A dt_k
    decay = _segment_sums(log_decay, rows).masked_fill_(~allowed, float("-inf")).exp_()
    c_rows = gather_rows(ssm.C, rows).permute(0, 2, 1, 3)  # [batch, head, query, state]
    scale = ssm.dt if ssm.weight is None else ssm.weight  # Mamba-2: dt_s; Discrete Mamba-2: 1
    b_dt = (ssm.B * scale[..., None]).permute(0, 2, 3, 1)  # [batch, head, state, key]: B_s dt_s
    return decay.mul_(torch.matmul(c_rows, b_dt))


def _mamba1_rows(ssm: SSMInputs, rows: Tensor, allowed: Tensor) -> Tensor:
    elapsed = _segment_sums(torch.cumsum(ssm.dt.double(), dim=1), rows)  # [batch, head, query, key]
    elapsed.masked_fill_(~allowed, float("inf"))  # A < 0: exp(A * inf) = 0 above the diagonal
    c_rows = gather_rows(ssm.C, rows)  # [batch, query, state]
    total, term = torch.zeros_like(elapsed), torch.empty_like(elapsed)
    for n in range(ssm.A.shape[1]):  # the state axis (a handful), not positions
        torch.mul(elapsed, ssm.A[None, :, n, None, None], out=term)
        total.addcmul_(term.exp_(), (c_rows[:, :, n, None] * ssm.B[:, None, :, n])[:, None])  # C_t,n B_s,n: [batch, 1, query, key]
    return total.mul_(ssm.dt.transpose(1, 2)[:, :, None, :]).masked_fill_(~allowed, 0.0)


def _mamba1_full(ssm: SSMInputs, block: int) -> Tensor:
    """Every row of Mamba-1's matrix, in blocks of ``block`` positions.

    For a query ``t`` in block ``i`` and a key ``s`` in an earlier block, split the decay
    at ``p``, the last position before block ``i``:
    ``exp(A (S_t - S_s)) = exp(A (S_t - S_p)) * exp(A (S_p - S_s))``. Both exponents are
    ``<= 0`` (no overflow), and the sum over the state becomes one batched matmul
    ``left [.., query, state] @ right [.., state, key]``. Keys in the query's own block
    are computed directly, as in `_mamba1_rows`.
    """
    n_rows, n_pos, n_heads = ssm.dt.shape
    n_blocks = -(-n_pos // block)
    padded, n_state = n_blocks * block, ssm.A.shape[1]
    dt = torch.nn.functional.pad(ssm.dt, (0, 0, 0, padded - n_pos))  # [batch, pos, head]
    real = ssm.mask[..., None].to(ssm.B.dtype)  # zero B and C on padding: padding keys and queries get 0
    B, C = (torch.nn.functional.pad(x * real, (0, 0, 0, padded - n_pos)) for x in (ssm.B, ssm.C))  # [batch, pos, state]
    prefix = torch.cumsum(dt.double(), dim=1).transpose(1, 2)  # [batch, head, pos]: S_t
    cut = torch.nn.functional.pad(prefix[:, :, block - 1 :: block][:, :, :-1], (1, 0))  # [batch, head, block]: S_p
    A = ssm.A[None, :, None, None, :]  # [1, head, 1, 1, state]
    since = (prefix.unflatten(2, (n_blocks, block)) - cut[..., None]).float()  # [batch, head, block, query]: S_t - S_p
    left = torch.exp(since[..., None] * A) * C.unflatten(1, (n_blocks, block))[:, None]  # [batch, head, block, query, state]
    before = torch.arange(padded, device=dt.device) < (torch.arange(n_blocks, device=dt.device) * block)[:, None]  # key s <= p
    until = (cut[..., None] - prefix[:, :, None, :]).float().masked_fill_(~before, float("inf"))  # [b, h, block, key]: S_p - S_s
    right = torch.exp(until[:, :, :, None, :] * A.transpose(3, 4)) * (
        B.transpose(1, 2)[:, None, None] * dt.transpose(1, 2)[:, :, None, None]
    )
    full = torch.matmul(left, right).view(n_rows, n_heads, padded, padded)  # off-diagonal blocks
    blocks = prefix.unflatten(2, (n_blocks, block))  # [batch, head, block, pos in block]
    causal = torch.ones(block, block, dtype=torch.bool, device=dt.device).tril()
    elapsed = (blocks[..., :, None] - blocks[..., None, :]).float().masked_fill_(~causal, float("inf"))  # [b, h, block, q, s]
    c_blocks, b_blocks = C.unflatten(1, (n_blocks, block)), B.unflatten(1, (n_blocks, block))  # [batch, block, pos, state]
    diagonal, term = torch.zeros_like(elapsed), torch.empty_like(elapsed)
    for n in range(n_state):  # the state axis, not positions
        outer = (c_blocks[:, :, :, None, n] * b_blocks[:, :, None, :, n])[:, None]  # [batch, 1, block, q, s]: C_t,n B_s,n
        diagonal.addcmul_(torch.mul(elapsed, ssm.A[None, :, n, None, None, None], out=term).exp_(), outer)
    diagonal *= dt.transpose(1, 2).unflatten(2, (n_blocks, block))[:, :, :, None, :]  # dt_s
    full.view(n_rows, n_heads, n_blocks, block, n_blocks, block).diagonal(dim1=2, dim2=4).add_(diagonal.permute(0, 1, 3, 4, 2))
    return full[:, :, :n_pos, :n_pos]


def _delta_rows(delta: DeltaInputs, rows: Tensor) -> Tensor:
    """Gated DeltaNet: ``M[t, s] = beta_s k_s^T A_{s+1} ... A_t q_t`` with
    ``A_r = alpha_r (I - beta_r k_r k_r^T)``. Walking back from each query row, ``u``
    holds ``A_{s+1} ... A_t q_t`` and each step is a rank-one update, ``O(k_dim)``: a row
    costs ``O(T k_dim)`` per head, never a ``k_dim x k_dim`` matrix product. The loop
    runs over offsets ``t - s`` (every row at once)."""
    n_rows, n_pos, n_heads, _ = delta.k.shape
    u = gather_rows(delta.q, rows)  # [batch, query, head, k_dim]
    alpha = delta.log_alpha.exp()
    out = torch.zeros(n_rows, rows.shape[1], n_heads, n_pos, device=u.device)
    for offset in range(int(rows.max()) + 1):
        keys = rows - offset  # [batch, query]: the key s of each row at this step
        valid = (keys >= 0)[..., None]
        keys = keys.clamp(min=0)
        k, beta = gather_rows(delta.k, keys), gather_rows(delta.beta, keys) * valid  # [b, q, h, k_dim], [b, q, h]
        written = beta * (k * u).sum(-1)  # beta_s k_s . u
        out.scatter_add_(3, keys[:, :, None, None].expand(-1, -1, n_heads, 1), written[..., None])
        u = gather_rows(alpha, keys)[..., None] * (u - written[..., None] * k)  # u <- A_s u
    return out.permute(0, 2, 1, 3)


def implicit_rows(ssm: SSMInputs | DeltaInputs, rows: Tensor, include_skip: bool = False, block: int = 64) -> Tensor:
    """Rows of the implicit attention matrix.

    Args:
        ssm: one layer's `SSMInputs` (or `DeltaInputs`) for ``head`` heads.
        rows: ``[batch, query]`` absolute query positions.
        include_skip: add ``D_h`` on the diagonal (key = query), so that
            ``y_t = sum_s M[t, s] x_s`` with no separate skip term (a gated DeltaNet
            has none: its ``M`` alone gives ``o_t = sum_s M[t, s] v_s``).
        block: Mamba-1 only: block size of the full-matrix path (`_mamba1_full`), used
            when ``rows`` are all positions in order.

    Returns:
        ``[batch, head, query, key]`` float32; zero above the diagonal, on padding keys
        and on padding queries.
    """
    if isinstance(ssm, DeltaInputs):  # no skip term: y = M v exactly
        rows = rows.to(ssm.k.device)
        return _delta_rows(ssm, rows) * allowed_keys(rows, ssm.mask)
    rows = rows.to(ssm.dt.device)
    n_pos = ssm.mask.shape[1]
    if ssm.scalar_decay:
        pattern = _mamba2_rows(ssm, rows, allowed_keys(rows, ssm.mask))
    elif rows.shape[1] == n_pos and bool((rows == torch.arange(n_pos, device=rows.device)).all()):
        pattern = _mamba1_full(ssm, block)  # causal, and zero on padding by construction
    else:
        pattern = _mamba1_rows(ssm, rows, allowed_keys(rows, ssm.mask))
    if include_skip:
        keys = torch.arange(n_pos, device=rows.device)
        diagonal = (keys == rows[..., None]) & gather_rows(ssm.mask, rows)[..., None]
        pattern += ssm.D[None, :, None, None] * diagonal[:, None]
    return pattern


def work_bytes(n_rows: int, n_heads: int, n_query: int, n_key: int) -> int:
    """Peak bytes of `implicit_rows`: about three float32 ``[batch, head, query, key]`` tensors."""
    return 3 * 4 * n_rows * n_heads * n_query * n_key
