"""Reference twins of the batched LoRA kernels (lora_shrink.py, lora_expand.py): a gather of
each token's adapter matrices and a multiply-and-sum (a bmm of T tiny matrices is far slower
on the CPU), obviously right, graph-capturable (no host sync), and the CPU's path.
Index -1 = the token runs no adapter."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def lora_shrink(x: torch.Tensor, a: torch.Tensor, indices: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[t] = a[indices[t]] @ x[t] (0 where indices[t] < 0), accumulated in fp32.
    x [T, K], a [S, R, K], indices int [T], out [T, R] (written whole)."""
    t = x.shape[0]
    idx = indices[:t].long()
    g = a.index_select(0, idx.clamp(min=0)).float()                      # [T, R, K]
    h = (g * x.float().unsqueeze(1)).sum(-1)                             # [T, R]
    out.copy_(h * (idx >= 0).unsqueeze(-1))
    return out


def lora_expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, indices: torch.Tensor,
                slices: Sequence[tuple[int, int, int]], scale: float = 1.0) -> torch.Tensor:
    """For each slice (y_offset, size, h_offset): y[t, o:o+n] += scale * b[indices[t], o:o+n, :]
    @ h[t, ho:ho+R] (nothing where indices[t] < 0), in fp32, rounded once into y.
    y [T, N] (in place), h [T, >= ho+R], b [S, N, R], indices int [T]."""
    t, r = y.shape[0], b.shape[2]
    idx = indices[:t].long()
    valid = (idx >= 0).unsqueeze(-1)
    for o, n, ho in slices:
        g = b[:, o:o + n, :].index_select(0, idx.clamp(min=0)).float()   # [T, n, R]
        d = (g * h[:, ho:ho + r].float().unsqueeze(1)).sum(-1) * scale  # [T, n]
        ys = y[:, o:o + n]
        ys.copy_(torch.where(valid, ys.float() + d, ys.float()))
    return y
