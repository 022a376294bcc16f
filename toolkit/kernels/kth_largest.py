"""The k-th largest logit of selected rows by radix select (Triton): the top-k cut.

No sort and no top-k list: a float32's bits map to an unsigned key of the same order, and the
k-th largest key is found one byte at a time, most significant first. Pass p (of 4) counts, in
a 256-bin histogram, byte p of every key whose bytes before p match the ones found so far; the
bin where the count from the top reaches k is byte p of the answer. Each row is cut into chunks
of `chunk` tokens, one program each, adding its histogram into the row's with atomics (counts
are integers: the order of the additions does not matter). A pass first replays the passes
before it from their histograms, the same way in every program. Ties need nothing special:
the k-th largest key is the one where the count reaches k, duplicates included, as in
torch.topk(k).values[-1]. The twin is `reference_sampling.kth_largest`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _key(x):
    """float32 -> uint32 of the same order (negative floats: all bits flipped)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) == 0, bits | 0x80000000, ~bits)


@triton.jit
def _replay(hist_ptr, r, n_sel, k, PASSES: tl.constexpr):
    """(prefix of the answer's key, its first PASSES bytes; k within that prefix)."""
    prefix = tl.full([], 0, tl.uint32)
    bins = tl.arange(0, 256)
    for p in tl.static_range(PASSES):
        h = tl.load(hist_ptr + (p * n_sel + r) * 256 + 255 - bins)       # bins high to low
        seen = tl.cumsum(h, axis=0)                                       # count of bins >= 255-i
        i = tl.sum((seen < k).to(tl.int32), axis=0)                       # first i reaching k
        k = k - tl.sum(tl.where(bins < i, h, 0), axis=0)                  # minus those above
        prefix = (prefix << 8) | (255 - i).to(tl.uint32)
    return prefix, k


@triton.jit
def _pass_kernel(x_ptr, stride, n_cols, rows_ptr, top_k_ptr, hist_ptr, n_sel, chunk,
                 PASS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    split = tl.program_id(1)
    row = tl.load(rows_ptr + r).to(tl.int64)
    k = tl.load(top_k_ptr + row).to(tl.int32)
    prefix, _ = _replay(hist_ptr, r, n_sel, k, PASS)
    start0 = split * chunk
    end0 = tl.minimum(start0 + chunk, n_cols)
    counts = tl.zeros([256], dtype=tl.int32)
    for start in range(start0, end0, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        key = _key(tl.load(x_ptr + row * stride + cols, mask=cols < end0, other=0.0))
        match = cols < end0
        if PASS > 0:
            match = match & ((key >> (32 - 8 * PASS)) == prefix)
        digit = tl.where(match, (key >> (24 - 8 * PASS)) & 0xFF, 0).to(tl.int32)
        counts += tl.histogram(digit, 256)
        # the lanes that do not match were counted in bin 0: take them out
        counts -= tl.where(tl.arange(0, 256) == 0, tl.sum((~match).to(tl.int32), axis=0), 0)
    tl.atomic_add(hist_ptr + (PASS * n_sel + r) * 256 + tl.arange(0, 256), counts)


@triton.jit
def _answer_kernel(rows_ptr, top_k_ptr, hist_ptr, n_sel, out_ptr):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r).to(tl.int64)
    key, _ = _replay(hist_ptr, r, n_sel, tl.load(top_k_ptr + row).to(tl.int32), 4)
    bits = tl.where((key >> 31) == 1, key ^ 0x80000000, ~key)
    tl.store(out_ptr + row, bits.to(tl.float32, bitcast=True))


def kth_largest(x: torch.Tensor, top_k: torch.Tensor, rows: torch.Tensor, max_k: int,
                *, chunk: int = 8192, block: int = 1024) -> torch.Tensor:
    """float32 [N]: the top_k[r]-th largest value of x[r] for r in rows (-inf elsewhere).

    x float32 [N, V] (rows contiguous); top_k int [N], 1 <= top_k[r] <= V for r in rows;
    rows int64 [R]; max_k: the largest top_k among them (unused here: the twin's torch.topk
    width; kept for one signature). Five launches, each reading the listed rows once.
    """
    assert x.dim() == 2 and x.dtype == torch.float32 and x.stride(1) == 1
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    n, v = x.shape
    out = torch.full((n,), float("-inf"), device=x.device)
    sel = rows.numel()
    if sel == 0:
        return out
    rows = rows.to(torch.int64).contiguous()
    top_k = top_k.contiguous()
    block = min(block, triton.next_power_of_2(v))
    chunk = triton.cdiv(max(chunk, block), block) * block
    hist = torch.zeros(4, sel, 256, dtype=torch.int32, device=x.device)
    for p in range(4):
        _pass_kernel[(sel, triton.cdiv(v, chunk))](x, x.stride(0), v, rows, top_k, hist, sel,
                                                   chunk, PASS=p, BLOCK=block)
    _answer_kernel[(sel,)](rows, top_k, hist, sel, out)
    return out
