"""Slow, obviously-correct twins of `implicit_rows`, for tests and benchmarks.

The twin does not use the closed form at all. It runs the recurrence the closed form
is derived from, step by step, on unit impulses: ``M[t, s]`` is the output at step ``t``
when the input is 1 at step ``s`` and 0 elsewhere.

1. For each key ``s``: start from a zero state.
2. At step ``s`` add the input: ``h = dt_s B_s`` (times 1, the impulse).
3. For each later step ``t``: decay ``h = exp(dt_t A) h`` and read ``M[t, s] = C_t . h``.

Steps run one Python iteration each (``T (T + 1) / 2`` per call), vectorised only over
batch and heads. Use small ``T``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .capture import SSMInputs


def implicit_loop(ssm: SSMInputs, include_skip: bool = False, keys: Sequence[int] | None = None) -> Tensor:
    """The full ``[batch, head, pos, pos]`` implicit attention, by the recurrence.

    Padding queries and keys are zeroed afterwards, as in `implicit_rows`. ``keys``
    computes only those key columns (the others stay zero): the cost of a column ``s``
    is ``T - s`` steps, which lets a benchmark time a sample of columns and scale.
    """
    n_rows, n_pos, n_heads = ssm.dt.shape
    dt = ssm.dt.double()
    A = ssm.A.double()[:, None] if ssm.scalar_decay else ssm.A.double()  # [head, 1] or [head, state]
    B, C = ssm.B.double(), ssm.C.double()
    if not ssm.scalar_decay:  # Mamba-1: every channel sees the same B and C
        B, C = B[:, :, None, :].expand(-1, -1, n_heads, -1), C[:, :, None, :].expand(-1, -1, n_heads, -1)
    scale = dt if ssm.weight is None else ssm.weight.double()  # the input's factor: dt (Discrete Mamba-2: 1)
    pattern = torch.zeros(n_rows, n_heads, n_pos, n_pos, dtype=torch.float64)
    for s in range(n_pos) if keys is None else keys:
        state = scale[:, s, :, None] * B[:, s]  # [batch, head, state]: the impulse enters at step s
        pattern[:, :, s, s] = (C[:, s] * state).sum(-1)
        for t in range(s + 1, n_pos):
            state = torch.exp(dt[:, t, :, None] * A) * state
            pattern[:, :, t, s] = (C[:, t] * state).sum(-1)
    if include_skip:
        pattern += torch.diag_embed(ssm.D.double()[None, :, None].expand(n_rows, n_heads, n_pos))
    real = ssm.mask.cpu()
    pattern *= (real[:, None, :, None] & real[:, None, None, :]).double()
    return pattern.float()


def ssm_output_loop(ssm: SSMInputs, x: Tensor) -> Tensor:
    """The SSM output ``y [batch, pos, head, d_head]`` from inputs ``x [batch, pos, head, d_head]``
    by the plain recurrence ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t``, ``y_t = C_t . h_t + D x_t``."""
    n_rows, n_pos, n_heads = ssm.dt.shape
    dt, x = ssm.dt.double(), x.double()
    A = ssm.A.double()[:, None] if ssm.scalar_decay else ssm.A.double()
    B, C = ssm.B.double(), ssm.C.double()
    if not ssm.scalar_decay:
        B, C = B[:, :, None, :].expand(-1, -1, n_heads, -1), C[:, :, None, :].expand(-1, -1, n_heads, -1)
    scale = dt if ssm.weight is None else ssm.weight.double()
    state = torch.zeros(n_rows, n_heads, x.shape[-1], B.shape[-1], dtype=torch.float64)  # [batch, head, d_head, state]
    outputs = []
    for t in range(n_pos):
        decay = torch.exp(dt[:, t, :, None] * A)[:, :, None, :]
        state = decay * state + (scale[:, t, :, None, None] * x[:, t, :, :, None]) * B[:, t, :, None, :]
        outputs.append((state * C[:, t, :, None, :]).sum(-1) + ssm.D.double()[:, None] * x[:, t])
    return torch.stack(outputs, dim=1).float()
