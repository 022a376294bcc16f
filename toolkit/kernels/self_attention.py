"""Causal attention of prefill chunks over their own contiguous K/V (TMA loads) and, when they
have one, their cached prefix (paged).

The paged kernel (`paged_attention.py`) gathers every K/V tile page by page through per-row
pointers. A prefill chunk's own keys also lie contiguous in the step's k / v tensors (views of
the QKV projection [T, ...]), where Hopper's tensor memory accelerator loads whole [BLOCK_N, D]
tiles with one descriptor each (`TensorDescriptor`, Triton >= 3.4). This kernel is varlen, as
flash-attention's:

- a program owns one (tile of BLOCK_M query tokens of one chunk, one query head);
- it first walks the chunk's cached prefix (keys [0, P), every row sees all of them) in the
  paged cache, gathered page by page (pages are not contiguous, and Hopper's TMA has no gather;
  Triton pipelines these loads with cp.async), the last partial tile masked;
- then the chunk's own keys [0, tile end) by TMA: unmasked tiles first, then the diagonal ones
  masked;
- the tile table (int32 [W, 5]: chunk start row, query tile start, chunk length, prefix
  length, first entry of the sequence's page list) is built on the host, tiles with the most
  keys first, for load balance;
- GQA: query head h reads KV head h // (H / H_kv); the output optionally gets the log-sum-exp
  [T, H] (natural log);
- causal=False (bidirectional encoders: whole prompts, no prefix): every row sees all of its
  chunk's keys, unmasked tiles then the last partial one masked by the chunk's length (the
  CAUSAL constexpr; the causal variant compiles as before).

Twin: `reference_attention.self_attention` (float32, per sequence).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from toolkit.kernels.reference_attention import SELF_TILE_COLS

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


TILE_COLS = SELF_TILE_COLS   # columns of the tile table, in the order the kernel reads them


@triton.jit
def _online_softmax(acc, l_i, m_i, q, k, v, s_mask, qk_scale, MASKED: tl.constexpr):
    """One key tile: q [M, D], k / v [N, D], s_mask [M, N] (keys a row sees, when MASKED);
    acc [M, D], l_i / m_i [M] in log2 units. Every row sees at least one key of the first tile
    it meets, so m_i is finite after it."""
    s = tl.dot(q, k.T) * qk_scale                                          # [M, N]
    if MASKED:
        s = tl.where(s_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def _self_attention_kernel(
    q_desc, k_desc, v_desc, tiles_ptr, out_ptr, lse_ptr, k_cache_ptr, v_cache_ptr, kv_indices_ptr,
    stride_ot, stride_oh, stride_lt, stride_cb, stride_cs, stride_ch, scale,
    NUM_Q_PER_KV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LSE: tl.constexpr, HAS_PREFIX: tl.constexpr, PAGE: tl.constexpr, TILE_COLS: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    w = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // NUM_Q_PER_KV
    tile = tiles_ptr + w * TILE_COLS
    seq_start = tl.load(tile + 0)
    m0 = tl.load(tile + 1)                       # first query position of the tile (in the chunk)
    seq_len = tl.load(tile + 2)                  # the chunk's new tokens

    offs_m = m0 + tl.arange(0, BLOCK_M)          # [M] query positions in the chunk
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q = q_desc.load([seq_start + m0, h * D])    # [M, D]; rows past the tensor read as 0
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    qk_scale = scale * LOG2E

    if HAS_PREFIX:
        # the cached prefix, keys [0, prefix) in the paged cache: every row sees all of them
        prefix = tl.load(tile + 3)
        page_base = tl.load(tile + 4)
        head_off = kvh * stride_ch
        full = prefix - prefix % BLOCK_N
        for n in tl.range(0, full, BLOCK_N):
            pos = n + offs_n                                               # [N] key positions
            page = tl.load(kv_indices_ptr + page_base + pos // PAGE)
            slot = page.to(tl.int64) * stride_cb + (pos % PAGE) * stride_cs + head_off
            k = tl.load(k_cache_ptr + slot[:, None] + offs_d[None, :])     # [N, D]
            v = tl.load(v_cache_ptr + slot[:, None] + offs_d[None, :])
            acc, l_i, m_i = _online_softmax(acc, l_i, m_i, q, k, v, None, qk_scale, False)
        if full < prefix:                                                  # the partial last tile
            pos = full + offs_n
            kin = pos < prefix
            page = tl.load(kv_indices_ptr + page_base + pos // PAGE, mask=kin, other=0)
            slot = page.to(tl.int64) * stride_cb + (pos % PAGE) * stride_cs + head_off
            k = tl.load(k_cache_ptr + slot[:, None] + offs_d[None, :], mask=kin[:, None], other=0.0)
            v = tl.load(v_cache_ptr + slot[:, None] + offs_d[None, :], mask=kin[:, None], other=0.0)
            acc, l_i, m_i = _online_softmax(acc, l_i, m_i, q, k, v, kin[None, :], qk_scale, True)

    if CAUSAL:
        # the chunk's own keys every row of the tile sees: [0, m0) (m0 is a multiple of BLOCK_M,
        # so of BLOCK_N)
        for n in tl.range(0, m0, BLOCK_N):
            k = k_desc.load([seq_start + n, kvh * D])                      # [N, D]
            v = v_desc.load([seq_start + n, kvh * D])
            acc, l_i, m_i = _online_softmax(acc, l_i, m_i, q, k, v, None, qk_scale, False)
        # the diagonal: keys [m0, min(m0 + BLOCK_M, seq_len)), causal mask; a key past the chunk
        # is only ever "visible" to a query row past it too, which is not stored. V rows past the
        # chunk belong to the next one (or read as 0): p is 0 there for every stored row
        hi = tl.minimum(m0 + BLOCK_M, seq_len)
        for n in tl.range(m0, hi, BLOCK_N):
            k = k_desc.load([seq_start + n, kvh * D])
            v = v_desc.load([seq_start + n, kvh * D])
            causal = (n + offs_n)[None, :] <= offs_m[:, None]
            acc, l_i, m_i = _online_softmax(acc, l_i, m_i, q, k, v, causal, qk_scale, True)
    else:
        # bidirectional: all of the chunk's keys; whole tiles unmasked, then the partial last
        # one masked by the chunk's length (rows past it belong to the next chunk)
        full = seq_len - seq_len % BLOCK_N
        for n in tl.range(0, full, BLOCK_N):
            k = k_desc.load([seq_start + n, kvh * D])                      # [N, D]
            v = v_desc.load([seq_start + n, kvh * D])
            acc, l_i, m_i = _online_softmax(acc, l_i, m_i, q, k, v, None, qk_scale, False)
        if full < seq_len:
            k = k_desc.load([seq_start + full, kvh * D])
            v = v_desc.load([seq_start + full, kvh * D])
            kin = (full + offs_n)[None, :] < seq_len      # V rows past it: p is 0 there
            acc, l_i, m_i = _online_softmax(acc, l_i, m_i, q, k, v, kin, qk_scale, True)

    row_ok = offs_m < seq_len
    rows = (seq_start + offs_m).to(tl.int64)
    o = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    if HAS_LSE:
        tl.store(lse_ptr + rows * stride_lt + h, (m_i + tl.log2(l_i)) / LOG2E, mask=row_ok)


def tile_rows(seq_lens, block_m: int, starts=None, prefix_lens=None, page_base=None) -> np.ndarray:
    """int32 [W, TILE_COLS] (chunk start row, tile's first position, chunk length, prefix length,
    first page-list entry) on the host, tiles with the most keys first. seq_lens: each chunk's
    new tokens; starts: each chunk's first row (default: packed); prefix_lens / page_base: each
    sequence's cached tokens before the chunk and the start of its page list (default 0)."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    zeros = np.zeros_like(lens)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]) if starts is None else np.asarray(starts)
    prefix = zeros if prefix_lens is None else np.asarray(prefix_lens, dtype=np.int64)
    pages = zeros if page_base is None else np.asarray(page_base, dtype=np.int64)
    per = -(-lens // block_m)                                             # tiles per chunk
    seq = np.repeat(np.arange(len(lens)), per)
    m0 = (np.arange(per.sum()) - np.repeat(np.cumsum(per) - per, per)) * block_m
    rows = np.stack([starts[seq], m0, lens[seq], prefix[seq], pages[seq]], axis=1)
    rows = rows.astype(np.int32).reshape(-1, TILE_COLS)
    return rows[np.argsort(-(rows[:, 1] + rows[:, 3]), kind="stable")]   # keys a tile reads


def tile_table(seq_lens, block_m: int, device: torch.device | str, starts=None, prefix_lens=None,
               page_base=None) -> torch.Tensor:
    """`tile_rows` on the device."""
    return torch.from_numpy(tile_rows(seq_lens, block_m, starts, prefix_lens, page_base)).to(device)


def self_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiles: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor | None = None, *, scale: float,
                   kv_cache: torch.Tensor | None = None, kv_indices: torch.Tensor | None = None,
                   block_m: int = 128, block_n: int = 64, num_warps: int = 8,
                   num_stages: int = 3, causal: bool = True) -> None:
    """Causal attention of each chunk's tokens over its cached prefix and its own keys;
    causal=False: every token over all of its chunk's keys (no prefix: kv_cache must be None).

    q [T, H, D], k / v [T, H_kv, D] (the step's new tokens; each token's heads contiguous, rows
    may be strided, as views of a QKV projection); tiles int32 [W, TILE_COLS] from `tile_table`;
    out [T, H, D] (written); lse float32 [T, H] (natural log) when given. kv_cache [2, NB, BS,
    H_kv, D] (one layer, q's dtype) and kv_indices int32 (the page lists the tiles point into)
    hold the prefixes; without them the tiles' prefix lengths must be 0 (the twin checks).
    block_m must be a multiple of block_n.
    """
    t, h, d = q.shape
    h_kv = k.shape[1]
    if k.shape != v.shape or k.shape[0] != t or k.shape[2] != d or h % h_kv:
        raise ValueError(f"q must be [T, H, D] and k, v [T, H_kv, D] with H a multiple of H_kv; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if block_m % block_n or d & (d - 1):
        raise ValueError(f"block_m must be a multiple of block_n and D a power of two; got block_m="
                         f"{block_m}, block_n={block_n}, D={d}")
    if tiles.ndim != 2 or tiles.shape[1] != TILE_COLS:
        raise ValueError(f"tiles must be int32 [W, {TILE_COLS}] (tile_table), got {tuple(tiles.shape)}")
    has_prefix = kv_cache is not None
    if has_prefix and (kv_indices is None or kv_cache.dtype != q.dtype or kv_cache.ndim != 5
                       or tuple(kv_cache.shape[3:]) != (h_kv, d)):
        raise ValueError(f"kv_cache must be [2, NB, BS, {h_kv}, {d}] in q's dtype {q.dtype}, with "
                         f"kv_indices; got {tuple(kv_cache.shape)} {kv_cache.dtype}")
    if not causal and kv_cache is not None:
        raise ValueError("bidirectional self_attention (causal=False) takes whole prompts: no kv_cache prefix")
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
    if has_prefix:
        k_cache, v_cache = kv_cache[0], kv_cache[1]                        # [NB, BS, H_kv, D]
        cache_args = (k_cache, v_cache, kv_indices, *k_cache.stride()[:3])
        page = kv_cache.shape[2]
    else:
        cache_args, page = (out, out, tiles, 0, 0, 0), 1                  # placeholders
    _self_attention_kernel[(tiles.shape[0], h)](
        desc(q, block_m), desc(k, block_n), desc(v, block_n), tiles, out, lse_arg, *cache_args[:3],
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0, *cache_args[3:],
        float(scale), NUM_Q_PER_KV=h // h_kv, D=d, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_LSE=lse is not None, HAS_PREFIX=has_prefix, PAGE=page, TILE_COLS=TILE_COLS,
        CAUSAL=causal, num_warps=num_warps, num_stages=num_stages,
    )
