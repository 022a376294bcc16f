"""Causal self-attention of prefill chunks over their own, contiguous K/V, with TMA loads.

The paged kernel (`paged_attention.py`) gathers every K/V tile page by page through per-row
pointers; for a prefill that reads only its own new tokens (no cached prefix), those keys
also lie contiguous in the step's k / v tensors (views of the QKV projection [T, ...]), where
Hopper's tensor memory accelerator can load whole [BLOCK_N, D] tiles with one descriptor each
(`TensorDescriptor`, Triton >= 3.4). This kernel is that case, varlen as flash-attention's:

- a program owns one (tile of BLOCK_M query tokens of one sequence, one query head) and walks
  the sequence's keys [0, tile end): unmasked tiles first, then the diagonal ones masked;
- the tile table (int32 [W, 3]: sequence start row, query tile start, sequence length) is
  built on the host, longest tiles first (they have the most keys) for load balance;
- GQA: query head h reads KV head h // (H / H_kv); the output optionally gets the log-sum-exp
  [T, H] (natural log), so a chunk's attention over a cached prefix can be merged with it.

Twin: `reference_attention.self_attention` (float32, per sequence).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _self_attention_kernel(
    q_desc, k_desc, v_desc, tiles_ptr, out_ptr, lse_ptr, stride_ot, stride_oh, stride_lt,
    scale, NUM_Q_PER_KV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_LSE: tl.constexpr,
):
    w = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // NUM_Q_PER_KV
    seq_start = tl.load(tiles_ptr + w * 3 + 0)
    m0 = tl.load(tiles_ptr + w * 3 + 1)          # first query position of the tile (in the sequence)
    seq_len = tl.load(tiles_ptr + w * 3 + 2)

    offs_m = m0 + tl.arange(0, BLOCK_M)          # [M] query positions
    offs_n = tl.arange(0, BLOCK_N)
    q = q_desc.load([seq_start + m0, h * D])    # [M, D]; rows past the tensor read as 0
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    qk_scale = scale * LOG2E

    # keys every row of the tile sees: [0, m0) (m0 is a multiple of BLOCK_M, so of BLOCK_N)
    for n in tl.range(0, m0, BLOCK_N):
        k = k_desc.load([seq_start + n, kvh * D])                          # [N, D]
        v = v_desc.load([seq_start + n, kvh * D])
        s = tl.dot(q, k.T) * qk_scale                                      # [M, N] (log2 units)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    # the diagonal: keys [m0, min(m0 + BLOCK_M, seq_len)), causal mask; a key past the
    # sequence is only ever "visible" to a query row past it too, which is not stored
    hi = tl.minimum(m0 + BLOCK_M, seq_len)
    for n in tl.range(m0, hi, BLOCK_N):
        k = k_desc.load([seq_start + n, kvh * D])
        v = v_desc.load([seq_start + n, kvh * D])
        pos = n + offs_n
        s = tl.where(pos[None, :] <= offs_m[:, None], tl.dot(q, k.T) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))                              # finite: key m0 is seen
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        # V rows past the sequence belong to the next one (or read as 0): p is 0 there for
        # every stored row
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    row_ok = offs_m < seq_len
    rows = (seq_start + offs_m).to(tl.int64)
    offs_d = tl.arange(0, D)
    o = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    if HAS_LSE:
        tl.store(lse_ptr + rows * stride_lt + h, (m_i + tl.log2(l_i)) / LOG2E, mask=row_ok)


def tile_rows(seq_lens, block_m: int, starts=None) -> np.ndarray:
    """int32 [W, 3] (sequence start row, tile's first position, sequence length) on the host,
    tiles with the most keys first; starts: each sequence's first row (default: packed)."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if starts is None else np.asarray(starts)
    per = -(-lens // block_m)                                             # tiles per sequence
    seq = np.repeat(np.arange(len(lens)), per)
    m0 = (np.arange(per.sum()) - np.repeat(np.cumsum(per) - per, per)) * block_m
    rows = np.stack([starts[seq], m0, lens[seq]], axis=1).astype(np.int32).reshape(-1, 3)
    return rows[np.argsort(-rows[:, 1], kind="stable")]


def tile_table(seq_lens, block_m: int, device: torch.device | str, starts=None) -> torch.Tensor:
    """`tile_rows` on the device."""
    return torch.from_numpy(tile_rows(seq_lens, block_m, starts)).to(device)


def self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor | None = None, *, scale: float,
                   block_m: int = 128, block_n: int = 64, num_warps: int = 8,
                   num_stages: int = 3) -> None:
    """Causal attention of each sequence's tokens over its own keys.

    q [T, H, D], k / v [T, H_kv, D] (each token's heads contiguous; rows may be strided, as
    views of a QKV projection); tiles int32 [W, 3] from `tile_table(seq_lens, block_m)`;
    out [T, H, D] (written); lse float32 [T, H] (natural log) when given. block_m must be a
    multiple of block_n.
    """
    t, h, d = q.shape
    h_kv = k.shape[1]
    if k.shape != v.shape or k.shape[0] != t or k.shape[2] != d or h % h_kv:
        raise ValueError(f"q must be [T, H, D] and k, v [T, H_kv, D] with H a multiple of H_kv; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if block_m % block_n or d & (d - 1):
        raise ValueError(f"block_m must be a multiple of block_n and D a power of two; got block_m="
                         f"{block_m}, block_n={block_n}, D={d}")
    if tiles.shape[0] == 0:
        return

    def desc(x: torch.Tensor, rows: int) -> TensorDescriptor:
        # [T, heads * D] with the row stride of the view; a box is one head's [rows, D] tile
        return TensorDescriptor(x, [t, x.shape[1] * d], [x.stride(0), 1], [rows, d])

    for x in (q, k, v):
        if x.stride(2) != 1 or x.stride(1) != d:
            raise ValueError(f"q, k, v need each token's heads contiguous (strides [*, D, 1]), got "
                             f"{tuple(x.stride())}")
    lse_arg = lse if lse is not None else out
    _self_attention_kernel[(tiles.shape[0], h)](
        desc(q, block_m), desc(k, block_n), desc(v, block_n), tiles, out, lse_arg,
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0, float(scale),
        NUM_Q_PER_KV=h // h_kv, D=d, BLOCK_M=block_m, BLOCK_N=block_n, HAS_LSE=lse is not None,
        num_warps=num_warps, num_stages=num_stages,
    )
